"""Elementwise math and activations, and the softmax family: ``exp``, ``log``, ``sqrt``, ``abs``,
``tanh``, ``sigmoid``, ``relu``, ``leaky_relu``, ``silu``, ``softplus``, ``gelu``, ``clip``, ``where``,
``masked_fill``, ``softmax``, ``log_softmax`` (one fused node each, with its hand-derived backward).

This module binds their Tensor methods (``x.relu()``, ``x.softmax(-1)``...); their functional
face is :mod:`neural_arch.nn.functional`.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.core.ops_activation import log_softmax, relu
    >>> relu(Tensor(np.array([-1.0, 2.0]))).tolist()
    [0.0, 2.0]
    >>> round(float(np.exp(log_softmax(Tensor(np.zeros(4))).data).sum()), 6)
    1.0
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from neural_arch.core import device_kernels

from . import dtypes as _dtypes
from .autograd import Node
from .op_utils import _needs, _result, _same_device, _xp, unbroadcast
from .tensor import Tensor
from .thread_pool import parallel_chunks


# ============================================================================ elementwise
def _require_float(xd, op: str) -> None:
    """Refuse an integer or bool input where the op's arithmetic would be cast back to integers
    (torch raises for these too: ``"silu_cpu" not implemented for 'Long'``)."""
    if xd.dtype.kind in "biu":
        raise TypeError(f"{op}: expected a floating-point tensor, got dtype {xd.dtype}; convert it with "
                        f".float() (or .double()) first")


def exp(x: Tensor) -> Tensor:
    """Elementwise ``e ** x``; the gradient is the result itself.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([0.0]).exp().tolist()
        [1.0]
    """
    xd = _float_input(x.data)  # torch: integer input gives the default float dtype
    out = _xp(xd).exp(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * out,), (x,), "Exp"))


def log(x: Tensor) -> Tensor:
    """Elementwise natural logarithm; the gradient is ``1 / x``.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0]).log().tolist()
        [0.0]
    """
    xd = _float_input(x.data)  # torch: integer input gives the default float dtype
    out = _xp(xd).log(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g / xd,), (x,), "Log"))


def sqrt(x: Tensor) -> Tensor:
    """Elementwise square root; the gradient is ``0.5 / sqrt(x)``.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([4.0, 9.0]).sqrt().tolist()
        [2.0, 3.0]
    """
    xd = _float_input(x.data)  # torch: integer input gives the default float dtype
    out = _xp(xd).sqrt(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g / (2 * out),), (x,), "Sqrt"))


def abs(x: Tensor) -> Tensor:
    """Elementwise absolute value; the gradient is ``sign(x)`` (0 at 0).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-1.5, 2.0]).abs().tolist()
        [1.5, 2.0]
    """
    xd = x.data
    xp = _xp(xd)
    out = xp.abs(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * xp.sign(xd),), (x,), "Abs"))


def tanh(x: Tensor) -> Tensor:
    """Elementwise hyperbolic tangent; the gradient is ``1 - tanh(x) ** 2``.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([0.0]).tanh().tolist()
        [0.0]
    """
    xd = _float_input(x.data)  # torch: integer input gives the default float dtype
    out = _xp(xd).tanh(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * (1 - out * out),), (x,), "Tanh"))


def _sigmoid_array(xp, xd):
    # exp(-|x|) never overflows; pick the stable form per sign.
    e = xp.exp(-xp.abs(xd))
    return xp.where(xd >= 0, 1 / (1 + e), e / (1 + e)).astype(xd.dtype, copy=False)


def sigmoid(x: Tensor) -> Tensor:
    """Elementwise logistic function ``1 / (1 + exp(-x))``, computed without overflow.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([0.0]).sigmoid().tolist()
        [0.5]
    """
    xd = x.data
    if xd.dtype.kind in "biu":  # torch: an integer or bool input gives the default float dtype
        xd = xd.astype(_dtypes.default_float_dtype)
    out = _sigmoid_array(_xp(xd), xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * out * (1 - out),), (x,), "Sigmoid"))


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)`` elementwise; the gradient is 1 where ``x > 0``, else 0.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-1.0, 2.0]).relu().tolist()
        [0.0, 2.0]
    """
    xd = x.data
    xp = _xp(xd)
    out = xp.maximum(xd, 0)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * (xd > 0),), (x,), "Relu"))


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` where positive, ``negative_slope * x`` elsewhere.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.leaky_relu(na.tensor([-1.0, 2.0]), 0.5).tolist()
        [-0.5, 2.0]
    """
    xd = x.data
    xp = _xp(xd)
    pos = xd > 0
    out = xp.where(pos, xd, xd * negative_slope)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (xp.where(pos, g, g * negative_slope),), (x,), "LeakyRelu"))


def silu(x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (a.k.a. swish).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.silu(na.tensor([0.0])).tolist()
        [0.0]
    """
    xd = x.data
    _require_float(xd, "silu")
    s = _sigmoid_array(_xp(xd), xd)
    out = xd * s
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * (s * (1 + xd * (1 - s))),), (x,), "Silu"))


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """torch's ``F.softplus``: ``log(1 + exp(beta * x)) / beta``, and ``x`` itself where
    ``beta * x > threshold`` (the linear regime, as torch). Computed without overflow; the gradient
    is ``sigmoid(beta * x)`` (1 in the linear regime).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.softplus(na.tensor([-1.0, 0.0, 30.0])).tolist()]
        [0.3133, 0.6931, 30.0]
        >>> [round(v, 4) for v in F.softplus(na.tensor([1.0]), beta=2.0).tolist()]
        [1.0635]
    """
    x = input
    xd = x.data
    _require_float(xd, "softplus")
    xp = _xp(xd)
    bx = xd * beta  # a Python float keeps the dtype
    linear = bx > threshold
    # log(1 + e^z) = max(z, 0) + log1p(e^-|z|): no overflow for any z
    soft = (xp.maximum(bx, 0) + xp.log1p(xp.exp(-xp.abs(bx)))) / beta
    out = xp.where(linear, xd, soft).astype(xd.dtype, copy=False)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        return (xp.where(linear, g, g * _sigmoid_array(xp, bx)),)

    return _result(out, Node(fn, (x,), "Softplus"))


# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t*P(t)*exp(-z^2), t = 1/(1 + p|z|), |error| < 1.5e-7
# in exact arithmetic; float64 keeps that (1.39e-7 measured), float32 arithmetic reaches 5.2e-7
# (5.3e-7 with the earlier expression form). NumPy has no erf.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(xp, x):
    """Vectorised erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7); NumPy has no erf."""
    shape = x.shape
    x = x.reshape(-1)  # 1-d: ufuncs on 0-d arrays return scalars, which out= cannot take
    q, _ = _erfc_abs_and_gauss(xp, x)
    xp.subtract(1.0, q, out=q)
    return xp.copysign(q, x, out=q).reshape(shape)


def _erfc_abs_and_gauss(xp, z):
    """``(erfc(|z|), exp(-z*z))`` as two fresh arrays of ``z``'s dtype.

    Every step writes in place: the former expression form spent most of its time allocating and
    page-faulting about fifteen temporaries; this one makes two (docs/benchmarks.md, fused GELU).
    """
    t = xp.abs(z)
    t *= _AS_P
    t += 1.0
    xp.divide(1.0, t, out=t)
    q = xp.multiply(t, _AS_A[4])
    for coef in _AS_A[3::-1]:  # Horner: q = t*(a0 + t*(a1 + t*(a2 + t*(a3 + t*a4))))
        q += coef
        q *= t
    xp.multiply(z, z, out=t)
    xp.negative(t, out=t)
    xp.exp(t, out=t)
    q *= t
    return q, t


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# The A&S coefficients halved (exact: a power-of-two scaling), so the polynomial gives erfc(|z|) / 2,
# which is what Phi(x) = 1/2 + sign(x) * (1/2 - erfc(|z|) / 2) needs.
_AS_A_HALF = tuple(0.5 * a for a in _AS_A)


# The sign bit of each float dtype as its same-width integer: copysign(q, x) for q >= 0 is
# q | (x & sign), two integer passes where NumPy's copysign is a scalar loop several times slower.
_SIGN_BIT = {np.dtype(np.float32): np.int32(-(1 << 31)), np.dtype(np.float64): np.int64(-(1 << 63))}


def _gelu_erf_kernel(xp, x, q, e, need_grad: bool) -> None:
    """Exact GELU ``x * Phi(x)`` into ``q`` and, when ``need_grad``, its derivative
    ``Phi(x) + x * phi(x)`` into ``e`` (otherwise ``e`` is scratch); all three 1-d, one length.

    One fused pass over two arrays: ``e`` first holds ``t = 1 / (1 + p|z|)`` (``z = x / sqrt(2)``)
    while ``q`` accumulates the polynomial; ``e`` then becomes ``exp(-z^2)``, which is both erf's
    Gaussian factor and ``sqrt(2 pi) * phi(x)`` (the backward needs no second ``exp``), and ends as
    the derivative; ``q`` ends as the output. Chunks of an array give the unsplit result exactly.
    """
    t = xp.abs(x, out=e)
    t *= _AS_P * _INV_SQRT_2
    t += 1.0
    xp.divide(1.0, t, out=t)
    xp.multiply(t, _AS_A_HALF[4], out=q)
    for coef in _AS_A_HALF[3::-1]:  # Horner: q = t*(a0 + t*(a1 + t*(a2 + t*(a3 + t*a4)))) / 2
        q += coef
        q *= t
    xp.multiply(x, x, out=t)
    t *= -0.5
    xp.exp(t, out=t)  # exp(-z^2)
    q *= t  # erfc(|z|) / 2
    xp.subtract(0.5, q, out=q)  # (1 - erfc(|z|)) / 2 = erf(|z|) / 2 >= 0
    sign = _SIGN_BIT.get(x.dtype) if xp is np else None
    if sign is not None:
        bits = q.view(sign.dtype)
        xp.bitwise_or(bits, xp.bitwise_and(x.view(sign.dtype), sign), out=bits)
    else:
        xp.copysign(q, x, out=q)
    q += 0.5  # Phi(x)
    if need_grad:
        t *= _INV_SQRT_2PI  # phi(x)
        t *= x
        t += q
    q *= x


def _gelu_erf_arrays(xp, xd, need_grad: bool):
    """``(gelu(xd), gelu'(xd) or None)``: :func:`_gelu_erf_kernel` on fresh arrays, a large NumPy
    array split over the core's thread pool (:mod:`neural_arch.core.thread_pool`)."""
    shape = xd.shape
    x = xd.reshape(-1)  # 1-d: ufuncs on 0-d arrays return scalars, which out= cannot take
    q = xp.empty_like(x)
    e = xp.empty_like(x)
    if type(x) is np.ndarray:
        parallel_chunks(x.size, lambda lo, hi: _gelu_erf_kernel(np, x[lo:hi], q[lo:hi], e[lo:hi], need_grad),
                        work=25 * x.size)
    else:
        _gelu_erf_kernel(xp, x, q, e, need_grad)
    return q.reshape(shape), (e.reshape(shape) if need_grad else None)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU. ``approximate="none"``: ``x * Phi(x)`` (erf form, torch's default);
    ``"tanh"``: the tanh approximation used by GPT-2.

    Example::

        >>> import numpy as np
        >>> round(float(gelu(Tensor(np.array([1.0]))).data[0]), 6)
        0.841345
    """
    xd = x.data
    if xd.dtype.kind in "biu":
        _require_float(xd, "gelu")
    xp = _xp(xd)
    if xp is not np and approximate in ("none", "tanh") and device_kernels.applies(xd):
        return _gelu_device(x, xp, approximate)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (xd + 0.044715 * xd * xd * xd)
        th = xp.tanh(inner)
        out = 0.5 * xd * (1 + th)

        def fn(g):
            dinner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * xd * xd)
            return (g * (0.5 * (1 + th) + 0.5 * xd * (1 - th * th) * dinner),)

    elif approximate == "none":
        out, dgelu = _gelu_erf_arrays(xp, xd, _needs(x))
        if dgelu is not None:
            dgelu = dgelu.astype(xd.dtype, copy=False)

        def fn(g):
            return (g * dgelu,)

    else:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    out = out.astype(xd.dtype, copy=False)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(fn, (x,), "Gelu"))


def _gelu_device(x: Tensor, xp, approximate: str) -> Tensor:
    """:func:`gelu` on a device: forward and derivative in one kernel (neural_arch.core.device_kernels)."""
    out, dgelu = device_kernels.gelu(xp, x.data, approximate, _needs(x))
    if dgelu is None:
        return _result(out, None)
    return _result(out, Node(lambda g: (g * dgelu,), (x,), "Gelu"))


# ============================================================================ more elementwise math
def _float_input(xd):
    """torch's rule for a floating op: integer and bool input gives the default float dtype."""
    return xd.astype(_dtypes.default_float_dtype) if xd.dtype.kind in "biu" else xd


def _erf_array(xp, xd):
    """erf to the dtype's full precision (the A&S form above is good to 1.5e-7 only, too coarse
    for float64): the standard library's per element on the host, CuPy's special function on a device."""
    if xp is np:
        flat = np.fromiter((math.erf(v) for v in xd.reshape(-1).tolist()), dtype=np.float64, count=xd.size)
        return flat.reshape(xd.shape).astype(xd.dtype, copy=False)
    from cupyx.scipy import special  # only reached with CuPy arrays

    return special.erf(xd)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)

#: name -> (forward(xp, x), derivative(xp, x, out) or None for a piecewise-constant op, promotes
#: integer input to float): the unary ops added for torch's namespace, one node each
_UNARY = {
    "sin": (lambda xp, x: xp.sin(x), lambda xp, x, out: xp.cos(x), True),
    "cos": (lambda xp, x: xp.cos(x), lambda xp, x, out: -xp.sin(x), True),
    "erf": (_erf_array, lambda xp, x, out: _TWO_OVER_SQRT_PI * xp.exp(-x * x), True),
    "expm1": (lambda xp, x: xp.expm1(x), lambda xp, x, out: out + 1, True),
    "log1p": (lambda xp, x: xp.log1p(x), lambda xp, x, out: 1 / (x + 1), True),
    "log2": (lambda xp, x: xp.log2(x), lambda xp, x, out: 1 / (x * _LN2), True),
    "floor": (lambda xp, x: xp.floor(x), None, False),
    "ceil": (lambda xp, x: xp.ceil(x), None, False),
    "sign": (lambda xp, x: xp.where(xp.isnan(x), 0, xp.sign(x)), None, False),  # torch: sign(nan) = 0
    "tan": (lambda xp, x: xp.tan(x), lambda xp, x, out: 1 + out * out, True),
    "sinh": (lambda xp, x: xp.sinh(x), lambda xp, x, out: xp.cosh(x), True),
    "cosh": (lambda xp, x: xp.cosh(x), lambda xp, x, out: xp.sinh(x), True),
    "asin": (lambda xp, x: xp.arcsin(x), lambda xp, x, out: 1 / xp.sqrt(1 - x * x), True),
    "acos": (lambda xp, x: xp.arccos(x), lambda xp, x, out: -1 / xp.sqrt(1 - x * x), True),
    "atan": (lambda xp, x: xp.arctan(x), lambda xp, x, out: 1 / (1 + x * x), True),
    "log10": (lambda xp, x: xp.log10(x), lambda xp, x, out: 1 / (x * _LN10), True),
    "reciprocal": (lambda xp, x: 1 / x, lambda xp, x, out: -out * out, True),
    "rsqrt": (lambda xp, x: 1 / xp.sqrt(x), lambda xp, x, out: -0.5 * out * out * out, True),
    "trunc": (lambda xp, x: xp.trunc(x), None, False),
    # x - trunc(x): the gradient is 1 (torch's), so not piecewise constant; integers refused below
    "frac": (lambda xp, x: x - xp.trunc(x), lambda xp, x, out: xp.ones_like(x), False),
}


def _unary(name: str, x: Tensor) -> Tensor:
    forward, derivative, promotes = _UNARY[name]
    xd = x.data
    if promotes:
        xd = _float_input(xd)
    elif xd.dtype.kind in "biu":  # torch keeps an integer dtype: floor/ceil/trunc are the identity there
        if name == "frac":  # torch's kernel is floating-point only
            raise RuntimeError(f"frac: not implemented for integer tensors (got {xd.dtype}); an integer "
                               f"has no fractional part, so convert first (x.float().frac()) or use zeros")
        return _result(xd.copy() if name != "sign" or xd.dtype.kind == "b" else _xp(xd).sign(xd), None)
    xp = _xp(xd)
    with np.errstate(divide="ignore", invalid="ignore"):  # log2(0) = -inf, log1p(-2) = nan: as torch
        out = forward(xp, xd)
    out = out.astype(xd.dtype, copy=False)
    if not _needs(x):
        return _result(out, None)
    if derivative is None:  # piecewise constant: a zero gradient (torch)
        return _result(out, Node(lambda g: (xp.zeros_like(g),), (x,), name.capitalize()))

    def fn(g):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (g * derivative(xp, xd, out).astype(xd.dtype, copy=False),)

    return _result(out, Node(fn, (x,), name.capitalize()))


def _unary_op(name: str, formula: str, example: str):
    def op(input: Tensor) -> Tensor:
        return _unary(name, input)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"torch's ``{name}``: {formula} elementwise.\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> {example}\n"
    )
    return op


sin = _unary_op("sin", "the sine; integer input gives the default float dtype",
                "na.sin(na.tensor([0.0])).tolist()\n    [0.0]")
cos = _unary_op("cos", "the cosine; integer input gives the default float dtype",
                "na.cos(na.tensor([0.0])).tolist()\n    [1.0]")
erf = _unary_op("erf", "the error function, to full float64 precision",
                "import math\n    >>> na.erf(na.tensor([1.0], dtype=na.float64)).item() == math.erf(1.0)\n    True")
expm1 = _unary_op("expm1", "``exp(x) - 1``, exact for small ``x``",
                  "na.expm1(na.tensor([0.0])).tolist()\n    [0.0]")
log1p = _unary_op("log1p", "``log(1 + x)``, exact for small ``x``",
                  "na.log1p(na.tensor([0.0])).tolist()\n    [0.0]")
log2 = _unary_op("log2", "the base-2 logarithm",
                 "na.log2(na.tensor([8.0])).tolist()\n    [3.0]")
floor = _unary_op("floor", "the largest integer not above ``x`` (an integer tensor is returned as "
                  "is; zero gradient)", "na.floor(na.tensor([-1.5, 1.5])).tolist()\n    [-2.0, 1.0]")
ceil = _unary_op("ceil", "the smallest integer not below ``x`` (an integer tensor is returned as "
                 "is; zero gradient)", "na.ceil(na.tensor([-1.5, 1.5])).tolist()\n    [-1.0, 2.0]")
tan = _unary_op("tan", "the tangent; integer input gives the default float dtype",
                "na.tensor([0.0]).tan().tolist()\n    [0.0]")
sinh = _unary_op("sinh", "the hyperbolic sine", "na.tensor([0.0]).sinh().tolist()\n    [0.0]")
cosh = _unary_op("cosh", "the hyperbolic cosine", "na.tensor([0.0]).cosh().tolist()\n    [1.0]")
asin = _unary_op("asin", "the arcsine (NaN outside [-1, 1])", "na.tensor([0.0]).asin().tolist()\n    [0.0]")
acos = _unary_op("acos", "the arccosine (NaN outside [-1, 1])", "na.tensor([1.0]).acos().tolist()\n    [0.0]")
atan = _unary_op("atan", "the arctangent", "na.tensor([0.0]).atan().tolist()\n    [0.0]")
log10 = _unary_op("log10", "the base-10 logarithm", "na.tensor([100.0]).log10().tolist()\n    [2.0]")
reciprocal = _unary_op("reciprocal", "``1 / x``; integer input gives the default float dtype",
                       "na.tensor([4, 2]).reciprocal().tolist()\n    [0.25, 0.5]")
rsqrt = _unary_op("rsqrt", "``1 / sqrt(x)``", "na.tensor([4.0]).rsqrt().tolist()\n    [0.5]")
trunc = _unary_op("trunc", "the integer part, rounded toward zero (an integer tensor is returned as is; "
                  "zero gradient)", "na.tensor([-1.5, 1.5]).trunc().tolist()\n    [-1.0, 1.0]")
frac = _unary_op("frac", "``x - trunc(x)``, the fractional part with ``x``'s sign (gradient 1; floats only)",
                 "na.tensor([-1.5, 2.25]).frac().tolist()\n    [-0.5, 0.25]")
sign = _unary_op("sign", "-1, 0 or 1, and 0 for NaN as torch (integer and bool dtypes kept; zero gradient)",
                 "na.sign(na.tensor([-2.0, 0.0, 3.0])).tolist()\n    [-1.0, 0.0, 1.0]")


# Not module-level `round`: this module's examples use Python's builtin of that name (as ops_reduce
# keeps `_any`/`_all`); neural_arch.round and Tensor.round are this function.
def _round(input: Tensor, *, decimals: int = 0) -> Tensor:
    """torch's ``round(input, *, decimals=0)``: to the nearest integer, halves to even (as torch
    and NumPy), or to ``decimals`` decimal places; integer input is returned as is. Zero gradient.

    Example::

        >>> import neural_arch as na
        >>> na.round(na.tensor([0.5, 1.5, -2.5])).tolist(), na.round(na.tensor([1.26], dtype=na.float64), decimals=1).tolist()
        ([0.0, 2.0, -2.0], [1.3])
    """
    xd = input.data
    if xd.dtype.kind in "biu":
        return _result(xd.copy(), None)
    xp = _xp(xd)
    out = xp.round(xd, int(decimals)).astype(xd.dtype, copy=False)
    if not _needs(input):
        return _result(out, None)
    return _result(out, Node(lambda g: (xp.zeros_like(g),), (input,), "Round"))


def atan2(input: Tensor, other) -> Tensor:
    """torch's ``atan2(input, other)``: the angle of the point ``(other, input)`` elementwise, with
    broadcasting; integer input gives the default float dtype. Gradients: ``other / r2`` to
    ``input`` and ``-input / r2`` to ``other`` (``r2 = input**2 + other**2``).

    Example::

        >>> import neural_arch as na
        >>> round(na.atan2(na.tensor([1.0]), na.tensor([1.0])).item(), 6)
        0.785398
    """
    ot = other if isinstance(other, Tensor) else Tensor(other)
    yd, xd = input.data, ot.data
    _same_device([yd, xd], "atan2")
    if yd.dtype.kind in "biu" and xd.dtype.kind in "biu":
        yd, xd = _float_input(yd), _float_input(xd)
    elif yd.dtype.kind in "biu":  # torch: the integer side takes the float side's dtype
        yd = yd.astype(xd.dtype)
    elif xd.dtype.kind in "biu":
        xd = xd.astype(yd.dtype)
    xp = _xp(yd)
    out = xp.arctan2(yd, xd)
    if out.dtype.kind in "biu":
        out = out.astype(_dtypes.default_float_dtype)
    ry, rx = input.requires_grad, ot.requires_grad
    if not _needs(input if ry else None, ot if rx else None):
        return _result(out, None)
    ysh, xsh = yd.shape, xd.shape

    def fn(g):
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = yd * yd + xd * xd
            return (unbroadcast(g * xd / r2, ysh).astype(yd.dtype, copy=False) if ry else None,
                    unbroadcast(-g * yd / r2, xsh).astype(xd.dtype, copy=False) if rx else None)

    return _result(out, Node(fn, (input if ry else None, ot if rx else None), "Atan2", saved=(input, ot)))


def nan_to_num(input: Tensor, nan: float = 0.0, posinf=None, neginf=None) -> Tensor:
    """torch's ``nan_to_num``: NaN becomes ``nan``, +inf ``posinf`` and -inf ``neginf`` (by default
    the dtype's largest and smallest finite values). The gradient passes where the input was finite
    and is zero where it was replaced (torch).

    Example::

        >>> import neural_arch as na
        >>> na.nan_to_num(na.tensor([float("nan"), 1.0, float("-inf")]), neginf=-9.0).tolist()
        [0.0, 1.0, -9.0]
    """
    xd = input.data
    if xd.dtype.kind in "biu":
        return _result(xd.copy(), None)
    xp = _xp(xd)
    out = xp.nan_to_num(xd, copy=True, nan=nan, posinf=posinf, neginf=neginf)
    if not _needs(input):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * xp.isfinite(xd),), (input,), "NanToNum"))


def clip(x: Tensor, min=None, max=None) -> Tensor:
    """Clamp to ``[min, max]`` (either may be None; numbers or tensors that broadcast with ``x``),
    as torch's ``clamp``: ``minimum(maximum(x, min), max)``, so ``max`` wins where ``min > max``.

    ``x``'s gradient is 1 where ``min <= x <= max``, else 0. A tensor bound that requires grad
    receives the gradient where its value was picked (torch's rule: ``min`` where ``x < min < max``,
    ``max`` where ``x > max`` or ``min > max``); gradients are summed back to each input's shape.

    Example::

        >>> import neural_arch as na
        >>> na.core.clamp(na.tensor([-2.0, 0.5, 3.0]), min=0.0, max=1.0).tolist()
        [0.0, 0.5, 1.0]
    """
    if min is None and max is None:
        raise ValueError("clip: give at least one of min= or max=")
    xd = x.data
    xp = _xp(xd)
    lo = min.data if isinstance(min, Tensor) else min
    hi = max.data if isinstance(max, Tensor) else max
    out = xd
    if lo is not None:
        out = xp.maximum(out, lo)
    if hi is not None:
        out = xp.minimum(out, hi)
    if xd.dtype.kind not in "biu":  # keep a float dtype (bfloat16 too); an int one clamped to 1.5 is float (torch)
        out = out.astype(xd.dtype, copy=False)
    elif out.dtype.kind == "f":  # torch: the float bound's dtype, the default float for a Python float
        floats = [b.dtype for b in (lo, hi) if getattr(b, "dtype", None) is not None and b.dtype.kind == "f"]
        out = out.astype(np.result_type(*floats) if floats else _dtypes.default_float_dtype, copy=False)
    lot = min if isinstance(min, Tensor) and min.requires_grad else None
    hit = max if isinstance(max, Tensor) and max.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, lot, hit):
        return _result(out, None)
    xsh = xd.shape

    def fn(g):
        keep = True
        if lo is not None:
            keep = xd >= lo
        if hi is not None:
            keep = keep & (xd <= hi) if lo is not None else (xd <= hi)
        gx = unbroadcast(g * keep, xsh) if rx else None
        glo = ghi = None
        if lot is not None:  # the lower bound was the value picked
            picked = (xd < lo) & (lo < hi) if hi is not None else (xd < lo)
            glo = unbroadcast(g * picked, lo.shape).astype(lo.dtype, copy=False)
        if hit is not None:
            picked = (xd > hi) | (lo > hi) if lo is not None else (xd > hi)
            ghi = unbroadcast(g * picked, hi.shape).astype(hi.dtype, copy=False)
        return gx, glo, ghi

    return _result(out, Node(fn, (x if rx else None, lot, hit), "Clip", saved=(x, min, max)))


clamp = clip


_NOT_GIVEN = object()


def where(cond, a=_NOT_GIVEN, b=_NOT_GIVEN):
    """Pick from ``a`` where ``cond`` is true, else ``b`` (broadcasting; a or b may be scalars).
    ``cond`` must be boolean (torch's error otherwise); two Python numbers, or a Python float
    against an integer tensor, give torch's default float dtype. ``where(cond)`` alone is torch's
    ``nonzero(cond, as_tuple=True)``.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([-1.0, 2.0])
        >>> na.core.ops_activation.where(x.data > 0, x, 0.0).tolist()
        [0.0, 2.0]
    """
    cd = cond.data if isinstance(cond, Tensor) else cond
    if a is _NOT_GIVEN and b is _NOT_GIVEN:  # torch.where(condition): the indices of the true elements
        cx = _xp(cd)
        hits = cx.nonzero(cd.reshape(1) if cd.ndim == 0 else cd)
        return tuple(_result(i.astype(cx.int64, copy=False), None) for i in hits)
    if a is _NOT_GIVEN or b is _NOT_GIVEN:
        raise TypeError("where(condition, input, other): give both input and other, or neither")
    if hasattr(cd, "dtype") and cd.dtype != np.bool_:  # torch: a float mask is a bug, not "non-zero"
        raise TypeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype "
                        f"{cd.dtype}; compare it first (e.g. x > 0) or convert it with .bool()")
    at = a if isinstance(a, Tensor) else None
    bt = b if isinstance(b, Tensor) else None
    ad = at.data if at is not None else a
    bd = bt.data if bt is not None else b
    arrays = [d for d in (cd, ad, bd) if hasattr(d, "dtype") and not isinstance(d, np.generic)]
    if arrays:
        _same_device(arrays, "where")
    xp = _xp(arrays[0]) if arrays else np
    out = xp.where(cd, ad, bd)
    if out.dtype.kind == "f" and not builtins.any(
            hasattr(d, "dtype") and d.dtype.kind in "fc" for d in (ad, bd)):
        # a Python float against Python numbers or an integer tensor: torch's default float dtype
        # (NumPy would make it float64)
        out = out.astype(_dtypes.default_float_dtype)
    ra = at is not None and at.requires_grad
    rb = bt is not None and bt.requires_grad
    if not _needs(at if ra else None, bt if rb else None):
        return _result(out, None)
    ash = ad.shape if ra else None
    bsh = bd.shape if rb else None

    def fn(g):
        zero = xp.zeros((), dtype=g.dtype)
        return (
            unbroadcast(xp.where(cd, g, zero), ash) if ra else None,
            unbroadcast(xp.where(cd, zero, g), bsh) if rb else None,
        )

    return _result(out, Node(fn, (at if ra else None, bt if rb else None), "Where", saved=(cond,)))


def masked_fill(input: Tensor, mask, value) -> Tensor:
    """``value`` where the boolean ``mask`` is true, ``input`` elsewhere (``torch.masked_fill``).

    ``mask`` broadcasts with ``input``; ``value`` is a number or a 0-d tensor, cast to
    ``input``'s dtype. The gradient reaching ``input`` is zero where ``mask`` is true; a 0-d
    ``value`` tensor that requires grad receives the sum of the gradient where it was written.

    Example::

        >>> import neural_arch as na
        >>> scores = na.ones(2, 2)
        >>> scores.masked_fill(na.tril(na.ones(2, 2)) == 0, float("-inf")).tolist()
        [[1.0, -inf], [1.0, 1.0]]
    """
    md = mask.data if isinstance(mask, Tensor) else mask
    if getattr(md, "dtype", None) is None or md.dtype != np.bool_:
        got = getattr(md, "dtype", type(md).__name__)
        raise RuntimeError(f"masked_fill only supports boolean masks, but got mask with dtype {got}")
    vt = value if isinstance(value, Tensor) else None
    if vt is not None and vt.ndim != 0:
        raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got tensor "
                           f"with {vt.ndim} dimension(s).")
    xd = input.data
    vd = vt.data if vt is not None else value
    arrays = [xd, md] + ([vd] if vt is not None else [])
    _same_device(arrays, "masked_fill")
    xp = _xp(xd)
    fill = xp.asarray(vd).astype(xd.dtype)  # torch casts the value to the input's dtype
    out = xp.where(md, fill, xd)
    rv = vt is not None and vt.requires_grad
    if not _needs(input, vt if rv else None):
        return _result(out, None)
    xsh = xd.shape
    rx = input.requires_grad

    def fn(g):
        zero = xp.zeros((), dtype=g.dtype)
        gx = unbroadcast(xp.where(md, zero, g), xsh) if rx else None
        gv = xp.where(md, g, zero).sum().astype(vd.dtype) if rv else None
        return gx, gv

    return _result(out, Node(fn, (input if rx else None, vt if rv else None), "MaskedFill",
                                saved=(mask,)))


# ============================================================================ softmax family
def _softmax_input(x: Tensor, dtype, op: str) -> Tensor:
    """torch's ``dtype=``: the input cast first (differentiably); an integer input without it is
    torch's error."""
    if dtype is not None:
        return x.astype(dtype)
    if x.data.dtype.kind in "biu":
        raise TypeError(f"{op}: expected a floating-point tensor, got dtype {x.data.dtype}; convert it "
                        f"with .float() or pass dtype=")
    return x


def softmax(x: Tensor, axis: int = -1, *, dim=None, dtype=None) -> Tensor:
    """Softmax along ``axis`` (``dim=`` accepted as torch's alias; ``dtype=`` casts the input first,
    as torch; an integer input without it is torch's error).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.softmax(na.tensor([[0.0, 0.0]]), dim=-1).tolist()
        [[0.5, 0.5]]
    """
    if dim is not None:
        axis = dim
    x = _softmax_input(x, dtype, "softmax")
    xd = x.data
    xp = _xp(xd)
    if not xd.size:  # torch: an empty result (the max below has nothing to reduce)
        out = xd.copy()
    elif xp is not np and device_kernels.applies(xd):
        return _softmax_device(x, xp, axis)
    else:
        e = xp.exp(xd - xd.max(axis=axis, keepdims=True))
        out = e / e.sum(axis=axis, keepdims=True)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        go = g * out
        return (go - out * go.sum(axis=axis, keepdims=True),)

    return _result(out, Node(fn, (x,), "Softmax"))


def _softmax_device(x: Tensor, xp, axis) -> Tensor:
    """:func:`softmax` on a device: a max, a fused map-sum and one kernel each way."""
    out = device_kernels.softmax(xp, x.data, axis)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        if device_kernels.applies(g, out):
            return (device_kernels.softmax_backward(xp, g, out, axis),)
        go = g * out  # an upstream gradient of another dtype: the unfused formula
        return (go - out * go.sum(axis=axis, keepdims=True),)

    return _result(out, Node(fn, (x,), "Softmax"))


def _log_softmax_array(xp, xd, axis):
    if not xd.size:  # torch: an empty result (the max below has nothing to reduce)
        return xd.copy()
    if xp is not np and device_kernels.applies(xd):
        return device_kernels.log_softmax(xp, xd, axis)
    shifted = xd - xd.max(axis=axis, keepdims=True)
    lse = xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
    if getattr(shifted, "ndim", 0) and shifted.dtype == lse.dtype:
        shifted -= lse  # in place: the same subtraction, one (rows, classes) array fewer
        return shifted
    return shifted - lse


def log_softmax(x: Tensor, axis: int = -1, *, dim=None, dtype=None) -> Tensor:
    """Log-softmax along ``axis`` (alias ``dim=``; ``dtype=`` casts first), computed stably in one
    fused op.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> np.exp(F.log_softmax(na.tensor([[1.0, 1.0]]), dim=-1).data).tolist()
        [[0.5, 0.5]]
    """
    if dim is not None:
        axis = dim
    x = _softmax_input(x, dtype, "log_softmax")
    xd = x.data
    xp = _xp(xd)
    out = _log_softmax_array(xp, xd, axis)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        if xp is not np and device_kernels.applies(g, out):
            return (device_kernels.log_softmax_backward(xp, g, out, axis),)
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)

    return _result(out, Node(fn, (x,), "LogSoftmax"))


def _bind_methods(T) -> None:
    T.exp, T.log, T.sqrt, T.abs, T.tanh = exp, log, sqrt, abs, tanh
    T.__abs__ = abs
    T.sigmoid, T.relu, T.gelu = sigmoid, relu, gelu
    T.clip = clip
    T.clamp = clip
    T.softmax = softmax
    T.masked_fill = masked_fill
    T.log_softmax = log_softmax
    T.sin, T.cos, T.erf, T.expm1, T.log1p, T.log2 = sin, cos, erf, expm1, log1p, log2
    T.floor, T.ceil, T.round, T.sign = floor, ceil, _round, sign
    T.atan2, T.arctan2, T.nan_to_num = atan2, atan2, nan_to_num
    T.tan, T.sinh, T.cosh, T.log10 = tan, sinh, cosh, log10
    T.asin, T.acos, T.atan = T.arcsin, T.arccos, T.arctan = asin, acos, atan
    T.reciprocal, T.rsqrt, T.trunc, T.fix, T.frac = reciprocal, rsqrt, trunc, trunc, frac
