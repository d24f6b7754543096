"""torch's remaining random regularisers and samplers: ``F.dropout1d``, ``F.alpha_dropout`` and
``F.gumbel_softmax``. Their randomness comes from the seeded global generator
(:func:`neural_arch.manual_seed`), so a seeded run repeats.

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn import functional as F
    >>> y = F.gumbel_softmax(na.zeros(2, 3), hard=True)
    >>> y.sum(dim=-1).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.op_utils import _xp
from neural_arch.core.ops_activation import softmax
from neural_arch.core.ops_conv import dropout2d
from neural_arch.core.rng import get_generator
from neural_arch.core.tensor import Tensor
from neural_arch.nn.functional.activations import finish_inplace

__all__ = ["alpha_dropout", "dropout1d", "gumbel_softmax"]

# SELU's saturation value: -SELU_SCALE * SELU_ALPHA, the value alpha dropout drops to (torch's constant)
_ALPHA_PRIME = 1.7580993408473766


def _tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def _check_p(p: float) -> float:
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return float(p)


def _uniform(xd, shape):
    """Uniform [0, 1) draws of ``shape`` on ``xd``'s device (the global generator on the CPU)."""
    xp = _xp(xd)
    if xp is np:
        return get_generator().random(shape)
    return xp.random.random(shape)


def dropout1d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels of a ``(N, C, L)`` (or unbatched ``(C, L)``) input with probability ``p``,
    scaling the rest by ``1/(1-p)`` (torch's ``F.dropout1d``). Any other rank is refused, as torch
    refuses it (a 4-d input belongs to ``dropout2d``). ``inplace=True`` writes into the input where no
    graph tracks it, as the activations' ``inplace`` does.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> y = F.dropout1d(na.ones(1, 8, 3), p=0.5).data
        >>> sorted(set(y.std(axis=-1).ravel().tolist()))     # each channel all kept or all zeroed
        [0.0]
    """
    p = _check_p(p)
    x = _tensor(input)
    if x.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {x.ndim}D input. Note that "
                           f"dropout1d exists to provide channel-wise dropout on inputs with 1 spatial dimension, "
                           f"a channel dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    if x.ndim == 2:  # unbatched (C, L): one draw per channel
        return finish_inplace(x, dropout2d(x.unsqueeze(0), p, training).squeeze(0), inplace and training)
    return finish_inplace(x, dropout2d(x, p, training), inplace and training)


def alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Dropout that keeps a SELU network's zero mean and unit variance (torch's ``F.alpha_dropout``;
    note torch's default ``training=False``). A dropped element becomes SELU's saturation value
    ``-alpha'``, then everything is scaled by ``a`` and shifted by ``b``:
    ``a = ((1 - p) (1 + p alpha'^2)) ** -0.5``, ``b = a alpha' p``. ``p = 1`` gives zeros (torch).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.alpha_dropout(na.ones(3), 0.5).tolist()              # training=False: the input itself
        [1.0, 1.0, 1.0]
    """
    p = _check_p(p)
    x = _tensor(input)
    if not training or p == 0.0 or x.data.size == 0:
        return x
    xd = x.data
    if xd.dtype.kind in "biu":
        raise TypeError(f"alpha_dropout: expected a floating-point tensor, got dtype {xd.dtype}")
    if p == 1.0:
        return finish_inplace(x, x * 0.0, inplace)
    keep = _uniform(xd, xd.shape) >= p
    a = 1.0 / math.sqrt((_ALPHA_PRIME ** 2 * p + 1.0) * (1.0 - p))
    scale = (keep * a).astype(xd.dtype)                                   # a where kept, 0 where dropped
    shift = ((keep.astype(np.float64) - 1.0 + p) * (_ALPHA_PRIME * a)).astype(xd.dtype)  # b or b - a alpha'
    return finish_inplace(x, x * Tensor(scale) + Tensor(shift), inplace)


def gumbel_softmax(logits, tau: float = 1.0, hard: bool = False, eps: float = 1e-10, dim: int = -1) -> Tensor:
    """A sample from the Gumbel-softmax distribution (torch's ``F.gumbel_softmax``):
    ``softmax((logits + g) / tau, dim)`` with ``g = -log(E)``, ``E ~ Exponential(1)``. With ``hard=True``
    the result is the one-hot of its argmax in the forward pass and the soft sample's gradient in the
    backward (straight-through: ``y_hard - y_soft.detach() + y_soft``). ``eps`` is unused (torch's too).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> y = F.gumbel_softmax(na.zeros(1, 4), tau=0.5)
        >>> round(float(y.sum().item()), 6)
        1.0
    """
    x = _tensor(logits)
    if x.data.dtype.kind in "biu":
        raise TypeError(f"gumbel_softmax: expected floating-point logits, got dtype {x.data.dtype}")
    if not float(tau) > 0:
        raise ValueError(f"gumbel_softmax: tau must be positive, got {tau}")
    xd = x.data
    xp = _xp(xd)
    if xp is np:
        e = get_generator().exponential(size=xd.shape)
    else:
        e = xp.random.exponential(size=xd.shape)
    gumbels = (-xp.log(e)).astype(xd.dtype)
    y_soft = softmax((x + Tensor(gumbels)) / float(tau), axis=dim)
    if not hard:
        return y_soft
    sd = y_soft.data
    first = xp.argmax(sd, axis=dim)
    y_hard = (xp.arange(sd.shape[dim]).reshape((-1,) + (1,) * (sd.ndim - 1 - (dim % sd.ndim)))
              == xp.expand_dims(first, dim)).astype(sd.dtype)
    return Tensor(y_hard) - y_soft.detach() + y_soft
