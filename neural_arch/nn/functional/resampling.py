"""``interpolate``: torch's ``F.interpolate`` (resize the spatial dims of ``(N, C, *spatial)``).

Every supported mode is separable: the result is one 1-d resampling per spatial dim, applied in turn.
Each 1-d step is built from differentiable ops (``index_select`` and a weighted sum), so the gradient
comes from autograd: a nearest step scatter-adds the upstream gradient to the source it copied, a
linear step splits it between the two neighbours by the same weights.

The source indices and weights follow ATen's CPU kernels exactly (``aten/src/ATen/native/UpSample.h``):

* ``scale`` per dim is ``1 / scale_factor`` when a scale factor is given and ``recompute_scale_factor``
  is not True, otherwise ``in / out``.
* ``'nearest'``: ``src = min(floor(dst * scale), in - 1)`` computed in float32 (OpenCV's INTER_NEAREST,
  which torch keeps for compatibility), with two exact shortcuts: ``out == in`` copies and
  ``out == 2 * in`` takes ``dst // 2``.
* ``'nearest-exact'``: ``src = min(floor((dst + 0.5) * scale), in - 1)`` (PIL / scikit-image).
* ``'linear'``/``'bilinear'``/``'trilinear'``: ``align_corners=True`` maps corner centres onto corner
  centres, ``src = dst * (in - 1) / (out - 1)``; otherwise ``src = max(scale * (dst + 0.5) - 0.5, 0)``.
  The neighbours are ``floor(src)`` and the next index (clamped), with weight ``src - floor(src)`` on the
  second; ``out == in`` copies.
* ``'area'``: adaptive average pooling to the output size (3-D and 4-D input).

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn.functional.resampling import interpolate
    >>> x = na.tensor([[[1.0, 2.0, 4.0]]])
    >>> interpolate(x, scale_factor=2).tolist()
    [[[1.0, 1.0, 2.0, 2.0, 4.0, 4.0]]]
    >>> interpolate(x, size=5, mode="linear", align_corners=True).tolist()
    [[[1.0, 1.5, 2.0, 3.0, 4.0]]]
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from neural_arch.core.op_utils import _xp
from neural_arch.core.ops_conv import adaptive_avg_pool1d, adaptive_avg_pool2d
from neural_arch.core.ops_shape import index_select
from neural_arch.core.tensor import Tensor

__all__ = ["interpolate"]

_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area")
#: the one input rank each interpolating mode accepts (torch's rule)
_LINEAR_NDIM = {"linear": 3, "bilinear": 4, "trilinear": 5}


def _nearest_indices(xp, in_size: int, out_size: int, scale, exact: bool):
    """Source index of every output position along one dim, as ATen's ``nearest_idx``/``nearest_exact_idx``;
    made with ``xp`` on the input's device (no host copy)."""
    if not exact:
        # ATen's exact shortcuts: they keep float rounding from moving an index at scale 1 and 2
        if out_size == in_size:
            return None
        if out_size == 2 * in_size:
            return xp.arange(out_size) // 2
    # compute_scales_value<float>: the scale is a float32, whatever the input's dtype
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(in_size) / np.float32(out_size)
    if exact:
        # (dst + 0.5) is a double, multiplied by the float scale as a double, then floorf: rounded to float first
        src = xp.floor(((xp.arange(out_size) + 0.5) * float(s)).astype(np.float32))
    else:
        src = xp.floor(xp.arange(out_size, dtype=np.float32) * s)   # float * float in float32, as the kernel
    return xp.minimum(src.astype(np.int64), in_size - 1)


