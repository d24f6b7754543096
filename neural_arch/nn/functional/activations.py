"""torch's remaining element-wise activations, composed from the core's differentiable ops:
``elu``, ``selu``, ``celu``, ``mish``, ``hardswish``, ``hardsigmoid``, ``hardtanh``, ``relu6``,
``logsigmoid``, ``softsign``, ``tanhshrink``, ``threshold``, ``glu``, ``prelu`` and ``softmin``.

Each follows torch's documented formula, default arguments and subgradient at the kinks (the
masks below pick torch's side of every boundary), so a ported script gets torch's numbers and
torch's gradients; a NaN input stays NaN. ``inplace=True`` writes the result into the input when
autograd does not track it (so every alias sees it, as in torch); on a tensor of a recorded graph the
result is a new tensor, the rule ``t += x`` follows here (:mod:`neural_arch.core.ops_inplace`).
Exposed as ``neural_arch.nn.functional.<name>``.

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn import functional as F
    >>> [round(v, 4) for v in F.elu(na.tensor([-1.0, 2.0])).tolist()]
    [-0.6321, 2.0]
    >>> F.hardtanh(na.tensor([-3.0, 0.5, 3.0])).tolist()
    [-1.0, 0.5, 1.0]
"""

from __future__ import annotations

import warnings

import numpy as np

from neural_arch.core.autograd import is_grad_enabled
from neural_arch.core.op_utils import _xp
from neural_arch.core.ops_activation import clamp, exp, sigmoid, softmax, softplus, tanh, where
from neural_arch.core.tensor import Tensor

__all__ = [
    "celu",
    "elu",
    "glu",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "logsigmoid",
    "mish",
    "prelu",
    "relu6",
    "selu",
    "softmin",
    "softsign",
    "tanhshrink",
    "threshold",
]

# torch's SELU constants (Klambauer et al., 2017)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _float_tensor(x, who: str) -> Tensor:
    """``x`` as a floating-point Tensor; integer input is refused as torch refuses it (the
    activation's arithmetic would otherwise be truncated back to integers)."""
    x = x if isinstance(x, Tensor) else Tensor(np.asarray(x))
    if x.data.dtype.kind in "biu":
        raise TypeError(f"{who}: expected a floating-point tensor, got dtype {x.data.dtype}; convert it with "
                        f".float() (or .double()) first")
    return x


def finish_inplace(x: Tensor, out: Tensor, inplace: bool) -> Tensor:
    """torch's ``inplace=True``: ``out`` written into ``x`` (returned) when no graph tracks ``x``, so a
    script that ignores the return value still sees the result; otherwise ``out`` itself (a tensor of
    a recorded graph cannot be changed in place here without corrupting the gradients that used it).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> x = na.tensor([-2.0, 0.5])
        >>> _ = F.hardtanh(x, inplace=True)
        >>> x.tolist()
        [-1.0, 0.5]
    """
    if not inplace or (x.requires_grad and is_grad_enabled()):
        return out
    x.copy_(out)
    return x


def _exp_negative_part(x: Tensor, scale: float = 1.0) -> Tensor:
    """``exp(min(x, 0) * scale) - 1``: the ELU family's negative branch, computed on ``min(x, 0)`` so a
    large positive ``x`` never overflows (an ``inf`` there would turn the masked gradient into NaN)."""
    neg = clamp(x, max=0.0)
    return exp(neg * scale if scale != 1.0 else neg) - 1.0


