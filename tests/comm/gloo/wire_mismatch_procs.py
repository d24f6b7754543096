"""Rank-side helpers of ``test_wire_mismatch.py``: collectives that disagree across ranks at one
sequence number, over a fresh gloo group per example (a mismatch poisons the group it ran on).

The pool is started with ``init=False``; every call builds a ``GlooBackend`` straight from
``GlooBackend.create`` on a fresh ``PrefixStore`` of one TCPStore per rank process.
"""

from __future__ import annotations

import os
import time

import numpy as np

_STORE = None
_GROUP = None           # (key, backend): reused while its examples succeed
_COUNTER = [0]


def _store():
    global _STORE
    if _STORE is None:
        from neural_arch.distributed.rendezvous.store import TCPStore

        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _STORE = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=size,
                          is_master=rank == 0, timeout=30)
    return _STORE


def _backend(transport: str, fresh: bool):
    """This rank's group over ``transport``; a new one when ``fresh`` (the last one failed)."""
    global _GROUP
    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.rendezvous.store import PrefixStore

    if _GROUP is not None and _GROUP[0] == transport and not fresh:
        return _GROUP[1]
    if _GROUP is not None:
        _GROUP[1].shutdown()
        _GROUP = None
    _COUNTER[0] += 1
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = PrefixStore(f"wm/{transport}/{_COUNTER[0]}", _store())
    b = GlooBackend.create(store, rank, size, timeout=float(os.environ.get("GLOO_TEST_TIMEOUT", "10")),
                           transport=transport)
    _GROUP = (transport, b)
    return b


def _operand(rank: int, nelems: int, dtype: str) -> np.ndarray:
    # no period: a neighbour's segment in place of this rank's buffer cannot happen to look right
    return ((np.arange(nelems) * (rank + 2)) % 1009 + rank).astype(dtype)


def mismatched_allreduce(transport: str, specs, algo, fresh: bool):
    """Rank r calls ``all_reduce`` with ``specs[r] = (nelems, dtype, op)`` (every rank at the same
    sequence number), with the plan ``algo`` forced on every rank (None: chosen by size; on shm a
    forced plan runs over the rings instead of the direct collectives). Returns ("ok", result
    matches the oracle) or (error type, message)."""
    from neural_arch.distributed.comm.work import ReduceOp

    b = _backend(transport, fresh)
    nelems, dtype, op = specs[b.rank]
    x = _operand(b.rank, nelems, dtype)
    try:
        with b.forced_algorithm(algo):
            b.allreduce(x, ReduceOp.coerce(op))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return (type(exc).__name__, str(exc))
    ufunc = {"sum": np.add, "max": np.maximum}[op]
    want = _operand(0, nelems, dtype)
    for r in range(1, b.size):
        want = ufunc(want, _operand(r, nelems, dtype))
    return ("ok", bool(np.array_equal(x, want.astype(dtype))))


def rejected_then_next(transport: str, next_nelems: int):
    """Rank 0's all_reduce of a read-only 8 MiB float32 buffer (a ring: pipelined segments) is rejected before any I/O while
    rank 1's goes ahead; then rank 0 calls ``all_reduce`` of ``next_nelems`` float32 elements (the
    same count: a retry with a writable buffer). Returns [what each call did..., seconds]: a call
    is ("ok", result matches the oracle) or (error type, message)."""
    b = _backend(transport, True)
    n = 2 << 20
    want = _operand(0, n, "float32") + _operand(1, n, "float32")
    big = _operand(b.rank, n, "float32")
    out = []
    if b.rank == 0:
        big.flags.writeable = False
    t0 = time.monotonic()
    try:
        b.allreduce(big)
        out.append(("ok", bool(np.array_equal(big, want))))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.append((type(exc).__name__, str(exc)))
    if b.rank == 0:
        nxt = _operand(0, next_nelems, "float32")
        try:
            b.allreduce(nxt)
            out.append(("ok", bool(np.array_equal(nxt, want[:next_nelems]))))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out.append((type(exc).__name__, str(exc)))
    out.append(round(time.monotonic() - t0, 2))
    return out
