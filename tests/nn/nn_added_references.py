"""Float64 NumPy references for the torch-parity activations, distances, norms and losses of
``neural_arch.nn.functional`` (tests/nn/test_nn_added_explore.py), each written from torch's
documented formula (never from our implementation), plus a central finite-difference gradient.

Example::

    >>> import numpy as np
    >>> ref_elu(np.array([-1.0, 2.0])).round(4).tolist()
    [-0.6321, 2.0]
"""

from __future__ import annotations

import math

import numpy as np

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


# ----------------------------------------------------------------------------- activations
def ref_elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def ref_selu(x):
    return SELU_SCALE * (np.maximum(0, x) + np.minimum(0, SELU_ALPHA * np.expm1(np.minimum(x, 0))))


def ref_celu(x, alpha=1.0):
    return np.maximum(0, x) + np.minimum(0, alpha * np.expm1(np.minimum(x, 0) / alpha))


def ref_softplus(x):
    return np.logaddexp(0.0, x)


def ref_mish(x):
    return x * np.tanh(ref_softplus(x))


def ref_relu6(x):
    return np.minimum(np.maximum(0, x), 6)


def ref_hardswish(x):
    return x * ref_relu6(x + 3) / 6


def ref_hardsigmoid(x):
    return ref_relu6(x + 3) / 6


def ref_hardtanh(x, lo=-1.0, hi=1.0):
    return np.minimum(np.maximum(x, lo), hi)


def ref_logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def ref_softsign(x):
    return x / (1 + np.abs(x))


def ref_tanhshrink(x):
    return x - np.tanh(x)


def ref_threshold(x, threshold, value):
    return np.where(x > threshold, x, value)


def ref_sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def ref_glu(x, dim=-1):
    a, b = np.split(x, 2, axis=dim)
    return a * ref_sigmoid(b)


def ref_prelu(x, w):
    w = np.asarray(w, dtype=np.float64)
    if w.size > 1:
        w = w.reshape((x.shape[1],) + (1,) * (x.ndim - 2))
    else:
        w = w.reshape(())
    return np.where(x > 0, x, w * x)


def ref_softmin(x, dim):
    z = -x - np.max(-x, axis=dim, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=dim, keepdims=True)


# ----------------------------------------------------------------------------- distances, encodings
def ref_pnorm(v, p, axis, keepdims=False):
    a = np.abs(v)
    if p == math.inf:
        return a.max(axis=axis, keepdims=keepdims)
    if p == 1:
        return a.sum(axis=axis, keepdims=keepdims)
    return (a ** p).sum(axis=axis, keepdims=keepdims) ** (1.0 / p)


def ref_normalize(x, p=2.0, dim=1, eps=1e-12):
    return x / np.maximum(ref_pnorm(x, p, dim, keepdims=True), eps)


def ref_cosine_similarity(a, b, dim=1, eps=1e-8):
    """torch 2.x: each norm clamped on its own (the current F.cosine_similarity docs)."""
    a, b = np.broadcast_arrays(a, b)
    na_ = np.maximum(np.sqrt((a * a).sum(axis=dim)), eps)
    nb_ = np.maximum(np.sqrt((b * b).sum(axis=dim)), eps)
    return (a * b).sum(axis=dim) / (na_ * nb_)


def ref_pairwise_distance(a, b, p=2.0, eps=1e-6, keepdim=False):
    return ref_pnorm(a - b + eps, p, -1, keepdims=keepdim)


def ref_one_hot(labels, num_classes):
    out = np.zeros(labels.shape + (num_classes,), dtype=np.int64)
    for idx in np.ndindex(labels.shape):
        out[idx + (labels[idx],)] = 1
    return out


# ----------------------------------------------------------------------------- norms
def ref_instance_norm(x, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def ref_local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """b_c = a_c (k + alpha / n sum_{c' = c - n//2}^{c + (n-1)//2} a_{c'}^2) ** -beta, zero past the edges."""
    out = np.empty_like(x)
    channels = x.shape[1]
    for c in range(channels):
        lo, hi = max(0, c - size // 2), min(channels - 1, c + (size - 1) // 2)
        s = (x[:, lo:hi + 1] ** 2).sum(axis=1)
        out[:, c] = x[:, c] / (k + alpha / size * s) ** beta
    return out


def ref_bilinear(x1, x2, w, b=None):
    y = np.einsum("...i,oij,...j->...o", x1, w, x2)
    return y if b is None else y + b


# ----------------------------------------------------------------------------- losses
def reduce(loss, reduction):
    return {"mean": np.mean, "sum": np.sum}.get(reduction, lambda v: v)(loss)


def ref_margin_ranking(x1, x2, y, margin=0.0):
    return np.maximum(0, -y * (x1 - x2) + margin)


def ref_hinge_embedding(x, y, margin=1.0):
    return np.where(y != 1, np.maximum(0, margin - x), 0) + np.where(y != -1, x, 0)


def ref_soft_margin(x, y):
    return np.logaddexp(0.0, -y * x)


def ref_cosine_embedding(x1, x2, y, margin=0.0):
    eps = 1e-12
    cos = (x1 * x2).sum(-1) / np.sqrt(((x1 * x1).sum(-1) + eps) * ((x2 * x2).sum(-1) + eps))
    return np.where(y == 1, 1 - cos, 0) + np.where(y == -1, np.maximum(0, cos - margin), 0)


def ref_triplet(a, p, n, margin=1.0, norm=2.0, eps=1e-6, swap=False):
    d_ap = ref_pairwise_distance(a, p, norm, eps)
    d_an = ref_pairwise_distance(a, n, norm, eps)
    if swap:
        d_an = np.minimum(d_an, ref_pairwise_distance(p, n, norm, eps))
    return np.maximum(d_ap - d_an + margin, 0)


def ref_poisson_nll(x, t, log_input=True, full=False, eps=1e-8):
    loss = np.exp(x) - t * x if log_input else x - t * np.log(x + eps)
    if full:
        safe = np.where(t > 1, t, 2.0)
        stirling = safe * np.log(safe) - safe + 0.5 * np.log(2 * np.pi * safe)
        loss = loss + np.where(t > 1, stirling, 0)
    return loss


def ref_gaussian_nll(x, t, var, full=False, eps=1e-6):
    var = np.asarray(var, dtype=np.float64)
    if var.shape != x.shape and var.shape == x.shape[:-1]:
        var = var[..., None]
    v = np.maximum(var, eps)
    loss = 0.5 * (np.log(v) + (x - t) ** 2 / v)
    return loss + 0.5 * np.log(2 * np.pi) if full else loss


def ref_multilabel_soft_margin(x, y, weight=None):
    loss = -(y * ref_logsigmoid(x) + (1 - y) * ref_logsigmoid(-x))
    if weight is not None:
        loss = loss * weight
    return loss.mean(axis=-1)


# ----------------------------------------------------------------------------- finite differences
def central_differences(f, arrays, upstream, h=1e-6):
    """d sum(f(*arrays) * upstream) / d arrays[i], for every array, by central differences (float64)."""
    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros(np.shape(a))
        for idx in np.ndindex(np.shape(a)):
            plus = [np.array(b, dtype=np.float64) for b in arrays]
            minus = [np.array(b, dtype=np.float64) for b in arrays]
            plus[i][idx] += h
            minus[i][idx] -= h
            g[idx] = ((f(*plus) * upstream).sum() - (f(*minus) * upstream).sum()) / (2 * h)
        grads.append(g)
    return grads
