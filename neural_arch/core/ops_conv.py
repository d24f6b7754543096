"""Differentiable ops on ``(N, C, H, W)`` feature maps: ``conv2d``, ``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d``, ``pad``, channel dropout (``dropout2d``) and the transposed convolution
(``conv_transpose2d``), with torch's signatures; and their 1-d forms over ``(N, C, L)`` signals
(``conv1d``, ``conv_transpose1d``, ``max_pool1d``, ``avg_pool1d``, ``adaptive_avg_pool1d``), which run
the 2-d ops on ``(N, C, 1, L)``.

Convolution is im2col + GEMM: a strided *view* of the padded input holds every receptive field
without copying (``as_strided``), one reshape turns it into a ``(K, L)`` column matrix per image
and group, and a batched matmul does the rest. The backward pass multiplies by the transposed
weight and scatters the columns back (col2im) with one strided add per kernel offset, so the
loops run over ``kh * kw`` offsets, never over pixels. The column matrix is rebuilt in backward
instead of being saved: it is ``kh * kw`` times the input's size, too big to keep per layer.
The transposed convolution is the same machinery run the other way: its forward is conv2d's input
gradient (multiply by the transposed weight, col2im), its input gradient is conv2d's forward.
Everything goes through the input's array module, so the same code runs on NumPy and CuPy.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.core import ops_conv
    >>> x = Tensor(np.ones((1, 2, 5, 5)), requires_grad=True)
    >>> w = Tensor(np.ones((4, 2, 3, 3)), requires_grad=True)
    >>> y = ops_conv.conv2d(x, w, stride=2, padding=1)
    >>> y.shape, y.data[0, 0, 1, 1]
    ((1, 4, 3, 3), np.float64(18.0))
    >>> y.sum().backward(); w.grad.shape
    (4, 2, 3, 3)
    >>> ops_conv.max_pool2d(x, 2).shape, ops_conv.adaptive_avg_pool2d(x, 1).shape
    ((1, 2, 2, 2), (1, 2, 1, 1))
"""

from __future__ import annotations

import numpy as np

from .. import backend as _backend
from .autograd import Node
from .op_utils import _needs, _result, _xp, scatter_add
from .rng import get_generator
from .tensor import Tensor

__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "avg_pool1d", "avg_pool2d", "conv1d", "conv2d",
           "conv_transpose1d", "conv_transpose2d", "dropout2d", "max_pool1d", "max_pool2d", "pad"]


