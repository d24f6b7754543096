"""Rank functions of the FSDP expert-sharding tests in test_sharded_moe.py (module level: a RankPool
pickles them by reference).

FSDP shards each expert over its expert-data-parallel (edp) group: the model, batch and reference
are ep_rank_fns's (every rank trains a float64 copy single-process on every rank's rows and the
FSDP-wrapped expert-parallel copy on its own rows); returns the largest differences after
``steps`` Adam steps and the sizes of the arrays this rank keeps for the experts.
"""

from __future__ import annotations

import numpy as np
from ep_rank_fns import B, _batch, _model


def fsdp_expert_run(ep_size, top_k, capacity_factor, strategy="full", steps=3):
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.expert_parallel import expert_parallel_mesh, parallelize_moe
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, StateDictType
    from neural_arch.distributed.fsdp.wrap import ModuleWrapPolicy
    from neural_arch.optim import Adam, clip_grad_norm_

    world, rank = dist.get_world_size(), dist.get_rank()
    manual_seed(3)
    ref = _model(top_k, capacity_factor, 0.05)
    manual_seed(3)
    net = _model(top_k, capacity_factor, 0.05)
    x, y = _batch(world, False)
    mine = slice(rank * B, (rank + 1) * B)
    parallelize_moe(net, device_mesh=expert_parallel_mesh(ep_size) if ep_size < world else None)
    experts = [p for p in net.parameters() if getattr(p, "allreduce", True) is False]
    whole_expert_numel = sum(p.numel() for p in experts)       # what each rank kept before: all its experts
    policy = ModuleWrapPolicy({nn.MoE})
    if strategy == "hybrid":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        fsdp = FullyShardedDataParallel(net, auto_wrap_policy=policy, device_mesh=mesh,
                                        sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    else:
        fsdp = FullyShardedDataParallel(net, auto_wrap_policy=policy)
    opt, opt_ref = Adam(fsdp.parameters(), lr=0.05), Adam(ref.parameters(), lr=0.05)
    out = {"out": 0.0, "norm": 0.0, "dropped": 0, "norm_ref": 0.0}
    for _ in range(steps):
        opt.zero_grad()
        opt_ref.zero_grad()
        yr = ref(Tensor(x))
        (F.mse_loss(yr, Tensor(y)) + ref.moe.aux_loss).backward()
        yp = fsdp(Tensor(x[mine]))
        (F.mse_loss(yp, Tensor(y[mine])) + net.moe.aux_loss).backward()
        out["out"] = max(out["out"], float(np.abs(yp.data - yr.data[mine]).max()))
        # binding: every rank must see one process's norm (each expert's elements counted once)
        norm_ref = float(clip_grad_norm_(ref.parameters(), 0.05))
        out["norm_ref"] = max(out["norm_ref"], norm_ref)
        out["dropped"] += ref.moe.dropped
        out["norm"] = max(out["norm"], abs(float(fsdp.clip_grad_norm_(0.05)) - norm_ref))
        opt_ref.step()
        opt.step()
    theirs = dict(ref.named_parameters())
    full = fsdp.state_dict()               # a collective: global expert names, full values
    out["names"] = sorted(k for k in full if ".experts." in k)
    fsdp.load_state_dict({k: v + 1.0 for k, v in full.items()})     # a full state dict loads back (strict)
    again = fsdp.state_dict()
    out["full_roundtrip"] = max(float(np.abs(again[k] - (v + 1.0)).max()) for k, v in full.items())
    fsdp.load_state_dict(full)
    with fsdp.summon_full_params():        # the experts gathered whole into the module, under local names
        first = f"moe.experts.{net.moe.placement.expert_ids[0]}.fc1.weight"
        out["summoned"] = float(np.abs(net.moe.experts[0].fc1.weight.data - full[first]).max())
    out["params"] = max(float(np.abs(v - theirs[k].data).max()) for k, v in full.items())
    # the same through DCP's get_state_dict (full): the optimizer's moments too
    msd, osd = get_state_dict(fsdp, opt, options=StateDictOptions(full_state_dict=True))
    out["dcp_params"] = max(float(np.abs(np.asarray(v) - theirs[k].data).max()) for k, v in msd.items())
    out["dcp_moments"] = max(float(np.abs(np.asarray(osd["state"][k]["exp_avg_sq"]) -
                                          opt_ref.state[theirs[k]]["exp_avg_sq"]).max()) for k in theirs)
    with FullyShardedDataParallel.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        shards = fsdp.state_dict()
        fsdp.load_state_dict(shards)       # the sharded form loads back into the same layout
    out["sharded_expert_keys"] = sorted(k for k in shards if ".experts." in k)
    # memory: the arrays this rank keeps for its experts (parameters + Adam's moments)
    expert_shards = [u.flat_param for u in fsdp._expert_units] + list(fsdp._experts)
    kept = sum(p.numel() for p in expert_shards)
    moments = sum(v.size for p in expert_shards for v in opt.state[p].values() if np.ndim(v) > 0)
    edp = experts[0].expert_dp_group
    out["edp"] = 1 if edp is None else edp.size()
    out["memory"] = (kept, moments, whole_expert_numel)
    out["padding"] = max([u.layout.padded_numel - u.layout.numel for u in fsdp._expert_units] or [0])
    out["units"] = len(fsdp._expert_units)
    return out
