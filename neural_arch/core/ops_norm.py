"""Batch normalisation, split at the seam a synchronised (multi-rank) batch norm needs.

``batch_norm`` (torch's ``F.batch_norm``) is three steps, each public:

1. :func:`batch_norm_stats` - per-channel ``(count, mean, var)`` of the local batch;
2. (SyncBatchNorm only) combine the ranks' statistics: all-gather ``(count, mean, var)`` and call
   :func:`batch_norm_gather_stats`, which merges them exactly (Chan's parallel formula, so no
   ``E[x^2] - E[x]^2`` cancellation), then :func:`update_running_stats`;
3. :func:`batch_norm_elemt` - normalise with the given (global) ``mean``/``var``. Its backward
   needs two per-channel sums over the *global* batch, ``sum(dy)`` and ``sum(dy * xhat)``: it
   passes the local ones through ``reduce_grad(sum_dy, sum_dy_xhat) -> (sum_dy, sum_dy_xhat)``,
   which a SyncBatchNorm implements as an all-reduce (sum) over its group. ``count`` must then be
   the global element count per channel. The weight/bias gradients stay local sums, as in torch
   (DDP averages them afterwards).

With ``reduce_grad=None`` and local statistics this is exactly single-process batch norm, which
is what lets a SyncBatchNorm be tested against it.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.core import ops_norm
    >>> x = Tensor(np.arange(12.0).reshape(3, 2, 2), requires_grad=True)
    >>> rm, rv = np.zeros(2), np.ones(2)
    >>> y = ops_norm.batch_norm(x, rm, rv, training=True, momentum=0.1)
    >>> np.round(y.data.mean(axis=(0, 2)), 6).tolist(), np.round(rm, 3).tolist()
    ([0.0, 0.0], [0.45, 0.65])
    >>> count, mean, var = ops_norm.batch_norm_stats(x)
    >>> count, mean.tolist()
    (6, [4.5, 6.5])
"""

from __future__ import annotations

import numpy as np

from .autograd import Node
from .op_utils import _needs, _result, _xp
from .tensor import Tensor

__all__ = [
    "batch_norm",
    "batch_norm_elemt",
    "batch_norm_gather_stats",
    "batch_norm_stats",
    "update_running_stats",
]


def _channel_axes(ndim: int) -> tuple:
    return (0,) + tuple(range(2, ndim))


def _bshape(ndim: int, c: int) -> tuple:
    return (1, c) + (1,) * (ndim - 2)


def _acc_dtype(dtype):
    # float16/bfloat16 statistics are accumulated in float32 (as torch does); wider types as is
    return np.float32 if dtype.itemsize < 4 or dtype.kind not in "fc" else dtype


def _array(v):
    return v.data if isinstance(v, Tensor) else v


