"""``nn.utils``: torch's home of the gradient-clipping helpers and of ``parameters_to_vector`` /
``vector_to_parameters`` (:mod:`.convert_parameters`).

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

from neural_arch.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters"]

_FROM_OPTIM = ("clip_grad_norm_", "clip_grad_value_")


def __getattr__(name: str):
    if name in _FROM_OPTIM:
        from neural_arch.optim import clip  # lazy: nn must not load optim eagerly

        value = getattr(clip, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
