"""torch's margin, embedding and likelihood losses, composed from the core's differentiable ops:
``margin_ranking_loss``, ``hinge_embedding_loss``, ``soft_margin_loss``, ``cosine_embedding_loss``,
``triplet_margin_loss``, ``poisson_nll_loss``, ``gaussian_nll_loss`` and
``multilabel_soft_margin_loss`` (the cross-entropy family lives in :mod:`neural_arch.core.ops_loss`).

Each takes torch's arguments and defaults and reduces with ``reduction="mean" | "sum" | "none"``.
Operands whose shapes do not fit are refused (torch's error), never broadcast into a silently
different loss.

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn import functional as F
    >>> F.margin_ranking_loss(na.tensor([1.0, 2.0]), na.tensor([2.0, 1.0]), na.tensor([1.0, 1.0])).item()
    0.5
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from neural_arch.core.op_utils import _xp
from neural_arch.core.ops_activation import clamp, exp, log, softplus, where
from neural_arch.core.ops_reduce import minimum
from neural_arch.core.tensor import Tensor
from neural_arch.nn.functional.distances import pairwise_distance

__all__ = [
    "cosine_embedding_loss",
    "gaussian_nll_loss",
    "hinge_embedding_loss",
    "margin_ranking_loss",
    "multilabel_soft_margin_loss",
    "poisson_nll_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
]

_REDUCTIONS = ("none", "mean", "sum")


def _tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def _float(x, who: str, name: str) -> Tensor:
    x = _tensor(x)
    if x.data.dtype.kind in "biu":
        raise TypeError(f"{who}: {name} must be a floating-point tensor, got dtype {x.data.dtype}")
    return x


def _check_reduction(reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction (use 'mean', 'sum' or 'none')")
    return reduction


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    """torch's legacy ``size_average`` / ``reduce`` arguments, when given, decide the reduction (with
    torch's deprecation warning): ``reduce=False`` is ``"none"``, ``size_average=False`` is ``"sum"``.
    Ignoring them would silently average a loss the caller asked to keep per element."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    legacy = ("mean" if size_average else "sum") if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{legacy}' instead.",
                  UserWarning, stacklevel=3)
    return legacy


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _check_broadcast(who: str, input: Tensor, grow: bool = True, **others) -> None:
    """torch broadcasts these losses' other operands against the input. An operand that broadcasts into
    the input's shape (one target for every row) is fine; one that grows the result past the input's
    shape is warned about (as torch's regression losses warn): an ``(N, 1)`` input against an ``(N,)``
    target broadcasts to an ``(N, N)`` loss, which is almost never what was meant. Where torch refuses
    that growth (``grow=False``) it is torch's error, as are shapes that do not broadcast at all."""
    xs = tuple(input.shape)
    for name, other in others.items():
        os_ = tuple(other.shape)
        if os_ == xs:
            continue
        try:
            shape = np.broadcast_shapes(xs, os_)
        except ValueError:
            shape = None
        if shape is None or (not grow and shape != xs):
            raise RuntimeError(f"{who}: the size of {name} {list(os_)} must match (broadcast to) the size of "
                               f"the input {list(xs)}")
        if shape == xs:
            continue
        warnings.warn(f"{who}: using a {name} size {list(os_)} that is different to the input size {list(xs)}. "
                      f"This will likely lead to incorrect results due to broadcasting. Please ensure they have "
                      f"the same size.", UserWarning, stacklevel=3)


def _exact_softplus(x: Tensor) -> Tensor:
    """``log(1 + exp(x))`` without a linear cut-over (torch's losses use the exact form)."""
    return softplus(x, 1.0, float("inf"))


