"""Adamax (Kingma & Ba 2015, section 7.1): Adam with the infinity norm in place of the second moment,
torch's options ``weight_decay`` and ``maximize``; multi-tensor (``foreach``) by default for small tensors.

For step ``t`` (torch.optim.Adamax's documented algorithm)::

    g = -g if maximize;  g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    u = max(beta2 * u, |g| + eps)
    p = p - lr / (1 - beta1**t) * m / u

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.optim.adamax import Adamax
    >>> w = nn.Parameter(np.array([1.0]))
    >>> w.grad = Tensor(np.array([2.0]))
    >>> Adamax([w], lr=0.5, eps=0.0).step()
    >>> w.data.tolist()
    [0.5]
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer, refuse_unsupported_flags

__all__ = ["Adamax"]


def _lerp_(m, g, weight) -> None:
    """``m += weight * (g - m)`` in place, rounded the way torch's ``lerp_`` rounds (it switches to
    ``g - (g - m) * (1 - weight)`` for weights of one half or more)."""
    if weight < 0.5:
        m += weight * (g - m)
    else:
        m[...] = g - (g - m) * (1 - weight)


class Adamax(Optimizer):
    """Adamax; ``foreach=None`` updates a group's small host tensors in a few flat NumPy calls.

    Args:
        params: an iterable of Parameters or of param-group dicts.
        lr: learning rate (default ``2e-3``).
        betas: ``(beta1, beta2)``, decay of the first moment and of the infinity norm.
        eps: added to ``|g|`` before the maximum (default ``1e-8``).
        weight_decay: L2 penalty added to the gradient.
        foreach: ``None`` (flat updates for small host tensors), ``True`` (all) or ``False`` (none).
        maximize: ascend the objective instead of descending.
        capturable: torch's CUDA-graph flag; only ``False`` is supported (``True`` raises).
        differentiable: torch's autograd-through-the-step flag; only ``False`` is supported.

    State per parameter (torch's names): ``step``, ``exp_avg``, ``exp_inf``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.optim.adamax import Adamax
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = Adamax(model.parameters(), lr=1e-3)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), sorted(opt.state[model.weight])
        (True, ['exp_avg', 'exp_inf', 'step'])
    """

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 foreach: bool | None = None, *, maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False):
        if not 0.0 <= lr:
            raise ValueError(f"Adamax: invalid learning rate lr={lr}; it must be >= 0")
        if not 0.0 <= eps:
            raise ValueError(f"Adamax: invalid epsilon value eps={eps}; it must be >= 0")
        for i in (0, 1):
            if not 0.0 <= betas[i] < 1.0:
                raise ValueError(f"Adamax: invalid beta parameter at index {i}: {betas[i]}; it must be in [0, 1)")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Adamax: invalid weight_decay={weight_decay}; it must be >= 0")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "foreach": foreach,
                    "maximize": bool(maximize), "differentiable": bool(differentiable),
                    "capturable": bool(capturable)}
        refuse_unsupported_flags("Adamax", defaults)
        super().__init__(params, defaults)

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        beta1, beta2 = group["betas"]
        if group["maximize"]:
            g = -g  # a new array: never modify the caller's gradient
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * d
        _lerp_(st["exp_avg"], g, 1 - beta1)
        u = st["exp_inf"]
        u *= beta2
        xp.maximum(u, xp.abs(g) + group["eps"], out=u)
        d -= (group["lr"] / (1 - beta1 ** step)) * (st["exp_avg"] / u)


    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.core.tensor import Tensor
            >>> from neural_arch.optim.adamax import Adamax
            >>> w = nn.Parameter(np.array([1.0, 1.0]))
            >>> w.grad = Tensor(np.array([1.0, -1.0]))
            >>> Adamax([w], lr=0.1, eps=0.0).step()
            >>> w.data.tolist()
            [0.9, 1.1]
        """
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            refuse_unsupported_flags("Adamax", group)

            def init(state, data):
                xp = _backend.get_array_module(data)
                state["step"] = 0
                state["exp_avg"] = xp.zeros_like(data)
                state["exp_inf"] = xp.zeros_like(data)

            run_group(self, gi, group, ["exp_avg", "exp_inf"], init, self._update)
        return loss
