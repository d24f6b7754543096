"""Plain float64 NumPy references for the ops of ``tests/core/test_ops_added_explore.py``
(``logsumexp``, ``prod``, ``cumsum``, ``vector_norm``, ``gather``, ``scatter_add``, ``index_select``,
``softplus``, ``rms_norm``, ``group_norm``): each written from torch's documented formula, slice by
slice or element by element where that is the plainest statement, and each gradient the analytic
vector-Jacobian product with an upstream gradient ``g``. Nothing here imports ``neural_arch``: the
references must not share a bug with the code they check.

Example::

    >>> import numpy as np
    >>> logsumexp(np.array([[0.0, 0.0]]), (1,), False).tolist()[0] == np.log(2.0)
    True
    >>> gather(np.array([[1.0, 2.0], [3.0, 4.0]]), 1, np.array([[1], [0]])).tolist()
    [[2.0], [3.0]]
"""

from __future__ import annotations

import math

import numpy as np


def _rows(a, dims):
    """``a`` with the reduced ``dims`` moved last and flattened: ``(kept..., n)``, and the kept shape."""
    rest = [d for d in range(a.ndim) if d not in dims]
    moved = np.transpose(a, rest + list(dims))
    kept = moved.shape[: len(rest)]
    return moved.reshape(kept + (math.prod(a.shape[d] for d in dims),)), kept


def _flat(rows):
    """``(slices, n)``: one row per slice (explicit sizes: ``-1`` is ambiguous for empty arrays)."""
    return rows.reshape(math.prod(rows.shape[:-1]), rows.shape[-1])


def _unrows(r, shape, dims, keepdim):
    """A per-slice result ``(kept...)`` back in the reduction's output shape."""
    if keepdim:
        return np.reshape(r, [1 if i in dims else s for i, s in enumerate(shape)])
    return np.reshape(r, [s for i, s in enumerate(shape) if i not in dims])


def _expand(r, shape, dims):
    """A reduced result (either keepdim form) broadcastable against the input."""
    return np.reshape(r, [1 if i in dims else s for i, s in enumerate(shape)])


# ---------------------------------------------------------------------------------- reductions
def _lse_row(v):
    v = [float(t) for t in v]
    if not v:
        return -math.inf
    m = max(v)
    if m == -math.inf:
        return -math.inf
    if m == math.inf:
        return math.inf
    return m + math.log(math.fsum(math.exp(t - m) for t in v))


def logsumexp(a, dims, keepdim):
    """``log(sum(exp(a)))`` per slice (all -inf and empty slices: -inf)."""
    rows, kept = _rows(np.asarray(a, np.float64), dims)
    out = np.array([_lse_row(r) for r in _flat(rows)]).reshape(kept)
    return _unrows(out, a.shape, dims, keepdim)


def logsumexp_grad(a, dims, keepdim, g):
    """``g * softmax(a)`` over the slice (the derivative of log-sum-exp)."""
    out = _expand(logsumexp(a, dims, keepdim), a.shape, dims)
    with np.errstate(invalid="ignore"):
        return _expand(g, a.shape, dims) * np.exp(a - out)


def prod_grad_of_slice(v):
    """d prod / d v_i = the product of the other entries, by deleting each one in turn."""
    return np.array([np.prod(np.delete(v, i)) for i in range(len(v))])


def prod(a, dim, keepdim, g):
    """``(prod, grad)`` over one ``dim`` (None: every element)."""
    a = np.asarray(a, np.float64)
    dims = tuple(range(a.ndim)) if dim is None else (dim % a.ndim,)
    rows, kept = _rows(a, dims)
    flat = _flat(rows)
    out = np.array([np.prod(r) for r in flat]).reshape(kept)
    others = np.array([prod_grad_of_slice(r) for r in flat]).reshape(rows.shape)
    # back to the input's layout: undo the transpose of _rows
    rest = [d for d in range(a.ndim) if d not in dims]
    order = rest + list(dims)
    moved = others.reshape([a.shape[d] for d in order])
    others = np.transpose(moved, np.argsort(order))
    grad = _expand(g, a.shape, dims) * others
    return _unrows(out, a.shape, dims, keepdim), grad


