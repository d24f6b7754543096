"""``autocast``: run matmul-like ops in float16/bfloat16 and precision-sensitive ops in float32.

Op lists (torch's, restricted to the ops this framework has):

=============================  =================================================================
policy                         ops
=============================  =================================================================
lower precision (``dtype``)    ``linear``, ``matmul``, ``conv1d``, ``conv2d``, ``conv_transpose1d``,
                               ``conv_transpose2d``
float32                        ``softmax``, ``log_softmax``, ``layer_norm``, ``batch_norm``,
                               ``cross_entropy``, ``nll_loss``, ``mse_loss``, ``sum``, ``mean``,
                               ``exp``, ``log``
=============================  =================================================================

Inputs are cast only if they are float16/bfloat16/float32 (torch's "eligible" rule: float64
tensors are left alone, so float64 models are unaffected). Casts are differentiable, so the
gradients of float32 parameters come back in float32.

**bfloat16 on NumPy** comes from the ``ml_dtypes`` package (the one JAX uses): NumPy has no
bfloat16, and ``ml_dtypes`` gives a real 2-byte dtype with bfloat16 rounding whose matmul
accumulates in float32 (as GPUs do). CuPy has no bfloat16, so on the GPU use float16
(``device_type="cuda"`` defaults to float16, ``"cpu"`` to bfloat16, like torch).

Regions are per thread, as in torch: entering one in a thread casts only the ops that thread runs.

How it hooks in: the layers call their ops through ``neural_arch.nn.functional`` (``F.linear``...),
so while an autocast region is active those names point at casting wrappers (installed on the
first enter, removed on the last exit; the wrappers read the innermost region's settings at
call time, so nesting and ``enabled=False`` work). Ops called as Tensor methods or operators
(``a @ b``) are not covered; a dispatch hook inside the core would cover them (asked of the
core's owner). Nor is a function object taken before the region: ``criterion = F.cross_entropy``
evaluated outside ``autocast`` keeps the unwrapped function, so call ``F.cross_entropy(...)`` inside
the region (or upcast the outputs first, as ``DistributedTrainer`` does).

Example::

    >>> import numpy as np, neural_arch as na
    >>> from neural_arch import nn
    >>> from neural_arch.amp import autocast
    >>> lin = nn.Linear(4, 2)
    >>> with autocast("cpu", dtype=na.bfloat16):
    ...     y = lin(na.ones(3, 4))
    >>> y.dtype.name, lin.weight.dtype.name
    ('bfloat16', 'float32')
"""

from __future__ import annotations

import functools
import threading

import numpy as np

import neural_arch.nn.functional as F
from neural_arch.core import autocast_state
from neural_arch.core import dtypes as _dtypes
from neural_arch.core.tensor import Tensor

__all__ = ["FP32_OPS", "LOWER_PRECISION_OPS", "autocast", "get_autocast_dtype", "is_autocast_enabled"]

LOWER_PRECISION_OPS = ("linear", "matmul", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "prelu")
# torch's float32 list (its CUDA table; its CPU table holds the losses too): reductions, norms, exponentials and
# every loss, whose sums lose too much in 16 bits
FP32_OPS = ("softmax", "log_softmax", "softmin", "softplus", "layer_norm", "group_norm", "batch_norm", "normalize",
            "cosine_similarity", "pairwise_distance", "cross_entropy", "nll_loss", "mse_loss", "l1_loss",
            "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy_with_logits", "poisson_nll_loss",
            "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
            "cosine_embedding_loss", "triplet_margin_loss", "sum", "mean", "exp", "log")

# Regions are per thread, as torch's autocast state is thread-local: a region in one thread must not
# cast the ops another thread runs (an evaluation thread would silently compute in bfloat16). The
# stacks live in the core (``core.autocast_state``) so activation checkpointing can replay a region.
_local = autocast_state._local   # .stack: this thread's open regions, innermost last: (enabled, dtype)
_regions = autocast_state.regions
_open_regions = 0            # regions open in all threads: the wrappers are installed while > 0
_lock = threading.Lock()
_originals: dict = {}
_ELIGIBLE = ("float16", "bfloat16", "float32")


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """True inside an enabled autocast region.

    Example::

        >>> from neural_arch.amp import autocast, is_autocast_enabled
        >>> with autocast("cpu"):
        ...     is_autocast_enabled()
        True
        >>> is_autocast_enabled()
        False
    """
    stack = _regions()
    return bool(stack) and stack[-1][0]


