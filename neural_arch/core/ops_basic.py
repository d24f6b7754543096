"""Differentiable array ops: arithmetic, comparisons and matmul (the reductions live in
:mod:`.ops_reduce`, shape ops in :mod:`.ops_shape`, the ops' shared plumbing in :mod:`.op_utils`).

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

import contextlib

from .. import backend as _backend
from .autograd import Node
from .op_utils import (
    _SCALARS,
    _needs,
    _operand,
    _result,
    _xp,
    unbroadcast,
)
from .tensor import Tensor


# ============================================================================ arithmetic
def add(a: Tensor, b) -> Tensor:
    """``a + b`` with NumPy broadcasting; the gradient of each side is summed back to its shape.

    Example::

        >>> import neural_arch as na
        >>> (na.tensor([1.0, 2.0]) + 1).tolist()
        [2.0, 3.0]
    """
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
    """``a - b`` with NumPy broadcasting.

    Example::

        >>> import neural_arch as na
        >>> (na.tensor([1.0, 2.0]) - na.tensor([1.0, 1.0])).tolist()
        [0.0, 1.0]
    """
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
    """``b - a`` (what ``number - tensor`` calls).

    Example::

        >>> import neural_arch as na
        >>> (1 - na.tensor([1.0, 2.0])).tolist()
        [0.0, -1.0]
    """
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
    """``a * b`` elementwise, with NumPy broadcasting.

    Example::

        >>> import neural_arch as na
        >>> (na.tensor([1.0, 2.0]) * 3).tolist()
        [3.0, 6.0]
    """
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

    return _result(out, Node(fn, (a if ra else None, bt), "Mul", saved=(a, b)))


def div(a: Tensor, b) -> Tensor:
    """``a / b`` elementwise (true division), with NumPy broadcasting.

    Example::

        >>> import neural_arch as na
        >>> (na.tensor([1.0, 2.0]) / 2).tolist()
        [0.5, 1.0]
    """
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

    return _result(out, Node(fn, (a if ra else None, bt), "Div", saved=(b,)))


def rdiv(a: Tensor, b) -> Tensor:
    """``b / a`` for a non-Tensor (or Tensor) ``b``.

    Example::

        >>> import neural_arch as na
        >>> (1 / na.tensor([2.0, 4.0])).tolist()
        [0.5, 0.25]
    """
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

    return _result(out, Node(fn, (a if ra else None, bt), "RDiv", saved=(a,)))


def pow(a: Tensor, b) -> Tensor:  # noqa: A001  (mirrors the operator name)
    """``a ** b`` elementwise (``b`` a number or a Tensor).

    Example::

        >>> import neural_arch as na
        >>> (na.tensor([2.0, 3.0]) ** 2).tolist()
        [4.0, 9.0]
    """
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
            ga = _pow_base_grad(g, ad, bd, ash)
        if rb:
            gb = unbroadcast(_pow_exponent_grad(g, out, ad, bd), bsh)
        return ga, gb

    return _result(out, Node(fn, (a if ra else None, bt), "Pow", saved=(a, b)))


def rpow(a: Tensor, b) -> Tensor:
    """``b ** a``.

    Example::

        >>> import neural_arch as na
        >>> (2 ** na.tensor([1.0, 3.0])).tolist()
        [2.0, 8.0]
    """
    bd, bt = _operand(a, b)
    ad = a.data
    out = bd**ad
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        ga = unbroadcast(_pow_exponent_grad(g, out, bd, ad), ash) if ra else None
        gb = _pow_base_grad(g, bd, ad, bsh) if rb else None
        return ga, gb

    return _result(out, Node(fn, (a if ra else None, bt), "RPow", saved=(a, b)))


def _pow_base_grad(g, base, exponent, base_shape):
    """``d(base ** exponent)/d base`` times ``g``, summed to ``base_shape``: ``exponent * base **
    (exponent - 1)``, and 0 where the exponent is 0 (torch's rule: ``x ** 0`` is constant even at
    ``x = 0``, where the formula gives ``0 * inf``)."""
    if isinstance(exponent, _SCALARS):
        if exponent == 2:
            return g * (2 * base)  # the common square: skip the general power
        if exponent == 0:
            return unbroadcast(g * 0, base_shape)
        return unbroadcast(g * (exponent * base ** (exponent - 1)), base_shape)
    xp = _xp(g)
    with _errstate(xp):
        d = exponent * base ** (exponent - 1)
    return unbroadcast(g * xp.where(exponent == 0, 0, d), base_shape)


def _pow_exponent_grad(g, out, base, exponent):
    """``d(base ** exponent)/d exponent`` times ``g`` (not yet summed to a shape): ``out * log(base)``,
    and 0 where ``base == 0`` and ``exponent >= 0`` (torch's rule: ``0 ** y`` is flat there); a negative
    base gives nan, as torch."""
    xp = _xp(out)
    with _errstate(xp):
        d = out * xp.log(base)
    if isinstance(base, _SCALARS):  # a number base (``2 ** t``): one mask at most, no array made from it
        return g * (xp.where(exponent >= 0, 0, d) if base == 0 else d)
    return g * xp.where((base == 0) & (exponent >= 0), 0, d)


def _integral(d) -> bool:
    return d.dtype.kind in "biu" if hasattr(d, "dtype") else isinstance(d, int)


def _errstate(xp):
    """Silence NumPy's divide-by-zero warnings (CuPy does not warn, and has no ``errstate``)."""
    if hasattr(xp, "errstate"):
        return xp.errstate(divide="ignore", invalid="ignore")
    return contextlib.nullcontext()


def _mod(ad, bd, who: str):
    """``ad mod bd`` with Python's sign rule, and torch's error for an integer division by zero."""
    xp = _xp(ad if hasattr(ad, "dtype") else bd)  # one side is an array; the other may be a number
    if _integral(ad) and _integral(bd) and bool((xp.asarray(bd) == 0).any()):
        raise RuntimeError(f"ZeroDivisionError: {who}: integer modulo by zero")
    with _errstate(xp):  # a float modulo 0 is nan, as in torch: not worth a warning
        return xp.remainder(ad, bd)


def remainder(input, other) -> Tensor:
    """``input % other`` elementwise with Python's sign rule (the result has the sign of
    ``other``), as ``torch.remainder`` and ``numpy.mod``. Either side may be a number.

    Differentiable in float: ``d/dinput = 1``, ``d/dother = -floor(input / other)``. Integer
    tensors give integers (no gradient); an integer modulo zero raises ``RuntimeError`` as torch.

    Example::

        >>> import neural_arch as na
        >>> na.remainder(na.tensor([-3.0, 3.0]), 2).tolist(), (na.tensor([-3, 3]) % -2).tolist()
        ([1.0, 1.0], [-1, -1])
        >>> (5 % na.tensor([3.0, -3.0])).tolist()
        [2.0, -1.0]
    """
    if not isinstance(input, Tensor):
        if not isinstance(other, Tensor):
            raise TypeError("remainder(): expected a Tensor for input or other, got two numbers")
        return rremainder(other, input)
    bd, bt = _operand(input, other)
    ad = input.data
    out = _mod(ad, bd, "remainder")
    if not _needs(input, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = input.requires_grad, bt is not None

    def fn(g):
        gb = None
        if rb:
            with _errstate(_xp(g)):
                gb = unbroadcast(-g * _xp(g).floor_divide(ad, bd), bsh)
        return (unbroadcast(g, ash) if ra else None, gb)

    return _result(out, Node(fn, (input if ra else None, bt), "Remainder",
                                saved=(input,) if rb else None))


def rremainder(a: Tensor, b) -> Tensor:
    """``b % a`` (what ``number % tensor`` calls).

    Example::

        >>> import neural_arch as na
        >>> na.core.ops_basic.rremainder(na.tensor([4.0]), 7.0).tolist()
        [3.0]
    """
    bd, bt = _operand(a, b)
    ad = a.data
    out = _mod(bd, ad, "remainder")
    if not _needs(a, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())
    ra, rb = a.requires_grad, bt is not None

    def fn(g):
        ga = None
        if ra:
            with _errstate(_xp(g)):
                ga = unbroadcast(-g * _xp(g).floor_divide(bd, ad), ash)
        return (ga, unbroadcast(g, bsh) if rb else None)

    return _result(out, Node(fn, (a if ra else None, bt), "RRemainder",
                                saved=(b,) if ra else None))


def neg(a: Tensor) -> Tensor:
    """``-a`` elementwise.

    Example::

        >>> import neural_arch as na
        >>> (-na.tensor([1.0, -2.0])).tolist()
        [-1.0, 2.0]
    """
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
    """Matrix product with NumPy semantics: batched (broadcast batch dims) and 1-D cases.

    Example::

        >>> import neural_arch as na
        >>> (na.ones(2, 3) @ na.ones(3, 4)).shape
        (2, 4)
    """
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

    return _result(out, Node(fn, (a if ra else None, b if rb else None), "MatMul",
                                saved=(a, b)))


def rmatmul(a: Tensor, b) -> Tensor:
    """``b @ a`` (what ``array @ tensor`` calls).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> na.core.ops_basic.rmatmul(na.ones(3, 1), np.ones((2, 3), np.float32)).tolist()
        [[3.0], [3.0]]
    """
    b = b if isinstance(b, Tensor) else Tensor._wrap(_operand(a, b)[0])
    return matmul(b, a)


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
    T.__mod__ = remainder
    T.__rmod__ = rremainder
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
    T.remainder = remainder
    for name, op in (("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt),
                     ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)):
        setattr(T, name, _compare_method(name, op))
    T.equal = lambda self, other: bool(
        isinstance(other, Tensor) and self.shape == other.shape and bool((self.data == other.data).all())
    )
