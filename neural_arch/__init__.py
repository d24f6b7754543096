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

# torch's top-level functions (``torch.exp(x)``, ``torch.max(x, 1)``...): each is the core op that the
# Tensor method also is, or a thin wrapper where torch's function signature differs from the method's.
# Names that shadow Python builtins (abs, all, any, max, min, pow, round, sum) are importable by name
# but left out of __all__, as the dtype names are.
from .core.ops_activation import _round as round  # noqa: F401
from .core.ops_activation import (
    abs,  # noqa: F401
    acos,
    asin,
    atan,
    atan2,
    ceil,
    clamp,
    clip,
    cos,
    cosh,
    erf,
    exp,
    expm1,
    floor,
    frac,
    log,
    log1p,
    log2,
    log10,
    log_softmax,
    masked_fill,
    nan_to_num,
    reciprocal,
    relu,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sinh,
    softmax,
    sqrt,
    tan,
    tanh,
    trunc,
    where,
)
from .core.ops_basic import (
    allclose,
    bmm,
    einsum,
    isclose,
    lerp,
    matmul,
    neg,
    outer,
    remainder,
)
from .core.ops_basic import torch_add as add
from .core.ops_basic import torch_div as div
from .core.ops_basic import torch_mul as mul
from .core.ops_basic import torch_pow as pow  # noqa: F401
from .core.ops_basic import torch_sub as sub
from .core.ops_reduce import _all as all  # noqa: F401
from .core.ops_reduce import _any as any  # noqa: F401
from .core.ops_reduce import (
    amax,
    amin,
    argmax,
    argmin,
    argsort,
    count_nonzero,
    cumprod,
    cumsum,
    logsumexp,
    max,  # noqa: F401
    maximum,
    mean,
    min,  # noqa: F401
    minimum,
    nonzero,
    norm,
    prod,
    return_types,
    sort,
    std,
    sum,  # noqa: F401
    topk,
    var,
)
from .core.ops_shape import (
    broadcast_to,
    cat,
    chunk,
    clone,
    concatenate,
    diag,
    diagonal,
    flatten,
    flip,
    gather,
    index_select,
    masked_select,
    movedim,
    narrow,
    permute,
    repeat_interleave,
    reshape,
    roll,
    scatter_add,
    split,
    squeeze,
    stack,
    swapaxes,
    swapdims,
    tile,
    tril,
    triu,
    unbind,
    unsqueeze,
)
from .core.ops_shape import movedim as moveaxis
from .core.ops_shape import swapdims as transpose
from .core.rng import get_generator, manual_seed
from .core.tensor import Tensor, tensor
from .core.tensor_methods import (
    addcdiv,
    addcmul,
    addmm,
    addmv,
    baddbmm,
    bernoulli,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    clamp_max,
    clamp_min,
    cross,
    dot,
    fliplr,
    flipud,
    floor_divide,
    fmod,
    hypot,
    index_add,
    index_copy,
    index_fill,
    isfinite,
    isinf,
    isnan,
    kron,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    median,
    mm,
    mv,
    nanmean,
    nanmedian,
    nansum,
    positive,
    rsub,
    scatter,
    select,
    square,
    std_mean,
    t,
    tensor_split,
    trace,
    true_divide,
    unflatten,
    var_mean,
)
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
    # torch's top-level math, reductions and shape functions (builtin-shadowing names left out)
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "softmax", "log_softmax", "where", "clamp", "clip",
    "sin", "cos", "erf", "expm1", "log1p", "log2", "floor", "ceil", "sign", "atan2", "nan_to_num",
    "add", "sub", "mul", "div", "neg", "matmul", "einsum", "bmm", "outer", "lerp", "isclose", "allclose",
    "mean", "amax", "amin", "argmax", "argmin", "maximum", "minimum", "var", "std", "sort", "argsort",
    "topk", "cumprod", "count_nonzero", "nonzero",
    "reshape", "transpose", "swapaxes", "swapdims", "permute", "squeeze", "unsqueeze", "flatten", "split",
    "chunk", "clone", "broadcast_to", "flip", "roll", "unbind", "narrow", "movedim", "moveaxis", "tile",
    "diagonal", "diag", "repeat_interleave", "masked_select",
    # the function forms of torch's Tensor methods (core/tensor_methods.py) and more unary math
    "acos", "addcdiv", "addcmul", "addmm", "addmv", "asin", "atan", "baddbmm", "bernoulli", "bitwise_and",
    "bitwise_not", "bitwise_or", "bitwise_xor", "clamp_max", "clamp_min", "cosh", "cross", "dot", "fliplr", "flipud",
    "floor_divide", "fmod", "frac", "hypot", "index_add", "index_copy", "index_fill", "isfinite", "isinf", "isnan",
    "kron", "log10", "logical_and", "logical_not", "logical_or", "logical_xor", "median", "mm", "mv", "nanmean",
    "nanmedian", "nansum", "positive", "reciprocal", "rsqrt", "rsub", "scatter", "select", "sinh", "square",
    "std_mean", "t", "tan", "tensor_split", "trace", "true_divide", "trunc", "unflatten", "var_mean",
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
_LAZY = {"nn", "optim", "data", "backend", "cuda", "amp", "profiler", "linalg", "autograd"}


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
