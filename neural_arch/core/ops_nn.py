"""Differentiable neural-network ops: dropout, embedding, the normalisations over a sample
(``layer_norm``, ``rms_norm``, ``group_norm``) and the fused ``linear``
(the activations live in :mod:`.ops_activation`, the losses in :mod:`.ops_loss`; the functional
face of them all is :mod:`neural_arch.nn.functional`).

Several of these are fused (one graph node, a hand-derived backward) because they sit on the hot
path of every training step: ``linear``, ``layer_norm``, ``cross_entropy``, ``log_softmax``.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.nn import functional as F
    >>> x = Tensor(np.ones((4, 3)), requires_grad=True)
    >>> w = Tensor(np.ones((2, 3)), requires_grad=True)           # (out_features, in_features)
    >>> loss = F.cross_entropy(F.linear(x, w), np.array([0, 1, 1, 0]))
    >>> loss.backward()
    >>> w.grad.shape
    (2, 3)
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from neural_arch.core import device_kernels

from .. import backend as _backend
from .autograd import Node
from .op_utils import (
    VECTOR_OP_MIN_SIZE,
    _needs,
    _result,
    _xp,
    ones_vector,
    scatter_add,
    unbroadcast,
    vector_op,
)
from .rng import get_generator
from .tensor import Tensor
from .thread_pool import parallel_chunks


# ============================================================================ dropout, embedding
def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)`` (inverted
    dropout). Identity when ``training`` is False or ``p == 0``. Uses the global generator.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> x = na.ones(1000)
        >>> kept = F.dropout(x, p=0.5).data
        >>> sorted(set(kept.tolist())), F.dropout(x, p=0.5, training=False) is x
        ([0.0, 2.0], True)
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    xd = x.data
    if xd.dtype.kind in "biu":  # the 1 / (1 - p) scale would be truncated to an integer (torch raises)
        raise TypeError(f"dropout: expected a floating-point tensor, got dtype {xd.dtype}; convert it with "
                        f".float() first")
    xp = _xp(xd)
    if p == 1.0:
        mask = xp.zeros(xd.shape, dtype=xd.dtype)
    else:
        if xp is np:
            keep = get_generator().random(xd.shape, dtype=np.float32) >= p
        else:
            keep = xp.random.random(xd.shape, dtype=xp.float32) >= p
        mask = keep.astype(xd.dtype) * xd.dtype.type(1.0 / (1.0 - p))
    out = xd * mask
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * mask,), (x,), "Dropout"))


def embedding(indices, weight: Tensor, padding_idx=None) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices`` (any shape).

    The weight gradient is a scatter-add, so repeated indices accumulate. ``padding_idx`` (as
    torch's; negative counts from the end) names a row that receives no gradient: entries equal to
    it still read that row. A negative index raises ``IndexError`` as in torch (NumPy would wrap it
    around to a row from the end); device indices are not checked (that would wait for the GPU).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> weight = na.arange(6).reshape(3, 2).astype(na.float32)
        >>> F.embedding(np.array([[2, 0]]), weight).tolist()
        [[[4.0, 5.0], [0.0, 1.0]]]
    """
    idx = indices.data if isinstance(indices, Tensor) else indices
    wd = weight.data
    xp = _xp(wd)
    idx = xp.asarray(idx)
    if idx.dtype.kind not in "iu":
        if idx.dtype.kind == "f" and bool((idx == xp.round(idx)).all()):
            idx = idx.astype(xp.int64)
        else:
            raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    if padding_idx is not None:
        num = wd.shape[0]
        if not -num <= padding_idx < num:
            raise ValueError(f"embedding: padding_idx must be within the {num} embeddings "
                             f"([-{num}, {num - 1}]), got {padding_idx}")
        padding_idx = int(padding_idx) % num
    if type(idx) is np.ndarray and idx.size and idx.dtype.kind == "i" and idx.min() < 0:
        raise IndexError(f"embedding: index {int(idx.min())} is out of range for {wd.shape[0]} embeddings "
                         f"(valid: 0..{wd.shape[0] - 1})")
    out = wd[idx]
    if not _needs(weight):
        return _result(out, None)

    # The backward needs the weight's shape, not its values: keeping ``wd`` alive here would
    # hold the whole table (and, under FSDP, the gathered buffer it views) until this node runs.
    shape = wd.shape

    def fn(g):
        gw = xp.zeros(shape, dtype=g.dtype)
        scatter_add(xp, gw, idx.reshape(-1), g.reshape((-1,) + shape[1:]))
        if padding_idx is not None:
            gw[padding_idx] = 0  # only entries equal to padding_idx added to that row
        return (gw,)

    return _result(out, Node(fn, (weight,), "Embedding", saved=(indices,)))


