"""What RankPool ranks run for test_async_staging.py (module level: pickled by reference)."""

from __future__ import annotations

import os

import numpy as np


def _state(rank: int, world: int) -> dict:
    """Replicated arrays (one big enough to be split into row blocks), a row-sharded array and plain
    values; float64 and int32, the same on every rank where replicated."""
    from neural_arch.distributed.checkpoint import ShardedArray

    rng = np.random.default_rng(11)
    table = rng.normal(size=(64, 512))                       # 256 KiB: row blocks over the ranks
    small = rng.normal(size=(3, 5))
    counts = rng.integers(0, 1000, size=(7,), dtype=np.int32)
    full = rng.normal(size=(4 * world, 3))
    rows = full[4 * rank:4 * rank + 4].copy()
    return {"model": {"table": table, "small": small, "counts": counts},
            "sharded": ShardedArray(rows, global_shape=full.shape, offsets=(4 * rank, 0)),
            "epoch": 3, "name": "run"}


def _zeros_like(rank: int, world: int) -> dict:
    state = _state(rank, world)
    for key in ("table", "small", "counts"):
        state["model"][key] = np.zeros_like(state["model"][key])
    state["sharded"].local[...] = 0
    state["epoch"], state["name"] = 0, ""
    return state


def _chunk_crcs(meta: dict) -> dict:
    return {key: sorted((c["name"], tuple(c["crc32"]) if isinstance(c["crc32"], list) else c["crc32"])
                        for c in entry["chunks"]) for key, entry in meta["tensors"].items()}


def sync_and_async_equal_run(base: str, group_size: int) -> dict:
    """Save the same state with save() and with async_save(async_stager=DefaultStager()) on groups of
    ``group_size`` ranks; load both back; report whether every byte is equal."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.checkpoint import load, save
    from neural_arch.distributed.checkpoint.api import AsyncSaveResponse, async_save
    from neural_arch.distributed.checkpoint.staging import DefaultStager
    from neural_arch.distributed.subgroups import new_subgroups

    rank = dist.get_rank()
    group, _ = new_subgroups(group_size) if group_size < dist.get_world_size() else (None, None)
    grank = rank % group_size
    tag = f"g{group_size}_{rank // group_size}"
    sync_dir, async_dir = os.path.join(base, tag + "_sync"), os.path.join(base, tag + "_async")
    stager = DefaultStager()
    try:
        meta_sync = save(_state(grank, group_size), sync_dir, process_group=group)
        response = async_save(_state(grank, group_size), async_dir, process_group=group, async_stager=stager)
        assert isinstance(response, AsyncSaveResponse), type(response)
        assert response.staging_completion.result() is None
        meta_async = response.upload_completion.result()
        # A second save with the same layout reuses the stager's buffers (and the cached plan).
        again = async_save(_state(grank, group_size), async_dir + "_again", process_group=group, async_stager=stager)
        meta_again = again.upload_completion.result()
    finally:
        stager.close()
    dist.barrier()
    bad = []
    loaded = []
    for d in (sync_dir, async_dir, async_dir + "_again"):
        target = _zeros_like(grank, group_size)
        load(target, d)
        loaded.append(target)
    ref = loaded[0]
    for other in loaded[1:]:
        for key in ("table", "small", "counts"):
            a, b = ref["model"][key], other["model"][key]
            if a.dtype != b.dtype or a.tobytes() != b.tobytes():
                bad.append(key)
        if ref["sharded"].local.tobytes() != other["sharded"].local.tobytes():
            bad.append("sharded")
        if (ref["epoch"], ref["name"]) != (other["epoch"], other["name"]):
            bad.append("objects")
    expected = _state(grank, group_size)
    if ref["model"]["table"].tobytes() != expected["model"]["table"].tobytes():
        bad.append("sync save differs from the state")
    out = {"bad": bad}
    if grank == 0:
        out["crc_equal"] = _chunk_crcs(meta_sync) == _chunk_crcs(meta_async) == _chunk_crcs(meta_again)
        out["files"] = len(meta_async["files"])
    return out


def replicas_differ_run(base: str) -> dict:
    """A 'replicated' array that differs between the ranks, saved with asynchronous staging: the
    comparison moves to rank 0's commit (no collective after the call returns); nothing commits."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.checkpoint.api import async_save
    from neural_arch.distributed.checkpoint.staging import DefaultStager

    rank = dist.get_rank()
    stager = DefaultStager()
    try:
        response = async_save({"w": np.full(6, float(rank)), "same": np.ones(3)}, base, async_stager=stager)
        staging_error = response.staging_completion.exception()
        try:
            response.upload_completion.result()
            error = None
        except Exception as exc:  # noqa: BLE001 - reported to the test
            error = f"{type(exc).__name__}: {exc}"
    finally:
        stager.close()
    dist.barrier()
    return {"staging_error": staging_error, "error": error, "committed": os.path.exists(os.path.join(base, ".metadata"))}


def ddp_step_after_async_save_run(base: str) -> dict:
    """DDP with BatchNorm: async_save of the live parameters and buffers, then at once a training
    forward (DDP broadcasts the buffers, BatchNorm updates them), backward and step without waiting:
    the checkpoint holds the state before them, bitwise."""
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.checkpoint import load
    from neural_arch.distributed.checkpoint.api import async_save
    from neural_arch.distributed.checkpoint.staging import DefaultStager
    from neural_arch.distributed.ddp import DistributedDataParallel

    rng = np.random.default_rng(5)
    inner = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.BatchNorm1d(4, dtype=np.float64))
    model = DistributedDataParallel(inner)
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = Tensor(rng.normal(size=(6, 3)))          # the same batch on both ranks: replicas stay equal
    (model(x) ** 2).sum().backward()
    opt.step()
    live = {**dict(inner.named_parameters()), **dict(inner.named_buffers())}
    before = {k: np.array(v.data) for k, v in live.items()}
    stager = DefaultStager()
    try:
        response = async_save(live, base, async_stager=stager)
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()
        response.upload_completion.result()
    finally:
        stager.close()
    dist.barrier()
    got = {k: np.zeros_like(v) for k, v in before.items()}
    load(got, base)
    changed = any(not np.array_equal(before[k], v.data) for k, v in live.items())
    return {"equal": all(got[k].tobytes() == before[k].tobytes() for k in before), "changed": changed}
