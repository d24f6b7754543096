"""Rank-side helpers for the multi-process gloo tests (imported by the pool's rank processes).

The pool is started with ``init=False``: the first call builds a TCPStore from the pool's
MASTER_ADDR/MASTER_PORT and a GlooBackend straight from ``GlooBackend.create``, so these
tests exercise the backend and the real transport in isolation from the process-group layer.
"""

from __future__ import annotations

import os

import gloo_checks as C

_BACKEND = None
_STORE = None


def backend():
    global _BACKEND, _STORE
    if _BACKEND is None:
        from neural_arch.distributed.comm.gloo.backend import GlooBackend
        from neural_arch.distributed.rendezvous.store import TCPStore

        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        timeout = float(os.environ.get("GLOO_TEST_TIMEOUT", "20"))
        _STORE = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=size,
                          is_master=rank == 0, timeout=timeout)
        _BACKEND = GlooBackend.create(_STORE, rank, size, timeout=timeout,
                                      transport=os.environ.get("GLOO_TEST_TRANSPORT") or None)
    return _BACKEND


def run_checks(calls):
    """``calls``: list of (check name, args). Runs them in order on this rank's backend."""
    b = backend()
    return [getattr(C, name)(b, *args) for name, args in calls]


def transport_kinds():
    b = backend()
    return sorted(set(b.transport_kinds().values())) if b.size > 1 else []


def allreduce_unless_last():
    """Every rank but the last joins an all_reduce; returns (error type, message, seconds)."""
    import time

    import numpy as np

    b = backend()
    b.allreduce(np.ones(2))                   # a first collective that everyone joins
    if b.rank == b.size - 1:
        return ("skipped", "", 0.0)
    t0 = time.monotonic()
    try:
        b.allreduce(np.ones(4, np.float32))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return (type(exc).__name__, str(exc), time.monotonic() - t0)
    return ("no error", "", time.monotonic() - t0)


def die_if_last():
    """The last rank exits abruptly mid-job; the others all_reduce and report what they saw."""
    import time

    import numpy as np

    b = backend()
    b.allreduce(np.ones(2))
    if b.rank == b.size - 1:
        os._exit(3)
    t0 = time.monotonic()
    try:
        b.allreduce(np.ones(1 << 16, np.float32))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return (type(exc).__name__, str(exc), time.monotonic() - t0)
    return ("no error", "", time.monotonic() - t0)
