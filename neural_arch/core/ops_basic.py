"""Differentiable array ops: arithmetic, matmul, reductions (shape ops live in ``ops_shape``).

Each op computes with its inputs' array module (NumPy or CuPy: the array methods and ``xp``
found from the data), and records a backward closure only when grad mode is on and an input
requires grad. Gradients are raw arrays inside the engine; broadcasting is undone only when
shapes differ.

Example::

    >>> from neural_arch.core.tensor import Tensor
    >>> a = Tensor([[1.0], [2.0]], requires_grad=True)
    >>> b = Tensor([10.0, 20.0, 30.0], requires_grad=True)
    >>> (a * b).sum().backward()          # broadcasting: grads summed back to input shapes
    >>> a.grad.tolist(), b.grad.tolist()
    ([[60.0], [60.0]], [3.0, 3.0, 3.0])
"""

from __future__ import annotations

import builtins

import numpy as np

from .. import backend as _backend
from . import autograd as _ag
from .autograd import Node
from .tensor import Tensor

_SCALARS = (int, float, bool)
_bmax = builtins.max  # this module defines its own sum/max/min ops


# ============================================================================ helpers
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
    """``target[idx] += values`` with repeated indices accumulating (NumPy's ``add.at``)."""
    if xp is np:
        np.add.at(target, idx, values)
        return
    try:
        xp.add.at(target, idx, values)
    except (AttributeError, NotImplementedError, TypeError):  # older CuPy: cupyx.scatter_add
        import cupyx  # noqa: PLC0415  (only reached with CuPy arrays)

        cupyx.scatter_add(target, idx, values)


def _same_device(datas, op: str) -> None:
    """Raise a clear error when arrays of one op live on different devices (cheap on CPU)."""
    if all(type(d) is np.ndarray for d in datas):
        return
    first = datas[0]
    for d in datas[1:]:
        _backend.check_same_device(first, d, op)


