"""Loss modules: ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``,
``BCELoss``, ``BCEWithLogitsLoss`` and ``KLDivLoss``, each over its function in
:mod:`neural_arch.core.ops_loss`, and torch's margin / embedding / likelihood losses
(``MarginRankingLoss``, ``HingeEmbeddingLoss``, ``SoftMarginLoss``, ``CosineEmbeddingLoss``,
``TripletMarginLoss``, ``PoissonNLLLoss``, ``GaussianNLLLoss``, ``MultiLabelSoftMarginLoss``) over
:mod:`neural_arch.nn.functional.losses`, with torch's constructor arguments (class weights as buffers).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> logits = np.zeros((2, 3), dtype=np.float32)
    >>> round(float(nn.CrossEntropyLoss()(logits, np.array([0, 2])).item()), 4)  # log(3)
    1.0986
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.ops_loss import (
    _KL_REDUCTIONS,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    huber_loss,
    kl_div,
    l1_loss,
    nll_loss,
    smooth_l1_loss,
)
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module

__all__ = ["BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss",
           "NLLLoss", "SmoothL1Loss", "MarginRankingLoss", "HingeEmbeddingLoss", "SoftMarginLoss",
           "CosineEmbeddingLoss", "TripletMarginLoss", "PoissonNLLLoss", "GaussianNLLLoss",
           "MultiLabelSoftMarginLoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, who: str, allowed: tuple = _REDUCTIONS) -> str:
    if reduction not in allowed:
        raise ValueError(f"{who}: reduction must be one of {allowed}, got {reduction!r}")
    return reduction


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _shape(value) -> tuple:
    """A Tensor's or array's shape without reading its data (a device array stays where it is)."""
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def _torch_class_layout(shape, target_shape) -> bool:
    """Is ``target_shape`` the class-index target of torch's ``(N, C, d1, ...)`` layout (classes on dim 1)
    and not that of the ``(B, T, C)`` layout (classes last)? Where both fit, classes last (a language model)."""
    torch_target = (shape[0],) + tuple(shape[2:])
    return tuple(target_shape) == torch_target and tuple(target_shape) != tuple(shape[:-1])


class CrossEntropyLoss(Module):
    """Softmax cross-entropy between logits ``(N, C)`` (or ``(B, T, C)``) and integer targets.

    Extra leading dimensions are flattened, so a language model's ``(B, T, vocab)`` logits and
    ``(B, T)`` targets work directly. torch's ``(N, C, d1, ...)`` logits with an ``(N, d1, ...)``
    target (classes on dim 1: segmentation) are taken as torch takes them; a target that fits both
    layouts (``(B, T, C)`` with ``T == C``) is read as classes last. Targets equal to ``ignore_index``
    contribute nothing.
    ``weight`` (a ``(C,)`` tensor, torch's first argument, kept as a buffer) scales each class as in
    :func:`~neural_arch.nn.functional.cross_entropy`; the other arguments are keyword-only (torch's
    second positional argument is the legacy ``size_average``).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> round(nn.CrossEntropyLoss()(na.zeros(2, 4), np.array([0, 3])).item(), 4)     # log(4)
        1.3863
    """

    def __init__(self, weight=None, *, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.register_buffer("weight", weight)
        self.ignore_index = int(ignore_index)
        self.reduction = _check_reduction(reduction, "CrossEntropyLoss")
        self.label_smoothing = float(label_smoothing)

    def forward(self, logits, target):
        logits = logits if isinstance(logits, Tensor) else Tensor(logits)
        if logits.ndim > 2 and not _torch_class_layout(logits.shape, _shape(target)):
            soft = tuple(target.shape) == tuple(logits.shape)  # probabilities: one row per position
            logits = logits.reshape(-1, logits.shape[-1])
            target = target.reshape(-1, logits.shape[-1]) if soft else target.reshape(-1)
        if isinstance(target, Tensor) and not target.requires_grad:
            target = target.data
        return F.cross_entropy(logits, target, self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        extra = f", label_smoothing={self.label_smoothing}" if self.label_smoothing else ""
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}{extra}"


class MSELoss(Module):
    """Mean (or summed) squared error.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.MSELoss()(na.tensor([1.0, 3.0]), na.zeros(2)).item()
        5.0
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = _check_reduction(reduction, "MSELoss")

    def forward(self, input, target):
        input = input if isinstance(input, Tensor) else Tensor(input)
        target = target if isinstance(target, Tensor) else Tensor(target)
        return F.mse_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class NLLLoss(Module):
    """Negative log-likelihood of integer targets under log-probabilities, over
    :func:`~neural_arch.core.ops_loss.nll_loss` (``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)`` input).
    ``weight`` (``(C,)``, torch's first argument) is kept as a buffer; the other arguments are
    keyword-only (torch's second positional argument is the legacy ``size_average``).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import NLLLoss
        >>> NLLLoss()(na.tensor([[-1.0, -2.0], [-3.0, -4.0]]), np.array([0, 1])).item()
        2.5
    """

    def __init__(self, weight=None, *, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = int(ignore_index)
        self.reduction = _check_reduction(reduction, "NLLLoss")

    def forward(self, input, target):
        return nll_loss(_t(input), target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class L1Loss(Module):
    """Mean (or summed) absolute error, over :func:`~neural_arch.core.ops_loss.l1_loss`. ``reduction``
    is keyword-only (torch's first positional argument is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import L1Loss
        >>> L1Loss()(na.tensor([1.0, -3.0]), na.zeros(2)).item()
        2.0
    """

    def __init__(self, *, reduction: str = "mean"):
        super().__init__()
        self.reduction = _check_reduction(reduction, "L1Loss")

    def forward(self, input, target):
        return l1_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class SmoothL1Loss(Module):
    """torch's smooth L1 loss (quadratic below ``beta``, linear above), over
    :func:`~neural_arch.core.ops_loss.smooth_l1_loss`; ``beta=0`` is the L1 loss. Keyword-only
    arguments (torch's first positional argument is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import SmoothL1Loss
        >>> SmoothL1Loss(beta=2.0)(na.tensor([1.0, 4.0]), na.zeros(2)).item()       # (0.25 + 3) / 2
        1.625
    """

    def __init__(self, *, reduction: str = "mean", beta: float = 1.0):
        super().__init__()
        if not float(beta) >= 0:
            raise ValueError(f"SmoothL1Loss: beta must be non-negative, got {beta}")
        self.reduction = _check_reduction(reduction, "SmoothL1Loss")
        self.beta = float(beta)

    def forward(self, input, target):
        return smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, beta={self.beta}"


class HuberLoss(Module):
    """torch's Huber loss (quadratic below ``delta``, ``delta``-scaled linear above), over
    :func:`~neural_arch.core.ops_loss.huber_loss`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import HuberLoss
        >>> HuberLoss(delta=2.0)(na.tensor([1.0, 4.0]), na.zeros(2)).item()         # (0.5 + 6) / 2
        3.25
    """

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__()
        if not float(delta) > 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {delta}")
        self.reduction = _check_reduction(reduction, "HuberLoss")
        self.delta = float(delta)

    def forward(self, input, target):
        return huber_loss(input, target, self.reduction, self.delta)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, delta={self.delta}"


class BCELoss(Module):
    """Binary cross-entropy of probabilities, over
    :func:`~neural_arch.core.ops_loss.binary_cross_entropy`. ``weight`` (torch's first argument,
    broadcast to the input's shape) is kept as a buffer; ``reduction`` is keyword-only (torch's
    second positional argument is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import BCELoss
        >>> round(BCELoss()(na.tensor([0.5, 0.5]), na.tensor([1.0, 0.0])).item(), 4)     # log 2
        0.6931
    """

    def __init__(self, weight=None, *, reduction: str = "mean"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction = _check_reduction(reduction, "BCELoss")

    def forward(self, input, target):
        return binary_cross_entropy(input, target, self.weight, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class BCEWithLogitsLoss(Module):
    """Binary cross-entropy of ``sigmoid(input)``, computed stably from the logits, over
    :func:`~neural_arch.core.ops_loss.binary_cross_entropy_with_logits`. ``weight`` and ``pos_weight``
    (one value per class for a ``(N, C)`` input, say) are kept as buffers; the arguments after
    ``weight`` are keyword-only (torch's second positional argument is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import BCEWithLogitsLoss
        >>> loss = BCEWithLogitsLoss(pos_weight=na.tensor([3.0, 1.0]))
        >>> round(loss(na.zeros(1, 2), na.tensor([[1.0, 1.0]])).item(), 4)            # (3 + 1) log 2 / 2
        1.3863
    """

    def __init__(self, weight=None, *, reduction: str = "mean", pos_weight=None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)
        self.reduction = _check_reduction(reduction, "BCEWithLogitsLoss")

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                pos_weight=self.pos_weight)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class KLDivLoss(Module):
    """Kullback-Leibler divergence of log-probabilities ``input`` from ``target``, over
    :func:`~neural_arch.core.ops_loss.kl_div`. ``reduction="batchmean"`` gives the divergence per
    sample; torch's default ``"mean"`` divides by every element and warns. Keyword-only arguments
    (torch's first positional argument is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.loss import KLDivLoss
        >>> p = na.tensor([[0.25, 0.75]])
        >>> KLDivLoss(reduction="batchmean")(p.log(), p).item()
        0.0
    """

    def __init__(self, *, reduction: str = "mean", log_target: bool = False):
        super().__init__()
        self.reduction = _check_reduction(reduction, "KLDivLoss", _KL_REDUCTIONS)
        self.log_target = bool(log_target)

    def forward(self, input, target):
        return kl_div(input, target, reduction=self.reduction, log_target=self.log_target)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, log_target={self.log_target}"


# ---- margin, embedding and likelihood losses (torch's second positional argument is the legacy
# size_average in each: everything after the loss's own leading arguments is keyword-only here).
class MarginRankingLoss(Module):
    """``max(0, -y (x1 - x2) + margin)`` (torch's ``nn.MarginRankingLoss(margin=0.0)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.MarginRankingLoss(margin=1.0)(na.tensor([2.0]), na.tensor([1.0]), na.tensor([1.0])).item()
        0.0
    """

    def __init__(self, margin: float = 0.0, *, reduction: str = "mean"):
        super().__init__()
        self.margin = float(margin)
        self.reduction = _check_reduction(reduction, "MarginRankingLoss")

    def forward(self, input1, input2, target):
        return F.margin_ranking_loss(input1, input2, target, self.margin, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


class HingeEmbeddingLoss(Module):
    """``x`` for ``y = 1``, ``max(0, margin - x)`` for ``y = -1`` (torch's ``nn.HingeEmbeddingLoss(margin=1.0)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.HingeEmbeddingLoss()(na.tensor([0.25]), na.tensor([-1.0])).item()
        0.75
    """

    def __init__(self, margin: float = 1.0, *, reduction: str = "mean"):
        super().__init__()
        self.margin = float(margin)
        self.reduction = _check_reduction(reduction, "HingeEmbeddingLoss")

    def forward(self, input, target):
        return F.hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


class SoftMarginLoss(Module):
    """``log(1 + exp(-y x))`` averaged (torch's ``nn.SoftMarginLoss``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> round(nn.SoftMarginLoss()(na.tensor([0.0]), na.tensor([1.0])).item(), 4)
        0.6931
    """

    def __init__(self, *, reduction: str = "mean"):
        super().__init__()
        self.reduction = _check_reduction(reduction, "SoftMarginLoss")

    def forward(self, input, target):
        return F.soft_margin_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class CosineEmbeddingLoss(Module):
    """``1 - cos`` for ``y = 1``, ``max(0, cos - margin)`` for ``y = -1`` (torch's
    ``nn.CosineEmbeddingLoss(margin=0.0)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.CosineEmbeddingLoss()(na.tensor([[1.0, 0.0]]), na.tensor([[1.0, 0.0]]), na.tensor([-1.0])).item()
        1.0
    """

    def __init__(self, margin: float = 0.0, *, reduction: str = "mean"):
        super().__init__()
        self.margin = float(margin)
        self.reduction = _check_reduction(reduction, "CosineEmbeddingLoss")

    def forward(self, input1, input2, target):
        return F.cosine_embedding_loss(input1, input2, target, self.margin, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


class TripletMarginLoss(Module):
    """``max(d(a, p) - d(a, n) + margin, 0)`` (torch's ``nn.TripletMarginLoss(margin=1.0, p=2.0, eps=1e-6,
    swap=False)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> loss = nn.TripletMarginLoss(margin=1.0, eps=0.0)
        >>> loss(na.zeros(1, 2), na.zeros(1, 2), na.tensor([[3.0, 4.0]])).item()
        0.0
    """

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False, *,
                 reduction: str = "mean"):
        super().__init__()
        if float(margin) <= 0:
            raise ValueError(f"TripletMarginLoss: margin must be greater than 0, got {margin}")
        self.margin = float(margin)
        self.p = float(p)
        self.eps = float(eps)
        self.swap = bool(swap)
        self.reduction = _check_reduction(reduction, "TripletMarginLoss")

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_loss(anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
                                     reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, p={self.p}, eps={self.eps}, swap={self.swap}, reduction={self.reduction!r}"


class PoissonNLLLoss(Module):
    """Poisson negative log-likelihood (torch's ``nn.PoissonNLLLoss(log_input=True, full=False, eps=1e-8)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.PoissonNLLLoss()(na.tensor([0.0]), na.tensor([1.0])).item()
        1.0
    """

    def __init__(self, log_input: bool = True, full: bool = False, *, eps: float = 1e-8, reduction: str = "mean"):
        super().__init__()
        self.log_input = bool(log_input)
        self.full = bool(full)
        self.eps = float(eps)
        self.reduction = _check_reduction(reduction, "PoissonNLLLoss")

    def forward(self, log_input, target):
        return F.poisson_nll_loss(log_input, target, self.log_input, self.full, eps=self.eps,
                                  reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"log_input={self.log_input}, full={self.full}, eps={self.eps}, reduction={self.reduction!r}"


class GaussianNLLLoss(Module):
    """Gaussian negative log-likelihood with a predicted variance (torch's ``nn.GaussianNLLLoss(*,
    full=False, eps=1e-6, reduction="mean")``); called as ``loss(input, target, var)``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.GaussianNLLLoss()(na.tensor([1.0]), na.tensor([3.0]), na.tensor([1.0])).item()
        2.0
    """

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
        super().__init__()
        self.full = bool(full)
        self.eps = float(eps)
        self.reduction = _check_reduction(reduction, "GaussianNLLLoss")

    def forward(self, input, target, var):
        return F.gaussian_nll_loss(input, target, var, full=self.full, eps=self.eps, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"full={self.full}, eps={self.eps}, reduction={self.reduction!r}"


class MultiLabelSoftMarginLoss(Module):
    """One-versus-all logistic loss over ``(N, C)`` multi-label targets (torch's
    ``nn.MultiLabelSoftMarginLoss(weight=None)``; ``weight`` ``(C,)`` is kept as a buffer).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> round(nn.MultiLabelSoftMarginLoss()(na.zeros(1, 3), na.tensor([[1.0, 0.0, 1.0]])).item(), 4)
        0.6931
    """

    def __init__(self, weight=None, *, reduction: str = "mean"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction = _check_reduction(reduction, "MultiLabelSoftMarginLoss")

    def forward(self, input, target):
        return F.multilabel_soft_margin_loss(input, target, self.weight, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
