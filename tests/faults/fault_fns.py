"""Rank-side functions of the fault matrix (imported by the pool's rank processes).

Each case is one function of ``(case)``: every rank runs the fault, then a *correct* collective,
and reports both outcomes with the seconds each took, so the test (and
``benchmarks/bench_faults.py``) can check that a fault is an error on every rank and that nothing
after a mid-transfer error ever returns data. ``recover()`` then destroys and re-creates the
process group (the recovery every poisoned-group error asks for), so one pool serves every case.
"""

from __future__ import annotations

import os
import time

import numpy as np

import neural_arch.distributed as dist


def _backend():
    return dist.get_default_group().backend


def _outcome(fn):
    """(kind, message, seconds, value): kind is "ok" or the exception's class name."""
    start = time.monotonic()
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return (type(exc).__name__, str(exc)[:3000], time.monotonic() - start, None)
    return ("ok", "", time.monotonic() - start, value)


def _allreduce(array):
    _backend().allreduce(array)
    return array.tolist() if array.size <= 8 else float(array.sum())


# -- the faults --------------------------------------------------------------------------------------
def _readonly(b):
    """Rank 0 passes a read-only buffer: a ValueError at the call, before any I/O."""
    if b.rank == 0:
        ro = np.ones(int(os.environ.get("FAULT_READONLY_BYTES", str(1 << 20))) // 4, np.float32)
        ro.flags.writeable = False
        return _allreduce(ro)
    return "skipped"


def _dtype(b):
    """Same byte count, different dtype: rank 0 float32, the others int32."""
    return _allreduce(np.ones(4, np.float32 if b.rank == 0 else np.int32))


def _size(b):
    """Rank 0 reduces 4 elements, the others 5."""
    return _allreduce(np.ones(4 if b.rank == 0 else 5, np.float32))


def _op_order(b):
    """Rank 0 calls all_reduce then broadcast; the others broadcast then all_reduce (equal sizes)."""
    x, y = np.ones(4, np.float32), np.full(4, float(b.rank), np.float32)
    if b.rank == 0:
        b.allreduce(x)
        b.broadcast(y, 0)
    else:
        b.broadcast(y, 0)
        b.allreduce(x)
    return x.tolist()


def _p2p_size(b):
    """Rank 0 sends 3 floats, rank 1 receives into 4."""
    if b.rank == 0:
        b.send(np.ones(3, np.float32), 1)
        return "sent"
    if b.rank == 1:
        b.recv(np.empty(4, np.float32), 0)
        return "received"
    return "idle"


def _reduce_fault(b):
    """Rank 0's reduction fails half way (a stand-in for NumPy's "output array is read-only" during
    the reduction): bytes have moved, peers are mid-exchange."""
    if b.rank == 0 and b.name == "gloo":
        from neural_arch.distributed.comm.dtypes import REDUCE_UFUNCS

        real = REDUCE_UFUNCS[dist.ReduceOp.SUM]

        def broken(*args, **kwargs):
            raise ValueError("output array is read-only (injected fault)")
        REDUCE_UFUNCS[dist.ReduceOp.SUM] = broken
        try:
            return _allreduce(np.ones(1 << 12, np.float32))
        finally:
            REDUCE_UFUNCS[dist.ReduceOp.SUM] = real
    return _allreduce(np.ones(1 << 12, np.float32))


def _missing_rank(b):
    """The last rank skips an all_reduce; the others must time out naming it."""
    if b.rank == b.size - 1:
        time.sleep(float(os.environ.get("FAULT_TIMEOUT", "3")) + 1.0)
        return "skipped"
    return _allreduce(np.ones(4, np.float32))


CASES = {
    "readonly": _readonly,
    "dtype": _dtype,
    "size": _size,
    "op_order": _op_order,
    "p2p_size": _p2p_size,
    "reduce_fault": _reduce_fault,
    "missing_rank": _missing_rank,
}


def run_case(case: str) -> dict:
    """Run the fault, then a correct all_reduce; report both (kind, message, seconds, value)."""
    b = _backend()
    first = _outcome(lambda: CASES[case](b))
    if case == "readonly" and b.rank == 0:
        first = first[:3] + (None,)
    after = _outcome(lambda: _allreduce(np.full(4, float(b.rank + 1), np.float32)))
    return {"rank": b.rank, "first": first, "next": after}


def recover() -> list:
    """What every poisoned-group error says to do: destroy the group, create it again, go on."""
    dist.destroy_process_group()
    dist.init_process_group(backend=os.environ.get("NEURAL_ARCH_BACKEND") or None)
    x = np.full(3, float(dist.get_rank() + 1))
    _backend().allreduce(x)
    return x.tolist()


def rendezvous_without(absent: int, seconds: float):
    """Rank ``absent`` never calls init_process_group; the others report what they were told."""
    rank = int(os.environ["RANK"])
    if rank == absent:
        return ("absent", "", 0.0, None)
    return _outcome(lambda: dist.init_process_group(rendezvous_timeout=seconds) and None)
