"""neural_arch: a from-scratch deep-learning framework on NumPy/CuPy, built for distributed training.

Importing ``neural_arch`` loads the core (Tensor, autograd, ops) only; ``nn``, ``optim``, ``data``
and ``functional`` load on first attribute access, and ``neural_arch.distributed`` (and CuPy)
only when you import them yourself.

Example::

    >>> import neural_arch as na
    >>> na.manual_seed(0)
    >>> x = na.Tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 4.0]
"""

from __future__ import annotations

import importlib

from .core.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .core.rng import get_generator, manual_seed
from .core.tensor import Tensor, tensor

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Tensor",
    "tensor",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "manual_seed",
    "get_generator",
    "nn",
    "optim",
    "functional",
    "data",
    "backend",
]

# Lazily imported subpackages. `distributed` is deliberately absent: it must be imported
# explicitly (`import neural_arch.distributed as dist`), never as a side effect.
_LAZY = {"nn", "optim", "functional", "data", "backend"}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'neural_arch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY)