# ============================================================================ normalisation
def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, then scale/shift (fused op).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> y = F.layer_norm(na.tensor([[1.0, 3.0]]), (2,))
        >>> [round(v, 3) for v in y.tolist()[0]]
        [-1.0, 1.0]
    """
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    xd = x.data
    if xd.dtype.kind in "biu":  # the result would be cast back to integers (torch raises too)
        raise TypeError(f"layer_norm: expected a floating-point tensor, got dtype {xd.dtype}; convert it "
                        f"with .float() (or .double()) first")
    if xd.shape[xd.ndim - k :] != normalized_shape:
        raise ValueError(
            f"layer_norm: input shape {xd.shape} does not end with normalized_shape {normalized_shape}"
        )
    xp = _xp(xd)
    if _fused_rows_ok(xd, weight, bias, normalized_shape):
        return _layer_norm_rows(x, normalized_shape, weight, bias, eps)
    if xp is not np and _device_kernels_ok(xd, weight, bias, normalized_shape):
        return _layer_norm_device(x, xp, normalized_shape, weight, bias, eps)
    axes = tuple(range(xd.ndim - k, xd.ndim))
    mu = xd.mean(axis=axes, keepdims=True)
    xc = xd - mu
    var = (xc * xc).mean(axis=axes, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + eps)
    # In place from here (same arithmetic, fewer activation-sized temporaries): xc becomes xhat.
    xhat = xc
    if xhat.dtype == rstd.dtype:
        xhat *= rstd
    else:
        xhat = xc * rstd
    wd = weight.data if isinstance(weight, Tensor) else weight
    bd = bias.data if isinstance(bias, Tensor) else bias
    out = xhat * wd if wd is not None else xhat
    if bd is not None:
        if (wd is not None and getattr(bd, "dtype", None) == out.dtype
                and tuple(bd.shape) == tuple(out.shape[out.ndim - bd.ndim:])):
            out += bd  # out is fresh (xhat * wd): xhat, kept for backward, is not touched
        else:
            out = out + bd
    out = out.astype(xd.dtype, copy=False)
    wt = weight if isinstance(weight, Tensor) and weight.requires_grad else None
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)
    batch_axes = tuple(range(xd.ndim - k))
    n = 1
    for s in normalized_shape:
        n *= s

    def fn(g):
        gx = gw = gb = None
        if wt is not None:
            gw = (g * xhat).sum(axis=batch_axes)
        if bt is not None:
            gb = g.sum(axis=batch_axes)
        if rx:
            dxhat = g * wd if wd is not None else g
            m1 = dxhat.sum(axis=axes, keepdims=True) / n
            prod = dxhat * xhat
            m2 = prod.sum(axis=axes, keepdims=True) / n
            gx = dxhat - m1
            if prod.dtype == gx.dtype == xp.result_type(xhat, m2, rstd):
                # rstd * ((dxhat - m1) - xhat * m2), reusing two fresh temporaries
                xp.multiply(xhat, m2, out=prod)
                gx -= prod
                gx *= rstd
            else:
                gx = rstd * (gx - xhat * m2)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, wt, bt), "LayerNorm", saved=(weight,)))


def _device_kernels_ok(xd, weight, bias, normalized_shape) -> bool:
    """Whether :func:`_layer_norm_device` applies: float32/float64 device input, weight/bias (if any)
    of its dtype and exactly ``normalized_shape``."""
    params = [p.data if isinstance(p, Tensor) else p for p in (weight, bias) if p is not None]
    return device_kernels.applies(xd, *params) and all(tuple(p.shape) == normalized_shape for p in params)


def _layer_norm_device(x: Tensor, xp, normalized_shape, weight, bias, eps: float) -> Tensor:
    """:func:`layer_norm` on a device: the statistics as fused map-reduce kernels, the normalisation
    and its backward one kernel each (neural_arch.core.device_kernels); the general path's formulas."""
    xd = x.data
    k = len(normalized_shape)
    axes = tuple(range(xd.ndim - k, xd.ndim))
    wd = weight.data if isinstance(weight, Tensor) else weight
    bd = bias.data if isinstance(bias, Tensor) else bias
    out, xhat, rstd = device_kernels.layer_norm(xp, xd, axes, wd, bd, eps)
    wt = weight if isinstance(weight, Tensor) and weight.requires_grad else None
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)
    batch_axes = tuple(range(xd.ndim - k))

    def fn(g):
        if not device_kernels.applies(g, xhat):  # an upstream gradient of another dtype: match it first
            g = g.astype(xhat.dtype)
        return device_kernels.layer_norm_backward(xp, g, xhat, rstd, wd, axes, batch_axes,
                                                  rx, wt is not None, bt is not None)

    return _result(out, Node(fn, (x if rx else None, wt, bt), "LayerNorm", saved=(weight,)))


