"""Functional, differentiable ops (``import neural_arch.nn.functional as F``).

All of these take and return :class:`~neural_arch.core.tensor.Tensor` and record gradients.
Weight layout follows torch: ``linear(x, weight)`` with ``weight`` (out_features, in_features).

Example::

    >>> import numpy as np
    >>> import neural_arch.nn.functional as F
    >>> from neural_arch import Tensor
    >>> x = Tensor(np.array([[1.0, -2.0]], dtype=np.float32), requires_grad=True)
    >>> y = F.softmax(F.relu(x), axis=-1)
    >>> y.shape
    (1, 2)
    >>> img = Tensor(np.ones((1, 3, 8, 8), dtype=np.float32))
    >>> F.max_pool2d(F.conv2d(img, Tensor(np.ones((4, 3, 3, 3), dtype=np.float32)), padding=1), 2).shape
    (1, 4, 4, 4)
"""

from neural_arch.core.ops_basic import (  # noqa: F401
    add,
    amax,
    amin,
    argmax,
    argmin,
    div,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mul,
    pow,
    std,
    sub,
    sum,
    var,
)
from neural_arch.core.ops_conv import (
    adaptive_avg_pool2d,
    avg_pool2d,
    conv2d,
    dropout2d,
    max_pool2d,
    pad,
)
from neural_arch.core.ops_norm import batch_norm
from neural_arch.core.ops_shape import (  # noqa: F401
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
from neural_arch.core.ops_nn import (  # noqa: F401
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
    "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "pad", "dropout2d", "batch_norm",
    "amax", "amin", "argmax", "argmin", "maximum", "minimum", "std",
]

# ---- attention (issue 31): blockwise, online-softmax scaled dot-product attention ----------------
from neural_arch.core.ops_attention import scaled_dot_product_attention

__all__ += ["scaled_dot_product_attention"]
