"""Element-wise activation modules: ``ReLU``, ``GELU``, ``Tanh``, ``Sigmoid``, ``Softplus``, ``Softmax``.

They hold no parameters; they exist so activations can sit inside ``Sequential``.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> nn.ReLU()(np.array([-1.0, 2.0])).data.tolist()
    [0.0, 2.0]
"""

from __future__ import annotations

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "Softplus", "Softmax", "LogSoftmax"]


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


class ReLU(Module):
    """max(x, 0).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.ReLU()(na.tensor([-1.0, 2.0])).tolist()
        [0.0, 2.0]
    """

    def forward(self, x):
        return F.relu(_as_tensor(x))


class GELU(Module):
    """Gaussian error linear unit, as torch's ``nn.GELU(approximate="none" | "tanh")``.

    ``"none"`` is the exact ``x * Phi(x)`` (erf form); ``"tanh"`` is GPT-2's tanh approximation.

    Example::

        >>> import numpy as np
        >>> round(float(GELU(approximate="tanh")(np.array([1.0])).data[0]), 6)
        0.841192
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(_as_tensor(x), approximate=self.approximate)

    def extra_repr(self) -> str:
        # Only the non-default shows (torch always prints it; the repr test pins "GELU()").
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"


class Tanh(Module):
    """Elementwise hyperbolic tangent, as a layer.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Tanh()(na.tensor([0.0])).tolist()
        [0.0]
    """
    def forward(self, x):
        return F.tanh(_as_tensor(x))


class Sigmoid(Module):
    """Elementwise logistic function ``1 / (1 + exp(-x))``, as a layer.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Sigmoid()(na.tensor([0.0])).tolist()
        [0.5]
    """
    def forward(self, x):
        return F.sigmoid(_as_tensor(x))


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x > threshold`` (torch's
    ``nn.Softplus(beta=1.0, threshold=20.0)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> [round(v, 4) for v in nn.Softplus()(na.tensor([0.0, 25.0])).tolist()]
        [0.6931, 25.0]
    """

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = float(beta)
        self.threshold = float(threshold)

    def forward(self, x):
        return F.softplus(_as_tensor(x), self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"

class Softmax(Module):
    """Softmax over ``axis`` (``dim`` accepted as torch's spelling).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Softmax(dim=-1)(na.zeros(1, 4)).tolist()
        [[0.25, 0.25, 0.25, 0.25]]
    """

    def __init__(self, axis: int = -1, dim: int | None = None):
        super().__init__()
        self.axis = axis if dim is None else dim

    def forward(self, x):
        return F.softmax(_as_tensor(x), axis=self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    """Log-softmax over ``axis`` (``dim`` accepted as torch's spelling), computed stably in one op.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> y = nn.LogSoftmax(dim=-1)(na.zeros(1, 2))
        >>> [round(v, 4) for v in y.tolist()[0]]
        [-0.6931, -0.6931]
    """
    def forward(self, x):
        return F.log_softmax(_as_tensor(x), axis=self.axis)
