"""The device paths of the fused ops: each op's forward and backward arrays, composed from the kernels
of :mod:`~neural_arch.core.device_kernels.catalogue` and the array module's own reductions (row max,
row sum).

The ops call these only for device arrays (``xp`` not NumPy) of float32 or float64 (:func:`applies`);
NumPy arrays keep their CPU paths. Arrays in, arrays out: no ``Tensor`` here, so the optimizers use
the same module as the core's ops.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.device_kernels import ops
    >>> [round(v, 4) for v in ops.softmax(np, np.array([[0.0, 0.0, np.log(2.0)]]), -1).ravel().tolist()]
    [0.25, 0.25, 0.5]
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.device_kernels.catalogue import KERNELS, adam_kernel

__all__ = [
    "KERNEL_DTYPES", "adam_step", "applies", "cross_entropy_backward", "gelu", "layer_norm",
    "layer_norm_backward", "log_softmax", "log_softmax_backward", "softmax", "softmax_backward",
]

#: The dtypes the kernels are written and checked for.
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def applies(*arrays, same_shape: bool = False) -> bool:
    """Whether the kernels take these arrays (``None`` entries ignored): every one an array of one
    dtype, float32 or float64, and with ``same_shape`` one shape.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import applies
        >>> applies(np.ones(2, np.float32), None), applies(np.ones(2, np.float16)), applies(np.ones(2), 1.0)
        (True, False, False)
    """
    present = [a for a in arrays if a is not None]
    if not present:
        return False
    first = present[0]
    for a in present:
        dtype = getattr(a, "dtype", None)
        if dtype is None or isinstance(a, np.generic) or dtype != first.dtype or dtype not in KERNEL_DTYPES:
            return False
        if same_shape and a.shape != first.shape:
            return False
    return True


def gelu(xp, x, approximate: str, need_grad: bool):
    """``(gelu(x), gelu'(x) or None)``, ``approximate`` ``"none"`` (erf) or ``"tanh"``: one kernel.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import gelu
        >>> y, dy = gelu(np, np.array([1.0]), "none", True)
        >>> round(float(y[0]), 6), round(float(dy[0]), 6)
        (0.841345, 1.083315)
    """
    form = "gelu_erf" if approximate == "none" else "gelu_tanh"
    if need_grad:
        return KERNELS[form + "_grad"](xp, x)
    return KERNELS[form](xp, x), None


def softmax(xp, x, axis):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: a max, a fused map-sum, one kernel.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import softmax
        >>> softmax(np, np.zeros((1, 2)), -1).tolist()
        [[0.5, 0.5]]
    """
    m = x.max(axis=axis, keepdims=True)
    s = KERNELS["sum_exp_shifted"](xp, x, m, axis=axis, keepdims=True)
    return KERNELS["softmax_out"](xp, x, m, s)


def softmax_backward(xp, g, y, axis):
    """``g * y - y * sum(g * y)`` along ``axis`` for ``y = softmax(x)``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import softmax_backward
        >>> softmax_backward(np, np.ones((1, 2)), np.array([[0.5, 0.5]]), -1).tolist()   # constant g: 0
        [[0.0, 0.0]]
    """
    s = KERNELS["sum_product"](xp, g, y, axis=axis, keepdims=True)
    return KERNELS["softmax_grad"](xp, g, y, s)


def log_softmax(xp, x, axis):
    """``x - max - log(sum(exp(x - max)))`` along ``axis``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import log_softmax
        >>> np.exp(log_softmax(np, np.zeros((1, 4)), -1)).tolist()
        [[0.25, 0.25, 0.25, 0.25]]
    """
    m = x.max(axis=axis, keepdims=True)
    lse = KERNELS["log_sum_exp_shifted"](xp, x, m, axis=axis, keepdims=True)
    return KERNELS["log_softmax_out"](xp, x, m, lse)


def log_softmax_backward(xp, g, y, axis):
    """``g - exp(y) * sum(g)`` along ``axis`` for ``y = log_softmax(x)``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import log_softmax_backward
        >>> log_softmax_backward(np, np.array([[1.0, 0.0]]), np.log(np.array([[0.5, 0.5]])), -1).tolist()
        [[0.5, -0.5]]
    """
    return KERNELS["log_softmax_grad"](xp, g, y, g.sum(axis=axis, keepdims=True))


def layer_norm(xp, x, axes: tuple, weight, bias, eps: float):
    """``(out, xhat, rstd)`` of layer norm over ``axes`` (the trailing ones); ``weight``/``bias`` arrays
    of the normalised shape or ``None``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import layer_norm
        >>> out, xhat, rstd = layer_norm(np, np.array([[1.0, 3.0]]), (1,), None, None, 0.0)
        >>> out.tolist(), rstd.tolist()
        ([[-1.0, 1.0]], [[1.0]])
    """
    n = 1
    for a in axes:
        n *= x.shape[a]
    mean = x.mean(axis=axes, keepdims=True)
    var = KERNELS["sum_squared_deviation"](xp, x, mean, axis=axes, keepdims=True) / n
    rstd = 1.0 / xp.sqrt(var + eps)
    xhat, out = KERNELS["layer_norm_out"](xp, x, mean, rstd, 1 if weight is None else weight,
                                          0 if bias is None else bias)
    return out, xhat, rstd


def layer_norm_backward(xp, g, xhat, rstd, weight, axes: tuple, batch_axes: tuple,
                        need_x: bool, need_weight: bool, need_bias: bool):
    """``(gx, gw, gb)`` of :func:`layer_norm` (``None`` where not needed):
    ``gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat))``, ``gw = sum(g * xhat)``, ``gb = sum(g)``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import layer_norm_backward
        >>> gx, gw, gb = layer_norm_backward(np, np.ones((1, 2)), np.array([[-1.0, 1.0]]), np.ones((1, 1)),
        ...                                  None, (1,), (0,), True, True, True)
        >>> gx.tolist(), gw.tolist(), gb.tolist()
        ([[0.0, 0.0]], [-1.0, 1.0], [1.0, 1.0])
    """
    gx = gw = gb = None
    if need_weight:
        gw = KERNELS["sum_product"](xp, g, xhat, axis=batch_axes) if batch_axes else g * xhat
    if need_bias:
        gb = g.sum(axis=batch_axes)
    if need_x:
        n = 1
        for a in axes:
            n *= g.shape[a]
        if weight is None:
            m1 = g.sum(axis=axes, keepdims=True) / n
            m2 = KERNELS["sum_product"](xp, g, xhat, axis=axes, keepdims=True) / n
        else:
            m1 = KERNELS["sum_product"](xp, g, weight, axis=axes, keepdims=True) / n
            m2 = KERNELS["sum_product3"](xp, g, weight, xhat, axis=axes, keepdims=True) / n
        gx = KERNELS["layer_norm_grad"](xp, g, 1 if weight is None else weight, xhat, m1, m2, rstd)
    return gx, gw, gb


def cross_entropy_backward(xp, logp, target, scale, label_smoothing: float):
    """Cross entropy's gradient for ``(M, C)`` log-probabilities: ``(softmax - (1 - ls) * onehot(target)
    - ls / C) * scale``, ``scale`` one value per row.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import cross_entropy_backward
        >>> logp = np.log(np.array([[0.25, 0.75]]))
        >>> cross_entropy_backward(np, logp, np.array([1]), np.array([1.0]), 0.0).tolist()
        [[0.25, -0.25]]
    """
    rows, classes = logp.shape
    return KERNELS["cross_entropy_grad"](xp, logp, target.reshape(rows, 1), xp.arange(classes),
                                         scale.reshape(rows, 1).astype(logp.dtype, copy=False),
                                         1 - label_smoothing, label_smoothing / classes)


def adam_step(xp, d, g, m, v, vmax, beta1, beta2, eps, step_size, sqrt_bias2, decay, l2) -> None:
    """Adam's update of parameter ``d`` and state ``m``, ``v`` (``vmax``: AMSGrad) in place, one kernel;
    the arguments of :func:`neural_arch.optim.adam._adam_kernel` (``decay``: AdamW's factor, ``l2``:
    Adam's coupled decay, either ``None``).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.ops import adam_step
        >>> d, m, v = np.ones(2), np.zeros(2), np.zeros(2)
        >>> adam_step(np, d, np.ones(2), m, v, None, 0.5, 0.999, 1e-8, 0.01, 0.0316, None, None)
        >>> m.tolist()
        [0.5, 0.5]
    """
    kernel = adam_kernel(l2 is not None, vmax is not None)
    coef = l2 if l2 is not None else (1.0 if decay is None else decay)
    state = (d, m, v) + (() if vmax is None else (vmax,))
    kernel(xp, g, beta1, 1 - beta1, beta2, 1 - beta2, eps, step_size, sqrt_bias2, coef, *state)