def batch_norm_stats(x) -> tuple:
    """Per-channel ``(count, mean, var)`` of ``x`` ``(N, C, *)`` over every axis but 1.

    ``var`` is the biased (population) variance, computed in two passes for accuracy. Arrays
    are on ``x``'s device; ``count`` is a Python int.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_norm import batch_norm_stats
        >>> count, mean, var = batch_norm_stats(np.array([[1.0, 0.0], [3.0, 0.0]]))
        >>> count, mean.tolist(), var.tolist()
        (2, [2.0, 0.0], [1.0, 0.0])
    """
    xd = _array(x)
    axes = _channel_axes(xd.ndim)
    acc = _acc_dtype(xd.dtype)
    count = int(xd.size // xd.shape[1]) if xd.shape[1] else 0
    mean = xd.mean(axis=axes, dtype=acc)
    diff = xd.astype(acc, copy=False) - mean.reshape(_bshape(xd.ndim, xd.shape[1]))
    var = (diff * diff).mean(axis=axes)
    return count, mean, var


def batch_norm_gather_stats(counts, means, variances) -> tuple:
    """Merge per-rank statistics: ``counts`` ``(R,)``, ``means``/``variances`` ``(R, C)`` ->
    ``(count, mean, var)`` of the union of the ranks' batches (biased variance).

    Exact up to rounding: ``var = sum_r n_r * (var_r + (mean_r - mean)^2) / n``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_norm import batch_norm_gather_stats
        >>> count, mean, var = batch_norm_gather_stats(np.array([2, 2]), np.array([[0.0], [2.0]]),
        ...                                            np.array([[1.0], [1.0]]))
        >>> count, mean.tolist(), var.tolist()      # the four values -1, 1, 1, 3
        (4, [1.0], [2.0])
    """
    xp = _xp(means)
    counts = xp.asarray(counts, dtype=means.dtype).reshape(-1, 1)
    total = counts.sum()
    mean = (counts * means).sum(axis=0) / total
    var = (counts * (variances + (means - mean) ** 2)).sum(axis=0) / total
    return int(total), mean, var


def update_running_stats(running_mean, running_var, mean, var, count: int, momentum: float) -> None:
    """``running = (1 - momentum) * running + momentum * batch``, in place (Tensors or arrays).

    ``running_var`` tracks the *unbiased* variance (``var * n / (n - 1)``), as torch does.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_norm import update_running_stats
        >>> running_mean, running_var = np.zeros(1), np.ones(1)
        >>> update_running_stats(running_mean, running_var, np.array([1.0]), np.array([1.0]), 2, 0.5)
        >>> running_mean.tolist()
        [0.5]
    """
    m = float(momentum)
    if running_mean is not None:
        rm = _array(running_mean)
        rm *= 1.0 - m
        rm += (m * mean).astype(rm.dtype, copy=False)
    if running_var is not None:
        rv = _array(running_var)
        unbiased = var * (count / (count - 1)) if count > 1 else var
        rv *= 1.0 - m
        rv += (m * unbiased).astype(rv.dtype, copy=False)


def batch_norm_elemt(x: Tensor, mean, var, weight=None, bias=None, eps: float = 1e-5,
                     count: int | None = None, reduce_grad=None) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` per channel, with the given statistics.

    ``count=None``: ``mean``/``var`` are constants (running statistics, eval mode), so the
    gradient is just ``dy * weight / sqrt(var + eps)``. ``count=n``: they were computed from a
    batch of ``n`` elements per channel that includes ``x``, and the backward accounts for that;
    ``reduce_grad`` then turns the local ``(sum_dy, sum_dy_xhat)`` into global sums (see the
    module docstring).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.core.ops_norm import batch_norm_elemt
        >>> x = na.tensor([[1.0], [3.0]])
        >>> batch_norm_elemt(x, np.array([2.0]), np.array([1.0]), eps=0.0).data.ravel().tolist()
        [-1.0, 1.0]
    """
    xd = x.data
    xp = _xp(xd)
    c = xd.shape[1]
    shp = _bshape(xd.ndim, c)
    axes = _channel_axes(xd.ndim)
    acc = _acc_dtype(xd.dtype)
    mean = xp.asarray(_array(mean)).astype(acc, copy=False)
    rstd = 1.0 / xp.sqrt(xp.asarray(_array(var)).astype(acc, copy=False) + eps)
    xhat = (xd - mean.reshape(shp)) * rstd.reshape(shp)
    wd = _array(weight)
    bd = _array(bias)
    out = xhat * wd.reshape(shp) if wd is not None else xhat
    if bd is not None:
        out = out + bd.reshape(shp)
    out = out.astype(xd.dtype, copy=False)
    wt = weight if isinstance(weight, Tensor) and weight.requires_grad else None
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)
    scale = rstd * wd if wd is not None else rstd  # dy -> dx factor per channel

    def fn(g):
        gx = gw = gb = None
        sum_dy_xhat = (g * xhat).sum(axis=axes) if (wt is not None or (rx and count)) else None
        if wt is not None:
            gw = sum_dy_xhat.astype(wd.dtype, copy=False)
        if bt is not None:
            gb = g.sum(axis=axes).astype(bd.dtype, copy=False)
        if rx:
            if count is None:
                gx = g * scale.reshape(shp)
            else:
                sum_dy, sdx = g.sum(axis=axes), sum_dy_xhat
                if reduce_grad is not None:
                    sum_dy, sdx = reduce_grad(sum_dy, sdx)
                gx = scale.reshape(shp) * (g - (sum_dy / count).reshape(shp) - xhat * (sdx / count).reshape(shp))
            gx = gx.astype(xd.dtype, copy=False)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, wt, bt), "BatchNorm"))


def batch_norm(input: Tensor, running_mean, running_var, weight=None, bias=None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """torch's ``F.batch_norm`` for ``(N, C)``, ``(N, C, L)`` or ``(N, C, H, W)`` input.

    Training: normalise with the batch statistics and, when given, update ``running_mean`` /
    ``running_var`` in place (Tensors or arrays). Eval: normalise with the running statistics.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> x = na.tensor([[1.0], [3.0]])
        >>> mean, var = np.zeros(1, np.float32), np.ones(1, np.float32)
        >>> [round(v, 3) for v in F.batch_norm(x, mean, var, training=True).data.ravel().tolist()]
        [-1.0, 1.0]
        >>> round(float(mean[0]), 4)         # running statistics updated with momentum 0.1
        0.2
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected input of shape (N, C, *), got {list(x.shape)}")
    if training:
        count, mean, var = batch_norm_stats(x)
        if count <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {list(x.shape)}"
            )
        update_running_stats(running_mean, running_var, mean, var, count, momentum)
        return batch_norm_elemt(x, mean, var, weight, bias, eps, count=count)
    if running_mean is None or running_var is None:
        raise ValueError(
            "batch_norm: running_mean and running_var are needed when training=False; pass "
            "training=True to normalise with the batch statistics"
        )
    return batch_norm_elemt(x, running_mean, running_var, weight, bias, eps)