def margin_ranking_loss(input1, input2, target, margin: float = 0.0, size_average=None, reduce=None,
                        reduction: str = "mean") -> Tensor:
    """``max(0, -y * (x1 - x2) + margin)`` (torch's ``F.margin_ranking_loss``; ``y`` is 1 or -1).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.margin_ranking_loss(na.tensor([3.0]), na.tensor([1.0]), na.tensor([-1.0]), margin=1.0).item()
        3.0
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    x1, x2 = _float(input1, "margin_ranking_loss", "input1"), _float(input2, "margin_ranking_loss", "input2")
    y = _tensor(target)
    if not x1.ndim == x2.ndim == y.ndim:
        raise RuntimeError(f"margin_ranking_loss: all input tensors should have the same dimension, got sizes "
                           f"input1 {list(x1.shape)}, input2 {list(x2.shape)}, target {list(y.shape)}")
    _check_broadcast("margin_ranking_loss", x1, input2=x2, target=y)
    return _reduce(clamp(-y * (x1 - x2) + float(margin), min=0.0), reduction)


def hinge_embedding_loss(input, target, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
    """``x`` where ``y == 1``, ``max(0, margin - x)`` where ``y == -1`` (torch's
    ``F.hinge_embedding_loss``; as torch, a label other than 1 and -1 gets both terms).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.hinge_embedding_loss(na.tensor([0.3, 0.3]), na.tensor([1.0, -1.0]), reduction="none").tolist()
        [0.30000001192092896, 0.699999988079071]
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    x, y = _float(input, "hinge_embedding_loss", "input"), _tensor(target)
    _check_broadcast("hinge_embedding_loss", x, target=y)
    yd = y.data
    margin_term = where(yd != 1, clamp(float(margin) - x, min=0.0), 0.0)
    self_term = where(yd != -1, x, 0.0)
    return _reduce(margin_term + self_term, reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``log(1 + exp(-y * x))`` averaged over every element (torch's ``F.soft_margin_loss``),
    computed without overflow for any ``y * x``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> round(F.soft_margin_loss(na.tensor([0.0]), na.tensor([1.0])).item(), 4)    # log 2
        0.6931
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    x, y = _float(input, "soft_margin_loss", "input"), _tensor(target)
    _check_broadcast("soft_margin_loss", x, grow=False, target=y)
    return _reduce(_exact_softplus(-y * x), reduction)


def cosine_embedding_loss(input1, input2, target, margin: float = 0.0, size_average=None, reduce=None,
                          reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``y == 1``, ``max(0, cos(x1, x2) - margin)`` where ``y == -1``, over
    ``(N, D)`` rows with a ``(N,)`` target or one ``(D,)`` pair with a 0-d target (torch's
    ``F.cosine_embedding_loss``; the cosine there is ``dot(x1, x2) / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12))``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.cosine_embedding_loss(na.tensor([[1.0, 0.0]]), na.tensor([[0.0, 1.0]]), na.tensor([1.0])).item()
        1.0
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    who = "cosine_embedding_loss"
    x1, x2, y = _float(input1, who, "input1"), _float(input2, who, "input2"), _tensor(target)
    if x1.ndim not in (1, 2) or tuple(x1.shape) != tuple(x2.shape):
        raise RuntimeError(f"{who}: input1 and input2 must be (N, D) or (D,) of one shape, got "
                           f"{list(x1.shape)} and {list(x2.shape)}")
    if y.ndim != x1.ndim - 1:
        raise RuntimeError(f"{who}: target must have shape {list(x1.shape[:-1])} (one label per pair), got "
                           f"{list(y.shape)}")
    _check_broadcast(who, Tensor(np.empty(x1.shape[:-1])), target=y)
    dot = (x1 * x2).sum(dim=-1)
    norms = ((x1 * x1).sum(dim=-1) + 1e-12) * ((x2 * x2).sum(dim=-1) + 1e-12)
    cos = dot / norms ** 0.5
    yd = y.data
    pos = where(yd == 1, 1.0 - cos, 0.0)
    neg = where(yd == -1, clamp(cos - float(margin), min=0.0), 0.0)
    return _reduce(pos + neg, reduction)


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2, eps: float = 1e-6,
                        swap: bool = False, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``max(d(a, p) - d(a, n) + margin, 0)`` with ``d`` the ``pairwise_distance`` (torch's
    ``F.triplet_margin_loss``); ``swap=True`` takes ``d(a, n) = min(d(a, n), d(p, n))``. Inputs are
    ``(N, D)`` or ``(D,)``, all of one dimension count.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> a, p, n = na.tensor([[0.0, 0.0]]), na.tensor([[0.0, 0.0]]), na.tensor([[3.0, 4.0]])
        >>> F.triplet_margin_loss(a, p, n, margin=10.0, eps=0.0).item()
        5.0
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    who = "triplet_margin_loss"
    a, pos, neg = _float(anchor, who, "anchor"), _float(positive, who, "positive"), _float(negative, who, "negative")
    if not a.ndim == pos.ndim == neg.ndim:
        raise RuntimeError(f"{who}: the anchor, positive and negative tensors are expected to have the same "
                           f"number of dimensions ((N, D) or (D,)), got {a.ndim}-d, {pos.ndim}-d and {neg.ndim}-d")
    if not float(margin) > 0:
        raise ValueError(f"{who}: margin must be greater than 0, got {margin}")
    d_pos = pairwise_distance(a, pos, p, eps)
    d_neg = pairwise_distance(a, neg, p, eps)
    if swap:
        d_neg = minimum(d_neg, pairwise_distance(pos, neg, p, eps))
    return _reduce(clamp(d_pos - d_neg + float(margin), min=0.0), reduction)


def poisson_nll_loss(input, target, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of ``target`` under a Poisson of rate ``exp(input)`` (``log_input``) or
    ``input`` (torch's ``F.poisson_nll_loss``): ``exp(x) - y x``, or ``x - y log(x + eps)``; ``full``
    adds Stirling's ``y log y - y + log(2 pi y) / 2`` where ``y > 1``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.poisson_nll_loss(na.tensor([0.0]), na.tensor([2.0])).item()            # exp(0) - 0
        1.0
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    x, y = _float(input, "poisson_nll_loss", "input"), _float(target, "poisson_nll_loss", "target")
    _check_broadcast("poisson_nll_loss", x, target=y)
    if log_input:
        loss = exp(x) - y * x
    else:
        loss = x - y * log(x + float(eps))
    if full:
        yd = y.data
        xp = _xp(yd)
        big = yd > 1
        safe = xp.where(big, yd, 2.0)  # keep log() off the masked-out entries (no NaN in the backward)
        ys = Tensor(safe) if not y.requires_grad else where(big, y, Tensor(safe))
        stirling = ys * log(ys) - ys + log(ys * (2 * math.pi)) * 0.5
        loss = loss + where(big, stirling, 0.0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of ``target`` under a Gaussian of mean ``input`` and variance ``var``
    (torch's ``F.gaussian_nll_loss``): ``(log(max(var, eps)) + (x - y)^2 / max(var, eps)) / 2``
    (+ ``log(2 pi) / 2`` with ``full``). ``var`` is the input's shape, or one short of it (one variance
    per row), or the input's shape with one dimension of size 1, or a float. As torch, the clamp
    at ``eps`` passes the gradient through unchanged, and a negative variance is an error.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.gaussian_nll_loss(na.tensor([1.0]), na.tensor([3.0]), na.tensor([1.0])).item()       # (0 + 4) / 2
        2.0
    """
    x, y = _float(input, "gaussian_nll_loss", "input"), _float(target, "gaussian_nll_loss", "target")
    if isinstance(var, (int, float)) and not isinstance(var, bool):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = Tensor(np.full(x.shape, float(var), dtype=x.data.dtype))
    v = _float(var, "gaussian_nll_loss", "var")
    if bool((v.data < 0).any()):
        raise ValueError("var has negative entry/entries")
    xs, vs = tuple(x.shape), tuple(v.shape)
    if vs != xs:
        if xs[:-1] == vs:
            v = v.unsqueeze(-1)
        elif len(xs) == len(vs) and sum(b for a, b in zip(xs, vs) if a != b) == 1:
            pass
        else:
            raise ValueError(f"var is of incorrect size: input {list(xs)}, var {list(vs)} (give var the input's "
                             f"shape, the input's shape without its last dimension, or one dimension of size 1)")
    _check_reduction(reduction)
    _check_broadcast("gaussian_nll_loss", x, target=y)
    vd = v.data
    xp = _xp(vd)
    # torch clamps var in place under no_grad: the clamped value, the unclamped gradient.
    shift = xp.maximum(vd, eps) - vd
    v = v + Tensor(shift.astype(vd.dtype, copy=False)) if bool((shift != 0).any()) else v
    diff = x - y
    loss = (log(v) + diff * diff / v) * 0.5
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None,
                                reduction: str = "mean") -> Tensor:
    """One-versus-all logistic loss over the ``C`` labels of each row (torch's
    ``F.multilabel_soft_margin_loss``): ``-mean_c w_c [y_c log sigmoid(x_c) + (1 - y_c) log sigmoid(-x_c)]``
    per row, then the reduction over rows.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> round(F.multilabel_soft_margin_loss(na.zeros(1, 2), na.tensor([[1.0, 0.0]])).item(), 4)   # log 2
        0.6931
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    who = "multilabel_soft_margin_loss"
    x, y = _float(input, who, "input"), _tensor(target)
    if x.ndim == 0:
        raise IndexError(f"{who}: input must have a class dimension ((C,) or (N, C)), got a 0-d tensor")
    _check_broadcast(who, x, grow=False, target=y)
    # -log sigmoid(x) = softplus(-x), -log sigmoid(-x) = softplus(x): exact and overflow-free.
    loss = y * _exact_softplus(-x) + (1.0 - y) * _exact_softplus(x)
    if weight is not None:
        loss = loss * _tensor(weight)
    return _reduce(loss.mean(dim=-1), reduction)