def _row_dots(a, b=None):
    """``(a * b).sum(axis=1)`` (``b`` defaults to ``a``; a 1-d ``b`` is every row's weights)
    without the temporary: ``np.vecdot`` (NumPy >= 2) or einsum. Row by row, unlike a BLAS
    matrix-vector product, whose rounding depends on how many rows it is given: a block of rows
    on the thread pool gets exactly the values of the whole."""
    b = a if b is None else b
    vecdot = getattr(np, "vecdot", None)
    if vecdot is not None:
        return vecdot(a, b)
    return np.einsum("ij,ij->i" if b.ndim == 2 else "ij,j->i", a, b)


def _column_sums(a):
    """``a.sum(axis=0)`` of a 2-d float NumPy matrix as a BLAS matrix-vector product (``ones @ a``):
    it reads ``a`` once at full speed, where NumPy's column sum is about twice as slow."""
    return ones_vector(a.shape[0], a.dtype) @ a


def _fused_rows_ok(xd, weight, bias, normalized_shape) -> bool:
    """Whether :func:`_layer_norm_rows` applies: NumPy float32/float64 input, a non-empty row, and
    weight/bias (if any) of the input's dtype and exactly ``normalized_shape`` (no broadcasting)."""
    if type(xd) is not np.ndarray or xd.dtype not in (np.float32, np.float64) or xd.size == 0:
        return False
    for p in (weight, bias):
        if p is None:
            continue
        pd = p.data if isinstance(p, Tensor) else p
        if type(pd) is not np.ndarray or pd.dtype != xd.dtype or pd.shape != normalized_shape:
            return False
    return math.prod(normalized_shape) > 0


