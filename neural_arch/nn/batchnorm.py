"""``BatchNorm1d``, ``BatchNorm2d`` and ``BatchNorm3d``: batch normalisation with running statistics.

Training normalises with the batch's per-channel mean and (biased) variance and updates the
``running_mean`` / ``running_var`` buffers (``running_var`` with the unbiased variance), with
``momentum`` (``None``: cumulative average over ``num_batches_tracked`` batches). ``eval()``
normalises with the running statistics. ``track_running_stats=False`` keeps no buffers and always
uses batch statistics.

For SyncBatchNorm (in ``neural_arch.distributed``): subclass :class:`_BatchNorm`, call
:meth:`_BatchNorm._update_factor` for the momentum of this step, and build the forward from the
seam in :mod:`neural_arch.core.ops_norm` (``batch_norm_stats`` -> all-gather ->
``batch_norm_gather_stats`` -> ``update_running_stats`` -> ``batch_norm_elemt`` with an
all-reducing ``reduce_grad``).

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> bn = nn.BatchNorm2d(3)
    >>> bn
    BatchNorm2d(3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
    >>> y = bn(na.randn(4, 3, 5, 5) * 2 + 1)
    >>> int(bn.num_batches_tracked.item()), sorted(bn.state_dict())
    (1, ['bias', 'num_batches_tracked', 'running_mean', 'running_var', 'weight'])
    >>> bn.eval()(na.randn(1, 3, 5, 5)).shape     # eval: running statistics, any batch size
    (1, 3, 5, 5)
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]


class _BatchNorm(Module):
    """Shared implementation; subclasses only say which input ranks they accept."""

    _expected_dims: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None):
        super().__init__()
        if int(num_features) <= 0:
            raise ValueError(f"{type(self).__name__}: num_features must be positive, got {num_features}")
        self.num_features = int(num_features)
        self.eps = float(eps)
        self.momentum = momentum if momentum is None else float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        dtype = np.float32 if dtype is None else dtype
        c = self.num_features
        if self.affine:
            self.weight = Parameter(np.ones(c, dtype=dtype), device=device)
            self.bias = Parameter(np.zeros(c, dtype=dtype), device=device)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(c, dtype=dtype), device=device))
            self.register_buffer("running_var", Tensor(np.ones(c, dtype=dtype), device=device))
            self.register_buffer("num_batches_tracked", Tensor(np.zeros((), dtype=np.int64), device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.data[...] = 0
            self.running_var.data[...] = 1
            self.num_batches_tracked.data[...] = 0

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            self.weight.data[...] = 1
            self.bias.data[...] = 0

    def _check_input_dim(self, x: Tensor) -> None:
        if x.ndim not in self._expected_dims:
            want = " or ".join(f"{d}D" for d in self._expected_dims)
            raise ValueError(f"expected {want} input (got {x.ndim}D input)")
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) got an input with {x.shape[1]} channels "
                f"(shape {list(x.shape)}); channels are dim 1"
            )

    def _update_factor(self) -> float:
        """Count this training batch and return the running-statistics momentum to use for it
        (``momentum``, or ``1 / num_batches_tracked`` for a cumulative average)."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.data += 1
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.data)
        return factor

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        self._check_input_dim(x)
        factor = self._update_factor()
        # Batch statistics when training, or when there are no running statistics to use.
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        update = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if update else None, self.running_var if update else None,
                            self.weight, self.bias, use_batch, factor, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over ``(N, C)`` or ``(N, C, L)`` input (statistics per channel ``C``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> bn = nn.BatchNorm1d(3)
        >>> y = bn(na.randn(8, 3))
        >>> y.shape, bn.running_mean.shape
        ((8, 3), (3,))
    """

    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over ``(N, C, H, W)`` input (statistics per channel ``C``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> bn = nn.BatchNorm2d(4).eval()        # eval: normalise with the running statistics
        >>> bn(na.ones(2, 4, 3, 3)).shape
        (2, 4, 3, 3)
    """

    _expected_dims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch norm over ``(N, C, D, H, W)`` input (statistics per channel ``C``, over ``N, D, H, W``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.batchnorm import BatchNorm3d
        >>> bn = BatchNorm3d(2)
        >>> bn(na.randn(2, 2, 3, 4, 4)).shape, bn.running_var.shape
        ((2, 2, 3, 4, 4), (2,))
    """

    _expected_dims = (5,)
