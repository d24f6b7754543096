"""Adagrad (Duchi et al. 2011) with torch's options: ``lr_decay``, ``weight_decay``,
``initial_accumulator_value``, ``eps`` and ``maximize``; multi-tensor (``foreach``) by default for small tensors.

For step ``t`` (torch.optim.Adagrad's documented algorithm)::

    g = -g if maximize;  g = g + weight_decay * p
    clr = lr / (1 + (t - 1) * lr_decay)
    s = s + g * g                      (s starts at initial_accumulator_value)
    p = p - clr * g / (sqrt(s) + eps)

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> from neural_arch.core.tensor import Tensor
    >>> w = nn.Parameter(np.array([1.0]))
    >>> w.grad = Tensor(np.array([2.0]))
    >>> optim.Adagrad([w], lr=0.5, eps=0.0).step()
    >>> w.data.tolist()
    [0.5]
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad; ``foreach=None`` updates a group's small host tensors in a few flat NumPy calls.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.Adagrad(model.parameters(), lr=0.1)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10,
                 foreach: bool | None = None, maximize: bool = False):
        for name, value in (("lr", lr), ("lr_decay", lr_decay), ("weight_decay", weight_decay),
                            ("initial_accumulator_value", initial_accumulator_value), ("eps", eps)):
            if value < 0.0:
                raise ValueError(f"Adagrad: invalid {name}={value}; it must be >= 0")
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value, "eps": eps,
                                  "foreach": foreach, "maximize": maximize})

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        if group["maximize"]:
            g = -g
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * d
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        s = st["sum"]
        s += g * g
        std = xp.sqrt(s)
        std += group["eps"]
        d -= clr * (g / std)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            def init(state, data, value=group["initial_accumulator_value"]):
                state["step"] = 0
                state["sum"] = np.full_like(data, value)

            run_group(self, gi, group, ["sum"], init, self._update)
        return loss