# ============================================================================ helpers
def _pair(value, name: str, minimum: int | None = None) -> tuple:
    """``value`` as a pair of ints; with ``minimum``, each must be at least that (torch refuses a
    zero stride, dilation or kernel: a zero dilation would otherwise run and give wrong numbers)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = (int(value), int(value))
    try:
        value = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in value):
        # int() would truncate: stride=(1.5, 2) used to run as (1, 2)
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    value = tuple(int(v) for v in value)
    if len(value) == 1:
        value = value * 2
    if len(value) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value}")
    if minimum is not None and min(value) < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be {kind}, got {value}")
    return value


def _as_4d(x: Tensor, who: str):
    """(tensor as 4-D, was_unbatched). torch accepts (C, H, W) as one unbatched image."""
    if x.ndim == 4:
        return x, False
    if x.ndim == 3:
        return x.reshape(1, *x.shape), True
    raise ValueError(
        f"Expected 3D (unbatched) or 4D (batched) input to {who}, but got input of size: {list(x.shape)}"
    )


def _pad_hw(xp, xd, top, bottom, left, right, value=0):
    """Pad the last two dims (a new array; the input itself when there is nothing to pad)."""
    if not (top or bottom or left or right):
        return xd
    n, c, h, w = xd.shape
    out = xp.full((n, c, h + top + bottom, w + left + right), value, dtype=xd.dtype)
    out[:, :, top:top + h, left:left + w] = xd
    return out


def _windows(xp, xpad, kh, kw, sh, sw, dh, dw, ho, wo, kernel_last: bool):
    """A strided view (no copy) of every receptive field of the padded input.

    ``kernel_last``: shape ``(N, C, ho, wo, kh, kw)`` (pooling: reduce the last two axes);
    else ``(N, C, kh, kw, ho, wo)`` (convolution: ``(C, kh, kw)`` then folds into K).
    """
    n, c = xpad.shape[:2]
    s0, s1, s2, s3 = xpad.strides
    if kernel_last:
        shape, strides = (n, c, ho, wo, kh, kw), (s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw)
    else:
        shape, strides = (n, c, kh, kw, ho, wo), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw)
    return xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)


def _col2im(xp, dcols, padded_shape, kh, kw, sh, sw, dh, dw, ho, wo):
    """Sum ``dcols`` ``(N, C, kh, kw, ho, wo)`` back onto the padded input (inverse of _windows)."""
    out = xp.zeros(padded_shape, dtype=dcols.dtype)
    for i in range(kh):
        hs = i * dh
        for j in range(kw):
            ws = j * dw
            out[:, :, hs:hs + sh * (ho - 1) + 1:sh, ws:ws + sw * (wo - 1) + 1:sw] += dcols[:, :, i, j]
    return out


def _columns(xp, xpad, kh, kw, sh, sw, dh, dw, ho, wo):
    """The ``(N, C, kh, kw, ho, wo)`` receptive fields of ``xpad`` as a new array, copied one strided
    slice per kernel offset (the inverse of _col2im; no ``as_strided``, so it runs on any array module)."""
    n, c = xpad.shape[:2]
    cols = xp.empty((n, c, kh, kw, ho, wo), dtype=xpad.dtype)
    for i in range(kh):
        hs = i * dh
        for j in range(kw):
            ws = j * dw
            cols[:, :, i, j] = xpad[:, :, hs:hs + sh * (ho - 1) + 1:sh, ws:ws + sw * (wo - 1) + 1:sw]
    return cols


def _groups(value, who: str) -> int:
    """``groups`` as a positive int (a float used to be truncated by ``int()``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{who}: groups must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{who}: non-positive groups is not supported, got groups={value}")
    return int(value)


def _conv_padding(padding, kh, kw, dh, dw, sh, sw):
    """(top, bottom, left, right) from an int, a pair, 'valid' or 'same' (torch's rules)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding == "same":
            if (sh, sw) != (1, 1):
                raise ValueError("padding='same' is not supported for strided convolutions")
            th, tw = dh * (kh - 1), dw * (kw - 1)
            # torch puts the odd extra row/column at the end
            return th // 2, th - th // 2, tw // 2, tw - tw // 2
        raise ValueError(f"padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    ph, pw = _pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"negative padding is not supported, got {padding}")
    return ph, ph, pw, pw


# ============================================================================ convolution
def conv2d(input: Tensor, weight: Tensor, bias=None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation, like torch) of ``input`` ``(N, C_in, H, W)`` (or an
    unbatched ``(C_in, H, W)``) with ``weight`` ``(C_out, C_in / groups, kH, kW)``.

    ``padding`` may be an int, a pair, ``"valid"`` or ``"same"``. Output size per spatial dim:
    ``floor((H + 2 * pad - dilation * (k - 1) - 1) / stride) + 1``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.conv2d(na.ones(1, 3, 5, 5), na.ones(4, 3, 3, 3), padding=1).shape
        (1, 4, 5, 5)
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    x, unbatched = _as_4d(x, "conv2d")
    if unbatched:
        out = conv2d(x, weight, bias, stride, padding, dilation, groups)
        return out.reshape(*out.shape[1:])
    xd, wd = x.data, weight.data
    if type(xd) is not type(wd):
        _backend.check_same_device(xd, wd, "conv2d")
    if wd.ndim != 4:
        raise ValueError(f"conv2d: weight must be 4-D (C_out, C_in/groups, kH, kW), got shape {list(wd.shape)}")
    n, c, h, w = xd.shape
    co, cg, kh, kw = wd.shape
    groups = int(groups)
    if groups < 1 or co % groups:
        raise ValueError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
            f"but got weight of size {list(wd.shape)} instead"
        )
    if cg * groups != c:
        raise ValueError(
            f"Given groups={groups}, weight of size {list(wd.shape)}, expected input{list(xd.shape)} "
            f"to have {cg * groups} channels, but got {c} channels instead"
        )
    sh, sw = _pair(stride, "stride", 1)
    dh, dw = _pair(dilation, "dilation", 1)
    top, bottom, left, right = _conv_padding(padding, kh, kw, dh, dw, sh, sw)
    hp, wp = h + top + bottom, w + left + right
    ho = (hp - dh * (kh - 1) - 1) // sh + 1
    wo = (wp - dw * (kw - 1) - 1) // sw + 1
    if ho <= 0 or wo <= 0:
        raise ValueError(
            f"conv2d: calculated padded input size per channel: ({hp} x {wp}); effective kernel size: "
            f"({dh * (kh - 1) + 1} x {dw * (kw - 1) + 1}); the kernel can't be larger than the input"
        )
    xp = _xp(xd)
    k, L, cog = cg * kh * kw, ho * wo, co // groups

    def columns():
        xpad = _pad_hw(xp, xd, top, bottom, left, right)
        # The reshape copies the strided view into a contiguous (N, G, K, L) column matrix.
        return _windows(xp, xpad, kh, kw, sh, sw, dh, dw, ho, wo, False).reshape(n, groups, k, L)

    wmat = wd.reshape(groups, cog, k)
    out = (wmat @ columns()).reshape(n, co, ho, wo)  # (G, Co/G, K) @ (N, G, K, L)
    bd = None
    if bias is not None:
        bd = bias.data if isinstance(bias, Tensor) else xp.asarray(bias)
        if tuple(bd.shape) != (co,):  # torch: a 1-D bias of C_out elements, nothing that merely reshapes
            raise ValueError(f"conv2d: expected bias to be 1-D with {co} elements, got shape {list(bd.shape)}")
        out += bd.reshape(1, co, 1, 1)
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx, rw = x.requires_grad, weight.requires_grad
    if not _needs(x if rx else None, weight if rw else None, bt):
        return _result(out, None)

    def fn(g):
        gm = g.reshape(n, groups, cog, L)
        gx = gw = gb = None
        if bt is not None:
            gb = g.sum(axis=(0, 2, 3))
        if rw:
            gw = (gm @ columns().swapaxes(-1, -2)).sum(axis=0).reshape(wd.shape)
        if rx:
            dcols = (wmat.swapaxes(-1, -2) @ gm).reshape(n, c, kh, kw, ho, wo)
            gpad = _col2im(xp, dcols, (n, c, hp, wp), kh, kw, sh, sw, dh, dw, ho, wo)
            gx = gpad[:, :, top:top + h, left:left + w]
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, weight if rw else None, bt), "Conv2d",
                                saved=(x, weight)))


def _check_output_padding(output_padding, stride, dilation, who: str) -> None:
    """torch's rule: each output padding must be smaller than its stride or its dilation (a larger one
    would add rows that no input pixel reaches and that no other output size could describe)."""
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise ValueError(f"{who}: output padding must be smaller than either stride or dilation, but got "
                             f"output_padding={tuple(output_padding)}, stride={tuple(stride)}, "
                             f"dilation={tuple(dilation)}")


def conv_transpose2d(input: Tensor, weight: Tensor, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """2-D transposed convolution (torch's ``F.conv_transpose2d``, the gradient of :func:`conv2d` with
    respect to its input) of ``input`` ``(N, C_in, H, W)`` (or an unbatched ``(C_in, H, W)``) with
    ``weight`` ``(C_in, C_out / groups, kH, kW)``. Each input pixel adds itself times the kernel into
    the output, ``stride`` apart; ``padding`` crops that many rows/columns from each side of the
    full result, ``output_padding`` adds rows/columns at the end (it must be smaller than the stride
    or the dilation, as torch). Output size per spatial dim:
    ``(H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.conv_transpose2d(na.ones(1, 3, 4, 4), na.ones(3, 2, 3, 3), stride=2, padding=1,
        ...                    output_padding=1).shape
        (1, 2, 8, 8)
        >>> F.conv_transpose2d(na.ones(1, 1, 1, 2), na.ones(1, 1, 1, 2)).tolist()   # overlaps add up
        [[[[1.0, 2.0, 1.0]]]]
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    weight = weight if isinstance(weight, Tensor) else Tensor(weight)
    x, unbatched = _as_4d(x, "conv_transpose2d")
    if unbatched:
        out = conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)
        return out.reshape(*out.shape[1:])
    xd, wd = x.data, weight.data
    if type(xd) is not type(wd):
        _backend.check_same_device(xd, wd, "conv_transpose2d")
    if wd.ndim != 4:
        raise ValueError(f"conv_transpose2d: weight must be 4-D (C_in, C_out/groups, kH, kW), got shape "
                         f"{list(wd.shape)}")
    n, c, h, w = xd.shape
    ci, cog, kh, kw = wd.shape
    groups = _groups(groups, "conv_transpose2d")
    if ci % groups:
        raise ValueError(f"conv_transpose2d: given groups={groups}, expected weight to be divisible by {groups} "
                         f"at dimension 0, but got weight of size {list(wd.shape)}")
    if ci != c:
        raise ValueError(f"conv_transpose2d: given transposed=1, weight of size {list(wd.shape)}, expected input "
                         f"{list(xd.shape)} to have {ci} channels, but got {c} channels")
    sh, sw = _pair(stride, "stride", 1)
    ph, pw = _pair(padding, "padding", 0)
    oph, opw = _pair(output_padding, "output_padding", 0)
    dh, dw = _pair(dilation, "dilation", 1)
    _check_output_padding((oph, opw), (sh, sw), (dh, dw), "conv_transpose2d")
    # The full (uncropped) output: every input pixel's kernel footprint, plus the output padding rows.
    hf, wf = (h - 1) * sh + dh * (kh - 1) + 1 + oph, (w - 1) * sw + dw * (kw - 1) + 1 + opw
    ho, wo = hf - 2 * ph, wf - 2 * pw
    if ho <= 0 or wo <= 0:
        raise ValueError(f"conv_transpose2d: the output size ({ho} x {wo}) is too small: input ({h} x {w}), "
                         f"kernel ({kh} x {kw}), stride {(sh, sw)}, padding {(ph, pw)}, dilation {(dh, dw)}, "
                         f"output_padding {(oph, opw)}")
    xp = _xp(xd)
    co, cg, k = cog * groups, c // groups, cog * kh * kw
    wmat = wd.reshape(groups, cg, k)
    xm = xd.reshape(n, groups, cg, h * w)
    # conv2d's input gradient: (G, K, C_in/G) @ (N, G, C_in/G, H*W) columns, scattered back by col2im.
    cols = (wmat.swapaxes(-1, -2) @ xm).reshape(n, co, kh, kw, h, w)
    full = _col2im(xp, cols, (n, co, hf, wf), kh, kw, sh, sw, dh, dw, h, w)
    out = xp.ascontiguousarray(full[:, :, ph:ph + ho, pw:pw + wo])
    if bias is not None:
        bd = bias.data if isinstance(bias, Tensor) else xp.asarray(bias)
        if tuple(bd.shape) != (co,):
            raise ValueError(f"conv_transpose2d: expected bias to be 1-D with {co} elements (C_out), got shape "
                             f"{list(bd.shape)}")
        out += bd.reshape(1, co, 1, 1)
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx, rw = x.requires_grad, weight.requires_grad
    if not _needs(x if rx else None, weight if rw else None, bt):
        return _result(out, None)

    def fn(g):
        gx = gw = gb = None
        if bt is not None:
            gb = g.sum(axis=(0, 2, 3))
        if rx or rw:
            # conv2d's forward on the upstream gradient: its receptive fields, as columns.
            gfull = _pad_hw(xp, g, ph, hf - ph - ho, pw, wf - pw - wo)
            gcols = _columns(xp, gfull, kh, kw, sh, sw, dh, dw, h, w).reshape(n, groups, k, h * w)
            if rx:
                gx = (wmat @ gcols).reshape(n, c, h, w)
            if rw:
                gw = (xm @ gcols.swapaxes(-1, -2)).sum(axis=0).reshape(wd.shape)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, weight if rw else None, bt), "ConvTranspose2d",
                                saved=(x, weight)))