def _layer_norm_rows(x: Tensor, normalized_shape, weight, bias, eps: float) -> Tensor:
    """:func:`layer_norm` on NumPy float32/float64 as ``(rows, n)`` matrices.

    The row reductions are dot products (``np.vecdot``), which read their operands once and leave
    no temporaries, and the backward uses ``sum(g * w * xhat) = (g * xhat) . w``, so ``g * xhat`` serves both the weight gradient and the
    input gradient. Same formulas as the general path; sums are taken in a different order
    (float rounding).
    """
    xd = x.data
    xshape = xd.shape
    n = math.prod(normalized_shape)
    rows = xd.reshape(xd.size // n, n)
    n_rows = rows.shape[0]
    dtype = xd.dtype
    ones = ones_vector(n, dtype)
    wd = None if weight is None else (weight.data if isinstance(weight, Tensor) else weight).reshape(n)
    bd = None if bias is None else (bias.data if isinstance(bias, Tensor) else bias).reshape(n)
    xhat = np.empty_like(rows)
    rstd = np.empty(n_rows, dtype=dtype)
    out = xhat if wd is None and bd is None else np.empty_like(rows)

    def forward_rows(lo, hi):
        # rows [lo, hi) only: the thread pool runs disjoint row ranges at once
        r, xh, sd = rows[lo:hi], xhat[lo:hi], rstd[lo:hi]
        mu = _row_dots(r, ones)
        mu /= n
        np.subtract(r, mu[:, None], out=xh)  # centred; becomes xhat in place below
        var = _row_dots(xh)
        var /= n
        var += eps
        np.sqrt(var, out=var)
        np.divide(1.0, var, out=sd)
        xh *= sd[:, None]
        if wd is not None:
            vector_op(np.multiply, xh, wd, out[lo:hi])
            if bd is not None:
                vector_op(np.add, out[lo:hi], bd, out[lo:hi])
        elif bd is not None:
            vector_op(np.add, xh, bd, out[lo:hi])

    parallel_chunks(n_rows, forward_rows, work=8 * rows.size)
    rstd = rstd[:, None]
    out = out.reshape(xshape)
    wt = weight if isinstance(weight, Tensor) and weight.requires_grad else None
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)

    def fn(g):
        g2 = g.reshape(rows.shape)
        gx = gw = gb = None
        gxhat = np.empty_like(xhat) if (wt is not None or rx) else None
        w = ones if wd is None else wd
        if rx:
            gx = np.empty_like(xhat)
            m2 = np.empty(n_rows, dtype=dtype)

        def products(lo, hi):
            # gx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w; rows
            # [lo, hi) only (the thread pool runs disjoint row ranges at once)
            g_r = g2[lo:hi]
            if gxhat is not None:
                np.multiply(g_r, xhat[lo:hi], out=gxhat[lo:hi])
            if rx:
                gxr = gx[lo:hi]
                m1 = _row_dots(g_r, w)
                m1 /= n
                np.divide(_row_dots(gxhat[lo:hi], w), n, out=m2[lo:hi])
                vector_op(np.multiply, g_r, w, gxr)
                gxr -= m1[:, None]

        def finish(lo, hi):
            scratch = gxhat[lo:hi]  # its products are summed into gw already: reused
            np.multiply(xhat[lo:hi], m2[lo:hi, None], out=scratch)
            gxr = gx[lo:hi]
            gxr -= scratch
            gxr *= rstd[lo:hi]

        parallel_chunks(n_rows, products, work=6 * rows.size)
        if wt is not None:
            gw = _column_sums(gxhat).reshape(normalized_shape)
        if bt is not None:
            gb = _column_sums(g2).reshape(normalized_shape)
        if rx:
            parallel_chunks(n_rows, finish, work=3 * rows.size)
            gx = gx.reshape(xshape)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, wt, bt), "LayerNorm", saved=(weight,)))


def _param_data(p, name: str, shape: tuple, op: str):
    """A weight/bias (Tensor, array or None) as an array of exactly ``shape`` (torch's check)."""
    if p is None:
        return None
    d = p.data if isinstance(p, Tensor) else p
    if tuple(d.shape) != tuple(shape):
        raise RuntimeError(f"{op}: expected {name} of shape {list(shape)}, got {list(d.shape)}")
    return d


def _grad_param(p):
    return p if isinstance(p, Tensor) and p.requires_grad else None


