"""torch's ``F.one_hot``: integer class labels to an int64 one-hot encoding.

Example::

    >>> import numpy as np
    >>> from neural_arch.nn import functional as F
    >>> F.one_hot(np.array([0, 2]), 3).tolist()
    [[1, 0, 0], [0, 0, 1]]
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.op_utils import _xp
from neural_arch.core.tensor import Tensor

__all__ = ["one_hot"]


def one_hot(tensor, num_classes: int = -1) -> Tensor:
    """An int64 tensor of shape ``tensor.shape + (num_classes,)`` with a 1 at each label (torch's
    ``F.one_hot``). ``num_classes=-1`` takes ``max(label) + 1``. As torch: the labels must be an int64
    tensor; a negative label, a label ``>= num_classes`` and ``num_classes=-1`` on an empty tensor are
    errors (never a silently wrapped or dropped row). The result holds no gradient.

    Example::

        >>> import numpy as np
        >>> from neural_arch.nn import functional as F
        >>> F.one_hot(np.array([[1], [0]])).shape
        (2, 1, 2)
    """
    labels = tensor.data if isinstance(tensor, Tensor) else np.asarray(tensor)
    if labels.dtype != np.int64:
        raise RuntimeError(f"one_hot is only applicable to index tensor of type LongTensor (int64), got dtype "
                           f"{labels.dtype}; convert it with .long() first")
    if isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes, (int, np.integer)):
        raise TypeError(f"one_hot: num_classes must be an int, got {num_classes!r}")
    num_classes = int(num_classes)
    xp = _xp(labels)
    if labels.size == 0:
        if num_classes <= 0:  # torch: 0 classes for no labels is "cannot infer" too
            raise RuntimeError("one_hot: can not infer total number of classes from empty tensor; pass num_classes")
    else:
        low, high = int(labels.min()), int(labels.max())
        if low < 0:
            raise RuntimeError(f"one_hot: class values must be non-negative, got {low}")
        if num_classes == -1:
            num_classes = high + 1
        elif high >= num_classes:
            raise RuntimeError(f"one_hot: class values must be smaller than num_classes ({num_classes}), got {high}")
    if num_classes < 0:
        raise RuntimeError(f"one_hot: num_classes should be -1 or non-negative, got {num_classes}")
    out = (labels[..., None] == xp.arange(num_classes, dtype=np.int64)).astype(np.int64)
    return Tensor(out)
