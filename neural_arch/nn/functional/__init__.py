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

from neural_arch.core.ops_activation import (
    abs,
    clamp,
    clip,
    exp,
    gelu,
    leaky_relu,
    log,
    log_softmax,
    relu,
    sigmoid,
    silu,
    softmax,
    softplus,
    sqrt,
    tanh,
    where,
)
from neural_arch.core.ops_basic import add, div, matmul, mul, pow, sub  # noqa: F401
from neural_arch.core.ops_conv import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    avg_pool1d,
    avg_pool2d,
    conv1d,
    conv2d,
    conv_transpose1d,
    conv_transpose2d,
    dropout2d,
    max_pool1d,
    max_pool2d,
    pad,
)
from neural_arch.core.ops_loss import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from neural_arch.core.ops_nn import dropout, embedding, group_norm, layer_norm, linear, rms_norm  # noqa: F401
from neural_arch.core.ops_norm import batch_norm
from neural_arch.core.ops_reduce import (
    amax,
    amin,
    argmax,
    argmin,
    max,
    maximum,
    mean,
    min,
    minimum,
    std,
    sum,
    var,
)
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

__all__ = [
    "linear", "relu", "gelu", "tanh", "sigmoid", "silu", "leaky_relu", "softmax", "log_softmax",
    "dropout", "embedding", "layer_norm", "cross_entropy", "nll_loss", "mse_loss", "where", "clip",
    "clamp", "cat", "concatenate", "stack", "split", "chunk", "exp", "log", "sqrt", "abs",
    "matmul", "sum", "mean", "max", "min", "var", "add", "sub", "mul", "div", "pow", "reshape",
    "transpose", "permute", "squeeze", "unsqueeze", "flatten", "broadcast_to",
    "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "pad", "dropout2d", "batch_norm",
    "amax", "amin", "argmax", "argmin", "maximum", "minimum", "std",
    "softplus", "rms_norm", "group_norm",
    "conv1d", "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
    "conv_transpose1d", "conv_transpose2d",
]

# ---- attention (issue 31): blockwise, online-softmax scaled dot-product attention ----------------
from neural_arch.core.ops_attention import scaled_dot_product_attention

__all__ += ["scaled_dot_product_attention"]

# ---- torch parity (issue h6): activations, distances, encodings, random regularisers, norms, losses ------
from neural_arch.nn.functional.activations import (
    celu,
    elu,
    glu,
    hardsigmoid,
    hardswish,
    hardtanh,
    logsigmoid,
    mish,
    prelu,
    relu6,
    selu,
    softmin,
    softsign,
    tanhshrink,
    threshold,
)
from neural_arch.nn.functional.bilinear_form import bilinear
from neural_arch.nn.functional.distances import cosine_similarity, normalize, pairwise_distance
from neural_arch.nn.functional.encodings import one_hot
from neural_arch.nn.functional.losses import (
    cosine_embedding_loss,
    gaussian_nll_loss,
    hinge_embedding_loss,
    margin_ranking_loss,
    multilabel_soft_margin_loss,
    poisson_nll_loss,
    soft_margin_loss,
    triplet_margin_loss,
)
from neural_arch.nn.functional.norms import instance_norm, local_response_norm
from neural_arch.nn.functional.stochastic import alpha_dropout, dropout1d, gumbel_softmax

__all__ += [
    "elu", "selu", "celu", "mish", "hardswish", "hardsigmoid", "hardtanh", "relu6", "logsigmoid", "softsign",
    "tanhshrink", "threshold", "glu", "prelu", "softmin", "one_hot", "normalize", "cosine_similarity",
    "pairwise_distance", "dropout1d", "alpha_dropout", "gumbel_softmax", "instance_norm", "local_response_norm",
    "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "cosine_embedding_loss",
    "triplet_margin_loss", "poisson_nll_loss", "gaussian_nll_loss", "multilabel_soft_margin_loss", "bilinear",
]

from neural_arch.nn.functional.resampling import interpolate

__all__ += ["interpolate"]
