"""NAdam (Dozat 2016, "Incorporating Nesterov Momentum into Adam"), torch's update rule with its
momentum-decay schedule ``mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``.

For step ``t`` with gradient ``g`` (torch.optim.NAdam's documented algorithm)::

    g = -g if maximize
    p = p * (1 - lr * weight_decay)  if decoupled_weight_decay  else  g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
    mu_product = mu_1 * ... * mu_t
    m_hat = mu_{t+1} * m / (1 - mu_product * mu_{t+1}) + (1 - mu_t) * g / (1 - mu_product)
    p = p - lr * m_hat / (sqrt(v / (1 - beta2**t)) + eps)

Example::

    >>> from neural_arch import nn, optim
    >>> opt = optim.NAdam(nn.Linear(4, 2).parameters())
    >>> opt.param_groups[0]["lr"], opt.param_groups[0]["momentum_decay"]
    (0.002, 0.004)
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.optim.optimizer import Optimizer

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """Adam with Nesterov momentum; updates ``p.data`` in place, one tensor at a time.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.NAdam(model.parameters(), lr=1e-3)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False):
        if lr < 0.0:
            raise ValueError(f"NAdam: invalid learning rate lr={lr}; it must be >= 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"NAdam: betas must be two numbers in [0, 1), got {betas}")
        for name, value in (("eps", eps), ("weight_decay", weight_decay), ("momentum_decay", momentum_decay)):
            if value < 0.0:
                raise ValueError(f"NAdam: invalid {name}={value}; it must be >= 0")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "momentum_decay": momentum_decay,
                                  "decoupled_weight_decay": bool(decoupled_weight_decay), "foreach": foreach,
                                  "maximize": bool(maximize)})

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            psi = group["momentum_decay"]
            for p, g in self._params_with_grad(group):
                d = p.data
                xp = _backend.get_array_module(d)
                if group["maximize"]:
                    g = -g  # a new array: never modify the caller's gradient
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    state["mu_product"] = 1.0
                    state["exp_avg"] = xp.zeros_like(d)
                    state["exp_avg_sq"] = xp.zeros_like(d)
                state["step"] += 1
                t = state["step"]
                if wd != 0:
                    if group["decoupled_weight_decay"]:
                        d *= 1 - lr * wd
                    else:
                        g = g + wd * d
                mu = beta1 * (1 - 0.5 * 0.96 ** (t * psi))
                mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
                mu_product = state["mu_product"] = float(state["mu_product"]) * mu
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m *= beta1
                m += (1 - beta1) * g
                v *= beta2
                v += (1 - beta2) * (g * g)
                denom = xp.sqrt(v / (1 - beta2**t))
                denom += eps
                d -= (lr * (1 - mu) / (1 - mu_product)) * (g / denom)
                d -= (lr * mu_next / (1 - mu_product * mu_next)) * (m / denom)
        return loss
