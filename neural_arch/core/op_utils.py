"""The plumbing every differentiable op shares: the array module of an input, the output Tensor
(``_result``), "does anything need a gradient?" (``_needs``), device checks, a scalar-or-Tensor
operand, undoing broadcasting in a backward (``unbroadcast``), reduction axes, and a scatter-add
that works on NumPy and CuPy.

Names keep their leading underscore: they are the ops' internals, not a public API
(every op module imports them from here).

Example::

    >>> import numpy as np
    >>> unbroadcast(np.ones((4, 3)), (1, 3)).tolist()      # a (1, 3) input broadcast to (4, 3)
    [[4.0, 4.0, 4.0]]
    >>> _norm_axes(-1, 3), _norm_axes(None, 2)
    ((2,), (0, 1))
"""

from __future__ import annotations

import builtins

import numpy as np

from .. import backend as _backend
from . import autograd as _ag
from . import dtypes as _dtypes
from .tensor import Tensor

_SCALARS = (int, float, bool)
_bmax = builtins.max  # the reduction modules define their own sum/max/min ops


def _xp(arr):
    return np if type(arr) is np.ndarray else _backend.get_array_module(arr)


def _as_array(x):
    # Ops on 0-d arrays return NumPy scalars; a Tensor always holds an array.
    return np.asarray(x) if isinstance(x, np.generic) else x


def _result(data, node) -> Tensor:
    """Build an op's output Tensor (fast path: no checks, no copies)."""
    t = object.__new__(Tensor)
    t.data = np.asarray(data) if isinstance(data, np.generic) else data
    t._grad = None
    t._hooks = None
    t._post_hooks = None
    t.grad_fn = node
    t.requires_grad = node is not None
    return t


def scatter_add(xp, target, idx, values) -> None:
    """``target[idx] += values`` with repeated indices accumulating (NumPy's ``add.at``).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.op_utils import scatter_add
        >>> target = np.zeros(3)
        >>> scatter_add(np, target, np.array([0, 0, 2]), np.array([1.0, 1.0, 5.0]))
        >>> target.tolist()
        [2.0, 0.0, 5.0]
    """
    if xp is np:
        if (getattr(idx, "ndim", 0) == 1 and idx.size >= 64 and getattr(values, "ndim", 0) == target.ndim >= 2
                and values.shape[0] == idx.size and idx.dtype.kind in "iu" and idx.min() >= 0):
            _scatter_add_rows(target, idx, values)
            return
        np.add.at(target, idx, values)
        return
    try:
        xp.add.at(target, idx, values)
    except (AttributeError, NotImplementedError, TypeError):  # older CuPy: cupyx.scatter_add
        import cupyx  # noqa: PLC0415  (only reached with CuPy arrays)

        cupyx.scatter_add(target, idx, values)


