"""Rank functions of test_sharded_moe.py: ZeRO-1, ZeRO-2 and FSDP over an expert-parallel MoE model
against one process on the union batch (module level: a RankPool pickles them by reference).

The model, batch and parameter comparison are ep_rank_fns's: every rank builds the same float64
model from one seed, trains a copy single-process on every rank's rows (rank 0's first) and the
wrapped expert-parallel copy on its own rows, and returns the largest differences.
"""

from __future__ import annotations

import numpy as np
from ep_rank_fns import B, _batch, _diff, _model


def _wrap(wrapper, net):
    """(model to call, optimizer) for ``wrapper`` in zero1 / zero2 / fsdp / fsdp-hybrid."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from neural_arch.distributed.fsdp.wrap import ModuleWrapPolicy
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import Adam

    if wrapper == "zero1":                     # DDP reduces (experts over their group), ZeRO-1 steps
        ddp = dist.DistributedDataParallel(net)
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), Adam, lr=0.05)
    if wrapper == "zero2":                     # no DDP: the optimizer reduces every gradient
        return net, ZeroRedundancyOptimizer(net.parameters(), Adam, stage=2, lr=0.05, bucket_cap_mb=1e-4)
    policy = ModuleWrapPolicy({nn.MoE})        # the MoE (router) a unit of its own, the rest the root
    if wrapper == "fsdp-hybrid":               # replicate 2 x shard world/2: the data-parallel size is both
        mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("replicate", "shard"))
        fsdp = FullyShardedDataParallel(net, auto_wrap_policy=policy, device_mesh=mesh,
                                        sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    else:
        fsdp = FullyShardedDataParallel(net, auto_wrap_policy=policy)
    return fsdp, Adam(fsdp.parameters(), lr=0.05)


def sharded_moe_run(wrapper, ep_size, top_k=2, steps=3):
    """Outputs, aux loss, clipped global gradient norm and parameters after ``steps`` Adam steps:
    wrapped vs single process."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.expert_parallel import expert_parallel_mesh, parallelize_moe
    from neural_arch.optim import Adam, clip_grad_norm_

    world, rank = dist.get_world_size(), dist.get_rank()
    manual_seed(3)
    ref = _model(top_k, None, 0.05)
    manual_seed(3)
    net = _model(top_k, None, 0.05)
    x, y = _batch(world, False)
    mine = slice(rank * B, (rank + 1) * B)
    parallelize_moe(net, device_mesh=expert_parallel_mesh(ep_size) if ep_size < world else None)
    ids = net.moe.placement.expert_ids
    experts = [p for p in net.parameters() if getattr(p, "allreduce", True) is False]
    model, opt = _wrap(wrapper, net)
    opt_ref = Adam(ref.parameters(), lr=0.05)
    out = {"out": 0.0, "aux": 0.0, "norm": 0.0}
    for _ in range(steps):
        opt_ref.zero_grad()
        opt.zero_grad()
        yr = ref(Tensor(x))
        (F.mse_loss(yr, Tensor(y)) + ref.moe.aux_loss).backward()
        yp = model(Tensor(x[mine]))
        aux = net.moe.aux_loss
        (F.mse_loss(yp, Tensor(y[mine])) + aux).backward()
        out["out"] = max(out["out"], float(np.abs(yp.data - yr.data[mine]).max()))
        out["aux"] = max(out["aux"], abs(float(aux.data) - float(ref.moe.aux_loss.data)))
        # a binding clip: every rank must see one process's norm (each expert counted once)
        norm_ref = float(clip_grad_norm_(ref.parameters(), 0.05))
        norm = float((model if wrapper.startswith("fsdp") else opt).clip_grad_norm_(0.05))
        out["norm"] = max(out["norm"], abs(norm - norm_ref))
        opt_ref.step()
        opt.step()
    if wrapper.startswith("fsdp"):
        full = model.state_dict()              # a collective: global expert names, full values
        out["params"] = _diff_named(ref, full)
        unit_numel = sum(u.layout.numel for u in model._units)
        out["experts_outside_units"] = (unit_numel == sum(p.numel() for p in net.parameters()) -
                                        sum(p.numel() for p in experts))
    else:
        out["params"] = _diff(ref, net, ids)
        # the experts' optimizer state is sharded over their expert-data-parallel group: each rank holds
        # the state of its share of them (all of them where every expert lives once)
        out["expert_state"] = (sum(1 for p in experts if p in opt.optim.state), len(experts))
        opt.consolidate_state_dict(to=0)
        if rank == 0:                          # the replicated parameters' state and rank 0's experts'
            state = opt.state_dict()["state"]
            out["state_entries"] = (len(state), len(list(net.parameters())))
            # rank 0's experts' moments, gathered from their owners, equal one process's
            names = [n for n, _ in net.named_parameters()]
            theirs = dict(ref.named_parameters())
            worst = 0.0
            for i, name in enumerate(names):
                if name.startswith("moe.experts."):
                    local, rest = name[len("moe.experts."):].split(".", 1)
                    q = theirs[f"moe.experts.{ids[int(local)]}.{rest}"]
                    worst = max(worst, float(np.abs(state[i]["exp_avg"] - opt_ref.state[q]["exp_avg"]).max()))
            out["expert_moments"] = worst
    return out


def _diff_named(ref, full):
    theirs = dict(ref.named_parameters())
    worst = 0.0
    for name, value in full.items():       # experts under their global index: one process's names
        worst = max(worst, float(np.abs(value - theirs[name].data).max()))
    return worst
