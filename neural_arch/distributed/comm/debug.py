"""Fixed-length fingerprints of collectives, compared across ranks in debug mode.

``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL`` makes every collective first all-gather one of
these per rank. The length is fixed so that the check itself can never hang on the very
shape mismatch it is looking for.

Example::

    fp = fingerprint(OpInfo("all_reduce", 3, shape=(4,), dtype="float32"))
    describe_fingerprint(fp)        # 'all_reduce shape (4,) float32'
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.comm.work import OpInfo

FINGERPRINT_LEN = 16
OP_CODES = {name: i for i, name in enumerate(
    ["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
     "all_to_all", "barrier", "broadcast_object", "all_gather_object"])}
_DTYPES = ("bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8")

_DTYPE_CODES = {name: i + 1 for i, name in enumerate(_DTYPES)}
_OP_NAMES = {code: name for name, code in OP_CODES.items()}
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}
_REDUCE_CODES = {"sum": 1, "avg": 2, "max": 3, "min": 4, "product": 5}
_REDUCE_NAMES = {v: k for k, v in _REDUCE_CODES.items()}
_MAX_DIMS = FINGERPRINT_LEN - 6


def fingerprint(info: OpInfo) -> np.ndarray:
    fp = np.full(FINGERPRINT_LEN, -1, dtype=np.int64)
    fp[0] = OP_CODES.get(info.name, 99)
    fp[1] = info.seq
    fp[2] = -1 if info.root is None else info.root
    fp[3] = _DTYPE_CODES.get(info.dtype or "", 0)
    fp[4] = _REDUCE_CODES.get(info.reduce_op or "", 0)
    shape = info.shape or ()
    fp[5] = len(shape) if info.shape is not None else -1
    for i, d in enumerate(shape[:_MAX_DIMS]):
        fp[6 + i] = d
    return fp


def describe_fingerprint(fp: np.ndarray) -> str:
    name = _OP_NAMES.get(int(fp[0]), "?")
    ndim = int(fp[5])
    shape = tuple(int(d) for d in fp[6:6 + min(ndim, _MAX_DIMS)]) if ndim >= 0 else None
    parts = [f"{name}"]
    if shape is not None:
        parts.append(f"shape {shape}")
    if fp[3]:
        parts.append(_DTYPE_NAMES.get(int(fp[3]), "?"))
    if fp[2] >= 0:
        parts.append(f"root {int(fp[2])}")
    if fp[4]:
        parts.append(f"op {_REDUCE_NAMES.get(int(fp[4]), '?')}")
    return " ".join(parts)
