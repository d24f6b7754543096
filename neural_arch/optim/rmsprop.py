"""RMSprop (Hinton's lecture 6e) with torch's options: ``alpha``, ``eps``, ``weight_decay``,
``momentum``, ``centered`` and ``maximize``; multi-tensor (``foreach``) by default for small tensors on the host.

For each parameter ``p`` with gradient ``g`` (torch.optim.RMSprop's documented algorithm)::

    g = -g if maximize;  g = g + weight_decay * p
    v = alpha * v + (1 - alpha) * g * g
    avg = sqrt(v - g_avg**2) + eps  with  g_avg = alpha * g_avg + (1 - alpha) * g   if centered
    avg = sqrt(v) + eps                                                             otherwise
    buf = momentum * buf + g / avg;  p = p - lr * buf      if momentum > 0
    p = p - lr * g / avg                                    otherwise

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> from neural_arch.core.tensor import Tensor
    >>> w = nn.Parameter(np.array([1.0, 2.0]))
    >>> w.grad = Tensor(np.array([1.0, -1.0]))
    >>> optim.RMSprop([w], lr=0.01, alpha=0.0, eps=0.0).step()
    >>> w.data.tolist()
    [0.99, 2.01]
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop; ``foreach=None`` updates a group's small host tensors in a few flat NumPy calls.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.RMSprop(model.parameters(), lr=0.01)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 foreach: bool | None = None, maximize: bool = False):
        for name, value in (("lr", lr), ("alpha", alpha), ("eps", eps), ("weight_decay", weight_decay),
                            ("momentum", momentum)):
            if value < 0.0:
                raise ValueError(f"RMSprop: invalid {name}={value}; it must be >= 0")
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay,
                                  "momentum": momentum, "centered": centered, "foreach": foreach,
                                  "maximize": maximize})

    @staticmethod
    def _names(group):
        return (["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else [])
                + (["grad_avg"] if group["centered"] else []))

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        lr, alpha, eps, wd = group["lr"], group["alpha"], group["eps"], group["weight_decay"]
        if group["maximize"]:
            g = -g
        if wd != 0:
            g = g + wd * d  # a new array: never modify the caller's gradient
        v = st["square_avg"]
        v *= alpha
        v += (1 - alpha) * (g * g)
        if group["centered"]:
            ga = st["grad_avg"]
            ga *= alpha
            ga += (1 - alpha) * g
            avg = v - ga * ga
            xp.sqrt(avg, out=avg)
        else:
            avg = xp.sqrt(v)
        avg += eps
        if group["momentum"] > 0:
            buf = st["momentum_buffer"]
            buf *= group["momentum"]
            buf += g / avg
            d -= lr * buf
        else:
            d -= lr * (g / avg)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            names = self._names(group)

            def init(state, data, names=names):
                state["step"] = 0
                for name in names:
                    state[name] = np.zeros_like(data)

            run_group(self, gi, group, names, init, self._update)
        return loss