# ============================================================================ pooling
def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling output size (with its ceil_mode rule: the last window must start inside
    the input or the left padding)."""
    eff = size + 2 * p - d * (k - 1) - 1
    out = (-(-eff // s) if ceil_mode else eff // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode, who):
    kh, kw = _pair(kernel_size, "kernel_size", 1)
    sh, sw = _pair(kernel_size if stride is None or stride == () else stride, "stride", 1)
    ph, pw = _pair(padding, "padding", 0)
    dh, dw = _pair(dilation, "dilation", 1)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(
            f"{who}: pad should be smaller than or equal to half of kernel size, but got "
            f"padding={(ph, pw)}, kernel_size={(kh, kw)}"
        )
    h, w = x.shape[-2:]
    ho, wo = _pool_out(h, kh, sh, ph, dh, ceil_mode), _pool_out(w, kw, sw, pw, dw, ceil_mode)
    if ho <= 0 or wo <= 0:
        raise ValueError(f"{who}: output size ({ho} x {wo}) is too small for input of size ({h} x {w})")
    # ceil_mode windows may run past the padded input: pad the end a little more (never read
    # by torch's windows either, since they are clipped there).
    extra_h = max(0, (ho - 1) * sh + dh * (kh - 1) + 1 - (h + 2 * ph))
    extra_w = max(0, (wo - 1) * sw + dw * (kw - 1) + 1 - (w + 2 * pw))
    return kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, extra_h, extra_w


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False):
    """Max over each window; the gradient goes to the (first) maximal element of each window.

    With ``return_indices=True`` also returns the flat ``h * W + w`` position of each maximum in
    its input plane (int64), like torch.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.max_pool2d(na.arange(16).reshape(1, 1, 4, 4).astype(na.float32), 2).tolist()
        [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    x4, unbatched = _as_4d(x, "max_pool2d")
    xd = x4.data
    xp = _xp(xd)
    n, c, h, w = xd.shape
    kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, eh, ew = _pool_args(
        xd, kernel_size, stride, padding, dilation, ceil_mode, "max_pool2d")
    low = -np.inf if xd.dtype.kind == "f" else np.iinfo(xd.dtype).min
    xpad = _pad_hw(xp, xd, ph, ph + eh, pw, pw + ew, low)
    hp, wp = xpad.shape[-2:]
    flat = _windows(xp, xpad, kh, kw, sh, sw, dh, dw, ho, wo, True).reshape(n, c, ho, wo, kh * kw)
    arg = flat.argmax(axis=-1)  # first maximum of each window (NaN counts as maximal), as torch
    out = xp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    rows = xp.arange(ho).reshape(ho, 1) * sh + (arg // kw) * dh  # window position, padded coords
    cols = xp.arange(wo).reshape(1, wo) * sw + (arg % kw) * dw
    indices = None
    if return_indices:
        idx = ((rows - ph) * w + (cols - pw)).astype(xp.int64)
        indices = _result(idx[0] if unbatched else idx, None)
    if not _needs(x4):
        res = _result(out, None)
    else:
        where = (rows * wp + cols).reshape(n * c, ho * wo)

        def fn(g):
            gflat = xp.zeros((n * c, hp * wp), dtype=g.dtype)
            # scatter-add: with stride < kernel one element can be the maximum of several windows
            scatter_add(xp, gflat, (xp.arange(n * c).reshape(-1, 1), where), g.reshape(n * c, ho * wo))
            return (gflat.reshape(n, c, hp, wp)[:, :, ph:ph + h, pw:pw + w],)

        res = _result(out, Node(fn, (x4,), "MaxPool2d"))
    if unbatched:
        res = res.reshape(c, ho, wo)
    return (res, indices) if return_indices else res


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override=None) -> Tensor:
    """Mean over each window, with torch's divisor rules (``count_include_pad``,
    ``divisor_override``, windows clipped at the padded border in ``ceil_mode``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.avg_pool2d(na.arange(16).reshape(1, 1, 4, 4).astype(na.float32), 2).tolist()
        [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    x4, unbatched = _as_4d(x, "avg_pool2d")
    xd = x4.data
    xp = _xp(xd)
    n, c, h, w = xd.shape
    kh, kw, sh, sw, ph, pw, _, _, ho, wo, eh, ew = _pool_args(
        xd, kernel_size, stride, padding, 1, ceil_mode, "avg_pool2d")
    xpad = _pad_hw(xp, xd, ph, ph + eh, pw, pw + ew)
    hp, wp = xpad.shape[-2:]
    sums = _windows(xp, xpad, kh, kw, sh, sw, 1, 1, ho, wo, True).sum(axis=(-2, -1))

    def counts(size, k, s, p, o):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        with_pad = end - start
        inside = np.minimum(end, size) - np.maximum(start, 0)
        return with_pad, inside

    if divisor_override is not None and divisor_override == 0:
        raise ValueError("avg_pool2d: divisor_override must not be zero")
    if divisor_override:
        divisor = np.full((ho, wo), float(divisor_override))
    else:
        (hpad, hin), (wpad, win) = counts(h, kh, sh, ph, ho), counts(w, kw, sw, pw, wo)
        divisor = np.outer(hpad, wpad) if count_include_pad else np.outer(hin, win)
        divisor = np.where(divisor > 0, divisor, np.inf).astype(np.float64)  # empty window -> 0
    scale = xp.asarray(1.0 / divisor).astype(xd.dtype if xd.dtype.kind == "f" else np.float64)
    out = sums * scale
    if not _needs(x4):
        res = _result(out, None)
    else:
        def fn(g):
            gs = g * scale
            dcols = xp.broadcast_to(gs[:, :, None, None], (n, c, kh, kw, ho, wo))
            gpad = _col2im(xp, dcols, (n, c, hp, wp), kh, kw, sh, sw, 1, 1, ho, wo)
            return (gpad[:, :, ph:ph + h, pw:pw + w],)

        res = _result(out, Node(fn, (x4,), "AvgPool2d"))
    return res.reshape(c, ho, wo) if unbatched else res


def _adaptive_matrix(size: int, out: int, dtype) -> np.ndarray:
    """(out, size) averaging matrix: row i averages input bins floor(i*size/out) .. ceil((i+1)*size/out)."""
    m = np.zeros((out, size), dtype=np.float64)
    for i in range(out):
        start = (i * size) // out
        end = -(-((i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m.astype(dtype)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Average-pool to a fixed ``output_size`` (an int, a pair, ``None`` keeps that dim) using
    torch's bins. Computed as ``A_h @ x @ A_w.T`` with two small averaging matrices.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.adaptive_avg_pool2d(na.ones(1, 2, 5, 7), (1, 1)).shape
        (1, 2, 1, 1)
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    x4, unbatched = _as_4d(x, "adaptive_avg_pool2d")
    xd = x4.data
    xp = _xp(xd)
    h, w = xd.shape[-2:]
    if isinstance(output_size, (int, np.integer)) or output_size is None:
        output_size = (output_size, output_size)
    if len(output_size) != 2:  # a third entry used to be ignored silently
        raise ValueError(f"adaptive_avg_pool2d: output_size must be an int or a pair, got {tuple(output_size)}")
    oh, ow = (h if output_size[0] is None else int(output_size[0]),
              w if output_size[1] is None else int(output_size[1]))
    if oh <= 0 or ow <= 0:
        raise ValueError(f"adaptive_avg_pool2d: output_size must be positive, got {(oh, ow)}")
    dt = xd.dtype if xd.dtype.kind == "f" else np.float64
    ah = xp.asarray(_adaptive_matrix(h, oh, dt))
    aw = xp.asarray(_adaptive_matrix(w, ow, dt))
    out = ah @ xd @ aw.T
    if not _needs(x4):
        res = _result(out, None)
    else:
        res = _result(out, Node(lambda g: (ah.T @ g @ aw,), (x4,), "AdaptiveAvgPool2d"))
    return res.reshape(xd.shape[1], oh, ow) if unbatched else res


# ============================================================================ padding
_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
    """torch's ``F.pad``: ``pad`` lists (before, after) pairs starting from the *last* dim, e.g.
    ``(left, right, top, bottom)``. Modes: ``constant`` (negative pads crop), ``reflect``,
    ``replicate``, ``circular``.

    >>> import numpy as np
    >>> pad(Tensor(np.arange(3.0)), (1, 2), mode="reflect").tolist()
    [1.0, 0.0, 1.0, 2.0, 1.0, 0.0]
    """
    x = input if isinstance(input, Tensor) else Tensor(input)
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ValueError(f"pad: padding length must be even and at most 2 * ndim, got {len(pad)}")
    xd = x.data
    xp = _xp(xd)
    nd = xd.ndim
    pairs = {nd - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)}
    if mode == "constant":
        return _pad_constant(x, pairs, 0 if value is None else value)
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    # Other modes: an index array per padded dim; the gradient scatter-adds along the same index.
    index = {}
    for ax, (before, after) in pairs.items():
        size = xd.shape[ax]
        if before < 0 or after < 0:
            raise ValueError(f"pad: negative padding is only supported in constant mode, got {pad}")
        if mode == "reflect" and max(before, after) >= size:
            raise ValueError(
                f"pad: padding size should be less than the corresponding input dimension, but got "
                f"padding ({before}, {after}) at dimension {ax} of input {list(xd.shape)}"
            )
        if mode == "circular" and max(before, after) > size:
            raise ValueError(
                f"pad: circular padding ({before}, {after}) at dimension {ax} of input {list(xd.shape)} would "
                f"wrap around more than once; it must be at most the dimension's size"
            )
        if mode == "replicate" and size == 0:
            raise ValueError(f"pad: replicate padding needs a non-empty dimension {ax}, input {list(xd.shape)}")
        index[ax] = xp.asarray(np.pad(np.arange(size), (before, after), mode=_PAD_MODES[mode]))
    out = xd
    for ax, idx in index.items():
        out = xp.take(out, idx, axis=ax)
    if not _needs(x):
        return _result(out, None)
    shapes = []
    shape = list(xd.shape)
    for ax in index:
        shapes.append(tuple(shape))
        shape[ax] = int(index[ax].shape[0])

    def fn(g):
        for (ax, idx), shp in zip(reversed(list(index.items())), reversed(shapes)):
            acc = xp.zeros(shp, dtype=g.dtype)
            scatter_add(xp, acc, (slice(None),) * ax + (idx,), g)
            g = acc
        return (g,)

    return _result(out, Node(fn, (x,), "Pad"))


def _pad_constant(x: Tensor, pairs: dict, value) -> Tensor:
    xd = x.data
    xp = _xp(xd)
    src, dst, shape = [], [], list(xd.shape)
    for ax in range(xd.ndim):
        before, after = pairs.get(ax, (0, 0))
        size = xd.shape[ax]
        if size + before + after < 0:
            raise ValueError(f"pad: padding {before, after} would give dimension {ax} a negative size")
        shape[ax] = size + before + after
        # Negative amounts crop: copy input[crop_before : size - crop_after] to output[start:].
        crop_before, crop_after = max(-before, 0), max(-after, 0)
        kept = max(size - crop_before - crop_after, 0)
        start = max(before, 0)
        src.append(slice(crop_before, crop_before + kept))
        dst.append(slice(start, start + kept))
    out = xp.full(tuple(shape), value, dtype=xd.dtype)
    out[tuple(dst)] = xd[tuple(src)]
    if not _needs(x):
        return _result(out, None)
    src_t, dst_t = tuple(src), tuple(dst)

    def fn(g):
        gx = xp.zeros(xd.shape, dtype=g.dtype)
        gx[src_t] = g[dst_t]
        return (gx,)

    return _result(out, Node(fn, (x,), "ConstantPad"))


# ============================================================================ channel dropout
def dropout2d(input: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero whole channels with probability ``p`` (one draw per ``(n, c)``), scaling the rest by
    ``1/(1-p)``. Like torch, ``(N, C, H, W)`` and ``(N, C, L)`` inputs both drop per ``(n, c)``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> y = F.dropout2d(na.ones(1, 8, 2, 2), p=0.5).data
        >>> sorted(set(y.reshape(8, 4).std(axis=1).tolist()))    # each channel all kept or all zeroed
        [0.0]
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1], got {p}")
    x = input if isinstance(input, Tensor) else Tensor(input)
    if not training or p == 0.0:
        return x
    xd = x.data
    if xd.ndim < 2:
        raise ValueError(f"dropout2d needs a (N, C, ...) input, got shape {list(xd.shape)}")
    xp = _xp(xd)
    shape = xd.shape[:2] + (1,) * (xd.ndim - 2)
    if p == 1.0:
        mask = xp.zeros(shape, dtype=xd.dtype)
    else:
        if xp is np:
            keep = get_generator().random(shape, dtype=np.float32) >= p
        else:
            keep = xp.random.random(shape, dtype=xp.float32) >= p
        mask = keep.astype(xd.dtype) * xd.dtype.type(1.0 / (1.0 - p))
    out = xd * mask
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * mask,), (x,), "Dropout2d"))



# ============================================================================ 1-d: over the 2-d ops
# A (N, C, L) signal is a (N, C, 1, L) image: each 1-d op checks its arguments in 1-d terms (so an error
# names what the caller wrote), then runs the 2-d op with a height-1 kernel and drops the height.
def _single(value, name: str, minimum: int | None = None) -> int:
    """``value`` (an int or a 1-tuple) as an int; with ``minimum``, at least that."""
    if not isinstance(value, (int, np.integer)):
        value = tuple(value)
        if len(value) != 1:
            raise ValueError(f"{name} must be an int or a 1-tuple, got {value}")
        value = value[0]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {'positive' if minimum == 1 else 'non-negative'}, got {value}")
    return value


def _as_3d(x, who: str):
    """(``x`` as a (N, C, L) Tensor, was_unbatched). torch accepts (C, L) as one unbatched signal."""
    x = x if isinstance(x, Tensor) else Tensor(x)
    if x.ndim == 3:
        return x, False
    if x.ndim == 2:
        return x.reshape(1, *x.shape), True
    raise ValueError(f"Expected 2D (unbatched) or 3D (batched) input to {who}, but got input of size: "
                     f"{list(x.shape)}")


def _from_image(y: Tensor, unbatched: bool) -> Tensor:
    """A (N, C, 1, L) result back as (N, C, L), or (C, L) for an unbatched input."""
    n, c, _, length = y.shape
    return y.reshape(c, length) if unbatched else y.reshape(n, c, length)


def conv1d(input: Tensor, weight: Tensor, bias=None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """1-D convolution (cross-correlation, as torch) of ``input`` ``(N, C_in, L)`` (or an unbatched
    ``(C_in, L)``) with ``weight`` ``(C_out, C_in / groups, k)``: :func:`conv2d` on ``(N, C_in, 1, L)``.

    ``padding`` may be an int, ``"valid"`` or ``"same"`` (stride 1; an odd extra element goes at the
    end, as torch). Output length: ``floor((L + 2 * padding - dilation * (k - 1) - 1) / stride) + 1``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_conv import conv1d
        >>> conv1d(na.ones(2, 3, 10), na.ones(4, 3, 3), padding=1).shape
        (2, 4, 10)
        >>> conv1d(na.tensor([[1.0, 2.0, 3.0, 4.0]]), na.tensor([[[1.0, -1.0]]])).tolist()
        [[-1.0, -1.0, -1.0]]
    """
    x, unbatched = _as_3d(input, "conv1d")
    weight = weight if isinstance(weight, Tensor) else Tensor(weight)
    wd = weight.data
    if wd.ndim != 3:
        raise ValueError(f"conv1d: weight must be 3-D (C_out, C_in/groups, k), got shape {list(wd.shape)}")
    n, c, length = x.shape
    co, cg, k = wd.shape
    groups = int(groups)
    if groups < 1 or co % groups:
        raise ValueError(f"conv1d: given groups={groups}, expected weight to be divisible by {groups} at "
                         f"dimension 0, but got weight of size {list(wd.shape)}")
    if cg * groups != c:
        raise ValueError(f"conv1d: given groups={groups}, weight of size {list(wd.shape)}, expected input "
                         f"{list(x.shape)} to have {cg * groups} channels, but got {c} channels")
    s = _single(stride, "stride", 1)
    d = _single(dilation, "dilation", 1)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"conv1d: padding must be an int, 'valid' or 'same', got {padding!r}")
        if padding == "same" and s != 1:
            raise ValueError("conv1d: padding='same' is not supported for strided convolutions")
        pads = padding
        total = 0 if padding == "valid" else d * (k - 1)
    else:
        p = _single(padding, "padding", 0)
        pads, total = (0, p), 2 * p
    if length + total - d * (k - 1) - 1 < 0:
        raise ValueError(f"conv1d: calculated padded input length per channel: {length + total}; effective "
                         f"kernel size: {d * (k - 1) + 1}; the kernel can't be larger than the input")
    y = conv2d(x.reshape(n, c, 1, length), weight.reshape(co, cg, 1, k), bias, (1, s), pads, (1, d), groups)
    return _from_image(y, unbatched)


def conv_transpose1d(input: Tensor, weight: Tensor, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """1-D transposed convolution (torch's ``F.conv_transpose1d``) of ``input`` ``(N, C_in, L)`` (or an
    unbatched ``(C_in, L)``) with ``weight`` ``(C_in, C_out / groups, k)``: :func:`conv_transpose2d` on
    ``(N, C_in, 1, L)``. Output length:
    ``(L - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_conv import conv_transpose1d
        >>> conv_transpose1d(na.ones(2, 4, 5), na.ones(4, 3, 3), stride=2, output_padding=1).shape
        (2, 3, 12)
        >>> conv_transpose1d(na.tensor([[1.0, 10.0]]), na.tensor([[[1.0, 2.0]]])).tolist()
        [[1.0, 12.0, 20.0]]
    """
    x, unbatched = _as_3d(input, "conv_transpose1d")
    weight = weight if isinstance(weight, Tensor) else Tensor(weight)
    wd = weight.data
    if wd.ndim != 3:
        raise ValueError(f"conv_transpose1d: weight must be 3-D (C_in, C_out/groups, k), got shape "
                         f"{list(wd.shape)}")
    n, c, length = x.shape
    ci, cog, k = wd.shape
    s = _single(stride, "stride", 1)
    p = _single(padding, "padding", 0)
    op = _single(output_padding, "output_padding", 0)
    d = _single(dilation, "dilation", 1)
    _check_output_padding((op,), (s,), (d,), "conv_transpose1d")   # named in 1-d terms, before the 2-d call
    y = conv_transpose2d(x.reshape(n, c, 1, length), weight.reshape(ci, cog, 1, k), bias, (1, s), (0, p),
                         (0, op), groups, (1, d))
    return _from_image(y, unbatched)


def _pool1d_args(kernel_size, stride, padding, dilation, who: str):
    k = _single(kernel_size, "kernel_size", 1)
    s = k if stride is None or (not isinstance(stride, (int, np.integer)) and len(stride) == 0) \
        else _single(stride, "stride", 1)
    p = _single(padding, "padding", 0)
    d = _single(dilation, "dilation", 1)
    if p > k // 2:
        raise ValueError(f"{who}: pad should be at most half of kernel size, but got padding={p}, "
                         f"kernel_size={k}")
    return k, s, p, d


def _check_pool1d_length(length: int, k: int, s: int, p: int, d: int, ceil_mode: bool, who: str) -> None:
    if _pool_out(length, k, s, p, d, ceil_mode) <= 0:
        raise ValueError(f"{who}: output length {_pool_out(length, k, s, p, d, ceil_mode)} is too small "
                         f"for an input of length {length} (kernel_size={k}, padding={p}, dilation={d})")


def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over each window of a ``(N, C, L)`` (or ``(C, L)``) signal, torch's ``F.max_pool1d``:
    :func:`max_pool2d` with a height-1 window. ``return_indices=True`` also returns each maximum's
    position along ``L`` (int64).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_conv import max_pool1d
        >>> max_pool1d(na.tensor([[[1.0, 3.0, 2.0, 5.0, 4.0]]]), 2).tolist()
        [[[3.0, 5.0]]]
    """
    x, unbatched = _as_3d(input, "max_pool1d")
    k, s, p, d = _pool1d_args(kernel_size, stride, padding, dilation, "max_pool1d")
    n, c, length = x.shape
    _check_pool1d_length(length, k, s, p, d, ceil_mode, "max_pool1d")
    res = max_pool2d(x.reshape(n, c, 1, length), (1, k), (1, s), (0, p), (1, d), ceil_mode, return_indices)
    if not return_indices:
        return _from_image(res, unbatched)
    y, idx = res
    return _from_image(y, unbatched), _from_image(idx, unbatched)


def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Mean over each window of a ``(N, C, L)`` (or ``(C, L)``) signal, torch's ``F.avg_pool1d``
    (``count_include_pad``: zeros of the padding count in the divisor): :func:`avg_pool2d` with a
    height-1 window.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_conv import avg_pool1d
        >>> avg_pool1d(na.tensor([[[1.0, 3.0, 2.0, 6.0]]]), 2).tolist()
        [[[2.0, 4.0]]]
    """
    x, unbatched = _as_3d(input, "avg_pool1d")
    k, s, p, _ = _pool1d_args(kernel_size, stride, padding, 1, "avg_pool1d")
    n, c, length = x.shape
    _check_pool1d_length(length, k, s, p, 1, ceil_mode, "avg_pool1d")
    y = avg_pool2d(x.reshape(n, c, 1, length), (1, k), (1, s), (0, p), ceil_mode, count_include_pad)
    return _from_image(y, unbatched)


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """Average-pool a ``(N, C, L)`` (or ``(C, L)``) signal to ``output_size`` bins with torch's bin
    edges (``floor(i * L / out)`` to ``ceil((i + 1) * L / out)``): :func:`adaptive_avg_pool2d`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_conv import adaptive_avg_pool1d
        >>> adaptive_avg_pool1d(na.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0]]]), 2).tolist()
        [[[2.0, 4.0]]]
    """
    x, unbatched = _as_3d(input, "adaptive_avg_pool1d")
    out = _single(output_size, "output_size", 1)
    n, c, length = x.shape
    return _from_image(adaptive_avg_pool2d(x.reshape(n, c, 1, length), (1, out)), unbatched)
