"""Differentiable reductions: ``sum``, ``mean``, ``amax``/``amin``, ``max``/``min`` (all-reduce,
per-``dim`` with indices as torch's ``return_types``, or elementwise with a second tensor),
``maximum``/``minimum``, ``var``/``std``, ``logsumexp``, ``prod``, ``cumsum``, the norms
(``vector_norm`` as torch's ``linalg.vector_norm``, ``norm``), and the gradient-free
``argmax``/``argmin``/``any``/``all``.

Every op takes torch's ``dim``/``keepdim`` and NumPy's ``axis``/``keepdims`` spellings.
This module binds their Tensor methods (``x.sum()``, ``x.max(dim=1)``...).

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.core.ops_reduce import max, sum
    >>> x = Tensor(np.array([[1.0, 5.0], [7.0, 2.0]]))
    >>> sum(x, dim=0).tolist(), max(x, dim=1).indices.tolist()
    ([8.0, 7.0], [1, 0])
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from . import dtypes as _dtypes
from .autograd import Node
from .op_utils import (
    _as_array,
    _bmax,
    _expand_reduced,
    _needs,
    _norm_axes,
    _operand,
    _result,
    _xp,
    unbroadcast,
)
from .tensor import Tensor, _check_dim


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
    if dim == ():  # torch: an empty dim list reduces every dim (NumPy's axis=() would reduce none)
        dim = None
    if isinstance(dim, bool) or (isinstance(dim, tuple) and builtins.any(isinstance(d, bool) for d in dim)):
        raise TypeError(f"dim must be an int or a tuple of ints, not bool (got dim={dim!r})")
    return dim, bool(keepdim)


def sum(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None, axis=None,  # noqa: A001
        keepdims=None) -> Tensor:
    """Sum over ``dim`` (None = all, an int or a tuple); ``axis``/``keepdims`` are NumPy aliases.

    Example::

        >>> import neural_arch as na
        >>> x = na.ones(2, 3)
        >>> x.sum().item(), x.sum(dim=1).tolist()
        (6.0, [3.0, 3.0])
    """
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
    torch refuses integer means).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1.0, 3.0]]).mean(dim=1, keepdim=True).tolist()
        [[2.0]]
    """
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


def _minmax(x: Tensor, axis, keepdims, which, nan_is_extreme: bool = False):
    xd = x.data
    out = xd.max(axis=axis, keepdims=keepdims) if which == "Max" else xd.min(axis=axis, keepdims=keepdims)
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        o = _expand_reduced(out, shape, axis, keepdims)
        mask = xd == o
        if nan_is_extreme and xd.dtype.kind not in "biu":
            # torch's max()/min() of a tensor holding NaN (the result): its NaNs share the gradient
            # (NaN == NaN is False, so the mask alone would count 0 and give NaN everywhere);
            # torch's amax/amin keep the plain mask, NaN gradients included
            mask |= _xp(xd).isnan(xd)
        # Ties share the gradient equally (a subgradient; matches torch.amax/amin).
        count = mask.sum(axis=axis, keepdims=True)
        return (mask * (_expand_reduced(g, shape, axis, keepdims) / count),)

    return _result(out, Node(fn, (x,), which))