def _needs(*ts) -> bool:
    if not _ag._grad_enabled:
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
    if hasattr(b, "__cuda_array_interface__"):
        _backend.check_same_device(a.data, b, "binary op")
        return b, None
    # lists and the like: adopt the tensor's dtype so they behave like python scalars
    xp = _xp(a.data)
    dt = a.data.dtype if a.data.dtype.kind in "fc" else None
    return xp.asarray(b, dtype=dt), None


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (undo NumPy broadcasting). No work when shapes already match."""
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


# ============================================================================ arithmetic
def add(a: Tensor, b) -> Tensor:
    bd, bt = _operand(a, b)
    ad = a.data
    out = ad + bd
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        return (unbroadcast(g, ash) if ra else None, unbroadcast(g, bsh) if rb else None)

    return _result(out, Node(fn, (a if ra else None, bt), "Add", fresh=False))


def sub(a: Tensor, b) -> Tensor:
    bd, bt = _operand(a, b)
    ad = a.data
    out = ad - bd
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        return (unbroadcast(g, ash) if ra else None, unbroadcast(-g, bsh) if rb else None)

    return _result(out, Node(fn, (a if ra else None, bt), "Sub", fresh=False))


def rsub(a: Tensor, b) -> Tensor:
    bd, bt = _operand(a, b)
    ad = a.data
    out = bd - ad
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        return (unbroadcast(-g, ash) if ra else None, unbroadcast(g, bsh) if rb else None)

    return _result(out, Node(fn, (a if ra else None, bt), "RSub", fresh=False))


def mul(a: Tensor, b) -> Tensor:
    bd, bt = _operand(a, b)
    ad = a.data
    out = ad * bd
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        return (
            unbroadcast(g * bd, ash) if ra else None,
            unbroadcast(g * ad, bsh) if rb else None,
        )

    return _result(out, Node(fn, (a if ra else None, bt), "Mul"))


def div(a: Tensor, b) -> Tensor:
    bd, bt = _operand(a, b)
    ad = a.data
    out = ad / bd
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        ga = g / bd
        return (
            unbroadcast(ga, ash) if ra else None,
            unbroadcast(-ga * out, bsh) if rb else None,  # d(a/b)/db = -(a/b)/b
        )

    return _result(out, Node(fn, (a if ra else None, bt), "Div"))


def rdiv(a: Tensor, b) -> Tensor:
    """``b / a`` for a non-Tensor (or Tensor) ``b``."""
    bd, bt = _operand(a, b)
    ad = a.data
    out = bd / ad
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        gb = g / ad
        return (
            unbroadcast(-gb * out, ash) if ra else None,
            unbroadcast(gb, bsh) if rb else None,
        )

    return _result(out, Node(fn, (a if ra else None, bt), "RDiv"))


def pow(a: Tensor, b) -> Tensor:  # noqa: A001  (mirrors the operator name)
    bd, bt = _operand(a, b)
    ad = a.data
    out = ad**bd
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        ga = gb = None
        if ra:
            if isinstance(bd, _SCALARS) and bd == 2:
                ga = g * (2 * ad)  # the common square: skip the general power
            else:
                ga = unbroadcast(g * (bd * ad ** (bd - 1)), ash)
        if rb:
            xp = _xp(out)
            gb = unbroadcast(g * out * xp.log(xp.where(ad > 0, ad, 1)), bsh)
        return ga, gb

    return _result(out, Node(fn, (a if ra else None, bt), "Pow"))


def rpow(a: Tensor, b) -> Tensor:
    """``b ** a``."""
    bd, bt = _operand(a, b)
    ad = a.data
    out = bd**ad
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        xp = _xp(out)
        ga = unbroadcast(g * out * xp.log(bd), ash) if ra else None
        gb = unbroadcast(g * (ad * bd ** (ad - 1)), bsh) if rb else None
        return ga, gb

    return _result(out, Node(fn, (a if ra else None, bt), "RPow"))


def neg(a: Tensor) -> Tensor:
    out = -a.data
    if not _needs(a):
        return _result(out, None)
    return _result(out, Node(lambda g: (-g,), (a,), "Neg"))


def _compare(op):
    def cmp(a: Tensor, b) -> Tensor:
        if b is None or isinstance(b, str):
            return NotImplemented  # `t == None` is False (identity), like torch
        bd, _ = _operand(a, b)
        return _result(op(a.data, bd), None)

    return cmp


def matmul(a: Tensor, b) -> Tensor:
    """Matrix product with NumPy semantics: batched (broadcast batch dims) and 1-D cases."""
    if not isinstance(b, Tensor):
        b = Tensor._wrap(_operand(a, b)[0])
    ad, bd = a.data, b.data
    if type(ad) is not type(bd):
        _backend.check_same_device(ad, bd, "matmul")
    if ad.ndim == 0 or bd.ndim == 0:
        raise ValueError("matmul: both operands need at least 1 dimension; use * for scalars")
    out = ad @ bd
    if not _needs(a, b):
        return _result(out, None)
    ra, rb = a.requires_grad, b.requires_grad

    def fn(g):
        a2 = ad if ad.ndim > 1 else ad[None, :]
        b2 = bd if bd.ndim > 1 else bd[:, None]
        g2 = g
        if ad.ndim == 1:
            g2 = g2[..., None, :] if bd.ndim > 1 else g2[..., None]
        if bd.ndim == 1:
            g2 = g2[..., None]
        ga = gb = None
        if ra:
            ga = unbroadcast(g2 @ b2.swapaxes(-1, -2), a2.shape).reshape(ad.shape)
        if rb:
            gb = unbroadcast(a2.swapaxes(-1, -2) @ g2, b2.shape).reshape(bd.shape)
        return ga, gb

    return _result(out, Node(fn, (a if ra else None, b if rb else None), "MatMul"))


def rmatmul(a: Tensor, b) -> Tensor:
    b = b if isinstance(b, Tensor) else Tensor._wrap(_operand(a, b)[0])
    return matmul(b, a)


# ============================================================================ reductions
def sum(x: Tensor, axis=None, keepdims: bool = False, *, dim=None) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (None = all, int or tuple). ``dim=`` is accepted as torch's alias."""
    if dim is not None:
        axis = dim
    xd = x.data
    if isinstance(axis, list):
        axis = tuple(axis)
    out = xd.sum(axis=axis, keepdims=keepdims)
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        xp = _xp(xd)
        return (xp.broadcast_to(_expand_reduced(g, shape, axis, keepdims), shape),)

    return _result(out, Node(fn, (x,), "Sum", fresh=False))


