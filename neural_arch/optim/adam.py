"""Adam and AdamW (decoupled weight decay), torch's update formulas, in place and vectorised.

For step t with gradient g (Adam adds ``weight_decay * p`` to g; AdamW instead multiplies
``p`` by ``1 - lr * weight_decay`` first)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_hat = max(v_hat, v) if amsgrad else v
    p = p - lr / (1 - beta1**t) * m / (sqrt(v_hat) / sqrt(1 - beta2**t) + eps)

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    >>> opt.param_groups[0]["betas"]
    (0.9, 0.999)
"""

from __future__ import annotations

import math

from neural_arch import backend as _backend
from neural_arch.optim.optimizer import Optimizer

__all__ = ["Adam", "AdamW"]


def _check(lr, betas, eps, weight_decay, who):
    if lr < 0.0:
        raise ValueError(f"{who}: invalid learning rate lr={lr}; it must be >= 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{who}: betas must be two numbers in [0, 1), got {betas}")
    if eps < 0.0:
        raise ValueError(f"{who}: invalid eps={eps}; it must be >= 0")
    if weight_decay < 0.0:
        raise ValueError(f"{who}: invalid weight_decay={weight_decay}; it must be >= 0")


class Adam(Optimizer):
    """Adam (Kingma & Ba) with optional L2 weight decay and AMSGrad.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.Adam(model.parameters(), lr=1e-3)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False):
        _check(lr, betas, eps, weight_decay, type(self).__name__)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                      "weight_decay": weight_decay, "amsgrad": amsgrad})

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            wd, amsgrad = group["weight_decay"], group["amsgrad"]
            for p, g in self._params_with_grad(group):
                d = p.data
                xp = _backend.get_array_module(d)
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = xp.zeros_like(d)
                    state["exp_avg_sq"] = xp.zeros_like(d)
                    if amsgrad:
                        state["max_exp_avg_sq"] = xp.zeros_like(d)
                state["step"] += 1
                t = state["step"]
                if wd != 0:
                    if self._decoupled:
                        d *= 1 - lr * wd
                    else:
                        g = g + wd * d
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m *= beta1
                # One temporary for (1-b1)*g, (1-b2)*g*g, the denominator and the update (same
                # arithmetic as the expression form): Adam is memory-bound.
                tmp = xp.multiply(g, 1 - beta1)
                m += tmp
                v *= beta2
                if getattr(tmp, "ndim", 0) > 0:  # 0-d: NumPy gives back a scalar, out= cannot take it
                    xp.multiply(g, g, out=tmp)
                    tmp *= 1 - beta2
                    v += tmp
                else:
                    v += (1 - beta2) * (g * g)
                if amsgrad:
                    vmax = state["max_exp_avg_sq"]
                    xp.maximum(vmax, v, out=vmax)
                    v = vmax
                bias1 = 1 - beta1**t
                bias2 = 1 - beta2**t
                reuse = getattr(tmp, "ndim", 0) > 0 and tmp.dtype == v.dtype and tmp.shape == v.shape
                update = xp.sqrt(v, out=tmp) if reuse else xp.sqrt(v)
                update /= math.sqrt(bias2)
                update += eps
                xp.divide(m, update, out=update)
                update *= lr / bias1
                d -= update
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p *= 1 - lr * weight_decay``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
