"""Pure helpers of the NCCL backend: tables, unique-id encoding, device choice, polling, watchdog.

Nothing here imports CuPy at module level, so all of it is unit-tested without a GPU
(``tests/gpu/test_nccl_nogpu.py``). :mod:`neural_arch.distributed.comm.nccl.backend` re-exports it.

Example::

    >>> from neural_arch.distributed.comm.nccl.support import version_tuple
    >>> version_tuple(21805)
    (2, 18, 5)
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np

from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.errors import DistributedError, RendezvousError

_log = logging.getLogger(__name__)

UID_BYTES = 128                 # sizeof(ncclUniqueId)
UID_MAGIC = b"NA-NCCL-UID1"     # lets a reader tell a unique id from whatever else sits under the key
UID_STORE_KEY = "nccl/uid"
AVG_MIN_VERSION = (2, 10, 0)    # ncclAvg appeared in NCCL 2.10
SPLIT_MIN_VERSION = (2, 18, 0)  # ncclCommSplit appeared in NCCL 2.18
GPU_HINT = ("pip install 'neural_arch[gpu]' (cupy-cuda12x) and pip install 'nvidia-nccl-cu12>=2.18' "
            "on a machine with an NVIDIA GPU")

#: numpy dtype name -> NCCL datatype constant name; bool travels as uint8 (same itemsize)
DTYPE_TO_NCCL = {
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
    "bool": "NCCL_UINT8",
}
#: ReduceOp -> NCCL reduction constant name (AVG falls back to SUM + divide on old NCCL)
OP_TO_NCCL = {
    ReduceOp.SUM: "NCCL_SUM", ReduceOp.PRODUCT: "NCCL_PROD", ReduceOp.MAX: "NCCL_MAX",
    ReduceOp.MIN: "NCCL_MIN", ReduceOp.AVG: "NCCL_AVG",
}


# -- pure helpers (unit-tested without a GPU) ------------------------------------------------
def encode_unique_id(uid) -> bytes:
    """NCCL unique id (CuPy gives a tuple of 128 C ``char`` ints, or bytes) -> store bytes.

    >>> decode_unique_id(encode_unique_id(tuple(range(-64, 64)))) == tuple(range(-64, 64))
    True
    """
    if isinstance(uid, (bytes, bytearray)):
        raw = bytes(uid)
    else:
        values = [int(v) for v in uid]
        if any(not -128 <= v <= 255 for v in values):
            raise ValueError("an NCCL unique id holds byte values (-128..255); got something else")
        raw = bytes(v & 0xFF for v in values)   # C char is signed: -1 <-> 0xFF
    if len(raw) != UID_BYTES:
        raise ValueError(f"an NCCL unique id has {UID_BYTES} bytes, got {len(raw)}")
    return UID_MAGIC + raw


def decode_unique_id(data: bytes) -> tuple:
    """Store bytes -> the tuple of signed ints ``NcclCommunicator`` takes.

    Example::

        >>> uid = tuple(range(-64, 64))                   # what nccl.get_unique_id() gives
        >>> decode_unique_id(encode_unique_id(uid)) == uid
        True
    """
    data = bytes(data)
    if not data.startswith(UID_MAGIC) or len(data) != len(UID_MAGIC) + UID_BYTES:
        raise RendezvousError(
            f"the value under {UID_STORE_KEY!r} in the store is not an NCCL unique id "
            f"({len(data)} bytes); is another job or an old run using the same store? "
            "Use a fresh MASTER_PORT or a PrefixStore per job")
    return tuple(int(v) for v in np.frombuffer(data[len(UID_MAGIC):], dtype=np.int8))


def version_tuple(code: int) -> tuple:
    """``nccl.get_version()`` -> (major, minor, patch); NCCL changed the encoding at 2.9.

    Example::

        >>> version_tuple(21803), version_tuple(2708)
        ((2, 18, 3), (2, 7, 8))
    """
    code = int(code)
    if code >= 10000:                      # 2.9 and later: major*10000 + minor*100 + patch
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def nccl_dtype(dtype, nccl) -> int:
    """The NCCL datatype code of ``dtype`` (bool -> uint8); a clear TypeError otherwise.

    Example::

        >>> from types import SimpleNamespace
        >>> nccl = SimpleNamespace(NCCL_FLOAT32=7, NCCL_UINT8=1)     # stands for cupy.cuda.nccl
        >>> nccl_dtype("float32", nccl), nccl_dtype("bool", nccl)
        (7, 1)
    """
    name = str(np.dtype(dtype))
    if name not in DTYPE_TO_NCCL:
        raise TypeError(f"dtype {name} cannot travel over NCCL; use one of {sorted(DTYPE_TO_NCCL)}")
    return int(getattr(nccl, DTYPE_TO_NCCL[name]))


def nccl_reduce_op(op, nccl, version: tuple) -> tuple:
    """``(nccl op code, divide_after)``: AVG is native from NCCL 2.10, else SUM then divide.

    Example::

        >>> from types import SimpleNamespace
        >>> nccl = SimpleNamespace(NCCL_SUM=0, NCCL_AVG=4)            # stands for cupy.cuda.nccl
        >>> nccl_reduce_op("avg", nccl, (2, 18, 3)), nccl_reduce_op("avg", nccl, (2, 8, 0))
        ((4, False), (0, True))
    """
    op = ReduceOp.coerce(op)
    if op is ReduceOp.AVG:
        if tuple(version) >= AVG_MIN_VERSION and hasattr(nccl, "NCCL_AVG"):
            return int(nccl.NCCL_AVG), False
        return int(nccl.NCCL_SUM), True
    return int(getattr(nccl, OP_TO_NCCL[op])), False


def select_device(local_rank: int, device_count: int, device=None) -> int:
    """The GPU index for this rank: ``device`` ("cuda:N", N or None) or ``local_rank % count``.

    Example::

        >>> select_device(local_rank=3, device_count=2), select_device(0, 2, device="cuda:1")
        (1, 1)
    """
    if device_count < 1:
        raise DistributedError(f"the 'nccl' backend needs a GPU but CUDA sees none. {GPU_HINT}")
    if device is not None and not isinstance(device, (str, int, np.integer)):
        if getattr(device, "type", "cuda") != "cuda":        # neural_arch.backend.Device, torch-likes
            raise ValueError(f"device={device!r}: the 'nccl' backend runs on 'cuda' devices only")
        device = getattr(device, "index", None)
    if device is None:
        return int(local_rank) % device_count
    if isinstance(device, str):
        text = device.strip().lower()
        if text in ("cuda", "gpu"):
            return int(local_rank) % device_count
        if not text.startswith("cuda:") or not text[5:].isdigit():
            raise ValueError(f"device={device!r}: the 'nccl' backend needs 'cuda', 'cuda:N' or an int")
        device = int(text[5:])
    index = int(device)
    if not 0 <= index < device_count:
        raise ValueError(f"device={device!r} is out of range: this machine has {device_count} GPU(s)")
    return index


def local_rank_from_env(rank: int) -> int:
    """``LOCAL_RANK`` (set by our launcher, torchrun, ...) or, failing that, the global rank.

    Example::

        device_id = select_device(local_rank_from_env(rank), cupy.cuda.runtime.getDeviceCount())
    """
    for var in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return int(rank)


def poll_until(done: Callable[[], bool], check_error: Callable[[], None], deadline: float,
               sleep: Callable[[float], None] = time.sleep, spin_s: float = 50e-6,
               max_sleep_s: float = 1e-3) -> bool:
    """Poll ``done()`` until True (-> True) or ``deadline`` (-> False); ``check_error`` may raise.

    A short spin first (small collectives finish in microseconds), then sleeps doubling up to
    ``max_sleep_s``: a long collective costs about one CUDA query per millisecond.

    Example::

        >>> import time
        >>> poll_until(lambda: True, lambda: None, deadline=time.monotonic() + 1.0)
        True
    """
    spin_end = time.monotonic() + spin_s
    delay = 10e-6
    while True:
        if done():
            return True
        check_error()
        now = time.monotonic()
        if now >= deadline:
            return bool(done())
        if now < spin_end:
            sleep(0)                  # yield the GIL to other Python threads, but do not nap
            continue
        sleep(min(delay, max(deadline - now, 0.0)))
        delay = min(delay * 2, max_sleep_s)


def _import_nccl():
    """``(cupy, cupy.cuda.nccl)`` or ``(None, None)``; never raises, never warns."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # CuPy warns at import when libnccl is missing
            import cupy
            from cupy.cuda import nccl
        return cupy, nccl
    except Exception:  # noqa: BLE001 - ImportError, or a broken CUDA install raising anything
        return None, None


