"""``Flatten`` and ``Unflatten``: reshape layers for ``Sequential`` models (torch's defaults).

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> nn.Flatten()(na.zeros(2, 3, 4, 5)).shape
    (2, 60)
    >>> nn.Unflatten(1, (3, 20))(na.zeros(2, 60)).shape
    (2, 3, 20)
"""

from __future__ import annotations

from neural_arch.core.tensor import Tensor
from neural_arch.nn.module import Module

__all__ = ["Flatten", "Unflatten"]


class Flatten(Module):
    """Flatten dims ``start_dim`` to ``end_dim`` into one (default: all but the batch dim).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Flatten()(na.ones(2, 3, 4)).shape
        (2, 12)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Expand dim ``dim`` into ``unflattened_size``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Unflatten(1, (3, 4))(na.ones(2, 12)).shape
        (2, 3, 4)
    """

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = int(dim), tuple(int(s) for s in unflattened_size)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        d = self.dim % x.ndim
        return x.reshape(*x.shape[:d], *self.unflattened_size, *x.shape[d + 1:])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
