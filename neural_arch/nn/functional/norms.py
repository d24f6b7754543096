"""torch's ``F.instance_norm`` and ``F.local_response_norm``, composed from the core's
differentiable ops (means, squares, slices, powers).

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn import functional as F
    >>> y = F.instance_norm(na.randn(2, 3, 8))
    >>> bool(abs(y.data.mean(axis=-1)).max() < 1e-5)
    True
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.op_utils import _xp
from neural_arch.core.ops_norm import update_running_stats
from neural_arch.core.ops_shape import concatenate
from neural_arch.core.tensor import Tensor

__all__ = ["instance_norm", "local_response_norm"]


def _tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def _channel_param(p, channels: int, ndim: int, name: str):
    """A per-channel ``(C,)`` weight/bias/statistic reshaped to broadcast over ``(N, C, *)``."""
    if p is None:
        return None
    p = _tensor(p)
    if tuple(p.shape) != (channels,):
        raise RuntimeError(f"instance_norm: {name} should have shape ({channels},) (one value per channel), "
                           f"got {tuple(p.shape)}")
    return p.reshape((1, channels) + (1,) * (ndim - 2))


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each ``(n, c)`` slice of a ``(N, C, *)`` input over its spatial elements, then scale and
    shift per channel (torch's ``F.instance_norm``; biased variance). With ``use_input_stats`` the
    given ``running_mean`` / ``running_var`` are updated in place with the batch average of the
    per-instance mean and unbiased variance; without it, they normalise instead. As torch, a slice of
    a single spatial element cannot be normalised by its own statistics (``ValueError``).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> x = na.tensor([[[1.0, 3.0]]])
        >>> [round(v, 4) for v in F.instance_norm(x).tolist()[0][0]]
        [-1.0, 1.0]
    """
    x = _tensor(input)
    if x.ndim < 2:
        raise ValueError(f"instance_norm: expected an input of at least 2 dimensions (N, C, *), got {x.ndim}")
    if x.data.dtype.kind in "biu":
        raise TypeError(f"instance_norm: expected a floating-point tensor, got dtype {x.data.dtype}")
    n, c = x.shape[0], x.shape[1]
    spatial = tuple(range(2, x.ndim))
    count = int(np.prod(x.shape[2:])) if spatial else 1
    if use_input_stats and count <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {tuple(x.shape)}")
    w = _channel_param(weight, c, x.ndim, "weight")
    b = _channel_param(bias, c, x.ndim, "bias")
    if use_input_stats:
        mean = x.mean(dim=spatial, keepdim=True)
        centred = x - mean
        var = (centred * centred).mean(dim=spatial, keepdim=True)
        if running_mean is not None or running_var is not None:
            for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
                if stat is not None and tuple(_tensor(stat).shape) != (c,):
                    raise RuntimeError(f"instance_norm: {name} should contain {c} elements (one per channel), "
                                       f"got shape {tuple(_tensor(stat).shape)}")
            # torch: the running statistics track the batch average of each instance's statistics
            md = mean.data.reshape(n, c).mean(axis=0)
            vd = var.data.reshape(n, c).mean(axis=0)
            update_running_stats(running_mean, running_var, md, vd, count, momentum)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("instance_norm: use_input_stats=False needs running_mean and running_var")
        mean = _channel_param(Tensor(_tensor(running_mean).data), c, x.ndim, "running_mean")
        var = _channel_param(Tensor(_tensor(running_var).data), c, x.ndim, "running_var")
        centred = x - mean
    y = centred / (var + eps) ** 0.5
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def local_response_norm(input, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """Normalise each element by the squares of its neighbours across channels (torch's
    ``F.local_response_norm``, AlexNet's LRN): ``x / (k + alpha / size * S) ** beta`` where ``S`` sums
    ``x**2`` over the ``size`` channels from ``c - size // 2`` to ``c + (size - 1) // 2``, zero past the
    edges (torch divides by ``size`` there too). Input ``(N, C, *)`` with at least 3 dimensions.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> y = F.local_response_norm(na.ones(1, 3, 1), size=2, alpha=1.0, beta=1.0, k=0.0)
        >>> y.tolist()                       # ones / (S / 2): S = 1 at channel 0, 2 elsewhere
        [[[2.0], [1.0], [1.0]]]
    """
    x = _tensor(input)
    if x.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {x.ndim} dimensions)")
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"local_response_norm: size must be an int, got {size!r}")
    if size < 1:
        raise RuntimeError(f"local_response_norm: size (the window over channels) must be positive, got {size}")
    if x.data.size == 0:
        return x
    size = int(size)
    before, after = size // 2, (size - 1) // 2
    sq = x * x
    xp = _xp(x.data)
    parts = []
    if before:
        parts.append(Tensor(xp.zeros((x.shape[0], before) + tuple(x.shape[2:]), dtype=x.data.dtype)))
    parts.append(sq)
    if after:
        parts.append(Tensor(xp.zeros((x.shape[0], after) + tuple(x.shape[2:]), dtype=x.data.dtype)))
    padded = concatenate(parts, axis=1) if len(parts) > 1 else sq
    c = x.shape[1]
    window = padded[:, 0:c]
    for offset in range(1, size):
        window = window + padded[:, offset:offset + c]
    return x / (window * (float(alpha) / size) + float(k)) ** float(beta)
