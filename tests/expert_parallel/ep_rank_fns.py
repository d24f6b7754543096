"""Functions the expert-parallel tests run on every rank of a RankPool (module level: pickled by reference).

Each rank builds the same float64 model from one seed, trains a copy single-process on the union
batch (every rank's rows, rank 0's first) and the expert-parallel copy on its own rows, and returns
the largest differences, so the tests assert in the parent.
"""

from __future__ import annotations

import numpy as np

C, E, H, B = 6, 4, 5, 5          # width, experts, expert hidden width, tokens per rank


def _model(top_k, capacity_factor, z):
    from neural_arch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(C, C)
            self.moe = nn.MoE(C, E, top_k=top_k, hidden_dim=H, capacity_factor=capacity_factor,
                              aux_loss_coef=0.5, z_loss_coef=z)

        def forward(self, x):
            return self.moe(self.pre(x))

    net = Net().double()
    rng = np.random.default_rng(11)
    net.moe.router.weight.data[...] = rng.standard_normal((E, C))     # routing spread over experts
    return net


def _batch(world, stranded):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((world * B, C))
    y = rng.standard_normal((world * B, C))
    return x, y


def ep_train_run(ep_size, top_k, capacity_factor, how="world", stranded=False, local_aux=False, steps=3):
    """Single-process on the union batch vs expert-parallel + DDP: outputs, aux loss, parameters."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.expert_parallel import expert_parallel_mesh, parallelize_moe
    from neural_arch.optim import Adam

    world, rank = dist.get_world_size(), dist.get_rank()
    z = 0.05
    manual_seed(3)
    ref = _model(top_k, capacity_factor, z)
    manual_seed(3)
    net = _model(top_k, capacity_factor, z)
    x, y = _batch(world, stranded)
    if stranded:
        # The last rank's tokens all pick experts 0 (and 1): with ep >= 2 they all live on ep rank 0,
        # so the last rank sends nothing to itself or its other peers (zero-length splits).
        for m in (ref, net):
            m.pre.weight.data[...] = np.eye(C)
            m.pre.bias.data[...] = 0.0
            m.moe.router.weight.data[...] = 0.0
            m.moe.router.weight.data[0, 0] = 4.0
            m.moe.router.weight.data[1, 1] = 3.0
        x[(world - 1) * B:] = np.abs(x[(world - 1) * B:]) * 0.1
        x[(world - 1) * B:, 0] = 5.0
        x[(world - 1) * B:, 1] = 4.0
    mine = slice(rank * B, (rank + 1) * B)

    if how == "world":
        parallelize_moe(net, ep_group=None if ep_size == world else _ep_groups(ep_size), local_aux_loss=local_aux)
    elif how == "mesh":
        parallelize_moe(net, device_mesh=expert_parallel_mesh(ep_size), local_aux_loss=local_aux)
    ddp = dist.DistributedDataParallel(net)
    ids = net.moe.placement.expert_ids

    opt_ref, opt = Adam(ref.parameters(), lr=0.05), Adam(ddp.parameters(), lr=0.05)
    out = {"out": 0.0, "aux": 0.0, "params": 0.0, "grads": 0.0}
    # the experts this rank's tokens choose at the first step (``pre`` is the identity when stranded)
    first = (x[mine] @ net.pre.weight.data.T + net.pre.bias.data) @ net.moe.router.weight.data.T
    out["choices"] = sorted({int(e) for e in np.argsort(-first, axis=1, kind="stable")[:, :top_k].reshape(-1)})
    for _ in range(steps):
        opt_ref.zero_grad()
        opt.zero_grad()
        yr = ref(Tensor(x))
        loss_ref = F.mse_loss(yr, Tensor(y)) + ref.moe.aux_loss
        loss_ref.backward()
        yp = ddp(Tensor(x[mine]))
        aux = net.moe.aux_loss
        if local_aux:
            aux_ref = _local_aux(top_k, capacity_factor, z, ref, x[mine])
        else:
            aux_ref = float(ref.moe.aux_loss.data)
        loss = F.mse_loss(yp, Tensor(y[mine])) + aux
        loss.backward()
        out["out"] = max(out["out"], float(np.abs(yp.data - yr.data[mine]).max()))
        out["aux"] = max(out["aux"], abs(float(aux.data) - aux_ref))
        if not local_aux:
            out["grads"] = max(out["grads"], _diff(ref, net, ids, grad=True))
        opt_ref.step()
        opt.step()
    out["params"] = _diff(ref, net, ids)
    out["ids"] = list(ids)
    out["dropped"] = net.moe.dropped
    return out


def _local_aux(top_k, capacity_factor, z, ref, x_local):
    """Megatron's per-rank statistics: the reference MoE run on this rank's rows alone."""
    from neural_arch.core.tensor import Tensor, no_grad

    with no_grad():
        ref.moe.capacity_factor = None
        ref(Tensor(x_local))
        ref.moe.capacity_factor = capacity_factor
    return float(ref.moe.aux_loss.data)


def _ep_groups(ep_size):
    """Consecutive ranks as expert-parallel groups, torch style (every rank creates every group)."""
    import neural_arch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for start in range(0, world, ep_size):
        g = dist.new_group(list(range(start, start + ep_size)))
        if start <= rank < start + ep_size:
            mine = g
    return mine


def _diff(ref, net, ids, grad=False):
    def arr(p):
        return p.grad.data if grad else p.data

    worst = 0.0
    for name, p in net.named_parameters():
        if name.startswith("moe.experts."):
            local, rest = name[len("moe.experts."):].split(".", 1)
            q = dict(ref.named_parameters())[f"moe.experts.{ids[int(local)]}.{rest}"]
        else:
            q = dict(ref.named_parameters())[name]
        worst = max(worst, float(np.abs(arr(p) - arr(q)).max()))
    return worst


def a2a_uneven_run():
    """The differentiable uneven all_to_all_single against NumPy: rank r sends (r + d) % 3 rows to d."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.nn.functional import all_to_all_single

    n, r = dist.get_world_size(), dist.get_rank()
    sizes = [[(s + d) % 3 for d in range(n)] for s in range(n)]               # sizes[s][d]
    rows = [np.arange(sum(sizes[s]) * 2, dtype=np.float64).reshape(-1, 2) + 100 * s for s in range(n)]
    x = Tensor(rows[r].copy(), requires_grad=True)
    y = all_to_all_single(x, output_split_sizes=[sizes[s][r] for s in range(n)], input_split_sizes=sizes[r])
    expect = np.concatenate([rows[s][sum(sizes[s][:r]):sum(sizes[s][:r + 1])] for s in range(n)])
    w = np.random.default_rng(r).standard_normal(y.shape)
    (y * Tensor(w)).sum().backward()
    # d/dx of sum_r' <y_r', w_r'>: each row of x gets the weight its receiver applied to it
    ws = [np.random.default_rng(d).standard_normal((sum(sizes[s][d] for s in range(n)), 2)) for d in range(n)]
    gexp = np.concatenate([ws[d][sum(sizes[s][d] for s in range(r)):sum(sizes[s][d] for s in range(r + 1))]
                           for d in range(n)])
    return float(np.abs(y.data - expect).max()), float(np.abs(x.grad.data - gexp).max())


