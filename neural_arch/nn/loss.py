"""Loss modules: ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``,
``BCELoss``, ``BCEWithLogitsLoss`` and ``KLDivLoss``, each over its function in
:mod:`neural_arch.core.ops_loss` with torch's constructor arguments (class weights as buffers).

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
           "NLLLoss", "SmoothL1Loss"]

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
