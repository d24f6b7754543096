"""Plain float64 NumPy references for the core ops' exploring property tests
(``tests/core/test_ops_*_explore.py``): each forward written out by hand from torch's documented
formula, and each gradient the analytic derivative (a vector-Jacobian product with an upstream
gradient ``g``). Nothing here imports ``neural_arch``: the references must not share a bug with the
code they check.

Example::

    >>> import numpy as np
    >>> unbroadcast(np.ones((2, 3)), (1, 3)).tolist()
    [[2.0, 2.0, 2.0]]
    >>> [round(v, 4) for v in softmax(np.array([0.0, np.log(3.0)]), -1).tolist()]
    [0.25, 0.75]
"""

from __future__ import annotations

import math

import numpy as np


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (what broadcasting did to an input of that shape, undone)."""
    g = np.asarray(g, dtype=np.float64)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(axis=i, keepdims=True)
    return g.reshape(shape)


# ---------------------------------------------------------------------------------- elementwise
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    """Exact erf (the standard library's, element by element: references need not be fast)."""
    return _ERF(np.asarray(x, dtype=np.float64))


def phi_cdf(x):
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0)))


def phi_pdf(x):
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


_C = math.sqrt(2.0 / math.pi)

#: name -> (forward f(x), derivative f'(x)) for the unary ops; x float64
UNARY = {
    "exp": (np.exp, np.exp),
    "log": (np.log, lambda x: 1.0 / x),
    "sqrt": (np.sqrt, lambda x: 0.5 / np.sqrt(x)),
    "abs": (np.abs, np.sign),  # torch: sgn, 0 at 0
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "sigmoid": (sigmoid, lambda x: sigmoid(x) * (1.0 - sigmoid(x))),
    "relu": (lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(np.float64)),  # 0 at 0 (torch)
    "silu": (lambda x: x * sigmoid(x), lambda x: sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x)))),
    "gelu": (lambda x: x * phi_cdf(x), lambda x: phi_cdf(x) + x * phi_pdf(x)),
    "gelu_tanh": (
        lambda x: 0.5 * x * (1.0 + np.tanh(_C * (x + 0.044715 * x**3))),
        lambda x: 0.5 * (1.0 + np.tanh(_C * (x + 0.044715 * x**3)))
        + 0.5 * x * (1.0 - np.tanh(_C * (x + 0.044715 * x**3)) ** 2) * _C * (1.0 + 3 * 0.044715 * x * x),
    ),
    "neg": (np.negative, lambda x: -np.ones_like(x)),
}


def leaky_relu(x, slope):
    """``(forward, derivative)``; torch's derivative at 0 is the slope (``x > 0`` picks 1)."""
    return np.where(x > 0, x, slope * x), np.where(x > 0, 1.0, slope)


def binary(op, a, b, g):
    """``(out, grad_a, grad_b)`` of ``a op b`` for op in ``+ - * / **``, gradients summed back to
    each input's shape (a number operand gets ``None``); torch's rules at the singular points of
    ``**``: ``d(a**b)/da`` is 0 where ``b == 0``, and ``d(a**b)/db`` is 0 where ``a == 0`` and
    ``b >= 0``."""
    sa = np.shape(a)
    sb = np.shape(b) if isinstance(b, np.ndarray) else None
    a = np.asarray(a, dtype=np.float64)
    bb = np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        if op == "+":
            out, da, db = a + bb, np.ones_like(a + bb), np.ones_like(a + bb)
        elif op == "-":
            out, da, db = a - bb, np.ones_like(a - bb), -np.ones_like(a - bb)
        elif op == "*":
            out = a * bb
            da, db = bb * np.ones_like(out), a * np.ones_like(out)
        elif op == "/":
            out = a / bb
            da, db = 1.0 / bb * np.ones_like(out), -a / (bb * bb) * np.ones_like(out)
        elif op == "**":
            out = a**bb
            da = np.where(bb == 0, 0.0, bb * a ** (bb - 1.0))
            db = np.where((a == 0) & (bb >= 0), 0.0, out * np.log(a))
        else:
            raise ValueError(op)
    ga = unbroadcast(g * da, sa)
    gb = unbroadcast(g * db, sb) if sb is not None else None
    return out, ga, gb


# ---------------------------------------------------------------------------------- reductions
def norm_dims(dim, ndim):
    if dim is None:
        return tuple(range(ndim))
    dims = dim if isinstance(dim, tuple) else (dim,)
    return tuple(sorted(d % ndim for d in dims))


