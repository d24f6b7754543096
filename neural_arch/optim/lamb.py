"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"): Adam's direction scaled
per tensor by the trust ratio ``||p|| / ||r + weight_decay * p||``; multi-tensor by default.

For step ``t`` and each parameter tensor ``p`` (PyTorch has no LAMB; this is the paper's
Algorithm 2 with the identity scaling function, as in common implementations)::

    m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
    r = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)     (no correction if bias_correction=False)
    u = r + weight_decay * p
    trust = ||p|| / ||u||   (1 when either norm is 0)
    p = p - lr * trust * u

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.LAMB(model.parameters(), lr=1e-3, weight_decay=0.01)
    >>> opt.param_groups[0]["betas"]
    (0.9, 0.999)
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer

__all__ = ["LAMB"]


def trust_ratio(num, den):
    """``num / den`` where both are > 0, else 1 (scalars or per-element arrays of segment norms)."""
    if np.ndim(num) == 0:
        return num / den if num > 0 and den > 0 else 1.0
    xp = _backend.get_array_module(num)
    return xp.where((num > 0) & (den > 0), num / xp.where(den > 0, den, 1.0), 1.0)


class LAMB(Optimizer):
    """Layer-wise adaptive moments for large-batch training (data parallel with huge global batches).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.LAMB(model.parameters(), lr=1e-3)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, bias_correction: bool = True, foreach: bool | None = None):
        if lr < 0.0:
            raise ValueError(f"LAMB: invalid learning rate lr={lr}; it must be >= 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"LAMB: betas must be two numbers in [0, 1), got {betas}")
        if eps < 0.0 or weight_decay < 0.0:
            raise ValueError(f"LAMB: eps={eps} and weight_decay={weight_decay} must be >= 0")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "bias_correction": bias_correction, "foreach": foreach})

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        (b1, b2), eps, wd = group["betas"], group["eps"], group["weight_decay"]
        m, v = st["exp_avg"], st["exp_avg_sq"]
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        bc1, bc2 = (1 - b1**step, 1 - b2**step) if group["bias_correction"] else (1.0, 1.0)
        u = xp.sqrt(v / bc2)
        u += eps
        xp.divide(m / bc1, u, out=u)
        if wd != 0:
            u += wd * d
        d -= group["lr"] * trust_ratio(seg.norms(d), seg.norms(u)) * u

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            run_group(self, gi, group, ["exp_avg", "exp_avg_sq"], _init_moments, self._update)
        return loss


def _init_moments(state, data):
    state["step"] = 0
    state["exp_avg"] = np.zeros_like(data)
    state["exp_avg_sq"] = np.zeros_like(data)
