"""Rprop (Riedmiller & Braun 1993, resilient backpropagation): every element keeps its own step size,
grown while its gradient keeps its sign and shrunk when the sign flips; only the gradient's sign moves the
parameter. torch's options ``etas``, ``step_sizes`` and ``maximize``; multi-tensor (``foreach``) by default
for small tensors.

For each element with gradient ``g`` and the gradient ``g_prev`` kept from the previous step
(torch.optim.Rprop's algorithm; step sizes start at ``lr``)::

    g = -g if maximize
    factor = etaplus if g * g_prev > 0,  etaminus if g * g_prev < 0,  1 otherwise
    step_size = clamp(step_size * factor, step_size_min, step_size_max)
    g = 0 where the sign flipped (factor == etaminus)
    p = p - sign(g) * step_size;   g_prev = g

Full-batch only, as in torch: with mini-batches the sign of the gradient is noise.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.optim.rprop import Rprop
    >>> w = nn.Parameter(np.array([1.0, 1.0]))
    >>> opt = Rprop([w], lr=0.5)
    >>> for g in ([1.0, 1.0], [1.0, -1.0]):
    ...     w.grad = Tensor(np.array(g)); opt.step()
    >>> w.data.round(12).tolist(), opt.state[w]["step_size"].tolist()
    ([-0.1, 0.5], [0.6, 0.25])
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer, refuse_unsupported_flags

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """Rprop; ``foreach=None`` updates a group's small host tensors in a few flat NumPy calls.

    Args:
        params: an iterable of Parameters or of param-group dicts.
        lr: the initial step size of every element (default ``1e-2``).
        etas: ``(etaminus, etaplus)``, the factors that shrink and grow a step size; ``0 < etaminus < 1 < etaplus``.
        step_sizes: ``(min, max)`` bounds of the step sizes (default ``(1e-6, 50)``).
        capturable: torch's CUDA-graph flag; only ``False`` is supported (``True`` raises).
        differentiable: torch's autograd-through-the-step flag; only ``False`` is supported.
        foreach: ``None`` (flat updates for small host tensors), ``True`` (all) or ``False`` (none).
        maximize: ascend the objective instead of descending.

    State per parameter (torch's names): ``step``, ``prev``, ``step_size``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.optim.rprop import Rprop
        >>> model = nn.Linear(3, 2)
        >>> opt = Rprop(model.parameters(), lr=0.01)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[model.weight]), round(float(opt.state[model.weight]["step_size"].max()), 6)
        (['prev', 'step', 'step_size'], 0.01)
    """

    def __init__(self, params, lr: float = 1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable: bool = False, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False):
        if not 0.0 <= lr:
            raise ValueError(f"Rprop: invalid learning rate lr={lr}; it must be >= 0")
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Rprop: invalid eta values {etas[0]}, {etas[1]}; they must satisfy "
                             "0 < etaminus < 1 < etaplus")
        defaults = {"lr": lr, "etas": tuple(etas), "step_sizes": tuple(step_sizes), "foreach": foreach,
                    "maximize": bool(maximize), "differentiable": bool(differentiable),
                    "capturable": bool(capturable)}
        refuse_unsupported_flags("Rprop", defaults)
        super().__init__(params, defaults)

    @staticmethod
    def _update(d, g, st, step, seg, group):
        xp = _backend.get_array_module(d)  # NumPy, or CuPy on the per-tensor path
        etaminus, etaplus = group["etas"]
        lo, hi = group["step_sizes"]
        if group["maximize"]:
            g = -g
        prev, size = st["prev"], st["step_size"]
        # torch's sequence exactly: factors written over the signs (a NaN product keeps NaN), and the
        # gradient zeroed where the factor equals etaminus
        factor = xp.sign(g * prev)
        factor[factor > 0] = etaplus
        factor[factor < 0] = etaminus
        factor[factor == 0] = 1
        size *= factor
        xp.clip(size, lo, hi, out=size)
        g = xp.where(factor == etaminus, 0, g).astype(d.dtype, copy=False)  # a new array: the caller's stays
        d -= xp.sign(g) * size
        prev[...] = g


    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.core.tensor import Tensor
            >>> from neural_arch.optim.rprop import Rprop
            >>> w = nn.Parameter(np.array([1.0, 1.0]))
            >>> w.grad = Tensor(np.array([3.0, -0.001]))
            >>> Rprop([w], lr=0.25).step()   # only the sign of the gradient counts
            >>> w.data.tolist()
            [0.75, 1.25]
        """
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            refuse_unsupported_flags("Rprop", group)

            def init(state, data, lr=group["lr"]):
                xp = _backend.get_array_module(data)
                state["step"] = 0
                state["prev"] = xp.zeros_like(data)
                state["step_size"] = xp.full_like(data, lr)

            run_group(self, gi, group, ["prev", "step_size"], init, self._update)
        return loss