def gpt_ep_run(ep_size, steps=2):
    """A GPT whose every other MLP is an MoE: expert-parallel + DDP vs one process on the union batch."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.expert_parallel import expert_parallel_mesh, parallelize_moe
    from neural_arch.optim import Adam

    world, rank = dist.get_world_size(), dist.get_rank()
    kw = {"top_k": 2, "capacity_factor": 1.0, "z_loss_coef": 0.01}
    models = []
    for _ in range(2):
        manual_seed(7)
        models.append(nn.GPT(11, 4, 2, 2, 8, moe_num_experts=4, moe_every=2, moe_kwargs=kw).double())
    ref, net = models
    idx = np.random.default_rng(1).integers(0, 11, size=(2 * world, 4))
    tgt = np.roll(idx, -1, axis=1)
    mine = slice(2 * rank, 2 * rank + 2)
    mesh = expert_parallel_mesh(ep_size) if ep_size < world else None
    parallelize_moe(net, device_mesh=mesh)
    ddp = dist.DistributedDataParallel(net)
    opt_ref, opt = Adam(ref.parameters(), lr=0.01), Adam(ddp.parameters(), lr=0.01)
    worst = {"logits": 0.0, "aux": 0.0}
    for _ in range(steps):
        opt_ref.zero_grad()
        opt.zero_grad()
        lr_ = ref(idx)
        (F.cross_entropy(lr_.reshape(-1, 11), tgt.reshape(-1)) + ref.aux_loss).backward()
        lp = ddp(idx[mine])
        (F.cross_entropy(lp.reshape(-1, 11), tgt[mine].reshape(-1)) + net.aux_loss).backward()
        worst["logits"] = max(worst["logits"], float(np.abs(lp.data - lr_.data[mine]).max()))
        worst["aux"] = max(worst["aux"], abs(float(net.aux_loss.data) - float(ref.aux_loss.data)))
        opt_ref.step()
        opt.step()
    worst["params"] = _diff_gpt(ref, net)
    worst["dropped"] = net.blocks[1].mlp.dropped
    return worst


def _diff_gpt(ref, net):
    theirs = dict(ref.named_parameters())
    worst = 0.0
    for name, p in net.named_parameters():
        if ".experts." in name:
            head, rest = name.split(".experts.", 1)
            local, rest = rest.split(".", 1)
            layer = net.get_submodule(head) if hasattr(net, "get_submodule") else None
            ids = layer.placement.expert_ids
            name = f"{head}.experts.{ids[int(local)]}.{rest}"
        worst = max(worst, float(np.abs(p.data - theirs[name].data).max()))
    return worst