def rms_norm(input: Tensor, normalized_shape, weight=None, eps=None) -> Tensor:
    """torch's ``F.rms_norm`` (2.4): ``x / sqrt(mean(x**2) + eps) * weight`` over the trailing
    ``normalized_shape`` dims; ``eps=None`` is the input dtype's machine epsilon (torch's default).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> y = F.rms_norm(na.tensor([[3.0, 4.0]]), (2,), eps=0.0)
        >>> [round(v, 4) for v in y.tolist()[0]]
        [0.8485, 1.1314]
    """
    x = input
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    xd = x.data
    if xd.dtype.kind in "biu":
        raise TypeError(f"rms_norm: expected a floating-point tensor, got dtype {xd.dtype}; convert it with "
                        f".float() (or .double()) first")
    if k > xd.ndim or xd.shape[xd.ndim - k:] != normalized_shape:
        raise RuntimeError(f"rms_norm: given normalized_shape={list(normalized_shape)}, expected input with "
                           f"shape [*, {', '.join(map(str, normalized_shape))}], got {list(xd.shape)}")
    wd = _param_data(weight, "weight", normalized_shape, "rms_norm")
    if eps is None:
        eps = float(ml_dtypes.finfo(xd.dtype).eps)   # NumPy's finfo refuses bfloat16
    xp = _xp(xd)
    axes = tuple(range(xd.ndim - k, xd.ndim))
    inv_n = 1.0 / max(math.prod(normalized_shape), 1)  # sums scaled, not means: nothing warns when empty
    rstd = 1.0 / xp.sqrt((xd * xd).sum(axis=axes, keepdims=True) * inv_n + eps)
    xhat = xd * rstd
    out = (xhat * wd if wd is not None else xhat).astype(xd.dtype, copy=False)
    wt = _grad_param(weight)
    rx = x.requires_grad
    if not _needs(x if rx else None, wt):
        return _result(out, None)
    batch_axes = tuple(range(xd.ndim - k))

    def fn(g):
        gx = gw = None
        if wt is not None:
            gw = (g * xhat).sum(axis=batch_axes).astype(wd.dtype, copy=False)
        if rx:
            dxhat = g * wd if wd is not None else g
            # d(x * rstd): rstd * (dxhat - xhat * mean(dxhat * xhat)) over the normalised dims
            gx = rstd * (dxhat - xhat * ((dxhat * xhat).sum(axis=axes, keepdims=True) * inv_n))
            gx = gx.astype(xd.dtype, copy=False)
        return gx, gw

    return _result(out, Node(fn, (x if rx else None, wt), "RmsNorm", saved=(weight,)))


def group_norm(input: Tensor, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """torch's ``F.group_norm``: input ``(N, C, *)`` with its ``C`` channels split into ``num_groups``
    groups, each ``(sample, group)`` normalised by its own mean and (biased) variance, then the
    per-channel ``weight``/``bias`` ``(C,)`` applied. ``C`` must divide by ``num_groups`` (torch's
    error otherwise).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> x = na.tensor([[[1.0, 3.0], [10.0, 30.0]]])          # N=1, C=2, L=2
        >>> [[round(v, 3) for v in row] for row in F.group_norm(x, 2, eps=0.0).tolist()[0]]
        [[-1.0, 1.0], [-1.0, 1.0]]
    """
    x = input
    xd = x.data
    if xd.ndim < 2:
        raise RuntimeError(f"group_norm: expected input of at least 2 dimensions (N, C, *), got shape "
                           f"{list(xd.shape)}")
    if xd.dtype.kind in "biu":
        raise TypeError(f"group_norm: expected a floating-point tensor, got dtype {xd.dtype}; convert it with "
                        f".float() (or .double()) first")
    n, c = xd.shape[:2]
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups <= 0 \
            or c % num_groups:
        raise RuntimeError(f"group_norm: expected number of channels in input to be divisible by num_groups, "
                           f"but got input of shape {list(xd.shape)} and num_groups={num_groups}")
    wd = _param_data(weight, "weight", (c,), "group_norm")
    bd = _param_data(bias, "bias", (c,), "group_norm")
    xp = _xp(xd)
    groups = (n, int(num_groups), math.prod(xd.shape) // (n * num_groups) if n else 0)
    bshape = (1, c) + (1,) * (xd.ndim - 2)
    inv_m = 1.0 / max(groups[2], 1)  # sums scaled, not means: an empty group (no element) warns of nothing
    xg = xd.reshape(groups)
    xc = xg - xg.sum(axis=-1, keepdims=True) * inv_m
    rstd = 1.0 / xp.sqrt((xc * xc).sum(axis=-1, keepdims=True) * inv_m + eps)
    xhat = (xc * rstd).reshape(xd.shape)
    out = xhat * wd.reshape(bshape) if wd is not None else xhat
    if bd is not None:
        out = out + bd.reshape(bshape)
    out = out.astype(xd.dtype, copy=False)
    wt, bt = _grad_param(weight), _grad_param(bias)
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)
    channel_axes = (0,) + tuple(range(2, xd.ndim))

    def fn(g):
        gx = gw = gb = None
        if wt is not None:
            gw = (g * xhat).sum(axis=channel_axes).astype(wd.dtype, copy=False)
        if bt is not None:
            gb = g.sum(axis=channel_axes).astype(bd.dtype, copy=False)
        if rx:
            d = (g * wd.reshape(bshape) if wd is not None else g).reshape(groups)
            h = xhat.reshape(groups)
            gx = rstd * (d - d.sum(axis=-1, keepdims=True) * inv_m - h * ((d * h).sum(axis=-1, keepdims=True) * inv_m))
            gx = gx.reshape(xd.shape).astype(xd.dtype, copy=False)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, wt, bt), "GroupNorm", saved=(weight,)))


