"""Instance normalisation layers: torch's ``nn.InstanceNorm1d`` and ``nn.InstanceNorm2d`` over
:func:`~neural_arch.nn.functional.instance_norm`.

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> norm = nn.InstanceNorm1d(3, affine=True, track_running_stats=True)
    >>> list(norm.state_dict())
    ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
"""

from __future__ import annotations

import warnings

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["InstanceNorm1d", "InstanceNorm2d"]


class _InstanceNorm(Module):
    """The shared body of the ``InstanceNorm{1,2}d`` layers; ``_spatial`` is the number of spatial dims.

    torch's defaults: ``affine=False`` and ``track_running_stats=False`` (unlike batch norm); with
    ``affine``, the keyword ``bias=False`` keeps only the scale (torch 2.x). With
    running statistics tracked, ``eval()`` normalises with them; otherwise every call uses the
    instance's own statistics.
    """

    _spatial = 1

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None, dtype=np.float32, *,
                 bias: bool = True):
        super().__init__()
        if int(num_features) < 1:
            raise ValueError(f"{type(self).__name__}: num_features must be positive, got {num_features}")
        self.num_features = int(num_features)
        self.eps = float(eps)
        self.momentum = momentum
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        if self.affine:
            self.weight = Parameter(np.ones(self.num_features, dtype=dtype), device=device)
            if bias:
                self.bias = Parameter(np.zeros(self.num_features, dtype=dtype), device=device)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(self.num_features, dtype=dtype), device=device))
            self.register_buffer("running_var", Tensor(np.ones(self.num_features, dtype=dtype), device=device))
            self.register_buffer("num_batches_tracked", Tensor(np.array(0, dtype=np.int64), device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, input):
        x = input if isinstance(input, Tensor) else Tensor(input)
        batched = self._spatial + 2
        if x.ndim not in (batched - 1, batched):
            raise ValueError(f"{type(self).__name__}: expected {batched - 1}D or {batched}D input "
                             f"(got {x.ndim}D input)")
        unbatched = x.ndim == batched - 1
        if unbatched:
            x = x.unsqueeze(0)
        if x.shape[1] != self.num_features:
            where = 0 if unbatched else 1
            if self.affine or self.track_running_stats:  # the per-channel tensors would be misapplied
                raise ValueError(f"{type(self).__name__}: expected input's size at dim={where} to match "
                                 f"num_features ({self.num_features}), but got: {x.shape[1]}")
            warnings.warn(f"{type(self).__name__}: input's size at dim={where} ({x.shape[1]}) does not match "
                          f"num_features ({self.num_features}), which is not used because affine=False",
                          UserWarning, stacklevel=3)
        use_input_stats = self.training or not self.track_running_stats
        # torch keeps num_batches_tracked at 0 here, so momentum=None (a cumulative average in batch norm)
        # leaves the running statistics where they are.
        momentum = self.momentum if self.momentum is not None else 0.0
        y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            use_input_stats, momentum, self.eps)
        return y.squeeze(0) if unbatched else y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    """Instance norm of ``(N, C, L)`` (or unbatched ``(C, L)``) input (torch's ``nn.InstanceNorm1d``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> y = nn.InstanceNorm1d(2)(na.randn(4, 2, 6))
        >>> bool(abs(y.data.mean(axis=-1)).max() < 1e-5)
        True
    """

    _spatial = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance norm of ``(N, C, H, W)`` (or unbatched ``(C, H, W)``) input (torch's ``nn.InstanceNorm2d``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> y = nn.InstanceNorm2d(2)(na.randn(1, 2, 3, 3))
        >>> bool(abs(y.data.mean(axis=(-2, -1))).max() < 1e-5)
        True
    """

    _spatial = 2
