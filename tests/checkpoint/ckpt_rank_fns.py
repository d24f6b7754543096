"""Layouts for the resharding matrix, and the functions RankPool ranks run (module level).

The reference state is a real model + Adam state after 3 steps (float64, same on every rank).
Each layout turns that global state into one rank's view: replicated arrays, row shards
(``ShardedArray`` boxes along dim 0) or FSDP-style flat shards (the concatenated, padded
parameters split evenly; each parameter's part given as a flat ``ShardedArray``).
"""

from __future__ import annotations

import numpy as np

LAYOUTS = {"single": 1, "ddp2": 2, "rows2": 2, "rows3": 3, "flat2": 2, "flat3": 3}


def reference_state() -> dict:
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    rng = np.random.default_rng(7)
    model = nn.Sequential(nn.Linear(5, 7, dtype=np.float64), nn.ReLU(), nn.Linear(7, 3, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.data.shape)
    opt = optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        x = Tensor(rng.normal(size=(4, 5)))
        loss = (model(x) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # one array big enough (256 KiB) that a replicated save splits it into row blocks over the ranks
    table = rng.normal(size=(64, 512))
    return {"model": dict(model.state_dict()), "optim": opt.state_dict(), "epoch": 2, "buffers": {"table": table}}


def _arrays(state):
    """[(container, key, array)] of every array leaf, in a fixed order."""
    out = []

    def walk(node):
        for k in sorted(node, key=str) if isinstance(node, dict) else range(len(node)):
            v = node[k]
            if isinstance(v, np.ndarray):
                out.append((node, k, v))
            elif isinstance(v, (dict, list)):
                walk(v)
    walk(state)
    return out


def view(state: dict, layout: str, rank: int, zero: bool = False) -> dict:
    """This rank's state dict in ``layout`` (values zeroed when ``zero``: a load target)."""
    import copy

    from neural_arch.distributed.checkpoint import ShardedArray
    world = LAYOUTS[layout]
    out = copy.deepcopy(state)
    leaves = _arrays(out)
    if layout.startswith("rows"):
        for node, k, a in leaves:
            if a.ndim == 0:
                continue
            bounds = np.linspace(0, a.shape[0], world + 1).astype(int)
            lo, hi = bounds[rank], bounds[rank + 1]
            node[k] = ShardedArray(a[lo:hi].copy(), a.shape, offsets=(lo,) + (0,) * (a.ndim - 1))
    elif layout.startswith("flat"):
        sizes = [a.size for _, _, a in leaves]
        total = sum(sizes)
        shard = -(-total // world)  # padded: every rank's flat shard has the same length
        lo, hi = rank * shard, (rank + 1) * shard
        start = 0
        for (node, k, a), n in zip(leaves, sizes):
            a0, a1 = max(lo, start), min(hi, start + n)
            if a0 < a1:
                node[k] = ShardedArray(a.reshape(-1)[a0 - start:a1 - start].copy(), a.shape, flat_offset=a0 - start)
            else:
                # this rank's shard does not touch this array: an empty piece keeps the key
                node[k] = ShardedArray(a.reshape(-1)[:0].copy(), a.shape, flat_offset=0)
            start += n
    if zero:
        for node, k, a in _arrays(out):
            a[...] = 0
        for node in _sharded(out):
            node.local[...] = 0
        out["epoch"] = -1
        out["optim"]["param_groups"][0]["lr"] = 0.0
    return out


def _sharded(state):
    from neural_arch.distributed.checkpoint import ShardedArray

    found = []

    def walk(node):
        for v in (node.values() if isinstance(node, dict) else node):
            if isinstance(v, ShardedArray):
                found.append(v)
            elif isinstance(v, (dict, list)):
                walk(v)
    walk(state)
    return found


def compare(got, want, path="") -> list[str]:
    """Paths where ``got`` differs from ``want`` (arrays: bitwise, same dtype)."""
    from neural_arch.distributed.checkpoint import ShardedArray

    if isinstance(want, ShardedArray):
        if not isinstance(got, ShardedArray):
            return [path]
        got, want = got.local, want.local
    if isinstance(want, np.ndarray):
        ok = isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape and \
            got.tobytes() == want.tobytes()
        return [] if ok else [path]
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [path + f" keys {sorted(map(str, got))} != {sorted(map(str, want))}"]
        return [d for k in want for d in compare(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in compare(g, w, f"{path}.{i}")] + \
            ([path] if len(got) != len(want) else [])
    return [] if got == want and type(got) is type(want) else [f"{path}: {got!r} != {want!r}"]


def save_layout(layout: str, directory: str, asynchronous: bool = False):
    import neural_arch.distributed as dist
    from neural_arch.distributed import checkpoint as dcp

    rank = dist.get_rank() if dist.is_initialized() else 0
    state = view(reference_state(), layout, rank)
    if asynchronous:
        dcp.async_save(state, directory).result()
        if dist.is_initialized():
            dist.barrier()
    else:
        dcp.save(state, directory)
    return True


def load_layout(layout: str, directory: str, fresh_optimizer: bool = False) -> list[str]:
    import neural_arch.distributed as dist
    from neural_arch.distributed import checkpoint as dcp

    rank = dist.get_rank() if dist.is_initialized() else 0
    want = view(reference_state(), layout, rank)
    target = view(reference_state(), layout, rank, zero=True)
    if fresh_optimizer:
        target["optim"]["state"] = {}  # a fresh optimizer: filled from the checkpoint
    dcp.load(target, directory)
    return compare(target, want)


def save_again(layout: str, directory: str) -> int:
    """Save the same layout twice more (sync, then async): how many plan exchanges hit the cache."""
    import os

    import neural_arch.distributed as dist
    from neural_arch.distributed import checkpoint as dcp
    from neural_arch.distributed.checkpoint import api

    rank = dist.get_rank() if dist.is_initialized() else 0
    state = view(reference_state(), layout, rank)
    before = api._plans.hits
    dcp.save(state, os.path.join(directory, "a"))
    state["epoch"] = 5  # a plain value changes: still the same layout
    dcp.async_save(state, os.path.join(directory, "b")).result()
    hits = api._plans.hits - before
    # Only the last rank's layout changes (a key only it holds): the others' staging under the
    # cached plan is redone under the new one.
    world = dist.get_world_size() if dist.is_initialized() else 1
    if rank == world - 1:
        state["only_last"] = np.arange(40_000.0)  # 320 KB: the balanced plan moves other chunks too
    dcp.async_save(state, os.path.join(directory, "c")).result()
    if dist.is_initialized():
        dist.barrier()
    return hits, api._plans.hits - before
