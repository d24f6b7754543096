"""Weight initialisers, in place, driven by the seeded global generator.

Every function fills ``tensor.data`` in place and returns the tensor. Values are drawn on the host
from :func:`neural_arch.core.tensor.get_generator` (or the ``generator`` you pass), so a model
built after ``manual_seed(s)`` is identical on every rank and on CPU or GPU, which is what DDP's
"same initial weights everywhere" check relies on.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import manual_seed
    >>> manual_seed(0)
    >>> w = nn.Parameter(np.empty((4, 3), dtype=np.float32))
    >>> _ = nn.init.kaiming_uniform_(w, a=5 ** 0.5)
    >>> bool(abs(w.data).max() <= 1 / 3 ** 0.5)
    True
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.rng import numpy_generator
from neural_arch.core.tensor import Tensor

__all__ = [
    "calculate_gain", "uniform_", "normal_", "constant_", "zeros_", "ones_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_",
]


def _check(tensor) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"init: expected a Tensor or Parameter, got {type(tensor).__name__}")
    return tensor


def _fill(tensor: Tensor, values: np.ndarray) -> Tensor:
    """Write host ``values`` into ``tensor`` in place (cast to its dtype, moved to its device)."""
    current = tensor.data
    values = np.asarray(values, dtype=np.dtype(current.dtype))
    current[...] = _backend.to_device(values, tensor.device)
    return tensor


def _rng(generator):
    return numpy_generator(generator)


def _fans(tensor: Tensor) -> tuple[int, int]:
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError(
            f"fan in/out need a tensor with at least 2 dimensions, got shape {shape}; "
            "use uniform_/normal_ for biases and vectors"
        )
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    # torch layout: weight is (out_features, in_features, *kernel)
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """Recommended gain for ``nonlinearity`` (same table as torch).

    Example::

        >>> from neural_arch.nn import init
        >>> init.calculate_gain("linear"), round(init.calculate_gain("relu"), 4)
        (1.0, 1.4142)
    """
    if nonlinearity in ("linear", "identity", "sigmoid") or nonlinearity.startswith("conv"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(
        f"calculate_gain: unknown nonlinearity {nonlinearity!r}; use one of linear, sigmoid, "
        "tanh, relu, leaky_relu, selu"
    )


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    """Fill with U(a, b).

    Example::

        >>> from neural_arch import nn
        >>> w = nn.init.uniform_(nn.Linear(4, 4).weight, -0.1, 0.1)
        >>> bool((abs(w.data) <= 0.1).all())
        True
    """
    _check(tensor)
    return _fill(tensor, _rng(generator).uniform(a, b, size=tensor.shape))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    """Fill with N(mean, std**2).

    Example::

        >>> from neural_arch import nn
        >>> w = nn.init.normal_(nn.Linear(100, 100).weight, std=0.02)
        >>> bool(0.015 < w.data.std() < 0.025)
        True
    """
    _check(tensor)
    return _fill(tensor, _rng(generator).normal(mean, std, size=tensor.shape))


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None):
    """Fill with N(mean, std**2) redrawn until inside [a, b] (absolute bounds, like torch).

    Example::

        >>> from neural_arch import nn
        >>> w = nn.init.trunc_normal_(nn.Linear(50, 50).weight, std=1.0, a=-0.5, b=0.5)
        >>> bool((abs(w.data) <= 0.5).all())
        True
    """
    _check(tensor)
    if not a < b or not std >= 0:
        raise ValueError(f"trunc_normal_: need a < b and std >= 0, got a={a}, b={b}, std={std}")
    rng = _rng(generator)
    if std == 0:
        return _fill(tensor, np.full(tensor.shape, min(max(mean, a), b)))
    phi = NormalDist(mean, std)
    if phi.cdf(b) - phi.cdf(a) < 0.01:  # also true far in a tail, where both round to 0 or 1
        return _fill(tensor, _trunc_normal_by_inversion(phi, a, b, rng, tensor.shape))
    values = rng.normal(mean, std, size=tensor.shape)
    bad = (values < a) | (values > b)
    while bad.any():  # rejection sampling: a few rounds, each keeps at least 1% of the draws
        values[bad] = rng.normal(mean, std, size=int(bad.sum()))
        bad = (values < a) | (values > b)
    return _fill(tensor, values)


def _trunc_normal_by_inversion(phi: NormalDist, a: float, b: float, rng, shape) -> np.ndarray:
    """N(mean, std) truncated to a narrow or far-off [a, b], by inverting the CDF.

    Rejection would take ~1/P(a <= x <= b) rounds, or never end when [a, b] lies far in a tail.
    A right-tail interval is mirrored into the left tail, where the CDF's tiny values are still
    represented; past underflow the distribution is all at the bound nearest the mean."""
    m, s = phi.mean, phi.stdev
    mirrored = a > m
    lo, hi = (2 * m - b, 2 * m - a) if mirrored else (a, b)

    def cdf(x):  # erfc keeps the left tail's tiny values (NormalDist.cdf's erf rounds them to 0)
        return 0.5 * math.erfc((m - x) / (s * math.sqrt(2.0)))

    low, high = cdf(lo), cdf(hi)
    if high <= low:
        values = np.full(shape, hi if hi <= m else lo)
    else:
        u = rng.uniform(low, high, size=shape)
        inverse = np.vectorize(lambda q: phi.inv_cdf(q) if 0.0 < q < 1.0 else (lo if q <= 0.0 else hi),
                               otypes=[float])
        values = np.clip(inverse(u), lo, hi)
    return 2 * m - values if mirrored else values


def constant_(tensor, value: float):
    """Fill ``tensor`` with ``value`` in place (no gradient recorded); returns it.

    Example::

        >>> from neural_arch import nn
        >>> nn.init.constant_(nn.Linear(2, 2).bias, 0.5).tolist()
        [0.5, 0.5]
    """
    _check(tensor)
    tensor.data[...] = value
    return tensor


def zeros_(tensor):
    """Fill ``tensor`` with zeros in place (no gradient recorded); returns it.

    Example::

        >>> from neural_arch import nn
        >>> nn.init.zeros_(nn.Linear(2, 2).bias).tolist()
        [0.0, 0.0]
    """
    return constant_(tensor, 0.0)


def ones_(tensor):
    """Fill ``tensor`` with ones in place (no gradient recorded); returns it.

    Example::

        >>> from neural_arch import nn
        >>> nn.init.ones_(nn.Linear(2, 2).bias).tolist()
        [1.0, 1.0]
    """
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).

    Example::

        >>> import math
        >>> from neural_arch import nn
        >>> w = nn.init.xavier_uniform_(nn.Linear(30, 20).weight)
        >>> bool(abs(w.data).max() <= math.sqrt(6 / (30 + 20)))
        True
    """
    fan_in, fan_out = _fans(_check(tensor))
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    """Glorot normal: N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out)).

    Example::

        >>> from neural_arch import nn
        >>> w = nn.init.xavier_normal_(nn.Linear(300, 200).weight)
        >>> round(float(w.data.std()), 2)          # sqrt(2 / 500)
        0.06
    """
    fan_in, fan_out = _fans(_check(tensor))
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity) -> float:
    fan_in, fan_out = _fans(_check(tensor))
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator=None):
    """He uniform: U(-b, b), b = sqrt(3) * gain / sqrt(fan). ``a=sqrt(5)`` is torch's Linear default.

    Example::

        >>> import math
        >>> from neural_arch import nn
        >>> w = nn.init.kaiming_uniform_(nn.Linear(50, 10).weight, nonlinearity="relu")
        >>> bool(abs(w.data).max() <= math.sqrt(6 / 50))
        True
    """
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None):
    """He normal: N(0, (gain / sqrt(fan))**2).

    Example::

        >>> from neural_arch import nn
        >>> w = nn.init.kaiming_normal_(nn.Linear(200, 300).weight, nonlinearity="relu")
        >>> round(float(w.data.std()), 1)          # sqrt(2 / fan_in)
        0.1
    """
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)
