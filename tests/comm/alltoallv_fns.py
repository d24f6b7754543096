"""Rank functions of test_alltoallv.py (module level: the rank pool pickles them by reference).

Every rank rebuilds the same global cases from their seeds (the split matrix and every rank's
input), runs the backend's uneven all-to-all and returns its output; the test compares it with
NumPy on the whole matrix.
"""

from __future__ import annotations

import functools

import numpy as np


def case_inputs(seed: int, counts, dtype: str, tail: tuple) -> list:
    """Every rank's input of one case: rank s holds ``sum(counts[s])`` rows of shape ``tail``."""
    rng = np.random.default_rng(seed)
    out = []
    for row in counts:
        data = rng.standard_normal((sum(row),) + tuple(tail)) * 10
        out.append((data > 0) if dtype == "bool" else data.astype(dtype))
    return out


def expected_output(seed: int, counts, dtype: str, tail: tuple, rank: int) -> np.ndarray:
    """NumPy's answer for ``rank``: block ``rank`` of every rank's input, in source-rank order."""
    inputs = case_inputs(seed, counts, dtype, tail)
    blocks = []
    for s, row in enumerate(counts):
        start = sum(row[:rank])
        blocks.append(inputs[s][start:start + row[rank]])
    return np.concatenate(blocks, axis=0)


def alltoallv_cases(cases: list, padded: bool = False) -> list:
    """Run every ``(seed, counts, dtype, tail, async_op)`` case on this rank's group backend.
    ``padded``: the Backend interface's default hook (the padding path) instead of the backend's own."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.comm.backend import Backend
    from neural_arch.distributed.resolve import _resolve_group

    backend = _resolve_group(None, "test").backend
    rank = dist.get_rank()
    own = backend._alltoallv

    def no_padding(*args):
        raise AssertionError("the native all_to_allv fell back to the padded equal-split all_to_all")

    if padded:
        backend._alltoallv = functools.partial(Backend._alltoallv, backend)
    else:
        backend._alltoall = no_padding          # the native path must not pad
    try:
        results = []
        for seed, counts, dtype, tail, async_op in cases:
            mine = case_inputs(seed, counts, dtype, tail)[rank]
            recv = [counts[s][rank] for s in range(len(counts))]
            out = np.full((sum(recv),) + tuple(tail), 7, dtype=mine.dtype)
            work = backend.alltoallv(out, mine, recv, counts[rank], async_op=async_op)
            work.wait()
            results.append(out)
        return results
    finally:
        backend._alltoallv = own
        backend.__dict__.pop("_alltoall", None)


def mismatched_splits() -> str:
    """Rank 0 expects one row more from rank 1 than rank 1 sends: the error each rank raises."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.resolve import _resolve_group

    world = _resolve_group(None, "test").backend
    backend = world.new_group(range(world.size))    # the error makes its group unusable: not the pool's world
    rank, n = dist.get_rank(), dist.get_world_size()
    sends = [1] * n
    recv = [1] * n
    if rank == 0:
        recv[1] = 2
    try:
        backend.alltoallv(np.zeros((sum(recv), 2)), np.ones((sum(sends), 2)), recv, sends)
    except Exception as exc:     # noqa: BLE001 - the test reads the type and message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def bad_arguments() -> list:
    """Argument errors raised in the caller, before any I/O (the group stays usable)."""
    from neural_arch.distributed.resolve import _resolve_group

    backend = _resolve_group(None, "test").backend
    n = backend.size
    errors = []
    for out, inp, recv, send in [
        (np.zeros((n, 2)), np.zeros((n, 2)), [1] * n, [1] * (n + 1)),           # too many splits
        (np.zeros((n, 2)), np.zeros((n, 2)), [1] * n, [2] + [1] * (n - 1)),     # do not sum to dim 0
        (np.zeros((n, 3)), np.zeros((n, 2)), [1] * n, [1] * n),                 # row shapes differ
        (np.zeros((n, 2), np.float32), np.zeros((n, 2)), [1] * n, [1] * n),     # dtypes differ
        (np.zeros((n, 2)), np.zeros((n, 2)), [-1, 2] + [1] * (n - 2), [1] * n),  # negative
    ]:
        try:
            backend.alltoallv(out, inp, recv, send)
            errors.append("no error")
        except ValueError as exc:
            errors.append(str(exc))
    x = np.arange(2.0 * n).reshape(n, 2)
    out = np.zeros_like(x)
    backend.alltoallv(out, x, [1] * n, [1] * n)        # still usable: an equal split after the errors
    errors.append(out[:, 0].tolist())
    return errors
