"""The core: ``Tensor``, the autograd engine, and the differentiable ops.

Example::

    >>> from neural_arch.core import Tensor, no_grad
    >>> x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> (x ** 2).mean().backward()
    >>> [round(v, 4) for v in x.grad.tolist()]
    [0.6667, 1.3333, 2.0]
"""

# tensor first: it binds the ops as methods, and the op modules import Tensor from it.
from .tensor import Tensor  # noqa: I001  (the module stays `core.tensor`; the function is neural_arch.tensor)
from .autograd import (
    RemovableHandle,
    enable_grad,
    is_backward_running,
    is_grad_enabled,
    no_grad,
    queue_callback,
    set_grad_enabled,
)
from .ops_basic import (
    add, allclose, bmm, div, einsum, isclose, lerp, matmul, mul, neg, outer, pow, remainder, sub,
)
from .ops_reduce import (
    amax, amin, argmax, argmin, argsort, count_nonzero, cumprod, max, maximum, mean, min, minimum, nonzero,
    return_types, sort, std, sum, topk, var,
)
from .op_utils import unbroadcast
from .ops_shape import (
    broadcast_to,
    cat,
    chunk,
    clone,
    concatenate,
    diag,
    diagonal,
    flatten,
    flip,
    getitem,
    masked_select,
    movedim,
    narrow,
    permute,
    repeat_interleave,
    reshape,
    roll,
    split,
    squeeze,
    stack,
    swapdims,
    tile,
    transpose,
    tril,
    triu,
    unbind,
    unsqueeze,
    view,
)
from .ops_nn import dropout, embedding, layer_norm, linear
from .ops_activation import (
    abs, atan2, ceil, clamp, clip, cos, erf, exp, expm1, floor, gelu, leaky_relu, log, log1p, log2, log_softmax,
    masked_fill, nan_to_num, relu, sigmoid, sign, silu, sin, softmax, sqrt, tanh, where,
)
from .ops_loss import cross_entropy, mse_loss, nll_loss
from .ops_conv import adaptive_avg_pool2d, avg_pool2d, conv2d, dropout2d, max_pool2d, pad
from .ops_norm import (
    batch_norm,
    batch_norm_elemt,
    batch_norm_gather_stats,
    batch_norm_stats,
    update_running_stats,
)
from .factory import multinomial
from .generator import Generator
from .rng import get_generator, manual_seed

__all__ = [
    "Tensor", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled",
    "queue_callback", "is_backward_running", "RemovableHandle", "manual_seed", "get_generator",
    "add", "sub", "mul", "div", "pow", "neg", "matmul", "sum", "mean", "max", "min", "var",
    "reshape", "transpose", "permute", "squeeze", "unsqueeze", "flatten", "broadcast_to",
    "getitem", "cat", "concatenate", "stack", "split", "chunk", "unbroadcast",
    "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "leaky_relu", "silu", "gelu",
    "softmax", "log_softmax", "where", "clip", "clamp", "dropout", "embedding", "layer_norm",
    "cross_entropy", "nll_loss", "mse_loss", "linear",
    "amax", "amin", "argmax", "argmin", "maximum", "minimum", "std", "return_types", "clone", "view",
    "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "pad", "dropout2d", "batch_norm",
    "batch_norm_stats", "batch_norm_gather_stats", "batch_norm_elemt", "update_running_stats",
    "Generator", "remainder", "masked_fill", "tril", "triu", "multinomial",
    "sin", "cos", "erf", "expm1", "log1p", "log2", "floor", "ceil", "sign", "atan2", "nan_to_num",
    "einsum", "bmm", "outer", "lerp", "isclose", "allclose", "sort", "argsort", "topk", "cumprod",
    "count_nonzero", "nonzero", "flip", "roll", "unbind", "narrow", "movedim", "tile", "diagonal", "diag",
    "repeat_interleave", "masked_select", "swapdims",
]
