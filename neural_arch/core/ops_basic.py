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

import builtins
import contextlib

import numpy as np

from .. import backend as _backend
from .autograd import Node
from .op_utils import (
    _SCALARS,
    _needs,
    _operand,
    _result,
    _xp,
    arith_operands,
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
    ad, bd, bt, od = arith_operands(a, b)
    out = ad + bd
    if od is not None:
        out = out.astype(od)
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
    ad, bd, bt, od = arith_operands(a, b)
    out = ad - bd
    if od is not None:
        out = out.astype(od)
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
    ad, bd, bt, od = arith_operands(a, b)
    out = bd - ad
    if od is not None:
        out = out.astype(od)
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
    ad, bd, bt, od = arith_operands(a, b)
    out = ad * bd
    if od is not None:
        out = out.astype(od)
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
    ad, bd, bt, od = arith_operands(a, b, True)
    out = ad / bd
    if od is not None:
        out = out.astype(od)
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
    ad, bd, bt, od = arith_operands(a, b, True)
    out = bd / ad
    if od is not None:
        out = out.astype(od)
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
    # torch's promotion (an integer tensor ** 0.5 is the default float, not float64)
    ad, bd, bt, od = arith_operands(a, b)
    out = ad**bd
    if od is not None:
        out = out.astype(od)
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
    ad, bd, bt, od = arith_operands(a, b)
    out = bd**ad
    if od is not None:
        out = out.astype(od)
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


# ============================================================================ einsum, bmm, outer, lerp
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum_explicit(equation: str, shapes):
    """``(input subscripts, output subscripts)`` with every ``...`` spelled out as letters (right
    aligned across operands, as broadcasting aligns them) and the implicit output made explicit
    (the ellipsis dims, then the letters used once, sorted: NumPy's and torch's rule)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(shapes):
        raise ValueError(f"einsum(): the equation names {len(subs)} operands but {len(shapes)} were given")
    used = {c for c in eq if c.isalpha()}
    free = [c for c in _LETTERS if c not in used]
    ell = [len(shp) - len(sub.replace("...", "")) for sub, shp in zip(subs, shapes)]
    n_ell = max([e for e, sub in zip(ell, subs) if "..." in sub] or [0])
    ell_letters = "".join(free[:n_ell])
    del free[:n_ell]
    subs = [sub.replace("...", ell_letters[n_ell - e:] if e else "") for sub, e in zip(subs, ell)]
    if arrow:
        out = rhs.replace("...", ell_letters)
    else:
        counts = {}
        for c in "".join(subs):
            counts[c] = counts.get(c, 0) + 1
        out = ell_letters + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell_letters))
    return subs, out, free


def einsum(equation: str, *operands) -> Tensor:
    """torch's ``einsum(equation, *operands)`` (operands also as one list): NumPy's Einstein
    summation, ellipsis and implicit output included, differentiable in every operand. The
    gradient of an operand is the einsum of the upstream gradient with the other operands; a
    letter repeated in one operand (a diagonal) and size-1 dims broadcast against other operands
    are handled.

    Example::

        >>> import neural_arch as na
        >>> a, b = na.ones(2, 3), na.ones(3, 4)
        >>> na.einsum("ij,jk->ik", a, b).shape, na.einsum("ii", na.eye(3)).item()
        ((2, 4), 3.0)
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ts = [t if isinstance(t, Tensor) else Tensor(t) for t in operands]
    if not ts:
        raise ValueError("einsum(): must provide at least one operand")
    datas = [t.data for t in ts]
    _backend_same_device(datas)
    xp = _xp(datas[0])
    # the spelled-out form: NumPy refuses an ellipsis summed away (``"i...->i"``), torch sums it
    subs, out_sub, free = _einsum_explicit(equation, [d.shape for d in datas])
    out = xp.asarray(xp.einsum(",".join(subs) + "->" + out_sub, *datas))
    if not _needs(*ts):
        return _result(out, None)
    sizes = {}
    for sub, d in zip(subs, datas):
        for c, n in zip(sub, d.shape):
            if n != 1 or c not in sizes:
                sizes[c] = n

    def grad_of(i, g):
        spare = list(free)
        target, eyes, present = [], [], set(out_sub).union(*(subs[j] for j in range(len(subs)) if j != i))
        for c, n in zip(subs[i], datas[i].shape):
            if n == 1 and sizes[c] != 1:  # broadcast against a larger dim: summed back to 1
                target.append(spare.pop())
            elif c in target:  # a repeated letter: a diagonal, written through an identity
                fresh = spare.pop()
                eyes.append(c + fresh)
                target.append(fresh)
                present.update(c + fresh)
            else:
                target.append(c)
        kept = "".join(c for c in target if c in present)
        ins = [out_sub] + [subs[j] for j in range(len(subs)) if j != i] + eyes
        arrays = [g] + [datas[j] for j in range(len(datas)) if j != i] + \
                 [xp.eye(sizes[e[0]], dtype=g.dtype) for e in eyes]
        gi = xp.einsum(",".join(ins) + "->" + kept, *arrays)
        gi = xp.asarray(gi).reshape([n if c in present else 1 for c, n in zip(target, datas[i].shape)])
        return xp.broadcast_to(gi, datas[i].shape).astype(datas[i].dtype, copy=False)

    def fn(g):
        return tuple(grad_of(i, g) if t.requires_grad else None for i, t in enumerate(ts))

    parents = tuple(t if t.requires_grad else None for t in ts)
    return _result(out, Node(fn, parents, "Einsum", saved=tuple(ts)))


def _backend_same_device(datas) -> None:
    if not all(type(d) is type(datas[0]) for d in datas):
        for d in datas[1:]:
            _backend.check_same_device(datas[0], d, "einsum")



def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """torch's ``bmm``: batched matrix product of two 3-d tensors ``(b, n, m) @ (b, m, p)``, with no
    broadcasting (a mismatched batch or inner size is torch's error; use ``matmul`` to broadcast).

    Example::

        >>> import neural_arch as na
        >>> na.bmm(na.ones(2, 3, 4), na.ones(2, 4, 5)).shape
        (2, 3, 5)
    """
    a, b = input, mat2
    if not isinstance(b, Tensor):
        raise TypeError(f"bmm(): mat2 must be a Tensor, got {type(b).__name__}")
    if a.ndim != 3 or b.ndim != 3:
        raise RuntimeError(f"bmm(): batch1 and batch2 must be 3D tensors, got {a.ndim}D and {b.ndim}D")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise RuntimeError(f"bmm(): expected size {list(a.shape)} @ {list(b.shape)} to have the same batch "
                           f"and matching inner sizes")
    return matmul(a, b)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """torch's ``outer`` (alias ``ger``): ``out[i, j] = input[i] * vec2[j]`` for two 1-d tensors.

    Example::

        >>> import neural_arch as na
        >>> na.outer(na.tensor([1.0, 2.0]), na.tensor([1.0, 10.0, 100.0])).tolist()
        [[1.0, 10.0, 100.0], [2.0, 20.0, 200.0]]
    """
    b = vec2 if isinstance(vec2, Tensor) else Tensor(vec2)
    if input.ndim != 1 or b.ndim != 1:
        raise RuntimeError(f"outer(): expected two 1-D tensors, got {input.ndim}D and {b.ndim}D")
    return mul(input.reshape(-1, 1), b.reshape(1, -1))


def lerp(input: Tensor, end: Tensor, weight) -> Tensor:
    """torch's ``lerp(input, end, weight)``: ``input + weight * (end - input)`` elementwise, with
    broadcasting; ``weight`` a number or a tensor, differentiable in all three.

    Example::

        >>> import neural_arch as na
        >>> na.lerp(na.zeros(2), na.tensor([1.0, 2.0]), 0.25).tolist()
        [0.25, 0.5]
    """
    end = end if isinstance(end, Tensor) else Tensor(end)
    if end.dtype != input.dtype:
        raise RuntimeError(f"lerp(): expected dtype {input.dtype} for `end` but got dtype {end.dtype}")
    return add(input, mul(sub(end, input), weight))


def isclose(input: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """torch's ``isclose``: ``|input - other| <= atol + rtol * |other|`` elementwise (equal infinities
    are close; NaN only with ``equal_nan``), as a bool tensor; the dtypes must match (torch).

    Example::

        >>> import neural_arch as na
        >>> na.isclose(na.tensor([1.0, 2.0]), na.tensor([1.0 + 1e-9, 2.1])).tolist()
        [True, False]
    """
    od = other.data if isinstance(other, Tensor) else other
    xd = input.data
    if hasattr(od, "dtype") and not isinstance(od, (np.generic,)) and od.dtype != xd.dtype:
        raise RuntimeError(f"isclose(): {xd.dtype} did not match {od.dtype}")
    if type(od) is not type(xd) and hasattr(od, "dtype") and not isinstance(od, np.generic):
        _backend.check_same_device(xd, od, "isclose")
    return _result(_xp(xd).isclose(xd, od, rtol=rtol, atol=atol, equal_nan=equal_nan), None)


def allclose(input: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """torch's ``allclose``: whether :func:`isclose` holds everywhere (a Python bool).

    Example::

        >>> import neural_arch as na
        >>> na.allclose(na.tensor([1.0]), na.tensor([1.0 + 1e-9])), na.allclose(na.ones(2), na.zeros(2))
        (True, False)
    """
    return builtins.bool(isclose(input, other, rtol, atol, equal_nan).data.all())


# ============================================================================ torch's function signatures
def _tensor_first(input, other, op: str):
    """torch's binary functions take a number on either side; ours dispatch on the Tensor."""
    if isinstance(input, Tensor):
        return input, other, False
    if isinstance(other, Tensor):
        return other, input, True
    raise TypeError(f"{op}(): expected a Tensor for input or other, got {type(input).__name__} and "
                    f"{type(other).__name__}")


def torch_add(input, other, *, alpha=1) -> Tensor:
    """torch's ``add(input, other, *, alpha=1)``: ``input + alpha * other``.

    Example::

        >>> import neural_arch as na
        >>> na.add(na.tensor([1.0, 2.0]), na.tensor([1.0, 1.0]), alpha=2).tolist(), na.add(1, na.ones(1)).tolist()
        ([3.0, 4.0], [2.0])
    """
    if alpha != 1:
        other = other * alpha
    t, o, _ = _tensor_first(input, other, "add")
    return add(t, o)


def torch_sub(input, other, *, alpha=1) -> Tensor:
    """torch's ``sub(input, other, *, alpha=1)``: ``input - alpha * other``.

    Example::

        >>> import neural_arch as na
        >>> na.sub(na.tensor([3.0]), na.tensor([1.0]), alpha=2).tolist(), na.sub(1, na.ones(1)).tolist()
        ([1.0], [0.0])
    """
    if alpha != 1:
        other = other * alpha
    t, o, swapped = _tensor_first(input, other, "sub")
    return rsub(t, o) if swapped else sub(t, o)


def torch_mul(input, other) -> Tensor:
    """torch's ``mul(input, other)`` (a number on either side).

    Example::

        >>> import neural_arch as na
        >>> na.mul(2, na.tensor([1.0, 3.0])).tolist()
        [2.0, 6.0]
    """
    t, o, _ = _tensor_first(input, other, "mul")
    return mul(t, o)


def torch_pow(input, exponent) -> Tensor:
    """torch's ``pow(input, exponent)``: either side may be a number (``pow(2, t)`` is ``2 ** t``).

    Example::

        >>> import neural_arch as na
        >>> na.pow(na.tensor([2.0, 3.0]), 2).tolist(), na.pow(2, na.tensor([1.0, 3.0])).tolist()
        ([4.0, 9.0], [2.0, 8.0])
    """
    t, o, swapped = _tensor_first(input, exponent, "pow")
    return rpow(t, o) if swapped else pow(t, o)


def torch_div(input, other, *, rounding_mode=None) -> Tensor:
    """torch's ``div(input, other, *, rounding_mode=None)``: true division, or rounded toward
    ``"trunc"`` zero or ``"floor"`` minus infinity (integer inputs then stay integers; the rounded
    quotient has a zero gradient).

    Example::

        >>> import neural_arch as na
        >>> na.div(na.tensor([-7.0, 7.0]), 2, rounding_mode="floor").tolist(), na.div(na.tensor([-7, 7]), 2, rounding_mode="trunc").tolist()
        ([-4.0, 3.0], [-3, 3])
    """
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                         f"{rounding_mode!r}")
    t, o, swapped = _tensor_first(input, other, "div")
    if rounding_mode is None:
        return rdiv(t, o) if swapped else div(t, o)
    od, _ = _operand(t, o)
    num, den = (od, t.data) if swapped else (t.data, od)
    xp = _xp(t.data)
    if _integral(num) and _integral(den):
        if bool((xp.asarray(den) == 0).any()):
            raise RuntimeError("ZeroDivisionError: div: integer division by zero")
        q = xp.floor_divide(num, den)
        if rounding_mode == "trunc":  # floor differs from trunc where the exact quotient is negative
            q = q + ((q < 0) & (q * den != num))
        return Tensor._wrap(xp.asarray(q))
    with _errstate(xp):
        q = xp.true_divide(num, den)
        q = xp.floor(q) if rounding_mode == "floor" else xp.trunc(q)
    parents = tuple(v if isinstance(v, Tensor) and v.requires_grad else None for v in (t, o))
    if not _needs(*parents):
        return _result(xp.asarray(q), None)
    shapes = tuple(v.data.shape if v is not None else None for v in parents)
    # a rounded quotient is piecewise constant: a zero gradient (torch)
    return _result(xp.asarray(q), Node(lambda g: tuple(None if sh is None else xp.zeros(sh, dtype=g.dtype)
                                                        for sh in shapes), parents, "DivRounded"))


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
    T.bmm, T.outer, T.ger, T.lerp, T.isclose, T.allclose = bmm, outer, outer, lerp, isclose, allclose
    for name, op in (("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt),
                     ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)):
        setattr(T, name, _compare_method(name, op))
    T.equal = lambda self, other: bool(
        isinstance(other, Tensor) and self.shape == other.shape and bool((self.data == other.data).all())
    )
