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

from neural_arch.backend import get_array_module
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

    Initialised N(0, 1) like torch (GPT overrides it with N(0, 0.02)). torch's arguments:

    * ``padding_idx``: that row starts at zero and receives no gradient from this lookup (a tied
      use of the same weight elsewhere still does); negative values count from the end.
    * ``max_norm``: before each lookup, the looked-up rows whose ``norm_type``-norm exceeds it are
      rescaled in place to ``max_norm`` (no gradient flows through the rescaling).
    * ``_weight`` / ``_freeze`` (and :meth:`from_pretrained`): start from a given table, optionally
      frozen. ``scale_grad_by_freq`` and ``sparse`` are not supported (an error, never ignored).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> emb = nn.Embedding(10, 3)
        >>> emb(np.array([[1, 2], [3, 4]])).shape
        (2, 2, 3)
        >>> nn.Embedding(5, 2, padding_idx=0).weight.data[0].tolist()
        [0.0, 0.0]
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, _freeze: bool = False, device=None, dtype=None):
        super().__init__()
        if int(num_embeddings) <= 0 or int(embedding_dim) <= 0:
            raise ValueError(
                f"Embedding: num_embeddings and embedding_dim must be positive, got "
                f"{num_embeddings}, {embedding_dim}"
            )
        if scale_grad_by_freq or sparse:
            raise NotImplementedError("Embedding: scale_grad_by_freq and sparse gradients are not supported")
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        if padding_idx is not None:
            padding_idx = int(padding_idx)
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be within num_embeddings "
                                 f"({self.num_embeddings}), got {padding_idx}")
            padding_idx %= self.num_embeddings
        self.padding_idx = padding_idx
        self.max_norm = None if max_norm is None else float(max_norm)
        self.norm_type = float(norm_type)
        shape = (self.num_embeddings, self.embedding_dim)
        if _weight is None:
            self.weight = Parameter(np.empty(shape, dtype=np.float32 if dtype is None else dtype), device=device)
            self.reset_parameters()
        else:
            weight = _weight.data if isinstance(_weight, Tensor) else _weight
            if tuple(weight.shape) != shape:
                raise ValueError(f"Embedding: _weight has shape {tuple(weight.shape)}, expected {shape}")
            self.weight = Parameter(weight, dtype=dtype, device=device)
        self.weight.requires_grad = not _freeze

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False) -> Embedding:
        """An Embedding holding a copy of the 2-D ``embeddings`` (frozen unless ``freeze=False``).

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> emb = nn.Embedding.from_pretrained(np.eye(3))
            >>> emb(np.array([2])).tolist(), emb.weight.requires_grad
            ([[0.0, 0.0, 1.0]], False)
        """
        data = embeddings.data if isinstance(embeddings, Tensor) else np.asarray(embeddings)
        if data.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got shape {tuple(data.shape)}")
        return cls(data.shape[0], data.shape[1], padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=data.copy(), _freeze=freeze)

    def _renorm(self, idx) -> None:
        """torch's embedding_renorm_: rows looked up here with a norm above max_norm, scaled down in place."""
        wd = self.weight.data
        xp = get_array_module(wd)
        rows = xp.unique(xp.asarray(idx).reshape(-1).astype(xp.int64))
        picked = wd[rows]
        norms = (xp.abs(picked) ** self.norm_type).sum(axis=1) ** (1.0 / self.norm_type)
        scale = xp.where(norms > self.max_norm, self.max_norm / (norms + 1e-7), 1.0)
        wd[rows] = (picked * scale[:, None]).astype(wd.dtype, copy=False)

    def forward(self, indices):
        if self.max_norm is not None:
            # the lookup's own index checks first: a bad index must fail before any row is rescaled
            F.embedding(indices, self.weight.detach())
            self._renorm(indices.data if isinstance(indices, Tensor) else indices)
        # the padding row gets no gradient from this lookup: F.embedding's rule (one owner)
        return F.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        return s
