"""ASGD, averaged stochastic gradient descent (Polyak & Juditsky 1992), with torch's options ``lambd``,
``alpha``, ``t0``, ``weight_decay`` and ``maximize``.

For step ``t`` with gradient ``g``, where ``eta`` and ``mu`` are the values the previous step left
(``eta = lr`` and ``mu = 1`` before the first) -- torch.optim.ASGD's algorithm::

    g = -g if maximize;  g = g + weight_decay * p
    p = p * (1 - lambd * eta) - eta * g
    ax = ax + mu * (p - ax)            (ax = p while mu == 1)
    eta = lr / (1 + lambd * lr * t) ** alpha
    mu = 1 / max(1, t - t0)

The average ``ax`` is kept in the state (``optimizer.state[p]["ax"]``); the parameters themselves
follow plain SGD with a decaying step, as in torch.

Precision: ``step``, ``eta`` and ``mu`` are Python numbers in float64. torch keeps them as 0-d tensors of
its default scalar dtype, float32 unless ``torch.set_default_dtype(torch.float64)``; against torch with
float64 as the default dtype the results agree to rounding.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.optim.asgd import ASGD
    >>> w = nn.Parameter(np.array([1.0]))
    >>> opt = ASGD([w], lr=0.5, lambd=0.0, t0=0)
    >>> for _ in range(3):
    ...     w.grad = Tensor(np.array([1.0])); opt.step()
    >>> w.data.tolist(), opt.state[w]["ax"].tolist()   # the mean of the iterates 0.0 and -0.5
    ([-0.5], [-0.25])
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.optim.optimizer import Optimizer, refuse_unsupported_flags

__all__ = ["ASGD"]


class ASGD(Optimizer):
    """Averaged SGD; updates ``p.data`` in place, one tensor at a time (``eta`` and ``mu`` are per
    parameter, so a learning-rate schedule reaches each parameter one step late, exactly as in torch).

    Args:
        params: an iterable of Parameters or of param-group dicts.
        lr: learning rate (default ``1e-2``).
        lambd: decay term (default ``1e-4``).
        alpha: power of the ``eta`` schedule (default ``0.75``).
        t0: the step from which the average starts (default ``1e6``).
        weight_decay: L2 penalty added to the gradient.
        foreach: accepted for torch compatibility; the update is per tensor whatever its value.
        maximize: ascend the objective instead of descending.
        capturable: torch's CUDA-graph flag; only ``False`` is supported (``True`` raises).
        differentiable: torch's autograd-through-the-step flag; only ``False`` is supported.

    State per parameter (torch's names): ``step``, ``eta``, ``mu``, ``ax``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.optim.asgd import ASGD
        >>> model = nn.Linear(3, 2)
        >>> opt = ASGD(model.parameters(), lr=0.1)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[model.weight]), opt.state[model.weight]["step"]
        (['ax', 'eta', 'mu', 'step'], 1)
    """

    def __init__(self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 weight_decay: float = 0, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False):
        if not 0.0 <= lr:
            raise ValueError(f"ASGD: invalid learning rate lr={lr}; it must be >= 0")
        if not 0.0 <= weight_decay:
            raise ValueError(f"ASGD: invalid weight_decay={weight_decay}; it must be >= 0")
        defaults = {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": bool(maximize), "differentiable": bool(differentiable),
                    "capturable": bool(capturable)}
        refuse_unsupported_flags("ASGD", defaults)
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.core.tensor import Tensor
            >>> from neural_arch.optim.asgd import ASGD
            >>> w = nn.Parameter(np.array([2.0]))
            >>> w.grad = Tensor(np.array([1.0]))
            >>> ASGD([w], lr=0.5, lambd=0.5).step()   # 2 * (1 - 0.5 * 0.5) - 0.5 * 1
            >>> w.data.tolist()
            [1.0]
        """
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            refuse_unsupported_flags("ASGD", group)
            lr, lambd, alpha, t0, wd = group["lr"], group["lambd"], group["alpha"], group["t0"], group["weight_decay"]
            for p, g in self._params_with_grad(group):
                d = p.data
                xp = _backend.get_array_module(d)
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    state["eta"] = float(lr)
                    state["mu"] = 1.0
                    state["ax"] = xp.zeros_like(d)
                # a state loaded from torch holds 0-d tensors (arrays) here: read them as numbers
                t = state["step"] = _number(state["step"]) + 1
                eta, mu = float(state["eta"]), float(state["mu"])
                if d.ndim == 0:  # 0-d arrays: work on 1-element views so in-place ops apply
                    d, g = d.reshape(1), g.reshape(1)
                if group["maximize"]:
                    g = -g  # a new array: never modify the caller's gradient
                if wd != 0:
                    g = g + wd * d
                d *= 1 - lambd * eta
                d -= eta * g
                ax = state["ax"]
                ax = ax.reshape(1) if ax.ndim == 0 else ax
                if mu != 1:
                    ax += mu * (d - ax)
                else:
                    ax[...] = d
                state["eta"] = lr / ((1 + lambd * lr * t) ** alpha)
                state["mu"] = 1 / max(1, t - t0)
        return loss


def _number(value):
    """An int step count from a number or a one-element array (a state converted from torch's tensors)."""
    value = float(value)
    return int(value) if value.is_integer() else value
