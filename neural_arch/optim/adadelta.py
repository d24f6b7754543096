"""Adadelta (Zeiler 2012, "An Adaptive Learning Rate Method") with torch's options ``lr``, ``rho``,
``eps``, ``weight_decay`` and ``maximize``; multi-tensor (``foreach``) by default for small tensors.

For each parameter ``p`` with gradient ``g`` (torch.optim.Adadelta's documented algorithm)::

    g = -g if maximize;  g = g + weight_decay * p
    v = rho * v + (1 - rho) * g * g
    delta = sqrt(u + eps) / sqrt(v + eps) * g
    u = rho * u + (1 - rho) * delta * delta
    p = p - lr * delta

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.optim.adadelta import Adadelta
    >>> w = nn.Parameter(np.array([1.0]))
    >>> w.grad = Tensor(np.array([2.0]))
    >>> Adadelta([w], rho=0.0, eps=1.0).step()   # delta = sqrt(0 + 1) / sqrt(4 + 1) * 2
    >>> round(w.item(), 6)
    0.105573
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer, refuse_unsupported_flags

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Adadelta; ``foreach=None`` updates a group's small host tensors in a few flat NumPy calls.

    Args:
        params: an iterable of Parameters or of param-group dicts.
        lr: scales the computed delta (default ``1.0``).
        rho: decay of the running averages of ``g * g`` and ``delta * delta`` (default ``0.9``).
        eps: added inside both square roots (default ``1e-6``).
        weight_decay: L2 penalty added to the gradient.
        foreach: ``None`` (flat updates for small host tensors), ``True`` (all) or ``False`` (none).
        capturable: torch's CUDA-graph flag; only ``False`` is supported (``True`` raises).
        differentiable: torch's autograd-through-the-step flag; only ``False`` is supported.
        maximize: ascend the objective instead of descending.

    State per parameter (torch's names): ``step``, ``square_avg``, ``acc_delta``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.optim.adadelta import Adadelta
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = Adadelta(model.parameters())
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), sorted(opt.state[model.weight])
        (True, ['acc_delta', 'square_avg', 'step'])
    """

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
                 foreach: bool | None = None, *, capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False):
        if not 0.0 <= lr:
            raise ValueError(f"Adadelta: invalid learning rate lr={lr}; it must be >= 0")
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Adadelta: invalid rho value rho={rho}; it must be in [0, 1]")
        if not 0.0 <= eps:
            raise ValueError(f"Adadelta: invalid epsilon value eps={eps}; it must be >= 0")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Adadelta: invalid weight_decay={weight_decay}; it must be >= 0")
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "foreach": foreach,
                    "capturable": bool(capturable), "maximize": bool(maximize),
                    "differentiable": bool(differentiable)}
        refuse_unsupported_flags("Adadelta", defaults)
        super().__init__(params, defaults)

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        rho, eps = group["rho"], group["eps"]
        if group["maximize"]:
            g = -g  # a new array: never modify the caller's gradient
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * d
        v, u = st["square_avg"], st["acc_delta"]
        v *= rho
        v += (1 - rho) * (g * g)
        delta = xp.sqrt(u + eps)
        delta /= xp.sqrt(v + eps)
        delta *= g
        u *= rho
        u += (1 - rho) * (delta * delta)
        d -= group["lr"] * delta


    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.core.tensor import Tensor
            >>> from neural_arch.optim.adadelta import Adadelta
            >>> w = nn.Parameter(np.array([0.0]))
            >>> w.grad = Tensor(np.array([3.0]))
            >>> Adadelta([w], lr=2.0, rho=0.0, eps=16.0).step()   # 2 * sqrt(16) / sqrt(9 + 16) * 3
            >>> round(-w.item(), 12)
            4.8
        """
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            refuse_unsupported_flags("Adadelta", group)

            def init(state, data):
                xp = _backend.get_array_module(data)
                state["step"] = 0
                state["square_avg"] = xp.zeros_like(data)
                state["acc_delta"] = xp.zeros_like(data)

            run_group(self, gi, group, ["square_avg", "acc_delta"], init, self._update)
        return loss
