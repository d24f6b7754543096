"""Rank-side helpers for test_alltoallv_direct.py (imported by the pool's rank processes).

Every rank rebuilds each case from its seed (the split matrix and every rank's input), runs the
uneven all-to-all and checks its own output against NumPy on the whole matrix; it returns "ok" or a
description of what differed, so the test compares plain strings.
"""

from __future__ import annotations

import os
import time

import numpy as np
from gloo_procs import backend


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _inputs(seed: int, counts, dtype: str, tail: tuple) -> list:
    """Every rank's input of one case: rank s holds ``sum(counts[s])`` rows of shape ``tail``."""
    rng = np.random.default_rng(seed)
    out = []
    for row in counts:
        data = rng.standard_normal((sum(row),) + tuple(tail)) * 10
        out.append((data > 0) if dtype == "bool" else data.astype(_dtype(dtype)))
    return out


def _expected(inputs: list, counts, rank: int) -> np.ndarray:
    blocks = []
    for s, row in enumerate(counts):
        start = sum(row[:rank])
        blocks.append(inputs[s][start:start + row[rank]])
    return np.concatenate(blocks, axis=0)


def _group(b, k: int):
    """The sub-group of ranks 0..k-1 (the world itself for k == its size); None off it. Every rank of
    the world calls this, in the same order (new_group is collective over the parent)."""
    return b if k == b.size else b.new_group(list(range(k)))


def run_cases(b, cases: list, expect_algorithm: str) -> list:
    """Each ``(seed, counts, dtype, tail, async_op)`` case on group ``b``, then an all_reduce (small or
    chunked, by the seed) that reuses the segment's buffers after it; one result string per case."""
    results = []
    for seed, counts, dtype, tail, async_op in cases:
        k = len(counts)
        me = b.rank
        inputs = _inputs(seed, counts, dtype, tail)
        mine = inputs[me]
        recv = [counts[s][me] for s in range(k)]
        out = np.full((sum(recv),) + tuple(tail), 7, dtype=mine.dtype)
        algo = b.chosen_algorithm("all_to_allv", mine)
        b.alltoallv(out, mine, recv, counts[me], async_op=async_op).wait()
        want = _expected(inputs, counts, me)
        if algo != expect_algorithm:
            results.append(f"case {seed}: ran {algo}, expected {expect_algorithm}")
        elif out.dtype != want.dtype or out.shape != want.shape or out.tobytes() != want.tobytes():
            results.append(f"case {seed} {counts} {dtype} {tail}: rank {me} got {out.shape} {out.dtype}")
        else:
            results.append("ok")
        n = 3 if seed % 2 else 3000      # 3000 float64: past a 4 KiB chunk, so the large buffers turn over
        x = np.full(n, float(me + 1))
        b.allreduce(x)
        if x[0] != k * (k + 1) / 2:
            results[-1] = f"case {seed}: the all_reduce after it got {x[0]}"
    return results


def cases_on_subgroups(cases_by_size: dict) -> dict:
    """``{k: cases}``: every k's cases on the group of ranks 0..k-1 (k = 1 .. world size), on the
    direct path (k >= 2) -- and, for k = 3, once more with the plans forced (the transport's steps, run
    twice: the second run takes them from the step cache)."""
    b = backend()
    out = {}
    for k in sorted(cases_by_size):
        g = _group(b, k)
        if g is None:
            continue
        cases = cases_by_size[k]
        out[k] = run_cases(g, cases, "direct" if k > 1 else "none")
        if k == 3:
            with g.forced_algorithm("ring"):
                out["plans"] = run_cases(g, cases[:4] + cases[:4], "pairwise_alltoallv")
    return out


def _fresh(name: str, size: int, timeout: float, transport: str | None = None):
    """A second gloo world of ranks 0..size-1 beside the pool's (its own store keys, transport and
    segment): a failure poisons it, not the world the other tests share."""
    import gloo_procs

    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.rendezvous.base import PrefixStore

    b = backend()
    if b.rank >= size:
        return None
    return GlooBackend.create(PrefixStore(f"h2/{name}", gloo_procs._STORE), b.rank, size, timeout=timeout,
                              transport=transport)


def tcp_cases(cases: list) -> list | None:
    """The cases over a fresh 3-rank world on TCP (no segment: the pairwise steps, cached by splits)."""
    fresh = _fresh("tcp", 3, 20.0, transport="tcp")
    if fresh is None:
        return None
    try:
        return run_cases(fresh, cases + cases, "pairwise_alltoallv")
    finally:
        fresh.shutdown()


def mismatched_splits() -> tuple | None:
    """On a fresh 3-rank world: rank 0 expects one row more from rank 1 than rank 1 sends. Returns
    (error type and message, whether this rank's output is untouched)."""
    fresh = _fresh("mismatch", 3, 20.0)
    if fresh is None:
        return None
    try:
        n = fresh.size
        recv = [1] * n
        if fresh.rank == 0:
            recv[1] = 2
        out = np.full((sum(recv), 2), 7.0)
        try:
            fresh.alltoallv(out, np.ones((n, 2)), recv, [1] * n)
            text = "no error"
        except Exception as exc:     # noqa: BLE001 - the test reads the type and message
            text = f"{type(exc).__name__}: {exc}"
        return text, bool((out == 7.0).all()), fresh.chosen_algorithm("all_to_allv", out)
    finally:
        fresh.shutdown()


def peer_never_arrives(timeout: float) -> tuple | None:
    """On a fresh 2-rank world with a ``timeout`` s deadline: rank 1 never calls the all_to_allv;
    rank 0 reports (error type, message, seconds waited). Both then meet on the pool's world."""
    b = backend()
    sub = b.new_group([0, 1])            # (every rank of the pool's world calls new_group)
    fresh = _fresh("late", 2, timeout)
    if fresh is None:
        return None
    try:
        outcome = ("skipped", "", 0.0)
        fresh.allreduce(np.ones(2))          # both are in the fresh world: the next op is #2
        if fresh.rank == 0:
            t0 = time.monotonic()
            try:
                fresh.alltoallv(np.zeros((2, 3)), np.ones((2, 3)), [1, 1], [1, 1])
                outcome = ("no error", "", time.monotonic() - t0)
            except Exception as exc:     # noqa: BLE001 - the test reads the type and message
                outcome = (type(exc).__name__, str(exc), time.monotonic() - t0)
        sub.barrier()                    # rank 1 waits here until rank 0 has seen its timeout
        return outcome + (os.getpid(),)
    finally:
        fresh.shutdown()
