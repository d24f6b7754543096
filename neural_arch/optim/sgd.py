"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (torch's formulas).

For each parameter ``p`` with gradient ``g``::

    g = -g if maximize
    g = g + weight_decay * p
    if momentum:
        buf = g                                  (first step)
        buf = momentum * buf + (1 - dampening) * g   (later steps)
        g = g + momentum * buf if nesterov else buf
    p = p - lr * g

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> from neural_arch.core.tensor import Tensor
    >>> w = nn.Parameter(np.array([1.0, 2.0]))
    >>> w.grad = Tensor(np.array([1.0, 1.0]))
    >>> optim.SGD([w], lr=0.5).step()
    >>> w.data.tolist()
    [0.5, 1.5]
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.optim._axpy import axpy_
from neural_arch.optim.optimizer import Optimizer, required

__all__ = ["SGD"]


class SGD(Optimizer):
    """SGD; updates ``p.data`` in place. ``lr`` is required.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr=required, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"SGD: invalid learning rate lr={lr}; it must be >= 0")
        if momentum < 0.0:
            raise ValueError(f"SGD: invalid momentum={momentum}; it must be >= 0")
        if weight_decay < 0.0:
            raise ValueError(f"SGD: invalid weight_decay={weight_decay}; it must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov=True needs momentum > 0 and dampening = 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                      "weight_decay": weight_decay, "nesterov": nesterov,
                                      "maximize": bool(maximize)})

    def step(self, closure=None):
        """Apply one update to every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            dampening, wd, nesterov = group["dampening"], group["weight_decay"], group["nesterov"]
            maximize = group.get("maximize", False)  # a group saved before the option existed has none
            for p, g in self._params_with_grad(group):
                d = p.data
                if maximize:
                    g = -g  # a new array: never modify the caller's gradient
                if wd != 0:
                    g = g + wd * d  # a new array: never modify the caller's gradient
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        # The parameter's module (never the gradient's ``.data`` duck-typed): a copy
                        # on the same device.
                        xp = _backend.get_array_module(d)
                        buf = state["momentum_buffer"] = xp.array(g, dtype=d.dtype, copy=True)
                    else:
                        buf *= momentum
                        buf += (1 - dampening) * g if dampening != 0 else g
                    g = g + momentum * buf if nesterov else buf
                # In place: DDP/ZeRO hold references to these very arrays. One BLAS pass when possible.
                axpy_(d, g, -lr)
        return loss
