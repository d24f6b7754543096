"""Seed 002's names for activation checkpointing (thin wrappers over :mod:`neural_arch.utils.checkpoint`).

``checkpoint_scope(model=None, check_fn=None)``: inside the ``with`` block, the selected
submodules of ``model`` run under :func:`~neural_arch.utils.checkpoint.checkpoint` (default
selection: modules named like blocks, i.e. every element of a ``ModuleList``, else every direct
child). Without a model the scope only sets :func:`is_checkpointing_enabled`, which modules
wrapped with ``checkpoint_wrapper(m, only_if=is_checkpointing_enabled)`` consult. Backward must
run inside the scope too (as in seed 002's example), or after it: wrapped modules keep their
checkpointed outputs either way.

Example (seed 002)::

    from neural_arch.optimization import gradient_checkpointing, memory_pool_scope
    with gradient_checkpointing.checkpoint_scope(model):
        with memory_pool_scope():
            loss = criterion(ddp_model(batch), targets)
            loss.backward()
"""

from __future__ import annotations

import contextlib

from neural_arch.utils.checkpoint import (
    apply_activation_checkpointing,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
)

__all__ = [
    "apply_activation_checkpointing",
    "checkpoint",
    "checkpoint_scope",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "is_checkpointing_enabled",
]

_depth = 0


def is_checkpointing_enabled() -> bool:
    """True inside a :func:`checkpoint_scope`.

    Example::

        >>> from neural_arch.optimization.gradient_checkpointing import checkpoint_scope, is_checkpointing_enabled
        >>> with checkpoint_scope():
        ...     is_checkpointing_enabled()
        True
        >>> is_checkpointing_enabled()
        False
    """
    return _depth > 0


def _default_targets(model):
    from neural_arch.nn.container import ModuleList

    lists = [m for _, m in model.named_modules() if isinstance(m, ModuleList)]
    if lists:
        return [child for ml in lists for child in ml.children()]
    return list(model.children())


@contextlib.contextmanager
def checkpoint_scope(model=None, check_fn=None):
    """Checkpoint ``model``'s blocks while the scope is open (see the module docstring).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.optimization.gradient_checkpointing import checkpoint_scope
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> with checkpoint_scope(model):
        ...     model(na.ones(2, 4)).sum().backward()
        >>> model[0].weight.grad.shape
        (4, 4)
    """
    global _depth
    wrapped = []
    if model is not None:
        targets = ([m for _, m in model.named_modules() if m is not model and check_fn(m)]
                   if check_fn is not None else _default_targets(model))
        for m in targets:
            if "_checkpoint_wrapper" not in m.__dict__:
                checkpoint_wrapper(m)
                wrapped.append(m)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for m in wrapped:
            m.__dict__["_checkpoint_wrapper"].unwrap()
