"""Gradient clipping by global norm: ``clip_grad_norm_``.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.optim import clip_grad_norm_
    >>> p = nn.Parameter(np.zeros(2))
    >>> p.grad = Tensor(np.array([3.0, 4.0]))
    >>> clip_grad_norm_([p], max_norm=1.0)
    5.0
    >>> np.round(p.grad.data, 3).tolist()
    [0.6, 0.8]
"""

from __future__ import annotations

import math

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad.data for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale all gradients in place so their joint ``norm_type``-norm is at most ``max_norm``.

    Returns the total norm *before* clipping, as a Python float. ``norm_type`` may be ``inf``.
    Scaling uses ``max_norm / (total + 1e-6)`` like torch and only happens when that is below 1.
    """
    grads = _grads(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return 0.0
    if norm_type <= 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    xp = _backend.get_array_module(grads[0])
    if math.isinf(norm_type):
        total = max(float(xp.abs(g).max()) if g.size else 0.0 for g in grads)
    elif norm_type == 2.0:
        # vdot of the flat view: one BLAS pass per gradient, no temporaries.
        total = math.sqrt(sum(float(xp.vdot(g.ravel(), g.ravel())) for g in grads))
    else:
        total = sum(float((xp.abs(g) ** norm_type).sum()) for g in grads) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"clip_grad_norm_: the total gradient norm is {total}; pass error_if_nonfinite=False to "
            "clip anyway, or look for the NaN/inf in the loss"
        )
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g *= coef
    return total


def clip_grad_value_(parameters, clip_value: float) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place."""
    clip_value = float(clip_value)
    for g in _grads(parameters):
        xp = _backend.get_array_module(g)
        xp.clip(g, -clip_value, clip_value, out=g)
