"""Differentiable neural-network ops: dropout, embedding, layer_norm and the fused ``linear``
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

import numpy as np

from .. import backend as _backend
from .autograd import Node
from .op_utils import _needs, _result, _xp, scatter_add
from .rng import get_generator
from .tensor import Tensor


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


def embedding(indices, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices`` (any shape).

    The weight gradient is a scatter-add, so repeated indices accumulate.

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
    out = wd[idx]
    if not _needs(weight):
        return _result(out, None)

    # The backward needs the weight's shape, not its values: keeping ``wd`` alive here would
    # hold the whole table (and, under FSDP, the gathered buffer it views) until this node runs.
    shape = wd.shape

    def fn(g):
        gw = xp.zeros(shape, dtype=g.dtype)
        scatter_add(xp, gw, idx.reshape(-1), g.reshape((-1,) + shape[1:]))
        return (gw,)

    return _result(out, Node(fn, (weight,), "Embedding"))


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
    if xd.shape[xd.ndim - k :] != normalized_shape:
        raise ValueError(
            f"layer_norm: input shape {xd.shape} does not end with normalized_shape {normalized_shape}"
        )
    xp = _xp(xd)
    if _fused_rows_ok(xd, weight, bias, normalized_shape):
        return _layer_norm_rows(x, normalized_shape, weight, bias, eps)
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

    return _result(out, Node(fn, (x if rx else None, wt, bt), "LayerNorm"))


def _row_dots(a):
    """``(a * a).sum(axis=1)`` without the temporary: ``np.vecdot`` (NumPy >= 2) or einsum."""
    vecdot = getattr(np, "vecdot", None)
    return vecdot(a, a) if vecdot is not None else np.einsum("ij,ij->i", a, a)


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

    The row reductions are dot products (``np.vecdot``, matrix-vector products), which read their
    operands once and leave no temporaries, and the backward uses
    ``sum(g * w * xhat) = (g * xhat) @ w``, so ``g * xhat`` serves both the weight gradient and the
    input gradient. Same formulas as the general path; sums are taken in a different order
    (float rounding).
    """
    xd = x.data
    xshape = xd.shape
    n = math.prod(normalized_shape)
    rows = xd.reshape(xd.size // n, n)
    dtype = xd.dtype
    ones = np.ones(n, dtype=dtype)
    mu = rows @ ones
    mu /= n
    xhat = rows - mu[:, None]  # centred; becomes xhat in place below
    var = _row_dots(xhat)
    var /= n
    var += eps
    rstd = np.sqrt(var, out=var)
    np.divide(1.0, rstd, out=rstd)
    rstd = rstd[:, None]
    xhat *= rstd
    wd = None if weight is None else (weight.data if isinstance(weight, Tensor) else weight).reshape(n)
    bd = None if bias is None else (bias.data if isinstance(bias, Tensor) else bias).reshape(n)
    if wd is not None:
        out = xhat * wd
        if bd is not None:
            out += bd
    elif bd is not None:
        out = xhat + bd
    else:
        out = xhat
    out = out.reshape(xshape)
    wt = weight if isinstance(weight, Tensor) and weight.requires_grad else None
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)

    def fn(g):
        g2 = g.reshape(rows.shape)
        gx = gw = gb = None
        gxhat = g2 * xhat if (wt is not None or rx) else None
        if wt is not None:
            gw = gxhat.sum(axis=0).reshape(normalized_shape)
        if bt is not None:
            gb = g2.sum(axis=0).reshape(normalized_shape)
        if rx:
            # gx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w
            if wd is not None:
                m1 = g2 @ wd
                m2 = gxhat @ wd
                gx = g2 * wd
            else:
                m1 = g2 @ ones
                m2 = gxhat @ ones
                gx = g2.copy()
            m1 /= n
            m2 /= n
            gx -= m1[:, None]
            np.multiply(xhat, m2[:, None], out=gxhat)
            gx -= gxhat
            gx *= rstd
            gx = gx.reshape(xshape)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, wt, bt), "LayerNorm"))


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
    if xd.ndim != 2:
        out = out.reshape(xshape[:-1] + (wd.shape[0],))
    bd = None
    if bias is not None:
        bd = bias.data if isinstance(bias, Tensor) else bias
        out += bd  # out is freshly allocated: add in place, no extra temporary
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
        gb = g2.sum(axis=0) if bt is not None else None
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, weight if rw else None, bt), "Linear"))


# ============================================================================ method binding