def _linear_indices(xp, in_size: int, out_size: int, scale, align_corners: bool, dtype):
    """``(i0, i1, lambda1)`` along one dim, as ATen's ``compute_source_index_and_lambda``, in ``dtype``
    (the kernel's opmath type: float for float32 input, double for float64); None when ``out == in``
    (the kernel copies)."""
    if out_size == in_size:
        return None
    t = np.dtype(dtype).type
    if out_size <= 1:
        ratio = t(0)
    elif align_corners:
        ratio = t(in_size - 1) / t(out_size - 1)
    elif scale is not None and scale > 0:
        ratio = t(1.0 / scale)
    else:
        ratio = t(in_size) / t(out_size)
    if align_corners:
        real = xp.arange(out_size, dtype=dtype) * ratio
    else:
        # scale * (dst + 0.5) is computed in double, then returned as the opmath type; negatives clamp to 0
        real = ((xp.arange(out_size) + 0.5) * float(ratio) - 0.5).astype(dtype)
        real = xp.maximum(real, t(0))
    i0 = xp.minimum(xp.floor(real).astype(np.int64), in_size - 1)
    lam = xp.minimum(xp.maximum(real - i0.astype(dtype), t(0)), t(1)).astype(dtype)
    i1 = xp.minimum(i0 + 1, in_size - 1)
    return i0, i1, lam


