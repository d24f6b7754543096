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
    if _backend.is_device_array(b):  # CuPy or a registered device type
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


def _compare_method(name: str, op):
    cmp = _compare(op)

    def method(self: Tensor, other) -> Tensor:
        out = cmp(self, other)
        if out is NotImplemented:
            raise TypeError(f"{name}(): expected a Tensor or a number, got {type(other).__name__}")
        return out

    method.__name__ = name
    method.__doc__ = f"Elementwise ``{name}`` comparison: a bool tensor (no gradient)."
    return method


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
def _reduce_args(dim, keepdim, axis, keepdims):
    """Resolve torch's ``dim``/``keepdim`` and NumPy's ``axis``/``keepdims`` spellings."""
    if axis is not None:
        if dim is not None:
            raise TypeError("give dim= or axis= (its NumPy alias), not both")
        dim = axis
    if keepdims is not None:
        keepdim = keepdims
    if isinstance(dim, list):
        dim = tuple(dim)
    return dim, bool(keepdim)


def sum(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None, axis=None,  # noqa: A001
        keepdims=None) -> Tensor:
    """Sum over ``dim`` (None = all, an int or a tuple); ``axis``/``keepdims`` are NumPy aliases."""
    axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
    xd = x.data
    out = xd.sum(axis=axis, keepdims=keepdims, dtype=dtype)
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        xp = _xp(xd)
        return (xp.broadcast_to(_expand_reduced(g, shape, axis, keepdims), shape),)

    return _result(out, Node(fn, (x,), "Sum", fresh=False))


def mean(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None, axis=None, keepdims=None) -> Tensor:
    """Mean over ``dim`` (alias ``axis``). Integer tensors give a float64 mean (NumPy's rule;
    torch refuses integer means)."""
    axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
    xd = x.data
    out = xd.mean(axis=axis, keepdims=keepdims, dtype=dtype)
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


def amax(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """Maximum over ``dim`` (None = all, an int or a tuple), values only; the gradient is shared
    equally among tied maxima (torch's ``amax``)."""
    axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
    return _minmax(x, axis, keepdims, "Max")


def amin(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """Minimum over ``dim``, values only; ties share the gradient (torch's ``amin``)."""
    axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
    return _minmax(x, axis, keepdims, "Min")


class _ReturnType(tuple):
    """Base of torch's ``return_types`` tuples: ``(values, indices)`` with attribute access."""

    __slots__ = ()
    _fields = ("values", "indices")

    def __new__(cls, values, indices):
        return tuple.__new__(cls, (values, indices))

    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])

    def __repr__(self) -> str:
        return f"neural_arch.return_types.{type(self).__name__}(values={self[0]!r}, indices={self[1]!r})"

    def __reduce__(self):
        return (type(self), tuple(self))


class return_types:  # lower-case: a namespace named like torch.return_types
    """The named tuples that ``max(dim)`` / ``min(dim)`` return."""

    class max(_ReturnType):
        __slots__ = ()

    class min(_ReturnType):
        __slots__ = ()


def _minmax_dim(x: Tensor, dim, keepdim: bool, which: str):
    """``(values, indices)`` along one dim; the gradient goes to the selected index only."""
    if isinstance(dim, tuple):
        raise TypeError(
            f"{which.lower()}(dim) takes a single dim and returns (values, indices); for several "
            f"dims use {'amax' if which == 'Max' else 'amin'}(dim={dim})"
        )
    xd = x.data
    xp = _xp(xd)
    if xd.ndim == 0:
        idx = xp.zeros((), dtype=xp.int64)
        vals = xd.copy()
    else:
        ax = dim % xd.ndim
        idx = (xd.argmax if which == "Max" else xd.argmin)(axis=ax, keepdims=True).astype(xp.int64)
        vals = xp.take_along_axis(xd, idx, axis=ax)
        if not keepdim:
            vals, idx = vals.squeeze(ax), idx.squeeze(ax)
    indices = _result(idx, None)
    rtype = return_types.max if which == "Max" else return_types.min
    if not _needs(x):
        return rtype(_result(vals, None), indices)
    shape = xd.shape

    def fn(g):
        if not shape:
            return (g,)
        ax = dim % len(shape)
        ik = idx if keepdim else xp.expand_dims(idx, ax)
        gk = g if keepdim else xp.expand_dims(g, ax)
        pos = xp.arange(shape[ax]).reshape((-1,) + (1,) * (len(shape) - ax - 1))
        return ((pos == ik) * gk,)

    return rtype(_result(vals, Node(fn, (x,), which + "Dim")), indices)


