"""Rank functions of test_expert_checkpoint.py (module level: a RankPool pickles them by reference).

The model, batch and wrappers are the other expert-parallel tests' (``ep_rank_fns``,
``sharded_moe_rank_fns``): every rank builds the same float64 MoE model from one seed, trains it
expert-parallel (ep inside dp) under a sharding wrapper, saves it with ``dcp.save``, and the full
state dicts (whole arrays, by name) come back to the test, which compares layouts with them.
"""

from __future__ import annotations

import numpy as np
from ep_rank_fns import B, _batch, _model
from sharded_moe_rank_fns import _wrap

LR = 0.05


def _build(wrapper: str, ep_size: int, fill=None):
    """(net, model to call, optimizer) of ``wrapper`` over an ep = ``ep_size`` MoE net on this rank;
    ``fill``: every parameter set to it first (nothing of a checkpoint is there before a load)."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.expert_parallel import expert_parallel_mesh, parallelize_moe
    from neural_arch.optim import Adam

    manual_seed(3)
    net = _model(2, None, 0.05)
    if fill is not None:
        for p in net.parameters():
            p.data[...] = fill
    world = dist.get_world_size() if dist.is_initialized() else 1
    if wrapper == "one":                       # one process, ep = 1: the plain model and Adam
        return net, net, Adam(net.parameters(), lr=LR)
    parallelize_moe(net, device_mesh=expert_parallel_mesh(ep_size) if ep_size < world else None)
    model, opt = _wrap(wrapper, net)
    return net, model, opt


def _train(net, model, opt, steps: int, rows: slice) -> None:
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor

    x, y = _batch(dist.get_world_size(), False)
    for _ in range(steps):
        opt.zero_grad()
        (F.mse_loss(model(Tensor(x[rows])), Tensor(y[rows])) + net.moe.aux_loss).backward()
        opt.step()


def _full(model, opt):
    """The full model and optimizer state dicts (whole arrays by name; a collective)."""
    from neural_arch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return msd, osd["state"]


def save_run(wrapper: str, ep_size: int, directory: str):
    """Train 2 steps at ep = ``ep_size`` under ``wrapper``, ``dcp.save`` it; returns (full model, full
    optimizer state, single-process reference model, reference optimizer state) on rank 0."""
    import neural_arch.distributed as dist
    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict

    rank, world = dist.get_rank(), dist.get_world_size()
    net, model, opt = _build(wrapper, ep_size)
    _train(net, model, opt, 2, slice(rank * B, (rank + 1) * B))
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
    full = _full(model, opt)
    ref, _, ref_opt = _build("one", 1)
    _train(ref, ref, ref_opt, 2, slice(0, world * B))   # one process on the union batch
    ref_state = {n: dict(ref_opt.state[p]) for n, p in ref.named_parameters()}
    return (*full, {n: p.data.copy() for n, p in ref.named_parameters()}, ref_state) if rank == 0 else None


def load_run(wrapper: str, ep_size: int, directory: str, whole=None):
    """A fresh model at ep = ``ep_size`` under ``wrapper`` (parameters -1, optimizer without state),
    loaded from ``directory`` (or, ``whole``: from these full model and optimizer-state dicts, every
    expert on every rank); returns its full state dicts (model, optimizer state)."""
    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    _, model, opt = _build(wrapper, ep_size, fill=-1.0)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    if whole is None:
        dcp.load(state, checkpoint_id=directory)
    else:
        state = {"model": whole[0], "optim": {"state": whole[1], "param_groups": osd["param_groups"]}}
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return _full(model, opt)


def differences(got: tuple, want: tuple) -> list[str]:
    """What differs (bitwise) between two (full model, full optimizer state) pairs."""
    (gm, go), (wm, wo) = got, want
    out = [f"model keys {sorted(set(gm) ^ set(wm))}"] if set(gm) != set(wm) else []
    out += [f"optim keys {sorted(set(go) ^ set(wo))}"] if set(go) != set(wo) else []
    for k in set(gm) & set(wm):
        if np.shape(gm[k]) != np.shape(wm[k]) or not np.array_equal(gm[k], wm[k]):
            out.append(f"model {k}")
    for k in set(go) & set(wo):
        for s in set(go[k]) | set(wo[k]):
            a, b = go[k].get(s), wo[k].get(s)
            if a is None or b is None or np.shape(a) != np.shape(b) or not np.array_equal(a, b):
                out.append(f"optim {k}.{s}")
    return sorted(out)


def largest_difference(got: tuple, want: tuple) -> float:
    """The largest absolute difference between two (full model, full optimizer state) pairs with the
    same keys (the arrays; ``step`` counts must be equal)."""
    (gm, go), (wm, wo) = got, want
    assert set(gm) == set(wm) and set(go) == set(wo), (sorted(set(gm) ^ set(wm)), sorted(set(go) ^ set(wo)))
    worst = max(float(np.abs(gm[k] - wm[k]).max()) for k in gm)
    for k in go:
        assert set(go[k]) == set(wo[k]) and go[k]["step"] == wo[k]["step"], (k, go[k].keys(), wo[k].keys())
        worst = max([worst] + [float(np.abs(go[k][s] - wo[k][s]).max()) for s in go[k] if s != "step"])
    return worst