def _scatter_add_rows(target, idx, values) -> None:
    """``np.add.at(target, idx, values)`` for whole rows (an embedding's gradient): the rows sorted
    by index and each run of equal indices summed with one ``add.reduceat``, then added with one
    fancy-index assignment (every index once). NumPy's ``add.at`` handles one row at a time."""
    order = np.argsort(idx, kind="stable")
    rows = idx[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    target[rows[starts]] += np.add.reduceat(values[order], starts, axis=0)


#: inner-loop length from which NumPy runs a binary ufunc against a broadcast row at the speed of
#: two same-shape arrays (its default buffer size): below it, ``(rows, n) op (n,)`` walks one short
#: row per inner loop and runs about half as fast (docs/benchmarks.md, issue 37)
_LONG_ROW = 8192
#: blocks of ``k`` rows below which :func:`vector_op` keeps the plain broadcast (measured break-even)
_MIN_BLOCKS = 8
#: elements below which :func:`vector_op` always keeps the plain broadcast (callers on a hot path
#: test this first and skip the call)
VECTOR_OP_MIN_SIZE = _LONG_ROW * _MIN_BLOCKS


def vector_op(ufunc, a, v, out) -> None:
    """``ufunc(a, v, out=out)`` for a 2-d NumPy ``a`` (rows, n) and a vector ``v`` (n,) broadcast over
    its rows (a bias add, a layer norm's weight), with the same values, faster for short rows.

    Blocks of ``k`` rows are viewed as one long row against ``v`` repeated ``k`` times (one small
    copy): each element gets exactly the arithmetic of the broadcast form, so results are
    bit-identical. ``a`` and ``out`` must be C-contiguous to be viewed so (``out`` may be ``a``);
    otherwise, on a device array, or for a matrix of fewer than :data:`_MIN_BLOCKS` blocks (the
    copy and the extra calls would cost more than they save), the broadcast form runs.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.op_utils import vector_op
        >>> a = np.ones((4, 3))
        >>> vector_op(np.add, a, np.array([1.0, 2.0, 3.0]), a)
        >>> a[-1].tolist()
        [2.0, 3.0, 4.0]
    """
    rows, n = a.shape if a.ndim == 2 and a.size >= VECTOR_OP_MIN_SIZE else (0, 0)
    k = -(-_LONG_ROW // n) if n else 0
    if (not (1 < k and k * _MIN_BLOCKS <= rows) or type(a) is not np.ndarray or type(out) is not np.ndarray
            or not (a.flags.c_contiguous and out.flags.c_contiguous)):
        ufunc(a, v, out=out)
        return
    main = rows - rows % k
    tiled = np.empty((k, n), dtype=v.dtype)
    tiled[...] = v
    blocks = (main // k, k * n)
    ufunc(a[:main].reshape(blocks), tiled.reshape(k * n), out=out[:main].reshape(blocks))
    if main != rows:
        ufunc(a[main:], v, out=out[main:])


_ONES: dict = {}
_ONES_KEPT = 64  # distinct (length, dtype) pairs kept; a model uses a handful


def ones_vector(n: int, dtype):
    """A read-only NumPy vector of ``n`` ones, shared: the operand of the reductions written as
    BLAS products (``ones @ a`` column sums, ``vecdot(a, ones)`` row sums), made once per length
    and dtype instead of once per call.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.op_utils import ones_vector
        >>> v = ones_vector(3, np.float32)
        >>> v.tolist(), v.flags.writeable, ones_vector(3, np.float32) is v
        ([1.0, 1.0, 1.0], False, True)
    """
    key = (n, dtype)
    v = _ONES.get(key)
    if v is None:
        if len(_ONES) >= _ONES_KEPT:
            _ONES.clear()
        v = np.ones(n, dtype=dtype)
        v.flags.writeable = False
        _ONES[key] = v
    return v


def _same_device(datas, op: str) -> None:
    """Raise a clear error when arrays of one op live on different devices (cheap on CPU)."""
    if all(type(d) is np.ndarray for d in datas):
        return
    first = datas[0]
    for d in datas[1:]:
        _backend.check_same_device(first, d, op)


def _needs(*ts) -> bool:
    if not _ag._grad_mode.enabled:
        return False
    for t in ts:
        if t is not None and t.requires_grad:
            return True
    return False


def _operand(a: Tensor, b):
    """Return (b_data, b_tensor_or_None) for a binary op's second argument."""
    if isinstance(b, Tensor):
        bd = b.data
        if type(bd) is not type(a.data):
            _backend.check_same_device(a.data, bd, "binary op")
        return bd, (b if b.requires_grad else None)
    if isinstance(b, _SCALARS):
        return b, None  # python scalars never upcast (NEP 50)
    if isinstance(b, np.ndarray) or isinstance(b, np.generic):
        if type(a.data) is not np.ndarray:
            _backend.check_same_device(a.data, b, "binary op")
        return b, None
    if _backend.is_device_array(b):  # CuPy or a registered device type
        _backend.check_same_device(a.data, b, "binary op")
        return b, None
    # lists and the like: adopt the tensor's dtype so they behave like python scalars
    xp = _xp(a.data)
    dt = a.data.dtype if a.data.dtype.kind in "fc" else None
    return xp.asarray(b, dtype=dt), None


# torch's type categories: a binary op's result takes the highest category among its operands
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2, "c": 3}      # ("V": ml_dtypes' bfloat16 and friends)


def promote_operands(ad, bd, true_divide: bool = False):
    """``(ad, bd, result_dtype)``: a binary arithmetic op's operands cast the way torch promotes,
    where NumPy's rules differ, and the dtype to cast its result to (None: as computed).

    NumPy widens where torch does not: an integer tensor with a float32 tensor, or with a Python
    float, or divided by an integer, gives float64 in NumPy and the float dtype (float32, the
    default) in torch; a bfloat16 tensor times a Python float gives float32 in NumPy (ml_dtypes)
    and bfloat16 in torch; a 0-d tensor of a higher precision than a same-kind tensor it meets
    widens the result in NumPy, not in torch. Left alone, one integer position tensor silently
    turned a float32 model's activations into float64. The cases NumPy gets right (the common
    ones: equal dtypes, a float tensor with a Python number) cost one comparison.

    Example:
        >>> import numpy as np
        >>> a, b, out = promote_operands(np.arange(3), np.ones(3, np.float32))
        >>> a.dtype, b.dtype, out
        (dtype('float32'), dtype('float32'), None)
    """
    if type(bd) in _SCALARS or not hasattr(bd, "dtype"):
        kind = ad.dtype.kind
        if isinstance(bd, float):
            if kind in "biu":
                return ad.astype(_dtypes.default_float_dtype), bd, None
            if kind == "V":                      # bfloat16: computed in float32, stored as bfloat16 (torch's opmath)
                return ad, bd, ad.dtype
        elif true_divide and kind in "biu":      # integer / integer: the default float, not float64
            return ad.astype(_dtypes.default_float_dtype), bd, None
        return ad, bd, None
    da, db = ad.dtype, bd.dtype
    if da == db:
        if true_divide and da.kind in "biu":
            f = _dtypes.default_float_dtype
            return ad.astype(f), bd.astype(f), None
        return ad, bd, None
    ca, cb = _CATEGORY.get(da.kind, 2), _CATEGORY.get(db.kind, 2)
    if ca != cb:                                 # the lower kind takes the higher operand's dtype
        if ca < cb:
            ad = ad.astype(db)
        else:
            bd = bd.astype(da)
    elif (ad.ndim == 0) != (bd.ndim == 0):       # same kind: a 0-d tensor does not widen a dimensioned one
        if ad.ndim == 0:
            ad = ad.astype(db)
        else:
            bd = bd.astype(da)
    if true_divide and ad.dtype.kind in "biu" and bd.dtype.kind in "biu":
        f = _dtypes.default_float_dtype
        return ad.astype(f), bd.astype(f), None
    return ad, bd, None


def arith_operands(a: Tensor, b, true_divide: bool = False):
    """``(a_data, b_data, b_tensor_or_None, result_dtype)`` for an arithmetic op: :func:`_operand`
    and :func:`promote_operands` in one call, with the common cases (equal dtypes, a float tensor
    with a Python number) decided by a comparison or two.

    Example:
        >>> import neural_arch as na
        >>> ad, bd, bt, od = arith_operands(na.tensor([1, 2]), 0.5)
        >>> ad.dtype, bd, bt, od
        (dtype('float32'), 0.5, None, None)
    """
    ad = a.data
    if isinstance(b, Tensor):
        bd = b.data
        if type(bd) is not type(ad):
            _backend.check_same_device(ad, bd, "binary op")
        bt = b if b.requires_grad else None
        if bd.dtype is ad.dtype and not true_divide:
            return ad, bd, bt, None
    elif type(b) is float or type(b) is int:
        if ad.dtype.kind in "fc" or (type(b) is int and not true_divide):
            return ad, b, None, None
        bd, bt = b, None
    else:
        bd, bt = _operand(a, b)
    ad, bd, od = promote_operands(ad, bd, true_divide)
    return ad, bd, bt, od


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (undo NumPy broadcasting). No work when shapes already match.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.op_utils import unbroadcast
        >>> unbroadcast(np.ones((2, 3)), (3,)).tolist()
        [2.0, 2.0, 2.0]
    """
    if g.shape == shape:
        return g
    nd = g.ndim - len(shape)
    if nd > 0:
        g = g.sum(axis=tuple(range(nd)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    if g.shape != shape:  # e.g. 0-d target
        g = g.reshape(shape)
    return g


def _norm_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (list, tuple)):
        return tuple(sorted(a % ndim if ndim else 0 for a in axis))
    return ((axis % ndim) if ndim else 0,)


def _expand_reduced(g, in_shape, axis, keepdims):
    """Reshape a reduced gradient so it broadcasts against the input shape."""
    if keepdims or axis is None:
        return g  # keepdims: already aligned; axis=None: a 0-d gradient broadcasts as is
    shape = list(in_shape)
    for a in _norm_axes(axis, len(in_shape)):
        shape[a] = 1
    return g.reshape(shape)
