"""Fixed-length fingerprints of collectives, compared across ranks in debug mode.

``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL`` makes every collective first all-gather one of
these per rank. The length is fixed so that the check itself can never hang on the very
shape mismatch it is looking for.

Example::

    fp = fingerprint(OpInfo("all_reduce", 3, shape=(4,), dtype="float32"))
    describe_fingerprint(fp)        # 'all_reduce shape (4,) float32'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # work.py reads the check word from here: a runtime import back would be a cycle
    from neural_arch.distributed.comm.work import OpInfo

FINGERPRINT_LEN = 16
OP_CODES = {name: i for i, name in enumerate(
    ["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
     "all_to_all", "barrier", "broadcast_object", "all_gather_object", "new_group", "all_to_allv"])}
# ops whose dim 0 may differ between ranks (uneven splits): the fingerprint compares the other dims only
_ANY_ROWS = frozenset({"all_to_allv"})
_DTYPES = ("bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8", "bfloat16")

_DTYPE_CODES = {name: i + 1 for i, name in enumerate(_DTYPES)}
_OP_NAMES = {code: name for name, code in OP_CODES.items()}
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}
_REDUCE_CODES = {"sum": 1, "avg": 2, "max": 3, "min": 4, "product": 5}
_REDUCE_NAMES = {v: k for k, v in _REDUCE_CODES.items()}
_MAX_DIMS = FINGERPRINT_LEN - 6

# -- the per-frame check word (always on, unlike the DETAIL fingerprint) ---------------------------
# Every transport frame of an op carries ``wire_word(...)``: 8 bits op kind | 5 bits dtype |
# 3 bits reduce op | 48 bits sequence number. Ranks that call different collectives, or the same
# one with another dtype, at one sequence number see different words on the first frame -- an error
# on the receiving side at no extra round trip (the byte count travels in the frame anyway).
# Point-to-point ops use one shared kind and no sequence number: a send and its recv are numbered
# independently on each side (their own header checks shape and dtype).
_P2P_CODE = 250
_DEBUG_CODE = 251
_SEQ_MASK = (1 << 48) - 1
_P2P_NAMES = frozenset({"send", "recv"})
_WIRE_CACHE: dict = {}


def wire_word(name: str, seq: int, dtype, reduce_op) -> int:
    """The frame check word of an op (see the comment above). ``dtype``/``reduce_op`` are names or None.

    Example::

        >>> word = wire_word("all_reduce", 3, "float32", "sum")
        >>> word == wire_word("all_reduce", 3, "float64", "sum")      # another dtype: another word
        False
    """
    try:
        base, mask = _WIRE_CACHE[name, dtype, reduce_op]   # the hot path: one dict lookup
    except KeyError:
        if name in _P2P_NAMES:
            base, mask = _P2P_CODE << 56, 0
        else:
            code = OP_CODES.get(name, _DEBUG_CODE if name.startswith("debug check") else 249)
            base = ((code << 56) | (_DTYPE_CODES.get(dtype or "", 0) << 51)
                    | (_REDUCE_CODES.get(reduce_op or "", 0) << 48))
            mask = _SEQ_MASK
        _WIRE_CACHE[name, dtype, reduce_op] = (base, mask)
    return base | (seq & mask)


def describe_wire(word: int, nbytes: int | None = None) -> str:
    """``'all_reduce #3 float32 op sum (16 bytes)'`` for a check word (error messages).

    Example::

        >>> describe_wire(wire_word("all_reduce", 3, "float32", "sum"), nbytes=16)
        'all_reduce #3 float32 op sum (16 bytes)'
    """
    if word == 0:
        return "an unchecked message" + (f" ({nbytes} bytes)" if nbytes is not None else "")
    code = word >> 56
    if code == _P2P_CODE:
        text = "a point-to-point message"
    else:
        name = _OP_NAMES.get(code, "debug check" if code == _DEBUG_CODE else "an internal op")
        text = f"{name} #{word & _SEQ_MASK}"
        dtype = _DTYPE_NAMES.get((word >> 51) & 0x1F)
        if dtype:
            text += f" {dtype}"
        red = _REDUCE_NAMES.get((word >> 48) & 0x7)
        if red:
            text += f" op {red}"
    return text + (f" ({nbytes} bytes)" if nbytes is not None else "")


def fingerprint(info: OpInfo) -> np.ndarray:
    """The fixed-length (``FINGERPRINT_LEN``) int64 summary of ``info`` that debug mode all-gathers:
    op, sequence number, root, dtype, reduce op and shape.

    Example::

        >>> from neural_arch.distributed.comm.work import OpInfo
        >>> fingerprint(OpInfo("all_reduce", 3, shape=(4,), dtype="float32")).shape
        (16,)
    """
    fp = np.full(FINGERPRINT_LEN, -1, dtype=np.int64)
    fp[0] = OP_CODES.get(info.name, 99)
    fp[1] = info.seq
    fp[2] = -1 if info.root is None else info.root
    fp[3] = _DTYPE_CODES.get(info.dtype or "", 0)
    fp[4] = _REDUCE_CODES.get(info.reduce_op or "", 0)
    shape = info.shape or ()
    if info.name in _ANY_ROWS and shape:
        shape = (-1,) + tuple(shape[1:])      # printed as -1: any number of rows
    fp[5] = len(shape) if info.shape is not None else -1
    for i, d in enumerate(shape[:_MAX_DIMS]):
        fp[6 + i] = d
    return fp


def describe_fingerprint(fp: np.ndarray) -> str:
    """A fingerprint in words (the mismatch error quotes one per rank).

    Example::

        >>> from neural_arch.distributed.comm.work import OpInfo
        >>> info = OpInfo("all_reduce", 3, shape=(4,), dtype="float32", reduce_op="sum")
        >>> describe_fingerprint(fingerprint(info))
        'all_reduce shape (4,) float32 op sum'
    """
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
