"""``LayerNorm``, ``RMSNorm``, ``GroupNorm``, ``LocalResponseNorm``, ``Dropout``, ``Dropout1d``,
``Dropout2d`` and ``AlphaDropout`` (batch norm lives in ``nn.batchnorm``, instance norm in
``nn.instancenorm``).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> ln = nn.LayerNorm(4)
    >>> y = ln(np.arange(8, dtype=np.float32).reshape(2, 4))
    >>> bool(abs(y.data.mean(-1)).max() < 1e-5)
    True
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["LayerNorm", "RMSNorm", "GroupNorm", "LocalResponseNorm", "Dropout", "Dropout1d", "Dropout2d",
           "AlphaDropout"]


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims, then scale and shift (learnable).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> ln = nn.LayerNorm(4)
        >>> y = ln(na.randn(2, 3, 4))
        >>> y.shape, bool(abs(y.data.mean(axis=-1)).max() < 1e-5)
        ((2, 3, 4), True)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype=np.float32, device=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype), device=device)
            if bias:
                self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype), device=device)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape`` dims with a learnable
    scale (torch 2.4's ``nn.RMSNorm``); ``eps=None`` is the input dtype's machine epsilon.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> norm = nn.RMSNorm(4)
        >>> y = norm(na.randn(2, 4))
        >>> y.shape, bool(abs((y.data ** 2).mean(axis=-1) - 1).max() < 1e-4)
        ((2, 4), True)
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None,
                 dtype=np.float32):
        super().__init__()
        if isinstance(normalized_shape, (int, np.integer)):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype), device=device)
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Group normalisation (torch's ``nn.GroupNorm(num_groups, num_channels, eps=1e-5,
    affine=True)``): the channels of ``(N, C, *)`` input split into ``num_groups`` groups, each
    normalised per sample, then a learnable per-channel scale and shift.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> gn = nn.GroupNorm(2, 4)
        >>> y = gn(na.randn(3, 4, 5))
        >>> y.shape, bool(abs(y.data.reshape(3, 2, 10).mean(axis=-1)).max() < 1e-5)
        ((3, 4, 5), True)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device=None, dtype=np.float32):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups = int(num_groups)
        self.num_channels = int(num_channels)
        self.eps = float(eps)
        self.affine = bool(affine)
        if self.affine:
            self.weight = Parameter(np.ones(self.num_channels, dtype=dtype), device=device)
            self.bias = Parameter(np.zeros(self.num_channels, dtype=dtype), device=device)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"

class Dropout(Module):
    """Zero each element with probability ``p`` while training, scaling the rest by 1/(1-p).

    Identity in ``eval()`` mode. The mask comes from the seeded global generator.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> drop = nn.Dropout(p=0.5)
        >>> sorted(set(drop(na.ones(1000)).tolist())), drop.eval()(na.ones(2)).tolist()
        ([0.0, 2.0], [1.0, 1.0])
    """

    _op = staticmethod(F.dropout)

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"{type(self).__name__}: p must be in [0, 1], got {p}")
        self.p = float(p)
        # Accepted for torch compatibility; the result is computed out of place either way.
        self.inplace = bool(inplace)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        if not self.training or self.p == 0.0:
            return x  # skip the op entirely: no mask, no graph node
        return self._op(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}" if self.inplace else f"p={self.p}"


class Dropout2d(Dropout):
    """Zero whole channels of ``(N, C, H, W)`` (or ``(N, C, L)``) input with probability ``p``
    while training, scaling the rest by 1/(1-p): one draw per ``(n, c)`` (torch's Dropout2d).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> y = nn.Dropout2d(p=0.5)(na.ones(1, 8, 2, 2)).data
        >>> sorted(set(y.reshape(8, 4).std(axis=1).tolist()))    # each channel all kept or all zeroed
        [0.0]
    """

    _op = staticmethod(F.dropout2d)


class Dropout1d(Dropout):
    """Zero whole channels of ``(N, C, L)`` (or unbatched ``(C, L)``) input with probability ``p`` while
    training, scaling the rest by 1/(1-p) (torch's ``nn.Dropout1d``; other ranks are refused).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> y = nn.Dropout1d(p=0.5)(na.ones(1, 8, 3)).data
        >>> sorted(set(y.std(axis=-1).ravel().tolist()))     # each channel all kept or all zeroed
        [0.0]
    """

    _op = staticmethod(F.dropout1d)


class AlphaDropout(Dropout):
    """Dropout that keeps SELU's self-normalising mean and variance (torch's ``nn.AlphaDropout(p=0.5)``):
    dropped elements take SELU's saturation value, then an affine map restores the statistics.
    Identity in ``eval()`` mode.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.AlphaDropout(0.2).eval()(na.ones(2)).tolist()
        [1.0, 1.0]
    """

    _op = staticmethod(F.alpha_dropout)


class LocalResponseNorm(Module):
    """Local response normalisation across channels (torch's ``nn.LocalResponseNorm(size, alpha=1e-4,
    beta=0.75, k=1.0)``), over :func:`~neural_arch.nn.functional.local_response_norm`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.LocalResponseNorm(2)(na.zeros(1, 3, 4)).shape
        (1, 3, 4)
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size = int(size)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.k = float(k)

    def forward(self, x):
        return F.local_response_norm(x if isinstance(x, Tensor) else Tensor(x), self.size, self.alpha, self.beta,
                                     self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
