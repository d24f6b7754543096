"""Vector similarity and distance: torch's ``F.normalize``, ``F.cosine_similarity`` and
``F.pairwise_distance``, composed from the core's differentiable ops (norms, clamps, sums).

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn import functional as F
    >>> F.normalize(na.tensor([[3.0, 4.0]], dtype=na.float64)).tolist()
    [[0.6, 0.8]]
    >>> F.cosine_similarity(na.tensor([[1.0, 0.0]]), na.tensor([[2.0, 0.0]])).tolist()
    [1.0]
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.ops_activation import clamp
from neural_arch.core.ops_reduce import vector_norm
from neural_arch.core.ops_shape import broadcast_to
from neural_arch.core.tensor import Tensor

__all__ = ["cosine_similarity", "normalize", "pairwise_distance"]


def _tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def _check_dim(dim: int, ndim: int, who: str) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"{who}: dimension out of range (expected to be in range of "
                         f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {dim})")
    return dim


def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None) -> Tensor:
    """``x / max(||x||_p, eps)`` along ``dim`` (torch's ``F.normalize``): each slice scaled to unit
    ``p``-norm; a slice whose norm is below ``eps`` is divided by ``eps`` (a zero slice stays zero).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.normalize(na.tensor([[1.0, 3.0], [0.0, 0.0]]), p=1.0).tolist()
        [[0.25, 0.75], [0.0, 0.0]]
    """
    if out is not None:
        raise TypeError("normalize: out= is not supported; use the returned tensor")
    x = _tensor(input)
    _check_dim(dim, x.ndim, "normalize")
    if x.ndim == 0:
        x = x.reshape(1)
        return (x / clamp(vector_norm(x, p, 0, keepdim=True), min=eps)).reshape(())
    return x / clamp(vector_norm(x, p, dim, keepdim=True), min=eps)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim``, after broadcasting them to one
    shape (torch's ``F.cosine_similarity``).

    torch 2.x clamps each norm on its own: ``dot(x1, x2) / (max(||x1||, eps) * max(||x2||, eps))`` (the
    current ``F.cosine_similarity`` docs and torch's result; the older ``max(||x1|| ||x2||, eps)``
    still printed on ``nn.CosineSimilarity``'s page differs for two short vectors: ``[1e-5, 0]``
    with itself is 1 here and in torch, 0.01 by the old formula).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.cosine_similarity(na.tensor([[1.0, 1.0]]), na.tensor([[1.0, -1.0]])).tolist()
        [0.0]
    """
    a, b = _tensor(x1), _tensor(x2)
    shape = np.broadcast_shapes(a.shape, b.shape)
    if a.shape != shape:
        a = broadcast_to(a, shape)
    if b.shape != shape:
        b = broadcast_to(b, shape)
    _check_dim(dim, len(shape), "cosine_similarity")
    if not shape:
        a, b, dim = a.reshape(1), b.reshape(1), 0
    # Normalise each operand first, as torch does: the product of two large norms cannot overflow.
    na_ = clamp(vector_norm(a, 2, dim, keepdim=True), min=eps)
    nb_ = clamp(vector_norm(b, 2, dim, keepdim=True), min=eps)
    return ((a / na_) * (b / nb_)).sum(dim=dim)


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` over the last dimension (torch's ``F.pairwise_distance``; the ``eps``
    keeps the norm's gradient finite where ``x1 == x2``). The inputs broadcast; 1-d inputs give a
    0-d result.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.pairwise_distance(na.tensor([[0.0, 0.0]]), na.tensor([[3.0, 4.0]])).tolist()]
        [5.0]
    """
    a, b = _tensor(x1), _tensor(x2)
    diff = a - b + eps
    if diff.ndim == 0:  # two scalars: a 0-d distance, keepdim or not (torch)
        return vector_norm(diff.reshape(1), p, -1).reshape(())
    return vector_norm(diff, p, -1, keepdim=keepdim)