def amax(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """Maximum over ``dim`` (None = all, an int or a tuple), values only; the gradient is shared
    equally among tied maxima (torch's ``amax``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1.0, 3.0], [4.0, 2.0]]).amax(dim=0).tolist()
        [4.0, 3.0]
    """
    axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
    return _minmax(x, axis, keepdims, "Max")


def amin(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """Minimum over ``dim``, values only; ties share the gradient (torch's ``amin``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1.0, 3.0], [4.0, 2.0]]).amin(dim=1).tolist()
        [1.0, 2.0]
    """
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
    """The named tuples that ``max(dim)`` / ``min(dim)`` return.

    Example::

        >>> import neural_arch as na
        >>> values, indices = na.tensor([[1.0, 3.0]]).max(dim=1)
        >>> values.tolist(), indices.tolist()
        ([3.0], [1])
    """

    class max(_ReturnType):
        __slots__ = ()

    class min(_ReturnType):
        __slots__ = ()

    class sort(_ReturnType):
        __slots__ = ()

    class topk(_ReturnType):
        __slots__ = ()

    class median(_ReturnType):
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
    ax = _check_dim(dim, xd.ndim)  # out of range is torch's IndexError, never a wrapped-around dim
    if xd.ndim == 0:
        idx = xp.zeros((), dtype=xp.int64)
        vals = xd.copy()
    else:
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
            return _minmax(x, None, False, which, nan_is_extreme=True)
        return _minmax_dim(x, axis, keepdims, which)

    return op


def maximum(a: Tensor, b) -> Tensor:
    """Elementwise maximum (broadcasting); a tie sends half the gradient to each side (torch).

    Example::

        >>> import neural_arch as na
        >>> na.core.maximum(na.tensor([1.0, 5.0]), na.tensor([3.0, 2.0])).tolist()
        [3.0, 5.0]
    """
    return _elementwise_extreme(a, b, "Maximum")


def minimum(a: Tensor, b) -> Tensor:
    """Elementwise minimum (broadcasting); a tie sends half the gradient to each side (torch).

    Example::

        >>> import neural_arch as na
        >>> na.core.minimum(na.tensor([1.0, 5.0]), na.tensor([3.0, 2.0])).tolist()
        [1.0, 2.0]
    """
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

    return _result(out, Node(fn, (a if ra else None, bt), name, saved=(a, b)))


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
or the elementwise :func:`minimum` with another tensor (see :func:`max`).
Example::

    >>> import neural_arch as na
    >>> x = na.tensor([[1.0, 3.0], [0.0, 2.0]])
    >>> x.min().item(), x.min(dim=1).indices.tolist()
    (0.0, [0, 0])
"""


def var(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, axis=None,
        keepdims=None, ddof=None) -> Tensor:
    """Variance over ``dim`` with torch's default Bessel correction (divide by ``n - 1``).

    ``correction=0`` (or ``unbiased=False``, or NumPy's ``ddof=0``) gives the population variance.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, 3.0]).var().item(), na.tensor([1.0, 3.0]).var(unbiased=False).item()
        (2.0, 1.0)
    """
    if isinstance(dim, bool):  # torch's overload var(input, unbiased): a bool there is not a dim
        if unbiased is not None:
            raise TypeError("var: unbiased given twice (positionally as a bool and by keyword)")
        dim, unbiased = None, dim
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
    n = math.prod(xd.shape[a] for a in _norm_axes(axis, xd.ndim))  # elements per result (0 if empty)
    # torch divides by max(0, n - correction): inf for n <= correction, so a sum of squares > 0
    # gives inf and an all-equal (or empty) slice gives nan, as torch
    scale = 1.0 / (n - ddof) if n > ddof else math.inf
    with np.errstate(invalid="ignore"):  # 0 * inf: the nan torch returns (CuPy has no errstate)
        out = (diff * diff).sum(axis=axis, keepdims=keepdims) * scale  # python float: dtype kept
    if not _needs(x):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        return (_expand_reduced(g, shape, axis, keepdims) * (2.0 * scale) * diff,)

    return _result(out, Node(fn, (x,), "Var"))


def std(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, axis=None,
        keepdims=None, ddof=None) -> Tensor:
    """Standard deviation: ``sqrt(var(...))`` with the same arguments (torch's default ``n - 1``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, 3.0]).std(correction=0).item()
        1.0
    """
    # ``** 0.5`` is Tensor.__pow__, i.e. ops_basic.pow (importing it here would be a cycle)
    return var(x, dim, unbiased, keepdim, correction=correction, axis=axis, keepdims=keepdims,
               ddof=ddof) ** 0.5


#: what each index reduction's docstring example prints, for ``[[1.0, 3.0], [4.0, 0.0]]`` along dim 1
_EXAMPLE_RESULTS = {"argmax": [1, 0], "argmin": [0, 1], "all": [True, False], "any": [True, True]}


def _index_reduce(name: str):
    def op(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
        axis, keepdims = _reduce_args(dim, keepdim, axis, keepdims)
        out = getattr(x.data, name)(axis=axis, keepdims=keepdims)
        if name in ("argmax", "argmin"):
            out = _as_array(out).astype(_xp(x.data).int64, copy=False)  # torch's index dtype
        return _result(out, None)

    op.__name__ = name
    op.__doc__ = (
        f"torch's ``{name}(dim=None, keepdim=False)`` (``axis``/``keepdims`` aliases); no gradient.\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> na.tensor([[1.0, 3.0], [4.0, 0.0]]).{name}(dim=1).tolist()\n"
        f"    {_EXAMPLE_RESULTS[name]}\n"
    )
    return op


argmax = _index_reduce("argmax")
argmin = _index_reduce("argmin")
# Not module-level `any`/`all`: this module still uses Python's builtins of those names.
_any = _index_reduce("any")
_all = _index_reduce("all")


# ============================================================================ logsumexp, prod, cumsum, norms
def _reduce_dims(dim, ndim: int, op: str) -> tuple:
    """``dim`` (None, an int, or a tuple/list; ``()`` and None mean every dim) as sorted axes in
    ``[0, ndim)``, with torch's errors: ``IndexError`` out of range, ``RuntimeError`` repeated."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{op}: dim must be an int or a tuple of ints, got {dim!r}")
    axes = [_check_dim(int(d), ndim) for d in dims]
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"{op}: dim {dim!r} names a dimension more than once")
    return tuple(sorted(axes)) if ndim else ()


def _kept_shape(shape, axes) -> tuple:
    """``shape`` with the reduced ``axes`` set to 1 (the keepdim shape)."""
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _dropped_shape(shape, axes) -> tuple:
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def logsumexp(input: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """torch's ``logsumexp(input, dim, keepdim=False)``: ``log(sum(exp(x)))`` over ``dim`` (an int,
    a tuple, or None/``()`` for every dim), computed stably with the slice's maximum shifted out.

    As in torch: a slice of all ``-inf`` gives ``-inf`` (its gradient is NaN, torch's
    ``exp(x - result)``), an empty slice gives ``-inf``, an integer input gives the default float
    dtype. The gradient is ``softmax(x)`` along the reduced dims.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[0.0, 0.0], [1000.0, 1000.0]], dtype=na.float64)
        >>> [round(v, 4) for v in na.logsumexp(x, dim=1).tolist()]
        [0.6931, 1000.6931]
        >>> na.tensor([float("-inf")] * 2).logsumexp(0).item()
        -inf
    """
    dim, keepdim = _reduce_args(dim, keepdim, axis, keepdims)
    x = input
    xd = x.data
    if xd.dtype.kind in "biu":  # torch: integers and bools give the default float dtype
        xd = xd.astype(_dtypes.default_float_dtype)
    xp = _xp(xd)
    axes = _reduce_dims(dim, xd.ndim, "logsumexp")
    kept = _kept_shape(xd.shape, axes)
    if math.prod(xd.shape[a] for a in axes) == 0:  # empty slices: log(0) (no maximum to shift by)
        outk = xp.full(kept, -math.inf, dtype=xd.dtype)
    else:
        m = xd.max(axis=axes, keepdims=True)
        # an infinite maximum is not shifted out (torch): all -inf stays -inf, +inf stays +inf
        m = xp.where(xp.isinf(m), 0, m).astype(xd.dtype, copy=False)
        with np.errstate(divide="ignore"):  # log(0) of an all -inf slice: -inf, as torch
            outk = xp.log(xp.exp(xd - m).sum(axis=axes, keepdims=True)) + m
    out = outk if keepdim else outk.reshape(_dropped_shape(xd.shape, axes))
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        with np.errstate(invalid="ignore"):  # -inf - (-inf) of an all -inf slice: NaN, as torch
            return ((g.reshape(kept) if not keepdim else g) * xp.exp(xd - outk),)

    return _result(out, Node(fn, (x,), "LogSumExp"))


def _int_to_int64(xd, dtype):
    """torch's accumulation dtype for ``prod``/``cumsum``: ``dtype=`` when given, int64 for integer
    and bool input (NumPy would keep uint64 or a platform int), the input's own otherwise."""
    if dtype is not None:
        return xd.astype(_dtypes.as_dtype(dtype), copy=False)
    if xd.dtype.kind in "biu":
        return xd.astype(_xp(xd).int64)
    return xd


def _product_of_others(xp, a, ax: int):
    """For each element, the product of the other elements of its slice along ``ax``: the exclusive
    cumulative products from both ends multiplied. Exact with zeros in the slice (no division), which
    gives torch's gradient of ``prod``: with one zero only that element's gradient is non-zero, with
    several all are zero."""
    n = a.shape[ax]
    if n == 0:
        return xp.ones(a.shape, dtype=a.dtype)
    one = xp.ones(_kept_shape(a.shape, (ax,)), dtype=a.dtype)
    head = a[(slice(None),) * ax + (slice(0, n - 1),)]
    tail = a[(slice(None),) * ax + (slice(1, n),)]
    before = xp.cumprod(xp.concatenate([one, head], axis=ax), axis=ax)
    after = xp.flip(xp.cumprod(xp.flip(xp.concatenate([tail, one], axis=ax), axis=ax), axis=ax), axis=ax)
    return before * after


def prod(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None, axis=None, keepdims=None) -> Tensor:
    """torch's ``prod``: the product of every element (``dim=None``) or along one ``dim``.

    torch's ``prod`` takes a single dim (reduce several by chaining calls); integer and bool input
    gives int64; ``dtype=`` casts the input first. The gradient is the product of the *other*
    elements of the slice, exact when the slice holds zeros (torch's rule: with one zero only that
    element gets a non-zero gradient, with two or more every gradient is zero).

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[2.0, 3.0], [0.0, 4.0]], requires_grad=True)
        >>> y = x.prod(dim=1)
        >>> y.tolist()
        [6.0, 0.0]
        >>> y.sum().backward()
        >>> x.grad.tolist()
        [[3.0, 2.0], [4.0, 0.0]]
    """
    dim, keepdim = _reduce_args(dim, keepdim, axis, keepdims)
    if isinstance(dim, tuple):
        raise TypeError(f"prod: dim must be a single int (torch's prod reduces one dim or all), got {dim!r}; "
                        f"chain calls to reduce several dims")
    x = input
    xd = _int_to_int64(x.data, dtype)
    xp = _xp(xd)
    shape = xd.shape
    if dim is None:
        out = _as_array(xd.prod())
        if keepdim:
            out = out.reshape((1,) * xd.ndim)
    else:
        ax = _check_dim(dim, xd.ndim)
        out = xd.prod(axis=ax if xd.ndim else None, keepdims=keepdim)
    if not _needs(x) or not _dtypes.is_floating_dtype(out.dtype):
        return _result(out, None)
    src = x.data.dtype

    def fn(g):
        if dim is None:
            others = _product_of_others(xp, xd.reshape(-1), 0).reshape(shape)
            gx = g.reshape(()) * others
        elif not shape:
            gx = g.reshape(())
        else:
            ax = dim % len(shape)
            gx = (g if keepdim else xp.expand_dims(g, ax)) * _product_of_others(xp, xd, ax)
        return (xp.asarray(gx).astype(src, copy=False),)

    return _result(out, Node(fn, (x,), "Prod"))


def cumsum(input: Tensor, dim=None, *, dtype=None, axis=None) -> Tensor:
    """torch's ``cumsum(input, dim)``: running sums along ``dim``; integer and bool input gives
    int64 and ``dtype=`` casts first (torch). The gradient is the reversed running sum of the
    upstream gradient.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
        >>> y = x.cumsum(dim=-1)
        >>> y.tolist()
        [[1.0, 3.0, 6.0]]
        >>> y.sum().backward()
        >>> x.grad.tolist()
        [[3.0, 2.0, 1.0]]
    """
    dim, _ = _reduce_args(dim, False, axis, None)
    if dim is None or isinstance(dim, tuple):
        raise TypeError(f"cumsum: dim must be a single int (torch's cumsum(input, dim)), got {dim!r}")
    x = input
    xd = _int_to_int64(x.data, dtype)
    xp = _xp(xd)
    ax = _check_dim(dim, xd.ndim)
    out = xp.cumsum(xd, axis=ax) if xd.ndim else xd.copy()
    if not _needs(x) or not _dtypes.is_floating_dtype(out.dtype):
        return _result(out, None)
    src = x.data.dtype

    def fn(g):
        if g.ndim:
            g = xp.flip(xp.cumsum(xp.flip(g, axis=ax), axis=ax), axis=ax)
        return (g.astype(src, copy=False),)

    return _result(out, Node(fn, (x,), "Cumsum"))


# ============================================================================ sort, argsort, topk, cumprod, counts
def _sort_indices(xp, xd, ax: int, descending: bool):
    """Stable sort order along ``ax``: NaN counts as the largest value (torch), and equal values
    keep their original order in both directions."""
    if not descending:
        return xp.argsort(xd, axis=ax, kind="stable")
    # ascending stable on the reversed slice, read backwards: descending, ties in original order
    n = xd.shape[ax]
    rev = xp.argsort(xp.flip(xd, axis=ax), axis=ax, kind="stable")
    return xp.flip((n - 1) - rev, axis=ax)


def _take_sorted(x: Tensor, idx, ax: int, name: str):
    """``x``'s values at ``idx`` along ``ax``; the gradient goes back to the picked positions."""
    xd = x.data
    xp = _xp(xd)
    vals = xp.take_along_axis(xd, idx, axis=ax)
    if not _needs(x) or not _dtypes.is_floating_dtype(vals.dtype):
        return _result(vals, None)
    shape = xd.shape

    def fn(g):
        gx = xp.zeros(shape, dtype=g.dtype)
        xp.put_along_axis(gx, idx, g, axis=ax)  # indices are distinct per slice: assignment is exact
        return (gx,)

    return _result(vals, Node(fn, (x,), name))


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """torch's ``sort(input, dim=-1, descending=False, stable=False)``: ``(values, indices)`` as
    ``return_types.sort``. NaN sorts as the largest value; the sort is always stable. The gradient
    goes back to each value's original position.

    Example::

        >>> import neural_arch as na
        >>> values, indices = na.sort(na.tensor([3.0, 1.0, 2.0]), descending=True)
        >>> values.tolist(), indices.tolist()
        ([3.0, 2.0, 1.0], [0, 2, 1])
    """
    xd = input.data
    xp = _xp(xd)
    if xd.ndim == 0:
        _check_dim(dim, 0)
        return return_types.sort(_take_sorted(input.reshape(1), xp.zeros(1, dtype=xp.int64), 0, "Sort")
                                 .reshape(()), _result(xp.zeros((), dtype=xp.int64), None))
    ax = _check_dim(dim, xd.ndim)
    idx = _sort_indices(xp, xd, ax, descending).astype(xp.int64, copy=False)
    return return_types.sort(_take_sorted(input, idx, ax, "Sort"), _result(idx, None))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """torch's ``argsort``: the indices that :func:`sort` returns (int64, stable; NaN largest).

    Example::

        >>> import neural_arch as na
        >>> na.argsort(na.tensor([[3, 1, 2]])).tolist(), na.tensor([1, 3, 2]).argsort(descending=True).tolist()
        ([[1, 2, 0]], [1, 2, 0])
    """
    return sort(input, dim, descending, stable).indices


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """torch's ``topk(input, k, dim=-1, largest=True, sorted=True)``: the ``k`` largest (or smallest)
    values along ``dim`` and their indices, as ``return_types.topk``, in sorted order (NaN counts as
    the largest). ``k`` beyond the dim's size is torch's error.

    Example::

        >>> import neural_arch as na
        >>> values, indices = na.topk(na.tensor([1.0, 5.0, 3.0, 4.0]), 2)
        >>> values.tolist(), indices.tolist()
        ([5.0, 4.0], [1, 3])
    """
    xd = input.data
    n = xd.shape[_check_dim(dim, xd.ndim)] if xd.ndim else 1
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"topk(): k must be an int, got {k!r}")
    if not 0 <= k <= n:
        raise RuntimeError(f"topk(): selected index k ({k}) out of range for a dimension of size {n}")
    values, indices = sort(input, dim, descending=largest)
    if xd.ndim == 0:
        return return_types.topk(values, indices)
    ax = _check_dim(dim, xd.ndim)
    lead = (slice(None),) * ax + (slice(0, k),)
    return return_types.topk(values[lead], _result(indices.data[lead], None))


def cumprod(input: Tensor, dim, *, dtype=None) -> Tensor:
    """torch's ``cumprod(input, dim, *, dtype=None)``: running products along ``dim``; integer and
    bool input gives int64, ``dtype=`` casts first. The gradient is exact with zeros in the slice
    (no division by the input): ``sum_{j >= i} g_j * prod_{k <= j, k != i} x_k``.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([2.0, 0.0, 3.0], requires_grad=True)
        >>> y = na.cumprod(x, 0)
        >>> y.tolist()
        [2.0, 0.0, 0.0]
        >>> y.sum().backward()
        >>> x.grad.tolist()
        [1.0, 8.0, 0.0]
    """
    if dim is None or isinstance(dim, (tuple, list)):
        raise TypeError(f"cumprod: dim must be a single int (torch's cumprod(input, dim)), got {dim!r}")
    x = input
    xd = _int_to_int64(x.data, dtype)
    xp = _xp(xd)
    ax = _check_dim(dim, xd.ndim)
    out = xp.cumprod(xd, axis=ax) if xd.ndim else xd.copy()
    if not _needs(x) or not _dtypes.is_floating_dtype(out.dtype):
        return _result(out, None)
    src = x.data.dtype

    def fn(g):
        if not g.ndim:
            return (g.astype(src, copy=False),)
        n = xd.shape[ax]
        if n == 0:
            return (xp.zeros(xd.shape, dtype=src),)
        def take(a, i):
            return a[(slice(None),) * ax + (slice(i, i + 1),)]

        # exclusive running product: prod_{k < i} x_k
        ones = xp.ones(_kept_shape(xd.shape, (ax,)), dtype=xd.dtype)
        before = xp.cumprod(xp.concatenate([ones, xd[(slice(None),) * ax + (slice(0, n - 1),)]], axis=ax), axis=ax)
        # S_i = g_i + x_{i+1} * S_{i+1}: the upstream gradients carried back through the later factors
        acc = [None] * n
        acc[n - 1] = take(g, n - 1)
        for i in range(n - 2, -1, -1):
            acc[i] = take(g, i) + take(xd, i + 1) * acc[i + 1]
        return ((before * xp.concatenate(acc, axis=ax)).astype(src, copy=False),)

    return _result(out, Node(fn, (x,), "Cumprod"))


def count_nonzero(input: Tensor, dim=None) -> Tensor:
    """torch's ``count_nonzero(input, dim=None)``: the number of non-zero elements over ``dim``
    (None = all, an int or a tuple), as int64.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[0, 1, 2], [0, 0, 3]])
        >>> na.count_nonzero(x).item(), x.count_nonzero(dim=1).tolist()
        (3, [2, 1])
    """
    xd = input.data
    axes = _reduce_dims(dim, xd.ndim, "count_nonzero")
    out = (xd != 0).sum(axis=axes if xd.ndim else None)
    return _result(_xp(xd).asarray(out).astype(_xp(xd).int64, copy=False), None)


def nonzero(input: Tensor, *, as_tuple: bool = False):
    """torch's ``nonzero(input, *, as_tuple=False)``: the indices of the non-zero elements, one row
    per element (an ``(n, ndim)`` int64 tensor, row-major order), or with ``as_tuple=True`` one 1-d
    index tensor per dim (NumPy's ``nonzero``; a 0-d input counts as 1-d there, as torch).

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[0, 1], [2, 0]])
        >>> na.nonzero(x).tolist(), [t.tolist() for t in x.nonzero(as_tuple=True)]
        ([[0, 1], [1, 0]], [[0, 1], [1, 0]])
    """
    xd = input.data
    xp = _xp(xd)
    if xd.ndim == 0:
        hit = bool(xd != 0)
        if as_tuple:
            return (_result(xp.zeros(int(hit), dtype=xp.int64), None),)
        return _result(xp.zeros((int(hit), 0), dtype=xp.int64), None)
    idx = tuple(i.astype(xp.int64, copy=False) for i in xp.nonzero(xd))
    if as_tuple:
        return tuple(_result(i, None) for i in idx)
    return _result(xp.stack(idx, axis=1), None)


def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """torch's ``linalg.vector_norm``: ``(sum |x|**ord) ** (1/ord)`` over ``dim`` (None = every
    element, an int or a tuple). ``ord`` is any number: ``inf`` is ``max |x|``, ``-inf`` ``min |x|``,
    ``0`` the count of non-zero elements. ``dtype=`` casts the input first; integer input is refused
    (torch's error).

    Gradients follow torch's subgradients: 0 where the norm is 0 (ord 2, any ord > 1), ``sign(x)``
    for ord 1, shared among tied maxima (minima) for ``inf`` (``-inf``), zero for ord 0. The ``inf``
    and negative norms of an empty slice have no value (torch's error).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_reduce import vector_norm
        >>> x = na.tensor([[3.0, -4.0], [0.0, 0.0]], requires_grad=True)
        >>> y = vector_norm(x, dim=1)
        >>> y.tolist(), vector_norm(x, ord=float("inf")).item(), vector_norm(x, ord=1).item()
        ([5.0, 0.0], 4.0, 7.0)
        >>> y.sum().backward()
        >>> x.grad.tolist()
        [[0.6000000238418579, -0.800000011920929], [0.0, 0.0]]
    """
    xd = x.data
    if dtype is not None:
        xd = xd.astype(_dtypes.as_dtype(dtype), copy=False)
    if xd.dtype.kind not in "fc":
        raise TypeError(f"linalg.vector_norm: expected a floating-point input, got dtype {xd.dtype}; "
                        f"convert it with .float() / .double() or pass dtype=")
    if isinstance(ord, (str, bool)) or not isinstance(ord, (int, float, np.integer, np.floating)):
        raise TypeError(f"linalg.vector_norm: ord must be a number (2, 1, inf, -inf, 0, any p), got {ord!r}")
    p = float(ord)
    xp = _xp(xd)
    axes = _reduce_dims(dim, xd.ndim, "linalg.vector_norm")
    if (p < 0 or p == math.inf) and any(xd.shape[a] == 0 for a in axes):
        raise RuntimeError(f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor because "
                           f"the operation does not have an identity (dims {axes} of shape {list(xd.shape)})")
    kept = _kept_shape(xd.shape, axes)
    a = xp.abs(xd)
    if p == 2:
        outk = xp.sqrt((a * a).sum(axis=axes, keepdims=True))
    elif p == 1:
        outk = a.sum(axis=axes, keepdims=True)
    elif p == math.inf:
        outk = a.max(axis=axes, keepdims=True)
    elif p == -math.inf:
        outk = a.min(axis=axes, keepdims=True)
    elif p == 0:
        outk = (a != 0).sum(axis=axes, keepdims=True).astype(a.dtype)
    else:
        with np.errstate(divide="ignore"):  # 0 ** negative p: inf, as torch (CuPy has no errstate)
            outk = (a ** p).sum(axis=axes, keepdims=True) ** (1.0 / p)
    outk = outk.astype(a.dtype, copy=False)
    out = outk if keepdim else outk.reshape(_dropped_shape(xd.shape, axes))
    if not _needs(x):
        return _result(out, None)
    src = x.data.dtype
    if p == 0:  # a count of non-zeros is piecewise constant: a zero gradient (torch)
        return _result(out, Node(lambda g: (xp.zeros(x.data.shape, dtype=src),), (x,), "VectorNorm"))

    def fn(g):
        gk = g if keepdim else g.reshape(kept)
        sign = xp.sign(xd)
        if p == 1:
            gx = sign * gk
        elif p in (math.inf, -math.inf):
            hit = (a == outk) | xp.isnan(a)  # ties share the gradient (torch's amax/amin rule)
            gx = sign * hit * (gk / hit.sum(axis=axes, keepdims=True))
        else:
            zero = outk == 0
            scale = xp.where(zero, 0, gk * xp.where(zero, 1, outk) ** (1.0 - p))  # 0 where the norm is 0
            if p == 2:
                gx = xd * scale
            else:
                gx = sign * xp.where(a == 0, 1, a) ** (p - 1.0) * scale  # sign(0) = 0 keeps 0 ** (p - 1) out
        return (gx.astype(src, copy=False),)

    return _result(out, Node(fn, (x,), "VectorNorm"))


def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """torch's ``norm(input, p="fro", dim=None, keepdim=False, dtype=None)``: ``"fro"`` (or None) is
    the 2-norm of the elements over ``dim`` (every element when None), a number ``p`` is
    ``vector_norm`` (torch's ``linalg.vector_norm``) with ``ord=p``. The nuclear norm (``"nuc"``)
    needs a matrix decomposition and is not provided.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[3.0, 4.0], [0.0, 0.0]])
        >>> x.norm().item(), x.norm(p=1, dim=0).tolist(), na.norm(x, float("inf")).item()
        (5.0, [3.0, 4.0], 4.0)
    """
    if p is None or p == "fro":
        if isinstance(dim, (tuple, list)) and len(dim) > 2:
            raise RuntimeError(f"norm: the Frobenius norm takes at most two dims, got dim={dim!r}")
        return vector_norm(input, 2, dim, keepdim, dtype=dtype)
    if isinstance(p, str):
        raise (NotImplementedError if p == "nuc" else ValueError)(
            f"norm: p={p!r} is not supported; use 'fro' or a number (vector_norm's ord)")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


def _bind_methods(T) -> None:
    T.sum, T.mean, T.max, T.min, T.var, T.std = sum, mean, max, min, var, std
    T.amax, T.amin, T.maximum, T.minimum = amax, amin, maximum, minimum
    T.any, T.all, T.argmax, T.argmin = _any, _all, argmax, argmin
    T.logsumexp, T.prod, T.cumsum, T.norm = logsumexp, prod, cumsum, norm
    T.sort, T.argsort, T.topk, T.cumprod = sort, argsort, topk, cumprod
    T.count_nonzero, T.nonzero = count_nonzero, nonzero
