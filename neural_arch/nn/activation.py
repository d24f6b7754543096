"""Element-wise activation modules: ``ReLU``, ``GELU``, ``Tanh``, ``Sigmoid``, ``Softplus``, ``Softmax``,
and torch's others (``ELU``, ``SELU``, ``CELU``, ``Mish``, ``Hardswish``, ``Hardsigmoid``, ``Hardtanh``,
``ReLU6``, ``LogSigmoid``, ``Softsign``, ``Tanhshrink``, ``Threshold``, ``GLU``, ``PReLU``, ``Softmin``).

Only ``PReLU`` holds a parameter (its learnable slope); the rest exist so activations can sit inside
``Sequential``. Each takes torch's arguments; ``inplace=True`` writes into the input where no autograd
graph tracks it, as the functional forms do (a recorded tensor gets a new result tensor).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> nn.ReLU()(np.array([-1.0, 2.0])).data.tolist()
    [0.0, 2.0]
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "Softplus", "Softmax", "LogSoftmax", "ELU", "SELU", "CELU",
           "Mish", "Hardswish", "Hardsigmoid", "Hardtanh", "ReLU6", "LogSigmoid", "Softsign", "Tanhshrink",
           "Threshold", "GLU", "PReLU", "Softmin"]


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


def _inplace_repr(inplace: bool) -> str:
    return ", inplace=True" if inplace else ""


class ELU(Module):
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)`` (torch's ``nn.ELU(alpha=1.0, inplace=False)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> [round(v, 4) for v in nn.ELU()(na.tensor([-1.0, 2.0])).tolist()]
        [-0.6321, 2.0]
    """

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = float(alpha)
        self.inplace = bool(inplace)

    def forward(self, x):
        return F.elu(_as_tensor(x), self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_repr(self.inplace)}"


class SELU(Module):
    """Scaled ELU with torch's fixed constants (``nn.SELU(inplace=False)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> [round(v, 4) for v in nn.SELU()(na.tensor([1.0])).tolist()]
        [1.0507]
    """

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x):
        return F.selu(_as_tensor(x), self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class CELU(Module):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`` (torch's ``nn.CELU(alpha=1.0, inplace=False)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> [round(v, 4) for v in nn.CELU(alpha=2.0)(na.tensor([-1.0])).tolist()]
        [-0.7869]
    """

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = float(alpha)
        self.inplace = bool(inplace)

    def forward(self, x):
        return F.celu(_as_tensor(x), self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_repr(self.inplace)}"


class _InplaceOnly(Module):
    """An activation whose only argument is torch's ``inplace`` flag."""

    _fn = None

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x):
        return type(self)._fn(_as_tensor(x), self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Mish(_InplaceOnly):
    """``x * tanh(softplus(x))`` (torch's ``nn.Mish``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> [round(v, 4) for v in nn.Mish()(na.tensor([1.0])).tolist()]
        [0.8651]
    """

    _fn = staticmethod(F.mish)


class Hardswish(_InplaceOnly):
    """``x * relu6(x + 3) / 6`` (torch's ``nn.Hardswish``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Hardswish()(na.tensor([0.0, 4.0])).tolist()
        [0.0, 4.0]
    """

    _fn = staticmethod(F.hardswish)


class Hardsigmoid(_InplaceOnly):
    """``relu6(x + 3) / 6`` (torch's ``nn.Hardsigmoid``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Hardsigmoid()(na.tensor([0.0])).tolist()
        [0.5]
    """

    _fn = staticmethod(F.hardsigmoid)


class Hardtanh(Module):
    """``x`` clamped to ``[min_val, max_val]`` (torch's ``nn.Hardtanh(min_val=-1.0, max_val=1.0,
    inplace=False)``); ``max_val <= min_val`` is refused at construction, as torch.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Hardtanh(-2.0, 2.0)(na.tensor([-3.0, 1.0, 3.0])).tolist()
        [-2.0, 1.0, 2.0]
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        if not float(max_val) > float(min_val):  # torch's layer refuses equal bounds too (F.hardtanh does not)
            raise ValueError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val = float(min_val)
        self.max_val = float(max_val)
        self.inplace = bool(inplace)

    def forward(self, x):
        return F.hardtanh(_as_tensor(x), self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_repr(self.inplace)}"


class ReLU6(Hardtanh):
    """``min(max(0, x), 6)`` (torch's ``nn.ReLU6``: a ``Hardtanh(0, 6)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.ReLU6()(na.tensor([-1.0, 7.0])).tolist()
        [0.0, 6.0]
    """

    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class LogSigmoid(Module):
    """``log(sigmoid(x))``, computed without overflow (torch's ``nn.LogSigmoid``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.LogSigmoid()(na.tensor([-100.0])).tolist()
        [-100.0]
    """

    def forward(self, x):
        return F.logsigmoid(_as_tensor(x))


class Softsign(Module):
    """``x / (1 + |x|)`` (torch's ``nn.Softsign``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Softsign()(na.tensor([1.0])).tolist()
        [0.5]
    """

    def forward(self, x):
        return F.softsign(_as_tensor(x))


class Tanhshrink(Module):
    """``x - tanh(x)`` (torch's ``nn.Tanhshrink``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Tanhshrink()(na.tensor([0.0])).tolist()
        [0.0]
    """

    def forward(self, x):
        return F.tanhshrink(_as_tensor(x))


class Threshold(Module):
    """``x`` where ``x > threshold``, else ``value`` (torch's ``nn.Threshold(threshold, value, inplace=False)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Threshold(0.5, -1.0)(na.tensor([0.2, 0.7])).tolist()
        [-1.0, 0.699999988079071]
    """

    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold = float(threshold)
        self.value = float(value)
        self.inplace = bool(inplace)

    def forward(self, x):
        return F.threshold(_as_tensor(x), self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}{_inplace_repr(self.inplace)}"


class GLU(Module):
    """Gated linear unit over the halves of ``dim`` (torch's ``nn.GLU(dim=-1)``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.GLU()(na.tensor([[2.0, 0.0]])).tolist()
        [[1.0]]
    """

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x):
        return F.glu(_as_tensor(x), self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class PReLU(Module):
    """``x`` where ``x > 0``, else ``weight * x`` with a learnable slope (torch's
    ``nn.PReLU(num_parameters=1, init=0.25)``): one slope shared by every channel, or one per
    channel (dim 1 of the input). The parameter is ``weight``, shape ``(num_parameters,)``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> act = nn.PReLU()
        >>> act(na.tensor([-4.0, 2.0])).tolist(), list(act.state_dict())
        ([-1.0, 2.0], ['weight'])
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=np.float32):
        super().__init__()
        if int(num_parameters) < 1:
            raise ValueError(f"PReLU: num_parameters must be at least 1, got {num_parameters}")
        self.num_parameters = int(num_parameters)
        self.init = float(init)
        self.weight = Parameter(np.full((self.num_parameters,), self.init, dtype=dtype), device=device)

    def reset_parameters(self) -> None:
        self.weight.data[...] = self.init

    def forward(self, x):
        return F.prelu(_as_tensor(x), self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Softmin(Module):
    """``softmax(-x, dim)`` (torch's ``nn.Softmin(dim=None)``; ``None`` is torch's implicit dim, with its
    warning).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.Softmin(dim=-1)(na.zeros(1, 2)).tolist()
        [[0.5, 0.5]]
    """

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmin(_as_tensor(x), self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