def elu(input, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)`` (torch's ``F.elu``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.elu(na.tensor([-1.0, 0.0, 1.0]), alpha=2.0).tolist()]
        [-1.2642, 0.0, 1.0]
    """
    x = _float_tensor(input, "elu")
    return finish_inplace(x, where(x.data > 0, x, _exp_negative_part(x) * float(alpha)), inplace)


def selu(input, inplace: bool = False) -> Tensor:
    """``scale * elu(x, alpha)`` with torch's fixed ``alpha = 1.6732...`` and ``scale = 1.0507...``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.selu(na.tensor([-1.0, 1.0])).tolist()]
        [-1.1113, 1.0507]
    """
    x = _float_tensor(input, "selu")
    return finish_inplace(x, where(x.data > 0, x, _exp_negative_part(x) * SELU_ALPHA) * SELU_SCALE, inplace)


def celu(input, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`` (torch's ``F.celu``); ``alpha = 0`` is
    refused (torch's error).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.celu(na.tensor([-1.0, 1.0]), alpha=2.0).tolist()]
        [-0.7869, 1.0]
    """
    alpha = float(alpha)
    if alpha == 0.0:
        raise RuntimeError("celu: alpha cannot be 0 for CELU (ZeroDivisionError)")
    x = _float_tensor(input, "celu")
    return finish_inplace(x, where(x.data > 0, x, _exp_negative_part(x, 1.0 / alpha) * alpha), inplace)


def mish(input, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))`` (torch's ``F.mish``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.mish(na.tensor([-1.0, 1.0])).tolist()]
        [-0.3034, 0.8651]
    """
    x = _float_tensor(input, "mish")
    # threshold=inf: softplus's exact, overflow-free form everywhere (torch's mish uses log1p(exp(x))).
    return finish_inplace(x, x * tanh(softplus(x, 1.0, float("inf"))), inplace)


def _inside(xd, low: float, high: float):
    """The open interval ``(low, high)``, and NaN: torch's hard activations pass the gradient only inside,
    and a NaN input must come out NaN (every comparison with NaN is false, so without the ``isnan``
    term a NaN would be replaced by a bound: ``hardtanh(nan)`` would be a silent 1.0)."""
    return ((xd > low) & (xd < high)) | _xp(xd).isnan(xd)


def hardsigmoid(input, inplace: bool = False) -> Tensor:
    """``0`` for ``x <= -3``, ``1`` for ``x >= 3``, else ``x / 6 + 1 / 2`` (torch's ``F.hardsigmoid``;
    the gradient is ``1/6`` strictly inside ``(-3, 3)``, 0 elsewhere, as torch).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.hardsigmoid(na.tensor([-4.0, 0.0, 4.0])).tolist()
        [0.0, 0.5, 1.0]
    """
    x = _float_tensor(input, "hardsigmoid")
    xd = x.data
    outside = (xd >= 3).astype(xd.dtype)  # 1 above, 0 below: a constant, no gradient
    return finish_inplace(x, where(_inside(xd, -3.0, 3.0), x / 6.0 + 0.5, Tensor(outside)), inplace)


def hardswish(input, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6`` (torch's ``F.hardswish``; the gradient is ``x / 3 + 1/2`` strictly inside
    ``(-3, 3)``, 0 from -3 down and 1 from 3 up, as torch 2.x).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.hardswish(na.tensor([0.0, 1.0, 4.0])).tolist()
        [0.0, 0.6666666865348816, 4.0]
    """
    x = _float_tensor(input, "hardswish")
    xd = x.data
    # The middle branch on x clamped to [-3, 3]: the branch where() does not pick still gets a zero
    # gradient, and 0 * inf there would make the gradient at +-inf NaN. Below -3 it is x * 0, not a
    # constant 0: -inf gives NaN, as torch's x * relu6(x + 3) / 6 does.
    mid = clamp(x, -3.0, 3.0)
    out = where(_inside(xd, -3.0, 3.0), mid * (mid + 3.0) / 6.0, where(xd >= 3, x, x * 0.0))
    return finish_inplace(x, out, inplace)


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` clamped to ``[min_val, max_val]`` (torch's ``F.hardtanh``; the gradient is 1 strictly
    inside, 0 at and beyond the bounds, as torch). ``min_val > max_val`` is refused (torch's error).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.hardtanh(na.tensor([-2.0, 0.5, 2.0]), -1.0, 1.0).tolist()
        [-1.0, 0.5, 1.0]
    """
    min_val, max_val = float(min_val), float(max_val)
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val cannot be greater than max_val (got min_val={min_val}, "
                         f"max_val={max_val})")
    x = _float_tensor(input, "hardtanh")
    xd = x.data
    bound = _xp(xd).where(xd <= min_val, min_val, max_val)  # the clamped value: a constant, no gradient
    return finish_inplace(x, where(_inside(xd, min_val, max_val), x, Tensor(bound.astype(xd.dtype))), inplace)


def relu6(input, inplace: bool = False) -> Tensor:
    """``min(max(0, x), 6)``: ``hardtanh(x, 0, 6)`` as torch defines it (gradient 0 at 0 and at 6).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.relu6(na.tensor([-1.0, 3.0, 7.0])).tolist()
        [0.0, 3.0, 6.0]
    """
    return hardtanh(input, 0.0, 6.0, inplace)


def logsigmoid(input) -> Tensor:
    """``log(1 / (1 + exp(-x)))``, computed as ``-softplus(-x)`` without overflow or underflow.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.logsigmoid(na.tensor([0.0, -100.0])).tolist()]
        [-0.6931, -100.0]
    """
    x = _float_tensor(input, "logsigmoid")
    return -softplus(-x, 1.0, float("inf"))


def softsign(input) -> Tensor:
    """``x / (1 + |x|)``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.softsign(na.tensor([-1.0, 3.0])).tolist()
        [-0.5, 0.75]
    """
    x = _float_tensor(input, "softsign")
    return x / (x.abs() + 1.0)


def tanhshrink(input) -> Tensor:
    """``x - tanh(x)``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.tanhshrink(na.tensor([0.0])).tolist()
        [0.0]
    """
    x = _float_tensor(input, "tanhshrink")
    return x - tanh(x)


def threshold(input, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold``, else ``value`` (torch's ``F.threshold``; both arguments required).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.threshold(na.tensor([1.0, 2.0]), 1.0, 5.0).tolist()
        [5.0, 2.0]
    """
    x = input if isinstance(input, Tensor) else Tensor(np.asarray(input))
    # "not x <= threshold" rather than "x > threshold": a NaN stays NaN (torch), never becomes ``value``
    return finish_inplace(x, where(~(x.data <= threshold), x, value), inplace)


def glu(input, dim: int = -1) -> Tensor:
    """Gated linear unit: ``a * sigmoid(b)`` where ``a, b`` are the two halves of ``input`` along ``dim``
    (whose size must be even; torch's error otherwise).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.glu(na.tensor([[2.0, 0.0]])).tolist()[0]]
        [1.0]
    """
    x = _float_tensor(input, "glu")
    if x.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    if not -x.ndim <= dim < x.ndim:
        raise IndexError(f"glu: dim {dim} is out of range for a {x.ndim}-d input")
    size = x.shape[dim]
    if size % 2:
        raise RuntimeError(f"glu: halving dimension must be even, but dimension {dim % x.ndim} is size {size}")
    half = size // 2
    axis = dim % x.ndim
    lead = (slice(None),) * axis
    # slices, not split(): a dimension of size 0 gives two empty halves (split(0) has no chunks)
    return x[lead + (slice(0, half),)] * sigmoid(x[lead + (slice(half, size),)])


def prelu(input, weight) -> Tensor:
    """``x`` where ``x > 0``, else ``weight * x`` (torch's ``F.prelu``): ``weight`` holds one slope, or
    one per channel (dim 1 of the input; dim 0 of a 1-d input), as torch. Any other count is refused
    (torch's error), never broadcast along the wrong dimension.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.prelu(na.tensor([[-2.0, 3.0]]), na.tensor([0.25])).tolist()
        [[-0.5, 3.0]]
    """
    x = _float_tensor(input, "prelu")
    w = weight if isinstance(weight, Tensor) else Tensor(np.asarray(weight))
    if w.ndim > 1:
        raise RuntimeError(f"prelu: expected `weight` to be a scalar or 1D tensor, but got ndim = {w.ndim}")
    count = int(np.prod(w.shape)) if w.ndim else 1
    if x.ndim == 0:
        channels = 1
    else:
        channels = x.shape[1] if x.ndim >= 2 else 1
    if count != 1 and count != channels:
        raise RuntimeError(f"prelu: mismatch of parameter numbers and input channel size: found parameter "
                           f"numbers = {count} and channel size = {channels}")
    if count == 1:
        slope = w.reshape(())
    else:
        slope = w.reshape((channels,) + (1,) * (x.ndim - 2))
    return where(x.data > 0, x, x * slope)


def _implicit_softmax_dim(ndim: int, who: str) -> int:
    warnings.warn(f"Implicit dimension choice for {who} has been deprecated. Change the call to include "
                  f"dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmin(input, dim=None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """``softmax(-x, dim)`` (torch's ``F.softmin``). ``dim=None`` picks torch's implicit dim (0 for a
    0-d, 1-d or 3-d input, else 1) with torch's deprecation warning; ``dtype`` casts the input first.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> [round(v, 4) for v in F.softmin(na.tensor([0.0, 1.0]), dim=0).tolist()]
        [0.7311, 0.2689]
    """
    x = _float_tensor(input, "softmin")
    if dtype is not None:
        x = x.astype(dtype)
    if dim is None:
        dim = _implicit_softmax_dim(x.ndim, "softmin")
    if not -max(x.ndim, 1) <= dim < max(x.ndim, 1):  # checked here: an empty input would pass any axis
        raise IndexError(f"softmin: dimension out of range (expected to be in range of [{-max(x.ndim, 1)}, "
                         f"{max(x.ndim, 1) - 1}], but got {dim})")
    return softmax(-x, axis=dim)

