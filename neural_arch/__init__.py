"""neural_arch: a from-scratch deep-learning framework on NumPy/CuPy, built for distributed training.

Importing ``neural_arch`` loads the core (Tensor, autograd, ops, creation functions, dtypes and
``save``/``load``) only; ``nn``, ``optim``, ``data`` and ``functional`` load on first attribute
access, and ``neural_arch.distributed`` (and CuPy) only when you import them yourself.

The names follow PyTorch, so a torch script ports by changing its imports
(``import neural_arch as torch``-style): ``randn``, ``zeros``, ``tensor``, ``cat``, ``float32``,
``no_grad``, ``save``/``load``, ``nn.Conv2d``, ``nn.BatchNorm2d``, ``nn.utils.clip_grad_norm_``...

Example::

    >>> import neural_arch as na
    >>> na.manual_seed(0)
    >>> x = na.tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 4.0]
    >>> na.cat([na.zeros(2), na.ones(1)]).tolist(), na.tensor([1, 2]).dtype == na.int64
    ([0.0, 0.0, 1.0], True)
"""

from __future__ import annotations

import importlib

from . import config as _config
from .blas_idle import sleep_idle_blas_threads as _sleep_idle_blas_threads

if _config.get("NEURAL_ARCH_BLAS_IDLE_SLEEP"):
    # before NumPy loads OpenBLAS where we can: its idle threads then sleep instead of holding a core
    _sleep_idle_blas_threads()

import numpy as _np  # noqa: E402 - after the BLAS setting above

from .allocator import tune_malloc as _tune_malloc  # noqa: E402

if _config.get("NEURAL_ARCH_MALLOC_TUNE"):
    _tune_malloc()   # a step's temporaries stay in the heap instead of being page-faulted in again every step

from .core.autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .core.dtypes import (  # noqa: F401  (torch's dtype names; `float`, `bool`... shadow builtins here only)
    bool,
    cdouble,
    cfloat,
    complex64,
    complex128,
    double,
    float,
    float16,
    float32,
    float64,
    half,
    int,
    int8,
    int16,
    int32,
    int64,
    long,
    short,
    uint8,
)
from .core.factory import (
    arange,
    device,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    is_tensor,
    linspace,
    multinomial,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
    zeros,
    zeros_like,
)
from .core.generator import Generator
from .core.ops_activation import masked_fill
from .core.ops_basic import remainder
from .core.ops_reduce import cumsum, logsumexp, norm, prod, return_types
from .core.ops_shape import cat, concatenate, gather, index_select, scatter_add, stack, tril, triu
from .core.rng import get_generator, manual_seed
from .core.tensor import Tensor, tensor
from .serialization import load, save

dtype = _np.dtype  # `isinstance(x, neural_arch.dtype)`, like torch.dtype

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Tensor",
    "tensor",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "inference_mode",
    "manual_seed",
    "get_generator",
    "Generator",
    "zeros", "ones", "empty", "full", "arange", "linspace", "eye", "randn", "rand", "randint",
    "randperm", "zeros_like", "ones_like", "empty_like", "full_like", "randn_like", "rand_like",
    "randint_like", "from_numpy", "is_tensor", "device", "cat", "concatenate", "stack",
    "save", "load", "return_types", "dtype", "multinomial", "remainder", "masked_fill", "tril", "triu",
    "logsumexp", "prod", "cumsum", "norm", "gather", "scatter_add", "index_select",
    "nn",
    "optim",
    "data",
    "amp",
    "autocast",
    "backend",
]
# The dtype objects (float32, long, bool, ...) are importable by name but left out of __all__ so
# that `from neural_arch import *` does not shadow Python's float/int/bool.

# Lazily imported subpackages. `distributed` is deliberately absent: it must be imported
# explicitly (`import neural_arch.distributed as dist`), never as a side effect.
_LAZY = {"nn", "optim", "data", "backend", "cuda", "amp", "profiler", "linalg"}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name == "autocast":  # torch.autocast(device_type, dtype=...): the class of neural_arch.amp
        from .amp import autocast

        globals()[name] = autocast
        return autocast
    if name == "bfloat16":  # needs ml_dtypes: imported on first use
        from .core import dtypes as _dtypes

        value = _dtypes.bfloat16
        globals()[name] = value
        return value
    raise AttributeError(f"module 'neural_arch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY | {"autocast", "bfloat16"})
