"""The GPT step's fused formulas as device kernels: GELU (erf and tanh forms), softmax, log-softmax,
layer norm, cross entropy's gradient and the Adam/AdamW update.

Each kernel replays the CPU formula of its op operation for operation (the same constants, the same
order), so on the fake device, whose arithmetic is NumPy's, a kernel gives the NumPy path's values up
to the rounding of a reordered sum; on a GPU it differs only by the device's ``exp``/``tanh`` rounding.
The reductions (row max, sums) stay separate launches: a ``ReductionKernel`` maps and sums in one pass
(``exp(x - max)`` summed without storing it), and the elementwise kernel then writes the result.

Every kernel carries ``reference`` (the unfused formula, any array module) and ``example`` (host
arguments): ``tests/strict_device/test_device_kernels.py`` checks each against its reference on the fake
device, and ``benchmarks/gpu_check.py`` compiles and checks each on a GPU.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.device_kernels.catalogue import KERNELS
    >>> y, dy = KERNELS["gelu_erf_grad"](np, np.array([0.0, 1.0]))
    >>> [round(v, 6) for v in y.tolist()], [round(v, 6) for v in dy.tolist()]
    ([0.0, 0.841345], [0.5, 1.083315])
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.device_kernels.kernel import ElementwiseKernel, ReductionKernel

__all__ = ["KERNELS", "adam_kernel"]

# The constants of the CPU formulas (neural_arch.core.ops_activation; a test checks they agree).
AS_P = 0.3275911  # Abramowitz & Stegun 7.1.26: erf(z) = 1 - t*P(t)*exp(-z^2), t = 1/(1 + p|z|)
AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_C = 0.044715


def _floats(rng, dtype, shape, positive=False):
    a = rng.standard_normal(shape) * 2
    return (np.abs(a) + 0.1 if positive else a).astype(dtype)


# ------------------------------------------------------------------------------------------- GELU
# The erf form computes Phi(x) = 1/2 + sign(x) * (1/2 - erfc(|z|) / 2), z = x / sqrt(2), with the A&S
# coefficients halved (exact), and exp(-z^2) serves erf and the derivative's phi(x) alike.
_GELU_ERF = f"""
const T p = {AS_P * INV_SQRT_2!r};
const T a0 = {0.5 * AS_A[0]!r};
const T a1 = {0.5 * AS_A[1]!r};
const T a2 = {0.5 * AS_A[2]!r};
const T a3 = {0.5 * AS_A[3]!r};
const T a4 = {0.5 * AS_A[4]!r};
const T half = 0.5;
const T minus_half = -0.5;
T t = 1 / (fabs(x) * p + 1);
T e = exp(x * x * minus_half);
T phi = copysign(half - ((((t * a4 + a3) * t + a2) * t + a1) * t + a0) * t * e, x) + half;
y = phi * x;
"""
_GELU_ERF_GRAD = _GELU_ERF + f"""const T inv_sqrt_2pi = {INV_SQRT_2PI!r};
dy = e * inv_sqrt_2pi * x + phi;
"""


def _erf_unfused(xp, z):
    t = 1.0 / (1.0 + AS_P * xp.abs(z))
    poly = t * (AS_A[0] + t * (AS_A[1] + t * (AS_A[2] + t * (AS_A[3] + t * AS_A[4]))))
    return xp.copysign(1.0 - poly * xp.exp(-z * z), z)


def _gelu_erf_reference(xp, x):
    return 0.5 * x * (1.0 + _erf_unfused(xp, x * INV_SQRT_2))


def _gelu_erf_grad_reference(xp, x):
    cdf = 0.5 * (1.0 + _erf_unfused(xp, x * INV_SQRT_2))
    return x * cdf, cdf + x * xp.exp(-0.5 * x * x) * INV_SQRT_2PI


_GELU_TANH = f"""
const T s = {SQRT_2_OVER_PI!r};
const T c = {TANH_C!r};
const T half = 0.5;
T th = tanh(s * (x + c * x * x * x));
y = half * x * (1 + th);
"""
_GELU_TANH_GRAD = _GELU_TANH + f"""const T c3 = {3 * TANH_C!r};
dy = half * (1 + th) + half * x * (1 - th * th) * (s * (1 + c3 * x * x));
"""


def _gelu_tanh_reference(xp, x):
    return 0.5 * x * (1 + xp.tanh(SQRT_2_OVER_PI * (x + TANH_C * x ** 3)))


def _gelu_tanh_grad_reference(xp, x):
    th = xp.tanh(SQRT_2_OVER_PI * (x + TANH_C * x ** 3))
    sech2 = 1 - th ** 2
    return 0.5 * x * (1 + th), 0.5 * (1 + th) + 0.5 * x * sech2 * SQRT_2_OVER_PI * (1 + 3 * TANH_C * x ** 2)


def _one_array(rng, dtype):
    return (_floats(rng, dtype, (7, 33)),), {}


# ---------------------------------------------------------------------------- softmax family, rows
def _rows(rng, dtype):
    x = _floats(rng, dtype, (6, 17))
    return x, x.max(axis=-1, keepdims=True)


def _shifted_example(rng, dtype):
    return _rows(rng, dtype), {"axis": -1, "keepdims": True}


def _softmax_out_example(rng, dtype):
    x, m = _rows(rng, dtype)
    return (x, m, np.exp(x - m).sum(axis=-1, keepdims=True)), {}


def _log_softmax_out_example(rng, dtype):
    x, m = _rows(rng, dtype)
    return (x, m, np.log(np.exp(x - m).sum(axis=-1, keepdims=True))), {}


def _grad_example(rng, dtype):
    g, y = _floats(rng, dtype, (6, 17)), _floats(rng, dtype, (6, 17))
    return (g, y, _floats(rng, dtype, (6, 1))), {}


def _products_example(n):
    def example(rng, dtype):
        return tuple(_floats(rng, dtype, (6, 17)) for _ in range(n)), {"axis": -1, "keepdims": True}

    return example


# ---------------------------------------------------------------------------- layer norm, cross entropy
def _layer_norm_out_example(rng, dtype):
    x = _floats(rng, dtype, (5, 12))
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    return (x, mean, rstd.astype(dtype), _floats(rng, dtype, (12,)), _floats(rng, dtype, (12,))), {}


def _layer_norm_out_reference(xp, x, mean, rstd, w, b):
    xhat = (x - mean) * rstd
    return xhat, xhat * w + b


def _layer_norm_grad_example(rng, dtype):
    g, w, xhat = _floats(rng, dtype, (5, 12)), _floats(rng, dtype, (12,)), _floats(rng, dtype, (5, 12))
    m1, m2 = (g * w).mean(axis=-1, keepdims=True), (g * w * xhat).mean(axis=-1, keepdims=True)
    return (g, w, xhat, m1, m2, _floats(rng, dtype, (5, 1), positive=True)), {}


def _layer_norm_grad_reference(xp, g, w, xhat, m1, m2, rstd):
    dxhat = g * w
    return rstd * (dxhat - m1 - xhat * m2)


def _cross_entropy_grad_example(rng, dtype):
    logits = _floats(rng, dtype, (6, 9))
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    target = rng.integers(0, 9, size=(6, 1))
    return (logp, target, np.arange(9), _floats(rng, dtype, (6, 1)), 0.9, 0.1 / 9), {}


def _cross_entropy_grad_reference(xp, logp, t, col, scale, target_weight, smoothing):
    # the CPU formula: softmax, minus the (smoothed) one-hot target, times the per-row scale
    onehot = (col == t).astype(logp.dtype)
    return (xp.exp(logp) - onehot * target_weight - smoothing) * scale


# ---------------------------------------------------------------------------------- Adam / AdamW
def _adam_source(l2: bool, amsgrad: bool) -> tuple[str, str, str]:
    """``(in_params, out_params, body)`` of the Adam update: torch's formulas in the CPU kernel's
    order (neural_arch.optim.adam); AdamW's decay is ``decay`` (1 for none), Adam's L2 is ``l2``."""
    ins = "T g, T beta1, T one_minus_beta1, T beta2, T one_minus_beta2, T eps, T step_size, T sqrt_bias2, " \
          + ("T l2" if l2 else "T decay")
    outs = "T d, T m, T v" + (", T vmax" if amsgrad else "")
    grad = "gr" if l2 else "g"
    body = ("T gr = g + l2 * d;\n" if l2 else "d = d * decay;\n") + f"""\