def _resample_axis(x: Tensor, axis: int, out_size: int, scale, mode: str, align_corners: bool) -> Tensor:
    """One separable step: ``x`` resampled along ``axis`` to ``out_size`` positions."""
    in_size = x.shape[axis]
    xp = _xp(x.data)
    if mode in ("nearest", "nearest-exact"):
        idx = _nearest_indices(xp, in_size, out_size, scale, mode == "nearest-exact")
        return x if idx is None else index_select(x, axis, idx)
    # positions in the kernel's opmath type (float32 for half input), weights then in the input's dtype
    taps = _linear_indices(xp, in_size, out_size, scale, align_corners, np.promote_types(x.dtype, np.float32))
    if taps is None:
        return x
    i0, i1, lam = taps
    shape = [1] * x.ndim
    shape[axis] = out_size
    lam = lam.astype(x.dtype).reshape(shape)
    a = index_select(x, axis, i0)
    b = index_select(x, axis, i1)
    # lambda0 = 1 - lambda1, as the kernel; a*l0 + b*l1 keeps a value exact where l1 == 0
    return a * (1 - lam) + b * lam


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def interpolate(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False) -> Tensor:
    """torch's ``F.interpolate``: resize the spatial dims of ``input`` ``(N, C, *spatial)``.

    Args:
        input: ``(N, C, W)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)``.
        size: the output spatial size (an int for every dim, or one per dim). Give ``size`` or
            ``scale_factor``, not both.
        scale_factor: multiplier of the spatial size (a float, or one per dim); the output size is
            ``floor(in * scale_factor)``.
        mode: ``'nearest'`` (torch's default, OpenCV's rule), ``'nearest-exact'``, ``'linear'`` (3-D),
            ``'bilinear'`` (4-D), ``'trilinear'`` (5-D) or ``'area'`` (3-D/4-D). ``'bicubic'`` and
            ``'lanczos'`` are not implemented and raise ``NotImplementedError``.
        align_corners: for the linear modes only (default False): True maps the centres of the corner
            pixels of input and output onto each other.
        recompute_scale_factor: True computes the output size from ``scale_factor`` and then uses
            ``in / out`` as the scale (not with ``size``); otherwise a given ``scale_factor`` itself is
            the scale, which can differ from ``in / out`` when ``in * scale_factor`` is not an integer.
        antialias: not implemented: True raises (torch's ValueError for modes other than bilinear/bicubic
            on 4-D input, ``NotImplementedError`` for bilinear).

    Returns a Tensor of ``input``'s dtype, differentiable with respect to ``input``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.functional.resampling import interpolate
        >>> img = na.arange(4.0).reshape(1, 1, 2, 2)
        >>> interpolate(img, size=(3, 3), mode="bilinear", align_corners=True).tolist()
        [[[[0.0, 0.5, 1.0], [1.0, 1.5, 2.0], [2.0, 2.5, 3.0]]]]
        >>> interpolate(img, scale_factor=(1, 2), mode="nearest-exact").shape
        (1, 1, 2, 4)
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    if mode not in _MODES:
        if mode in ("bicubic", "lanczos"):
            raise NotImplementedError(f"interpolate: mode={mode!r} is not implemented here; use 'bilinear' "
                                      f"(or resize outside the graph)")
        raise NotImplementedError(f"interpolate: unknown mode {mode!r}; the modes are nearest | nearest-exact | "
                                  f"linear | bilinear | trilinear | area")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating modes: "
                             "linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    dim = x.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        scales = None
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(
                    "Input and output must have the same number of spatial dimensions, but got input with spatial "
                    f"dimensions of {list(x.shape[2:])} and output size of {size}. Please provide input tensor "
                    "in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) format.")
            if not all(_is_int(s) for s in size):
                raise TypeError("expected size to be one of int or Tuple[int] or Tuple[int, int] or "
                                f"Tuple[int, int, int], but got size with types {[type(s) for s in size]}")
            out = [int(s) for s in size]
        else:
            if not _is_int(size):
                raise TypeError(f"expected size to be one of int or Tuple[int] or Tuple[int, int] or "
                                f"Tuple[int, int, int], but got size of type {type(size)}")
            out = [int(size)] * max(dim, 0)
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(
                    "Input and scale_factor must have the same number of spatial dimensions, but got input with "
                    f"spatial dimensions of {list(x.shape[2:])} and scale_factor of shape {scale_factor}. Please "
                    "provide input tensor in (N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) "
                    "format.")
            scales = [float(s) for s in scale_factor]
        else:
            scales = [float(scale_factor)] * max(dim, 0)
        out = None
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if mode == "area" and out is None:
        recompute_scale_factor = True
    if out is None:
        # torch: the size is floor(in * scale); the kernel then uses the given scale unless told to recompute
        out = [math.floor(x.shape[i + 2] * scales[i]) for i in range(dim)]
        if recompute_scale_factor:
            scales = None
    if antialias:
        if mode == "bilinear" and x.ndim == 4:
            raise NotImplementedError("interpolate: antialias=True is not implemented here; low-pass filter the "
                                      "input first (e.g. F.avg_pool2d) and use antialias=False")
        raise ValueError("Anti-alias option is restricted to bilinear, bicubic, and lanczos modes and requires "
                         "a 4-D tensor as input")
    if mode in _LINEAR_NDIM and x.ndim in (3, 4, 5) and x.ndim != _LINEAR_NDIM[mode]:
        raise NotImplementedError(f"Got {x.ndim}D input, but {mode} mode needs {_LINEAR_NDIM[mode]}D input")
    if x.ndim not in (3, 4, 5):
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {x.ndim}D) for "
                                  f"the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
                                  f"nearest-exact (got {mode})")
    spatial = list(x.shape[2:])
    if min(spatial) <= 0 or min(out) <= 0:
        raise RuntimeError(f"Input and output sizes should be greater than 0, but got input {tuple(spatial)} and "
                           f"output {tuple(out)}")
    if x.shape[1] == 0:
        raise RuntimeError(f"Non-empty {x.ndim}D data tensor expected but got a tensor with sizes {list(x.shape)}")
    if mode == "area":
        if x.ndim == 3:
            return adaptive_avg_pool1d(x, out[0])
        if x.ndim == 4:
            return adaptive_avg_pool2d(x, tuple(out))
        raise NotImplementedError("interpolate: mode='area' on 5-D input (adaptive_avg_pool3d) is not implemented "
                                  "here; use 'trilinear' or pool each depth slice with adaptive_avg_pool2d")
    if mode not in ("nearest", "nearest-exact") and x.dtype.kind != "f":
        raise RuntimeError(f"interpolate: mode={mode!r} needs a floating input (as torch's kernels), got dtype "
                           f"{x.dtype}; convert it with .float() first")
    y = x
    for i in range(dim):
        y = _resample_axis(y, 2 + i, out[i], None if scales is None else scales[i], mode, align_corners)
    # torch always returns a new tensor: writing into the result must never change the input
    return x.clone() if y is x else y