def get_autocast_dtype(device_type: str = "cpu"):
    """The lower-precision dtype of the innermost region (None outside autocast).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.amp import autocast, get_autocast_dtype
        >>> with autocast("cpu", dtype=na.bfloat16):
        ...     get_autocast_dtype("cpu") == na.bfloat16
        True
    """
    stack = _regions()
    return stack[-1][1] if stack else None


def _cast(x, dtype):
    if isinstance(x, Tensor) and x.dtype.name in _ELIGIBLE and x.dtype != dtype:
        return x.astype(dtype)
    return x


def _wrap(name: str, orig, lower: bool):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        stack = getattr(_local, "stack", None)
        if not (stack and stack[-1][0]):
            return orig(*args, **kwargs)
        dtype = stack[-1][1] if lower else np.dtype(np.float32)
        args = tuple(_cast(a, dtype) for a in args)
        kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        out = orig(*args, **kwargs)
        # ml_dtypes' bfloat16 matmul accumulates and returns float32: round the result to the
        # region's dtype, as a bfloat16 GEMM on hardware would.
        if lower and isinstance(out, Tensor) and out.dtype != dtype and out.dtype.name in _ELIGIBLE:
            out = out.astype(dtype)
        return out
    wrapper.__autocast_original__ = orig
    return wrapper


def _install() -> None:
    for names, lower in ((LOWER_PRECISION_OPS, True), (FP32_OPS, False)):
        for name in names:
            orig = getattr(F, name, None)
            if orig is None or hasattr(orig, "__autocast_original__"):
                continue
            _originals[name] = orig
            setattr(F, name, _wrap(name, orig, lower))


def _uninstall() -> None:
    for name, orig in _originals.items():
        setattr(F, name, orig)
    _originals.clear()


class autocast:
    """``with autocast("cpu", dtype=bfloat16):`` (also a decorator). See the module docstring.

    Args:
        device_type: ``"cpu"`` (default dtype bfloat16) or ``"cuda"`` (default float16).
        dtype: ``float16`` or ``bfloat16``.
        enabled: False turns autocast off inside an enclosing region.
        cache_enabled: accepted for torch compatibility (casts are not cached).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.amp import autocast
        >>> layer = nn.Linear(4, 2)
        >>> with autocast("cpu", dtype=na.bfloat16):
        ...     y = layer(na.ones(3, 4))
        >>> y.dtype == na.bfloat16, layer.weight.dtype
        (True, dtype('float32'))
    """

    def __init__(self, device_type: str = "cpu", dtype=None, enabled: bool = True, cache_enabled=None):
        kind = str(device_type).split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"autocast(device_type={device_type!r}): use 'cpu' or 'cuda'")
        if dtype is None:
            dtype = "bfloat16" if kind == "cpu" else np.float16
        dtype = _dtypes.as_dtype(dtype)
        if dtype.name not in ("float16", "bfloat16"):
            raise ValueError(f"autocast(dtype={dtype}): use float16 or bfloat16 (the lower-precision dtype)")
        if kind == "cuda" and dtype.name == "bfloat16":
            raise ValueError("autocast('cuda', dtype=bfloat16): CuPy has no bfloat16; use float16 on the GPU")
        self.device_type, self.fast_dtype, self.enabled = kind, dtype, bool(enabled)

    def __enter__(self):
        global _open_regions
        with _lock:
            if _open_regions == 0:
                _install()
            _open_regions += 1
        _regions().append((self.enabled, self.fast_dtype))
        return self

    def __exit__(self, *exc):
        global _open_regions
        _regions().pop()
        with _lock:
            _open_regions -= 1
            if _open_regions == 0:
                _uninstall()
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self.enabled):
                return func(*args, **kwargs)
        return wrapper


autocast_state.register_opener(autocast)   # checkpointing reopens regions through the core