def missing_requirement() -> str | None:
    """What keeps the NCCL backend from running here (a sentence), or None when nothing does.

    Example::

        reason = missing_requirement()
        backend = "nccl" if reason is None else "gloo"     # and log the reason
    """
    cp, nccl = _import_nccl()
    if cp is None:
        return f"CuPy is not installed (or fails to import): {GPU_HINT}"
    if not getattr(nccl, "available", False) or not hasattr(nccl, "NcclCommunicator"):
        return ("CuPy is installed but cannot load the NCCL library (libnccl.so.2): "
                "pip install 'nvidia-nccl-cu12>=2.18'")
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver raises CUDARuntimeError
        return f"CUDA reports no usable GPU ({type(exc).__name__}: {exc})"
    if count < 1:
        return "CUDA sees no GPU (check CUDA_VISIBLE_DEVICES and nvidia-smi)"
    return None


class _Watchdog:
    """Calls ``abort()`` when an armed deadline passes; makes host-blocking NCCL calls return."""

    def __init__(self, abort: Callable[[], None], name: str):
        self._abort, self._name = abort, name
        self._cv = threading.Condition()
        self._deadline: float | None = None
        self._fired = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float) -> None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name=self._name)
                self._thread.start()
            self._deadline, self._fired = deadline, False
            self._cv.notify()

    def disarm(self) -> bool:
        """Stop watching; True when the deadline fired (the communicator was aborted)."""
        with self._cv:
            self._deadline = None
            return self._fired

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and (self._deadline is None or self._deadline > time.monotonic()):
                    wait = None if self._deadline is None else self._deadline - time.monotonic()
                    self._cv.wait(wait)
                if self._stopped:
                    return
                self._deadline, self._fired = None, True
            try:
                self._abort()   # outside the lock: abort may take a while
            except Exception as exc:  # noqa: BLE001 - the caller reports the timeout
                _log.debug("watchdog abort failed: %s", exc)
