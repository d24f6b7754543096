"""What the comm layer moves and how it folds it: the supported dtypes and the in-place reductions.

Every backend moves :data:`SUPPORTED_DTYPES` (and ml_dtypes' bfloat16, recognised by name) and
reduces with :func:`reduce_into` / :func:`finish_average`; ``_xp``/``_is_array`` are
:mod:`neural_arch.backend`'s array-module helpers under the names the comm layer uses.

Example::

    >>> import numpy as np
    >>> a = np.array([1.0, 4.0]); reduce_into(a, np.array([3.0, 2.0]), ReduceOp.MAX); a
    array([3., 4.])
    >>> is_supported_dtype(np.dtype("float32")), is_supported_dtype(np.dtype("complex64"))
    (True, False)
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _array_backend
from neural_arch.distributed.comm.work import ReduceOp

__all__ = ["BFLOAT16", "FLOAT_DTYPE_KINDS", "REDUCE_UFUNCS", "SUPPORTED_DTYPES", "finish_average",
           "is_bfloat16", "is_supported_dtype", "reduce_into"]

# Dtypes every backend must move. bool travels as uint8 (same itemsize).
SUPPORTED_DTYPES = frozenset(
    np.dtype(t) for t in ("float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")
)
FLOAT_DTYPE_KINDS = ("f",)
#: The name of ml_dtypes' bfloat16, which is supported too and recognised by that name (its dtype
#: kind is ``"V"``) because importing ml_dtypes here would slow down every ``import neural_arch``,
#: and a bfloat16 array means it is loaded already.
BFLOAT16 = "bfloat16"
# The members as module constants: ``ReduceOp.AVG`` is an Enum class-attribute lookup that costs
# as much as hashing a member as a dict key on CPython 3.11, which added up to a
# third of a small collective's Python overhead.
_SUM, _AVG, _MAX, _MIN, _PRODUCT = ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT


#: reduce op -> the NumPy ufunc that folds one host buffer into another in place
#: (``ufunc(dst, src, out=dst)``); AVG accumulates as a sum, the caller divides at the end
#: (:func:`finish_average`). The gloo plans, gloo's shared-memory collectives and MPI's own
#: all_reduce strategies all reduce with it.
REDUCE_UFUNCS = {_SUM: np.add, _AVG: np.add, _MAX: np.maximum, _MIN: np.minimum, _PRODUCT: np.multiply}


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (without importing ml_dtypes).

    Example::

        >>> import numpy as np
        >>> is_bfloat16(np.dtype("float16"))
        False
    """
    return dtype.kind == "V" and dtype.name == BFLOAT16


def is_supported_dtype(dtype) -> bool:
    """Whether every backend can move arrays of ``dtype`` (:data:`SUPPORTED_DTYPES` or bfloat16).

    Example::

        >>> import numpy as np
        >>> is_supported_dtype(np.dtype("int64")), is_supported_dtype(np.dtype("complex64"))
        (True, False)
    """
    return dtype in SUPPORTED_DTYPES or is_bfloat16(dtype)


def reduce_into(dst, src, op: ReduceOp) -> None:
    """``dst = dst (op) src`` elementwise, in place. AVG accumulates as SUM (divide at the end).

    Example::

        >>> import numpy as np
        >>> acc = np.array([1.0, 4.0])
        >>> reduce_into(acc, np.array([3.0, 2.0]), ReduceOp.MIN)
        >>> acc
        array([1., 2.])
    """
    if op in (_SUM, _AVG):
        dst += src
    elif op is _MAX:
        np.maximum(dst, src, out=dst) if isinstance(dst, np.ndarray) else _xp(dst).maximum(dst, src, out=dst)
    elif op is _MIN:
        np.minimum(dst, src, out=dst) if isinstance(dst, np.ndarray) else _xp(dst).minimum(dst, src, out=dst)
    elif op is _PRODUCT:
        dst *= src
    else:  # pragma: no cover - ReduceOp.coerce rejects everything else
        raise ValueError(f"unsupported reduce op {op}")


def finish_average(array, size: int) -> None:
    """Turn an AVG that was accumulated as a SUM into the mean (float dtypes only).

    Example::

        >>> import numpy as np
        >>> acc = np.array([2.0, 4.0])
        >>> reduce_into(acc, np.array([4.0, 8.0]), ReduceOp.AVG)
        >>> finish_average(acc, size=2)
        >>> acc
        array([3., 6.])
    """
    array /= size


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """``str(dtype)``, cached: numpy's __str__ is slow enough to show on every small collective."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


# The one owner of "which array library" and "is this an array": neural_arch.backend (CuPy and
# any registered device type, e.g. the strict-device tests' fake GPU). Kept under these names for
# the comm layer's many call sites.
_xp = _array_backend.get_array_module
_is_array = _array_backend.is_array
