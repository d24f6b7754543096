"""Dtype objects with torch's names (``neural_arch.float32``, ``neural_arch.long``, ...).

They are plain ``numpy.dtype`` objects, so they work wherever NumPy (or CuPy) takes a dtype and
compare equal to ``tensor.dtype``. ``bfloat16`` comes from the ``ml_dtypes`` package (NumPy has no
native bfloat16); it is imported on first use so ``import neural_arch`` stays fast. CuPy has no
bfloat16, so bfloat16 tensors live on the CPU only.

Example::

    >>> import neural_arch as na
    >>> na.zeros(2, dtype=na.long).dtype == na.int64
    True
    >>> na.float is na.float32, na.double is na.float64, na.half is na.float16
    (True, True, True)
    >>> na.tensor([1.0]).to(na.bfloat16).dtype
    dtype(bfloat16)
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "as_dtype",
    "bool",
    "cdouble",
    "cfloat",
    "complex64",
    "complex128",
    "default_float_dtype",
    "double",
    "float",
    "float16",
    "float32",
    "float64",
    "half",
    "int",
    "int8",
    "int16",
    "int32",
    "int64",
    "is_floating_dtype",
    "long",
    "short",
    "uint8",
]

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
float16 = np.dtype(np.float16)
int64 = np.dtype(np.int64)
int32 = np.dtype(np.int32)
int16 = np.dtype(np.int16)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
bool = np.dtype(np.bool_)  # torch.bool (shadows the builtin in this module only)
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)

# torch's aliases
long = int64
int = int32  # torch.int is int32
short = int16
float = float32  # torch.float is float32
double = float64
half = float16
cfloat = complex64
cdouble = complex128

# torch's default floating dtype (what Python floats, randn and zeros give).
default_float_dtype = float32

_ML_DTYPES_HINT = "bfloat16 on NumPy needs the ml_dtypes package: pip install ml-dtypes"


def _bfloat16():
    try:
        import ml_dtypes  # lazy: only bfloat16 users pay for the import
    except ImportError as exc:  # pragma: no cover - ml-dtypes is a dependency
        raise ImportError(_ML_DTYPES_HINT) from exc
    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(name: str):
    if name == "bfloat16":
        value = _bfloat16()
        globals()["bfloat16"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def as_dtype(dtype) -> np.dtype:
    """Normalise a dtype-like (``na.float32``, ``np.float32``, ``"bfloat16"``, ``float``) to ``np.dtype``.

    Python ``float``/``int``/``bool`` map to float64/int64/bool, as in both NumPy and torch.

    >>> as_dtype("bfloat16"), as_dtype("float64"), as_dtype(np.int32)
    (dtype(bfloat16), dtype('float64'), dtype('int32'))
    """
    if type(dtype) is np.dtype:
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in ("bfloat16", "bf16"):
        return _bfloat16()
    try:
        return np.dtype(dtype)
    except TypeError:
        # torch.float32 and friends: map by name so a stray torch dtype gives a useful error.
        name = str(dtype).rsplit(".", 1)[-1]
        if name == "bfloat16":
            return _bfloat16()
        try:
            return np.dtype(name)
        except TypeError:
            raise TypeError(
                f"{dtype!r} is not a dtype; use neural_arch.float32 / int64 / bool / bfloat16 ... "
                f"or a NumPy dtype"
            ) from None


def is_floating_dtype(dtype) -> bool:
    """True for float16/32/64, bfloat16 and complex dtypes: the ones that may carry gradients.

    (bfloat16's NumPy ``kind`` is ``'V'``, so ``dtype.kind in 'fc'`` alone would miss it.)

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.dtypes import is_floating_dtype
        >>> is_floating_dtype(np.float32), is_floating_dtype(np.int64)
        (True, False)
    """
    dt = dtype if type(dtype) is np.dtype else np.dtype(dtype)
    return dt.kind in "fc" or dt.name == "bfloat16"
