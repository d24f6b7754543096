"""torch's ``F.bilinear``: ``y = x1^T A x2 + b`` with one ``(in1, in2)`` matrix per output feature
(the layer holding ``A`` and ``b`` is :class:`neural_arch.nn.Bilinear`).

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn import functional as F
    >>> F.bilinear(na.ones(5, 3), na.ones(5, 4), na.ones(2, 3, 4)).shape
    (5, 2)
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.tensor import Tensor

__all__ = ["bilinear"]


def _tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def bilinear(input1, input2, weight, bias=None) -> Tensor:
    """The bilinear form ``x1^T A_o x2 + b_o`` for each output feature ``o`` (torch's ``F.bilinear``):
    ``input1`` is ``(*, in1)``, ``input2`` ``(*, in2)`` with the same leading shape, ``weight``
    ``(out, in1, in2)``, ``bias`` ``(out,)``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.bilinear(na.tensor([[1.0, 2.0]]), na.tensor([[3.0]]), na.ones(1, 2, 1)).tolist()
        [[9.0]]
    """
    x1, x2, w = _tensor(input1), _tensor(input2), _tensor(weight)
    if w.ndim != 3:
        raise RuntimeError(f"bilinear: weight must be 3-d (out_features, in1_features, in2_features), got "
                           f"shape {list(w.shape)}")
    if x1.ndim < 1 or tuple(x1.shape[:-1]) != tuple(x2.shape[:-1]):
        raise RuntimeError(f"bilinear: input1 and input2 must have the same leading shape, got "
                           f"{list(x1.shape)} and {list(x2.shape)}")
    if x1.shape[-1] != w.shape[1] or x2.shape[-1] != w.shape[2]:
        raise RuntimeError(f"bilinear: input sizes ({x1.shape[-1]}, {x2.shape[-1]}) do not match the weight's "
                           f"(in1_features, in2_features) = ({w.shape[1]}, {w.shape[2]})")
    # (*, 1, 1, in1) @ (out, in1, in2) -> (*, out, 1, in2); then the dot with input2 over in2.
    left = x1.unsqueeze(-2).unsqueeze(-2) @ w
    y = (left.squeeze(-2) * x2.unsqueeze(-2)).sum(dim=-1)
    if bias is not None:
        y = y + _tensor(bias)
    return y