def mean(x: Tensor, axis=None, keepdims: bool = False, *, dim=None) -> Tensor:
    """Mean over ``axis`` (alias ``dim=``). Integer tensors give a float64 mean (like NumPy)."""
    if dim is not None:
        axis = dim
    xd = x.data
    if isinstance(axis, list):
        axis = tuple(axis)
    out = xd.mean(axis=axis, keepdims=keepdims)
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape
    n = xd.size // _bmax(out.size, 1) if xd.size else 1

    def fn(g):
        xp = _xp(xd)
        return (xp.broadcast_to(_expand_reduced(g / n, shape, axis, keepdims), shape),)

    return _result(out, Node(fn, (x,), "Mean", fresh=False))


def _minmax(x: Tensor, axis, keepdims, which):
    xd = x.data
    if isinstance(axis, list):
        axis = tuple(axis)
    out = xd.max(axis=axis, keepdims=keepdims) if which == "Max" else xd.min(axis=axis, keepdims=keepdims)
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        o = _expand_reduced(out, shape, axis, keepdims)
        mask = xd == o
        # Ties share the gradient equally (a subgradient; matches torch.amax/amin).
        count = mask.sum(axis=axis, keepdims=True)
        return (mask * (_expand_reduced(g, shape, axis, keepdims) / count),)

    return _result(out, Node(fn, (x,), which))


def max(x: Tensor, axis=None, keepdims: bool = False, *, dim=None) -> Tensor:  # noqa: A001
    """Maximum over ``axis`` (values only, NumPy style); the gradient goes to the maximal
    entries (shared on ties)."""
    return _minmax(x, axis if dim is None else dim, keepdims, "Max")


def min(x: Tensor, axis=None, keepdims: bool = False, *, dim=None) -> Tensor:  # noqa: A001
    """Minimum over ``axis`` (values only); the gradient goes to the minimal entries."""
    return _minmax(x, axis if dim is None else dim, keepdims, "Min")


def var(x: Tensor, axis=None, keepdims: bool = False, ddof: int = 0, *, dim=None) -> Tensor:
    """Variance over ``axis`` with NumPy's default ``ddof=0`` (pass ``ddof=1`` for torch's)."""
    if dim is not None:
        axis = dim
    xd = x.data
    if isinstance(axis, list):
        axis = tuple(axis)
    mu = xd.mean(axis=axis, keepdims=True)
    diff = xd - mu
    n = xd.size // _bmax(mu.size, 1) if xd.size else 1
    out = (diff * diff).sum(axis=axis, keepdims=keepdims) / (n - ddof)
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        return (_expand_reduced(g, shape, axis, keepdims) * (2.0 / (n - ddof)) * diff,)

    return _result(out, Node(fn, (x,), "Var"))


# ============================================================================ method binding
def _bind_methods(T) -> None:
    import operator

    T.__add__ = add
    T.__radd__ = add
    T.__sub__ = sub
    T.__rsub__ = rsub
    T.__mul__ = mul
    T.__rmul__ = mul
    T.__truediv__ = div
    T.__rtruediv__ = rdiv
    T.__pow__ = pow
    T.__rpow__ = rpow
    T.__neg__ = neg
    T.__matmul__ = matmul
    T.__rmatmul__ = rmatmul
    T.__lt__ = _compare(operator.lt)
    T.__le__ = _compare(operator.le)
    T.__gt__ = _compare(operator.gt)
    T.__ge__ = _compare(operator.ge)
    T.__eq__ = _compare(operator.eq)
    T.__ne__ = _compare(operator.ne)
    T.__hash__ = object.__hash__
    T.add, T.sub, T.mul, T.div, T.pow, T.neg, T.matmul = add, sub, mul, div, pow, neg, matmul
    T.sum, T.mean, T.max, T.min, T.var = sum, mean, max, min, var

    def _any(self, axis=None, keepdims=False):
        return _result(self.data.any(axis=axis, keepdims=keepdims), None)

    def _all(self, axis=None, keepdims=False):
        return _result(self.data.all(axis=axis, keepdims=keepdims), None)

    def _argmax(self, axis=None, keepdims=False):
        return _result(self.data.argmax(axis=axis, keepdims=keepdims), None)

    def _argmin(self, axis=None, keepdims=False):
        return _result(self.data.argmin(axis=axis, keepdims=keepdims), None)

    T.any, T.all, T.argmax, T.argmin = _any, _all, _argmax, _argmin