def cumsum(a, dim, g):
    """``(cumsum, grad)`` along ``dim``; the gradient as a product with the lower-triangular ones
    matrix (``out_j = sum_{i <= j} a_i``, so ``grad_i = sum_{j >= i} g_j``)."""
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return a.copy(), np.asarray(g, np.float64)
    n = a.shape[dim]
    lower = np.tril(np.ones((n, n)))
    out = np.moveaxis(np.moveaxis(a, dim, -1) @ lower.T, -1, dim)
    grad = np.moveaxis(np.moveaxis(np.asarray(g, np.float64), dim, -1) @ lower, -1, dim)
    return out, grad


def vector_norm(a, p, dims, keepdim):
    """torch's ``linalg.vector_norm`` per slice, from its definition."""
    rows, kept = _rows(np.abs(np.asarray(a, np.float64)), dims)
    flat = _flat(rows)

    def one(v):
        if p == math.inf:
            return v.max()
        if p == -math.inf:
            return v.min()
        if p == 0:
            return float(np.count_nonzero(v))
        with np.errstate(divide="ignore"):
            return math.fsum(v ** p) ** (1.0 / p)

    return _unrows(np.array([one(v) for v in flat]).reshape(kept), a.shape, dims, keepdim)


# ---------------------------------------------------------------------------------- indexing
def gather(a, dim, index):
    out = np.zeros(index.shape)
    for pos in np.ndindex(*index.shape):
        src = list(pos)
        src[dim] = index[pos]
        out[pos] = a[tuple(src)]
    return out


def gather_grad(shape, dim, index, g):
    grad = np.zeros(shape)
    for pos in np.ndindex(*index.shape):
        dst = list(pos)
        dst[dim] = index[pos]
        grad[tuple(dst)] += g[pos]
    return grad


def scatter_add(a, dim, index, src):
    out = np.array(a, np.float64, copy=True)
    for pos in np.ndindex(*index.shape):
        dst = list(pos)
        dst[dim] = index[pos]
        out[tuple(dst)] += src[pos]
    return out


def scatter_add_src_grad(src_shape, dim, index, g):
    grad = np.zeros(src_shape)
    for pos in np.ndindex(*index.shape):
        dst = list(pos)
        dst[dim] = index[pos]
        grad[pos] = g[tuple(dst)]
    return grad


def index_select(a, dim, index):
    return np.stack([np.take(a, int(i), axis=dim) for i in index], axis=dim) if len(index) else \
        np.zeros(a.shape[:dim] + (0,) + a.shape[dim + 1:])


def index_select_grad(shape, dim, index, g):
    grad = np.zeros(shape)
    for k, i in enumerate(index):
        dst = [slice(None)] * len(shape)
        dst[dim] = int(i)
        src = [slice(None)] * len(shape)
        src[dim] = k
        grad[tuple(dst)] += g[tuple(src)]
    return grad


# ---------------------------------------------------------------------------------- activations, norms
def softplus(x, beta, threshold):
    """``(value, derivative)``: ``log(1 + exp(beta x)) / beta``, linear above the threshold."""
    x = np.asarray(x, np.float64)
    bx = beta * x
    soft = np.logaddexp(0.0, bx) / beta
    sig = 0.5 * (1.0 + np.tanh(0.5 * bx))
    return np.where(bx > threshold, x, soft), np.where(bx > threshold, 1.0, sig)


def rms_norm(x, k, weight, eps):
    axes = tuple(range(x.ndim - k, x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    return y * weight if weight is not None else y


def group_norm(x, groups, weight, bias, eps):
    n, c = x.shape[:2]
    if x.size == 0:
        return x.copy()
    xs = x.reshape(n, groups, -1)
    mu = xs.mean(axis=-1, keepdims=True)
    var = ((xs - mu) ** 2).mean(axis=-1, keepdims=True)
    y = ((xs - mu) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y
