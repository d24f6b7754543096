"""Loss modules: ``CrossEntropyLoss`` and ``MSELoss``.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> logits = np.zeros((2, 3), dtype=np.float32)
    >>> round(float(nn.CrossEntropyLoss()(logits, np.array([0, 2])).item()), 4)  # log(3)
    1.0986
"""

from __future__ import annotations

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module

__all__ = ["CrossEntropyLoss", "MSELoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, who: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{who}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


class CrossEntropyLoss(Module):
    """Softmax cross-entropy between logits ``(N, C)`` (or ``(B, T, C)``) and integer targets.

    Extra leading dimensions are flattened, so a language model's ``(B, T, vocab)`` logits and
    ``(B, T)`` targets work directly. Targets equal to ``ignore_index`` contribute nothing.
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
        if logits.ndim > 2:
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