def expand_back(r, shape, dims, keepdim):
    """A reduced array broadcastable against the input again."""
    if keepdim:
        return r
    full = [1 if i in dims else n for i, n in enumerate(shape)]
    return np.reshape(r, full)


def var_reference(x, dims, correction, keepdim, g):
    """``(var, grad)`` over ``dims`` dividing by ``max(0, n - correction)`` (torch: inf, or nan for
    0 / 0, where ``n <= correction``)."""
    n = int(np.prod([x.shape[d] for d in dims])) if dims else 1
    denom = np.float64(max(n - correction, 0))
    with np.errstate(all="ignore"):
        mu = x.mean(axis=dims, keepdims=True)
        out = ((x - mu) ** 2).sum(axis=dims, keepdims=keepdim) / denom
        grad = expand_back(g, x.shape, dims, keepdim) * 2.0 * (x - mu) / denom
    return out, grad


# ---------------------------------------------------------------------------------- softmax family
def softmax(x, dim):
    if x.size == 0:
        return x.copy()
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def softmax_grad(x, dim, g):
    p = softmax(x, dim)
    return p * (g - (g * p).sum(axis=dim, keepdims=True))


def log_softmax(x, dim):
    if x.size == 0:
        return x.copy()
    s = x - x.max(axis=dim, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=dim, keepdims=True))


def log_softmax_grad(x, dim, g):
    return g - softmax(x, dim) * g.sum(axis=dim, keepdims=True)


# ---------------------------------------------------------------------------------- normalisation
def layer_norm(x, k, w, b, eps, g):
    """``(out, grad_x, grad_w, grad_b)`` of a layer norm over the last ``k`` dims (w, b may be None)."""
    axes = tuple(range(x.ndim - k, x.ndim))
    n = int(np.prod(x.shape[x.ndim - k:]))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    out = xhat * (w if w is not None else 1.0) + (b if b is not None else 0.0)
    lead = tuple(range(x.ndim - k))
    gw = (g * xhat).sum(axis=lead) if w is not None else None
    gb = g.sum(axis=lead) if b is not None else None
    d = g * (w if w is not None else 1.0)
    gx = rstd * (d - d.sum(axis=axes, keepdims=True) / n - xhat * (d * xhat).sum(axis=axes, keepdims=True) / n)
    return out, gx, gw, gb


# ---------------------------------------------------------------------------------- losses
def class_coefficients(target, C, weight, ignore_index, smoothing):
    """Per-row coefficients ``a`` with ``loss_row = -sum_c a_c log p_c`` for class-index targets,
    and each row's share of a "mean" denominator (torch: ``w[y]`` of non-ignored rows)."""
    w = np.ones(C) if weight is None else np.asarray(weight, dtype=np.float64)
    keep = target != ignore_index
    safe = np.where(keep, target, 0)
    a = np.zeros((target.size, C))
    a[np.arange(target.size), safe] = (1.0 - smoothing) * w[safe]
    a += smoothing / C * w[None, :]
    a *= keep[:, None]
    return a, w[safe] * keep


def cross_entropy_rows(logits2, a, share, reduction, g):
    """``(loss, grad_logits2)`` of ``-sum_c a_c log_softmax(x)_c`` per row of ``logits2`` (rows, C),
    reduced as torch does (``mean`` divides by ``sum(share)``)."""
    logp = log_softmax(logits2, -1)
    rows = -(a * logp).sum(axis=-1)
    with np.errstate(all="ignore"):
        if reduction == "mean":
            out = rows.sum() / share.sum()
            scale = np.full(rows.shape, g / share.sum())
        elif reduction == "sum":
            out = rows.sum()
            scale = np.full(rows.shape, float(g))
        else:
            out = rows
            scale = np.asarray(g, dtype=np.float64).reshape(-1)
        grad = (np.exp(logp) * a.sum(axis=-1, keepdims=True) - a) * scale[:, None]
    return out, grad


def classes_last(x):
    """``(N, C, d1, ...)`` -> ``(N * d1 * ..., C)`` rows; ``(C,)`` -> ``(1, C)``."""
    if x.ndim == 1:
        return x[None, :]
    return np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def classes_back(rows, shape):
    if len(shape) == 1:
        return rows.reshape(shape)
    moved = (shape[0],) + tuple(shape[2:]) + (shape[1],)
    return np.moveaxis(rows.reshape(moved), -1, 1)
