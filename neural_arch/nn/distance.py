"""Distance modules: torch's ``nn.CosineSimilarity`` and ``nn.PairwiseDistance`` over
:func:`~neural_arch.nn.functional.cosine_similarity` and :func:`~neural_arch.nn.functional.pairwise_distance`.

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> nn.PairwiseDistance(eps=0.0)(na.tensor([[0.0, 0.0]]), na.tensor([[3.0, 4.0]])).tolist()
    [5.0]
"""

from __future__ import annotations

from neural_arch.nn import functional as F
from neural_arch.nn.module import Module

__all__ = ["CosineSimilarity", "PairwiseDistance"]


class CosineSimilarity(Module):
    """Cosine similarity along ``dim`` (torch's ``nn.CosineSimilarity(dim=1, eps=1e-8)``): each norm is
    clamped to ``eps`` on its own, as torch 2.x computes it.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.CosineSimilarity()(na.tensor([[1.0, 0.0]]), na.tensor([[0.0, 2.0]])).tolist()
        [0.0]
    """

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim = int(dim)
        self.eps = float(eps)

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, self.dim, self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"


class PairwiseDistance(Module):
    """``||x1 - x2 + eps||_p`` over the last dimension (torch's ``nn.PairwiseDistance(p=2.0, eps=1e-6,
    keepdim=False)``; torch names the order attribute ``norm``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.PairwiseDistance(p=1.0, eps=0.0)(na.tensor([[1.0, 1.0]]), na.zeros(1, 2)).tolist()
        [2.0]
    """

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
        super().__init__()
        self.norm = float(p)
        self.eps = float(eps)
        self.keepdim = bool(keepdim)

    def forward(self, x1, x2):
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)

    def extra_repr(self) -> str:
        return f"p={self.norm}, eps={self.eps}, keepdim={self.keepdim}"
