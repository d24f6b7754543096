"""Affine and lookup layers: ``Linear``, ``Embedding``, ``Identity``.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> layer = nn.Linear(3, 2)
    >>> layer(np.ones((5, 3), dtype=np.float32)).shape
    (5, 2)
    >>> nn.Embedding(10, 4)(np.array([[1, 2, 3]])).shape
    (1, 3, 4)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["Linear", "Embedding", "Identity"]


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


class Identity(Module):
    """Returns its input unchanged (a placeholder that keeps module names stable).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> x = na.ones(2)
        >>> nn.Identity()(x) is x
        True
    """

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Initialised like torch: weight ~ kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)),
    and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn from the seeded global generator.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> layer = nn.Linear(4, 2)
        >>> layer(na.ones(3, 4)).shape, layer.weight.shape, layer.bias.shape
        ((3, 2), (2, 4), (2,))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=np.float32,
                 device=None):
        super().__init__()
        if int(in_features) <= 0 or int(out_features) <= 0:
            raise ValueError(
                f"Linear: in_features and out_features must be positive, got {in_features}, {out_features}"
            )
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.weight = Parameter(np.empty((self.out_features, self.in_features), dtype=dtype), device=device)
        if bias:
            self.bias = Parameter(np.empty((self.out_features,), dtype=dtype), device=device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(_as_tensor(x), self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer indices of any shape -> vectors, ``(*idx.shape, embedding_dim)``.

    Initialised N(0, 1) like torch (GPT overrides it with N(0, 0.02)).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> emb = nn.Embedding(10, 3)
        >>> emb(np.array([[1, 2], [3, 4]])).shape
        (2, 2, 3)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype=np.float32, device=None):
        super().__init__()
        if int(num_embeddings) <= 0 or int(embedding_dim) <= 0:
            raise ValueError(
                f"Embedding: num_embeddings and embedding_dim must be positive, got "
                f"{num_embeddings}, {embedding_dim}"
            )
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        shape = (self.num_embeddings, self.embedding_dim)
        self.weight = Parameter(np.empty(shape, dtype=dtype), device=device)
        init.normal_(self.weight)

    def forward(self, indices):
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
