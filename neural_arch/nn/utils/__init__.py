"""``nn.utils``: torch's home of the gradient-clipping helpers.

``clip_grad_norm_`` and ``clip_grad_value_`` are re-exported from :mod:`neural_arch.optim.clip`
(imported on first use, so ``import neural_arch.nn`` does not load the optimizers).

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> p = nn.Parameter(na.zeros(2))
    >>> p.grad = na.tensor([3.0, 4.0])
    >>> nn.utils.clip_grad_norm_([p], max_norm=1.0)
    5.0
    >>> nn.utils.clip_grad_value_([p], 0.5); p.grad.tolist()
    [0.5, 0.5]
"""

from __future__ import annotations

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def __getattr__(name: str):
    if name in __all__:
        from neural_arch.optim import clip  # lazy: nn must not load optim eagerly

        value = getattr(clip, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