# ============================================================================ linear
def linear(x: Tensor, weight: Tensor, bias=None) -> Tensor:
    """``x @ weight.T + bias`` as one fused op; ``weight`` is (out_features, in_features).

    ``x`` may have any number of leading dims (..., in_features).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.linear(na.ones(4, 3), na.ones(2, 3), na.zeros(2)).tolist()[0]
        [3.0, 3.0]
    """
    xd, wd = x.data, weight.data
    if type(xd) is not type(wd):
        _backend.check_same_device(xd, wd, "linear")
    if xd.shape[-1] != wd.shape[1]:
        raise ValueError(
            f"linear: input has {xd.shape[-1]} features but weight expects {wd.shape[1]} "
            f"(weight shape {wd.shape} is (out_features, in_features))"
        )
    xshape = xd.shape
    # One 2-d GEMM over all leading dims: NumPy runs (B, T, K) @ (K, N) as B separate GEMMs,
    # each too small to reach the BLAS's full speed (docs/benchmarks.md, issue 37).
    x2 = xd if xd.ndim == 2 else xd.reshape(math.prod(xshape[:-1]), xshape[-1])
    out = x2 @ wd.T
    bd = None if bias is None else (bias.data if isinstance(bias, Tensor) else bias)
    # out is freshly allocated: the bias is added in place, no extra temporary
    added = type(bd) is np.ndarray and bd.ndim == 1 and out.size >= VECTOR_OP_MIN_SIZE
    if added:
        vector_op(np.add, out, bd, out)
    if xd.ndim != 2:
        out = out.reshape(xshape[:-1] + (wd.shape[0],))
    if bd is not None and not added:
        out += bd
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx, rw = x.requires_grad, weight.requires_grad
    if not _needs(x if rx else None, weight if rw else None, bt):
        return _result(out, None)

    def fn(g):
        g2 = g if g.ndim == 2 else g.reshape(math.prod(g.shape[:-1]), g.shape[-1])
        gx = None
        if rx:
            gx = g2 @ wd
            if gx.shape != xshape:
                gx = gx.reshape(xshape)
        gw = (g2.T @ x2) if rw else None
        gb = linear_bias_grad(g2) if bt is not None else None
        if gb is not None and gb.shape != bd.shape:  # a bias broadcast from fewer elements (a 0-d one)
            gb = unbroadcast(gb, bd.shape)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, weight if rw else None, bt), "Linear",
                                saved=(x, weight)))


def linear_bias_grad(g2):
    """The bias gradient of :func:`linear` from its 2-d output gradient ``g2`` (rows, out_features): the
    column sums, as one BLAS matrix-vector product on NumPy float32/float64 (``ones @ g2`` reads ``g2``
    once at full speed, where NumPy's column sum is about twice as slow), else ``g2.sum(axis=0)``.
    The one owner of that expression: the zero-bubble pipeline's deferred weight gradient uses it too,
    so its gradients equal the engine's bit for bit.

    >>> import numpy as np
    >>> linear_bias_grad(np.arange(6.0).reshape(3, 2)).tolist()
    [6.0, 9.0]
    """
    if type(g2) is np.ndarray and g2.dtype in (np.float32, np.float64) and g2.ndim == 2:
        return _column_sums(g2)
    return g2.sum(axis=0)


# ============================================================================ method binding