m = m * beta1 + {grad} * one_minus_beta1;
v = v * beta2 + {grad} * {grad} * one_minus_beta2;
""" + ("vmax = max(vmax, v);\n" if amsgrad else "") + \
        f"d = d - m / (sqrt({'vmax' if amsgrad else 'v'}) / sqrt_bias2 + eps) * step_size;\n"
    return ins, outs, body


def _adam_reference(l2: bool, amsgrad: bool):
    def reference(xp, g, beta1, omb1, beta2, omb2, eps, step_size, sqrt_bias2, coef, d, m, v, vmax=None):
        if l2:
            g = g + coef * d
        else:
            d = d * coef
        m = beta1 * m + omb1 * g
        v = beta2 * v + omb2 * g * g
        if amsgrad:
            vmax = xp.maximum(vmax, v)
        denom = xp.sqrt(vmax if amsgrad else v) / sqrt_bias2 + eps
        return (d - step_size * m / denom, m, v) + ((vmax,) if amsgrad else ())

    return reference


def _adam_example(l2: bool, amsgrad: bool):
    def example(rng, dtype):
        shape = (4, 11)
        coef = 0.01 if l2 else 1 - 1e-3 * 0.1
        scalars = (0.9, 0.1, 0.999, 1 - 0.999, 1e-8, 1e-3 / (1 - 0.9 ** 3), math.sqrt(1 - 0.999 ** 3), coef)
        state = (_floats(rng, dtype, shape), _floats(rng, dtype, shape) * 0.1,
                 _floats(rng, dtype, shape, positive=True) * 0.01)
        vmax = (state[2] * 1.5,) if amsgrad else ()
        return (_floats(rng, dtype, shape),) + scalars + state + vmax, {}

    return example


def _adam(l2: bool, amsgrad: bool) -> ElementwiseKernel:
    name = ("adam_l2" if l2 else "adamw") + ("_amsgrad" if amsgrad else "")
    return ElementwiseKernel(*_adam_source(l2, amsgrad), name, reference=_adam_reference(l2, amsgrad),
                             example=_adam_example(l2, amsgrad))


def adam_kernel(l2: bool, amsgrad: bool) -> ElementwiseKernel:
    """The Adam update kernel: ``l2`` (Adam's coupled weight decay) or AdamW's decay factor (1: none),
    with or without AMSGrad. Call as ``kernel(xp, g, beta1, 1 - beta1, beta2, 1 - beta2, eps,
    step_size, sqrt(bias2), l2_or_decay, d, m, v[, vmax])``: ``d``, ``m``, ``v`` updated in place.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.catalogue import adam_kernel
        >>> d, m, v = np.ones(2), np.zeros(2), np.zeros(2)
        >>> kernel = adam_kernel(False, False)
        >>> _ = kernel(np, np.ones(2), 0.9, 0.1, 0.999, 0.001, 1e-8, 0.01, 0.0316, 1.0, d, m, v)
        >>> m.tolist(), bool(d[0] < 1)
        ([0.1, 0.1], True)
    """
    return KERNELS[("adam_l2" if l2 else "adamw") + ("_amsgrad" if amsgrad else "")]


def _summed(mapped):
    """The reference of a sum-reduction kernel: ``mapped(xp, *inputs)`` summed over the call's axes."""
    def reference(xp, *inputs, axis=None, keepdims=False):
        return mapped(xp, *inputs).sum(axis=axis, keepdims=keepdims)

    return reference


def _log_sum_exp_reference(xp, x, m, axis=None, keepdims=False):
    return xp.log(xp.exp(x - m).sum(axis=axis, keepdims=keepdims))


_E, _R = ElementwiseKernel, ReductionKernel

#: Every device kernel of the GPT step, by name (the GPU check compiles each one).
KERNELS: dict = {k.name: k for k in (
    _E("T x", "T y", _GELU_ERF, "gelu_erf", _gelu_erf_reference, _one_array),
    _E("T x", "T y, T dy", _GELU_ERF_GRAD, "gelu_erf_grad", _gelu_erf_grad_reference, _one_array),
    _E("T x", "T y", _GELU_TANH, "gelu_tanh", _gelu_tanh_reference, _one_array),
    _E("T x", "T y, T dy", _GELU_TANH_GRAD, "gelu_tanh_grad", _gelu_tanh_grad_reference, _one_array),
    # softmax: y = exp(x - max) / sum(exp(x - max)); the sum is mapped and reduced in one pass
    _R("T x, T m", "T y", "exp(x - m)", "a + b", "y = a", "0", "sum_exp_shifted",
       _summed(lambda xp, x, m: xp.exp(x - m)), _shifted_example),
    _R("T x, T m", "T y", "exp(x - m)", "a + b", "y = log(a)", "0", "log_sum_exp_shifted",
       _log_sum_exp_reference, _shifted_example),
    _E("T x, T m, T s", "T y", "y = exp(x - m) / s;", "softmax_out",
       lambda xp, x, m, s: xp.exp(x - m) / s, _softmax_out_example),
    _E("T g, T y, T s", "T gx", "gx = g * y - y * s;", "softmax_grad",
       lambda xp, g, y, s: y * (g - s), _grad_example),
    _E("T x, T m, T lse", "T y", "y = x - m - lse;", "log_softmax_out",
       lambda xp, x, m, lse: x - (m + lse), _log_softmax_out_example),
    _E("T g, T y, T s", "T gx", "gx = g - exp(y) * s;", "log_softmax_grad",
       lambda xp, g, y, s: g - xp.exp(y) * s, _grad_example),
    # row sums of products (softmax's and layer norm's backward), and layer norm's variance
    _R("T p, T q", "T y", "p * q", "a + b", "y = a", "0", "sum_product",
       _summed(lambda xp, p, q: p * q), _products_example(2)),
    _R("T p, T q, T r", "T y", "p * q * r", "a + b", "y = a", "0", "sum_product3",
       _summed(lambda xp, p, q, r: p * q * r), _products_example(3)),
    _R("T x, T m", "T y", "(x - m) * (x - m)", "a + b", "y = a", "0", "sum_squared_deviation",
       _summed(lambda xp, x, m: (x - m) ** 2), _shifted_example),
    _E("T x, T mean, T rstd, T w, T b", "T xhat, T y", "xhat = (x - mean) * rstd;\ny = xhat * w + b;",
       "layer_norm_out", _layer_norm_out_reference, _layer_norm_out_example),
    _E("T g, T w, T xhat, T m1, T m2, T rstd", "T gx", "gx = rstd * ((g * w - m1) - xhat * m2);",
       "layer_norm_grad", _layer_norm_grad_reference, _layer_norm_grad_example),
    # cross entropy's gradient: (softmax - smoothed one-hot target) * the row's scale, softmax = exp(logp)
    _E("T logp, int64 t, int64 col, T scale, T target_weight, T smoothing", "T gx",
       "gx = (exp(logp) - (col == t ? target_weight : 0) - smoothing) * scale;",
       "cross_entropy_grad", _cross_entropy_grad_reference, _cross_entropy_grad_example),
    _adam(False, False), _adam(False, True), _adam(True, False), _adam(True, True),
)}