def _max_or_min(which: str, elementwise):
    def op(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        if isinstance(dim, Tensor) or (dim is not None and not isinstance(dim, (int, np.integer, tuple, list))):
            return elementwise(x, dim)  # torch.max(a, b): the elementwise maximum
        axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
        if axis is None:
            return _minmax(x, None, False, which)
        return _minmax_dim(x, axis, keepdims, which)

    return op


def maximum(a: Tensor, b) -> Tensor:
    """Elementwise maximum (broadcasting); a tie sends half the gradient to each side (torch)."""
    return _elementwise_extreme(a, b, "Maximum")


def minimum(a: Tensor, b) -> Tensor:
    """Elementwise minimum (broadcasting); a tie sends half the gradient to each side (torch)."""
    return _elementwise_extreme(a, b, "Minimum")


def _elementwise_extreme(a: Tensor, b, name: str) -> Tensor:
    bd, bt = _operand(a, b)
    ad = a.data
    xp = _xp(ad)
    out = xp.maximum(ad, bd) if name == "Maximum" else xp.minimum(ad, bd)
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        wins = (ad > bd) if name == "Maximum" else (ad < bd)
        share = xp.where(wins, 1.0, xp.where(ad == bd, 0.5, 0.0)).astype(g.dtype, copy=False)
        return (
            unbroadcast(g * share, ash) if ra else None,
            unbroadcast(g * (1 - share), bsh) if rb else None,
        )

    return _result(out, Node(fn, (a if ra else None, bt), name))


max = _max_or_min("Max", maximum)  # noqa: A001
max.__name__ = "max"
max.__doc__ = """torch's ``max``: ``max(x)`` is the largest value (ties share the gradient);
``max(x, dim, keepdim=False)`` returns ``(values, indices)`` (``.values``/``.indices``) with the
gradient going to the selected index; ``max(x, other_tensor)`` is :func:`maximum`. For values
over several dims use :func:`amax`.

>>> t = Tensor([[1.0, 5.0], [7.0, 2.0]])
>>> t.max().item(), t.max(dim=1).values.tolist(), t.max(1).indices.tolist()
(7.0, [5.0, 7.0], [1, 0])
"""
min = _max_or_min("Min", minimum)  # noqa: A001
min.__name__ = "min"
min.__doc__ = """torch's ``min``: the smallest value, or ``(values, indices)`` along ``dim``,
or the elementwise :func:`minimum` with another tensor (see :func:`max`)."""


def var(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, axis=None,
        keepdims=None, ddof=None) -> Tensor:
    """Variance over ``dim`` with torch's default Bessel correction (divide by ``n - 1``).

    ``correction=0`` (or ``unbiased=False``, or NumPy's ``ddof=0``) gives the population variance.
    """
    axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
    given = [c for c in (correction, ddof) if c is not None]
    if unbiased is not None:
        given.append(1 if unbiased else 0)
    if len(given) > 1:
        raise TypeError("var: give only one of correction=, unbiased= or ddof=")
    ddof = given[0] if given else 1
    xd = x.data
    mu = xd.mean(axis=axis, keepdims=True)
    diff = xd - mu
    n = xd.size // _bmax(mu.size, 1) if xd.size else 1
    scale = 1.0 / (n - ddof) if n > ddof else float("nan")  # nan for n <= correction, as torch
    out = (diff * diff).sum(axis=axis, keepdims=keepdims) * scale  # python float: dtype kept
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        return (_expand_reduced(g, shape, axis, keepdims) * (2.0 * scale) * diff,)

    return _result(out, Node(fn, (x,), "Var"))


def std(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, axis=None,
        keepdims=None, ddof=None) -> Tensor:
    """Standard deviation: ``sqrt(var(...))`` with the same arguments (torch's default ``n - 1``)."""
    return pow(var(x, dim, unbiased, keepdim, correction=correction, axis=axis, keepdims=keepdims,
                   ddof=ddof), 0.5)


def _index_reduce(name: str):
    def op(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
        axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
        out = getattr(x.data, name)(axis=axis, keepdims=keepdims)
        if name in ("argmax", "argmin"):
            out = _as_array(out).astype(_xp(x.data).int64, copy=False)  # torch's index dtype
        return _result(out, None)

    op.__name__ = name
    op.__doc__ = f"torch's ``{name}(dim=None, keepdim=False)`` (``axis``/``keepdims`` aliases); no gradient."
    return op


argmax = _index_reduce("argmax")
argmin = _index_reduce("argmin")
# Not module-level `any`/`all`: this module still uses Python's builtins of those names.
_any = _index_reduce("any")
_all = _index_reduce("all")


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
    T.sum, T.mean, T.max, T.min, T.var, T.std = sum, mean, max, min, var, std
    T.amax, T.amin, T.maximum, T.minimum = amax, amin, maximum, minimum
    T.any, T.all, T.argmax, T.argmin = _any, _all, argmax, argmin
    for name, op in (("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt),
                     ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)):
        setattr(T, name, _compare_method(name, op))
    T.equal = lambda self, other: bool(
        isinstance(other, Tensor) and self.shape == other.shape and bool((self.data == other.data).all())
    )
