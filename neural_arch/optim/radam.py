"""RAdam (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and Beyond"), torch's
update rule: Adam whose adaptive step is switched on, and rectified, once the variance of the
adaptive rate is tractable (``rho_t > 5``); before that, a plain bias-corrected momentum step.

For step ``t`` with gradient ``g`` (torch.optim.RAdam's documented algorithm)::

    g = -g if maximize
    p = p * (1 - lr * weight_decay)  if decoupled_weight_decay  else  g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
    rho_inf = 2 / (1 - beta2) - 1;     rho_t = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    m_hat = m / (1 - beta1**t)
    rho_t > 5:  r = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))
                p = p - lr * m_hat * r * sqrt(1 - beta2**t) / (sqrt(v) + eps)
    otherwise:  p = p - lr * m_hat

Example::

    >>> from neural_arch import nn, optim
    >>> opt = optim.RAdam(nn.Linear(4, 2).parameters(), lr=1e-3, weight_decay=0.01, decoupled_weight_decay=True)
    >>> opt.param_groups[0]["betas"]
    (0.9, 0.999)
"""

from __future__ import annotations

import math

from neural_arch import backend as _backend
from neural_arch.optim.optimizer import Optimizer

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """Rectified Adam; updates ``p.data`` in place, one tensor at a time.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.RAdam(model.parameters(), lr=1e-3)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None, maximize: bool = False):
        if lr < 0.0:
            raise ValueError(f"RAdam: invalid learning rate lr={lr}; it must be >= 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"RAdam: betas must be two numbers in [0, 1), got {betas}")
        if eps < 0.0 or weight_decay < 0.0:
            raise ValueError(f"RAdam: eps={eps} and weight_decay={weight_decay} must be >= 0")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "decoupled_weight_decay": bool(decoupled_weight_decay), "foreach": foreach,
                                  "maximize": bool(maximize)})

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            rho_inf = 2 / (1 - beta2) - 1
            for p, g in self._params_with_grad(group):
                d = p.data
                xp = _backend.get_array_module(d)
                if group["maximize"]:
                    g = -g  # a new array: never modify the caller's gradient
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = xp.zeros_like(d)
                    state["exp_avg_sq"] = xp.zeros_like(d)
                state["step"] += 1
                t = state["step"]
                if wd != 0:
                    if group["decoupled_weight_decay"]:
                        d *= 1 - lr * wd
                    else:
                        g = g + wd * d
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m *= beta1
                m += (1 - beta1) * g
                v *= beta2
                v += (1 - beta2) * (g * g)
                bias2 = 1 - beta2**t
                m_hat = m / (1 - beta1**t)
                rho_t = rho_inf - 2 * t * beta2**t / bias2
                if rho_t > 5:
                    rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                    denom = xp.sqrt(v)
                    denom += eps
                    d -= (lr * rect * math.sqrt(bias2)) * (m_hat / denom)
                else:
                    d -= lr * m_hat
        return loss
