"""Functional, differentiable ops (``import neural_arch.functional as F``).

All of these take and return :class:`~neural_arch.core.tensor.Tensor` and record gradients.
Weight layout follows torch: ``linear(x, weight)`` with ``weight`` (out_features, in_features).

Example::

    >>> import numpy as np
    >>> import neural_arch.functional as F
    >>> from neural_arch import Tensor
    >>> x = Tensor(np.array([[1.0, -2.0]], dtype=np.float32), requires_grad=True)
    >>> y = F.softmax(F.relu(x), axis=-1)
    >>> y.shape
    (1, 2)
"""

from .core.ops_basic import (  # noqa: F401
    add,
    div,
    matmul,
    max,
    mean,
    min,
    mul,
    pow,
    sub,
    sum,
    var,
)
from .core.ops_shape import (  # noqa: F401
    broadcast_to,
    cat,
    chunk,
    concatenate,
    flatten,
    permute,
    reshape,
    split,
    squeeze,
    stack,
    transpose,
    unsqueeze,
)
from .core.ops_nn import (  # noqa: F401
    abs,
    clamp,
    clip,
    cross_entropy,
    dropout,
    embedding,
    exp,
    gelu,
    layer_norm,
    leaky_relu,
    linear,
    log,
    log_softmax,
    mse_loss,
    nll_loss,
    relu,
    sigmoid,
    silu,
    softmax,
    sqrt,
    tanh,
    where,
)

__all__ = [
    "linear", "relu", "gelu", "tanh", "sigmoid", "silu", "leaky_relu", "softmax", "log_softmax",
    "dropout", "embedding", "layer_norm", "cross_entropy", "nll_loss", "mse_loss", "where", "clip",
    "clamp", "cat", "concatenate", "stack", "split", "chunk", "exp", "log", "sqrt", "abs",
    "matmul", "sum", "mean", "max", "min", "var", "add", "sub", "mul", "div", "pow", "reshape",
    "transpose", "permute", "squeeze", "unsqueeze", "flatten", "broadcast_to",
]
