"""LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"): SGD whose step for
each tensor is scaled by a local rate ``trust_coefficient * ||p|| / (||g|| + weight_decay * ||p||)``.

For each parameter tensor ``p`` with gradient ``g`` (PyTorch has no LARS; this is the paper's
algorithm with the learning rate outside the momentum buffer, as in torchlars and timm)::

    local = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)  (1 if a norm is 0,
                                                                              or trust_coefficient == 0)
    d = local * (g + weight_decay * p)
    buf = d (first step);  buf = momentum * buf + (1 - dampening) * d (later)   if momentum > 0
    d = d + momentum * buf if nesterov else buf
    p = p - lr * d

Set ``trust_coefficient=0`` in a param group to train it with plain SGD (biases and norms are
often excluded from the adaptation).

Example::

    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.LARS([{"params": [model.weight]},
    ...                   {"params": [model.bias], "trust_coefficient": 0.0}], lr=0.1, momentum=0.9)
    >>> [g["trust_coefficient"] for g in opt.param_groups]
    [0.001, 0.0]
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer, required

__all__ = ["LARS"]


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling; ``lr`` is required.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.LARS(model.parameters(), lr=0.1, momentum=0.9)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr=required, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, trust_coefficient: float = 1e-3,
                 eps: float = 1e-8, foreach: bool | None = None):
        if lr is not required and lr < 0.0:
            raise ValueError(f"LARS: invalid learning rate lr={lr}; it must be >= 0")
        for name, value in (("momentum", momentum), ("weight_decay", weight_decay),
                            ("trust_coefficient", trust_coefficient), ("eps", eps)):
            if value < 0.0:
                raise ValueError(f"LARS: invalid {name}={value}; it must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("LARS: nesterov=True needs momentum > 0 and dampening = 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov,
                                  "trust_coefficient": trust_coefficient, "eps": eps, "foreach": foreach})

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        wd, tc, momentum = group["weight_decay"], group["trust_coefficient"], group["momentum"]
        if tc != 0:
            w_norm, g_norm = seg.norms(d), seg.norms(g)
            den = g_norm + wd * w_norm + group["eps"]
            ratio = tc * w_norm / (den + (den == 0))  # den == 0 only where the ratio is not used
            local = xp.where((w_norm > 0) & (g_norm > 0), ratio, 1.0)
        g = g + wd * d if wd != 0 else g.copy()
        if tc != 0:
            g *= local
        if momentum != 0:
            buf = st["momentum_buffer"]
            if step == 1:
                buf[...] = g
            else:
                buf *= momentum
                buf += (1 - group["dampening"]) * g
            g = g + momentum * buf if group["nesterov"] else buf
        d -= group["lr"] * g

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            names = ["momentum_buffer"] if group["momentum"] != 0 else []

            def init(state, data, names=names):
                state["step"] = 0
                for name in names:
                    state[name] = np.zeros_like(data)

            run_group(self, gi, group, names, init, self._update)
        return loss
