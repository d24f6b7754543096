"""``Conv1d`` and ``Conv2d``: convolution over ``(N, C, L)`` signals and ``(N, C, H, W)`` images, and
their transposes ``ConvTranspose1d`` / ``ConvTranspose2d`` (the gradient of a convolution with respect
to its input, used to upsample), with torch's arguments and init.

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    >>> conv
    Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
    >>> conv(na.randn(2, 3, 16, 16)).shape
    (2, 8, 16, 16)
    >>> nn.Conv2d(4, 4, 3, groups=2, padding="same", bias=False).weight.shape
    (4, 2, 3, 3)
    >>> from neural_arch.nn.conv import Conv1d
    >>> Conv1d(3, 8, kernel_size=5, padding="same")(na.randn(2, 3, 20)).shape
    (2, 8, 20)
    >>> up = nn.ConvTranspose2d(8, 3, kernel_size=3, stride=2, padding=1, output_padding=1)
    >>> up(na.randn(2, 8, 16, 16)).shape
    (2, 3, 32, 32)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.ops_conv import _check_output_padding, _conv_padding, _groups, _pair, _single, pad
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _check_conv_args(who: str, in_channels, out_channels, groups, padding_mode: str) -> None:
    """torch's constructor checks, shared by the convolution layers."""
    _groups(groups, who)  # an int: groups=1.5 used to pass the divisibility check and run as 1
    if int(in_channels) <= 0 or int(out_channels) <= 0:
        raise ValueError(f"{who}: channels must be positive, got {in_channels}, {out_channels}")
    if groups <= 0 or in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{who}: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
            f"divisible by groups ({groups})"
        )
    if padding_mode not in _PADDING_MODES:
        raise ValueError(f"{who}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")


def _reset_conv_parameters(weight, bias) -> None:
    """torch's init: weight ~ kaiming_uniform(a=sqrt(5)), bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = int(np.prod(weight.shape[1:]))
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        init.uniform_(bias, -bound, bound)


class Conv2d(Module):
    """Apply ``F.conv2d`` with a learnable ``weight`` ``(out_channels, in_channels / groups, kH, kW)``
    and optional ``bias`` ``(out_channels,)``.

    Initialised like torch: weight ~ kaiming_uniform(a=sqrt(5)) and bias ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) with ``fan_in = in_channels / groups * kH * kW``, from the seeded generator.
    ``padding`` may be an int, a pair, ``"valid"`` or ``"same"``; ``padding_mode`` ``"zeros"``
    (default), ``"reflect"``, ``"replicate"`` or ``"circular"``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        >>> conv(na.ones(2, 3, 16, 16)).shape, conv.weight.shape
        ((2, 8, 16, 16), (8, 3, 3, 3))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None):
        super().__init__()
        _check_conv_args("Conv2d", in_channels, out_channels, groups, padding_mode)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size, "kernel_size", 1)
        self.stride = _pair(stride, "stride", 1)
        self.padding = padding if isinstance(padding, str) else _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation", 1)
        self.groups = int(groups)
        self.padding_mode = padding_mode
        # Validates 'same' with stride > 1 now rather than at the first forward.
        self._pads = _conv_padding(self.padding, *self.kernel_size, *self.dilation, *self.stride)
        dtype = np.float32 if dtype is None else dtype
        shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        self.weight = Parameter(np.empty(shape, dtype=dtype), device=device)
        if bias:
            self.bias = Parameter(np.empty((self.out_channels,), dtype=dtype), device=device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_conv_parameters(self.weight, self.bias)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        if self.padding_mode != "zeros":
            top, bottom, left, right = self._pads
            x = F.pad(x, (left, right, top, bottom), mode=self.padding_mode)
            return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s


class Conv1d(Module):
    """Apply :func:`~neural_arch.core.ops_conv.conv1d` with a learnable ``weight``
    ``(out_channels, in_channels / groups, kernel_size)`` and optional ``bias`` ``(out_channels,)``,
    over ``(N, C, L)`` (or unbatched ``(C, L)``) input.

    torch's arguments and init (as :class:`Conv2d`, with ``fan_in = in_channels / groups *
    kernel_size``). ``padding`` may be an int, ``"valid"`` or ``"same"``; ``padding_mode`` ``"zeros"``
    (default), ``"reflect"``, ``"replicate"`` or ``"circular"``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.conv import Conv1d
        >>> conv = Conv1d(4, 6, kernel_size=3, stride=2)
        >>> conv
        Conv1d(4, 6, kernel_size=(3,), stride=(2,))
        >>> conv(na.ones(2, 4, 9)).shape, conv.weight.shape
        ((2, 6, 4), (6, 4, 3))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None):
        super().__init__()
        _check_conv_args("Conv1d", in_channels, out_channels, groups, padding_mode)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = (_single(kernel_size, "kernel_size", 1),)
        self.stride = (_single(stride, "stride", 1),)
        self.padding = padding if isinstance(padding, str) else (_single(padding, "padding", 0),)
        self.dilation = (_single(dilation, "dilation", 1),)
        self.groups = int(groups)
        self.padding_mode = padding_mode
        # (left, right) for the padding modes; also refuses 'same' with a stride now, not at the first call
        _, _, left, right = _conv_padding(self.padding if isinstance(self.padding, str) else (0, self.padding[0]),
                                          1, self.kernel_size[0], 1, self.dilation[0], 1, self.stride[0])
        self._pads = (left, right)
        dtype = np.float32 if dtype is None else dtype
        shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        self.weight = Parameter(np.empty(shape, dtype=dtype), device=device)
        if bias:
            self.bias = Parameter(np.empty((self.out_channels,), dtype=dtype), device=device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_conv_parameters(self.weight, self.bias)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        if self.padding_mode != "zeros":
            x = pad(x, self._pads, mode=self.padding_mode)
            return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        # Through F, as Conv2d: autocast rebinds F's names, and a direct call ran in float32 inside a region.
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,):
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s


# ============================================================================ transposed convolutions
def _output_padding(who: str, input_shape, output_size, stride, padding, kernel_size, dilation) -> tuple:
    """The output padding that makes the transposed convolution of an input of ``input_shape`` come out
    ``output_size`` (torch's ``forward(input, output_size)``: the spatial sizes, or the whole shape)."""
    nd = len(stride)
    leading = len(input_shape) - nd   # batch and channel dims (channel only, unbatched)
    output_size = tuple(int(v) for v in output_size)
    if len(output_size) == leading + nd:
        output_size = output_size[leading:]
    if len(output_size) != nd:
        raise ValueError(f"{who}: for {len(input_shape)}-D input, output_size must have {nd} or {leading + nd} "
                         f"elements (got {len(output_size)})")
    input_size = tuple(input_shape[leading:])
    result = []
    for i in range(nd):
        smallest = (input_size[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel_size[i] - 1) + 1
        largest = smallest + stride[i] - 1
        if not smallest <= output_size[i] <= largest:
            raise ValueError(f"{who}: requested an output size of {list(output_size)}, but valid sizes range from "
                             f"{smallest} to {largest} in dimension {i} (for an input of "
                             f"{list(input_size)})")
        result.append(output_size[i] - smallest)
    return tuple(result)


def _setup_transposed(layer, who, as_tuple, in_channels, out_channels, kernel_size, stride, padding,
                      output_padding, groups, bias, dilation, padding_mode, device, dtype) -> None:
    """Check torch's constructor arguments and give ``layer`` its attributes and parameters (shared by the
    two transposed layers as a function, as Conv1d/Conv2d share theirs)."""
    _check_conv_args(who, in_channels, out_channels, groups, padding_mode)
    if padding_mode != "zeros":  # torch's rule: the padding crops the output, there is nothing to fill
        raise ValueError(f"{who}: only 'zeros' padding_mode is supported, got {padding_mode!r}")
    layer.in_channels, layer.out_channels = int(in_channels), int(out_channels)
    layer.kernel_size = as_tuple(kernel_size, "kernel_size", 1)
    layer.stride = as_tuple(stride, "stride", 1)
    layer.padding = as_tuple(padding, "padding", 0)
    layer.output_padding = as_tuple(output_padding, "output_padding", 0)
    layer.dilation = as_tuple(dilation, "dilation", 1)
    _check_output_padding(layer.output_padding, layer.stride, layer.dilation, who)
    layer.groups, layer.padding_mode = int(groups), padding_mode
    dtype = np.float32 if dtype is None else dtype
    # torch's layout: (in, out / groups, k...), so fan_in (dim 1 times the kernel) is out / groups * k
    shape = (layer.in_channels, layer.out_channels // layer.groups) + layer.kernel_size
    layer.weight = Parameter(np.empty(shape, dtype=dtype), device=device)
    if bias:
        layer.bias = Parameter(np.empty((layer.out_channels,), dtype=dtype), device=device)
    else:
        layer.register_parameter("bias", None)


def _transposed_padding(layer, who, x, output_size) -> tuple:
    """The layer's output padding, or the one that gives ``output_size``."""
    if output_size is None:
        return layer.output_padding
    return _output_padding(who, tuple(x.shape), output_size, layer.stride, layer.padding,
                           layer.kernel_size, layer.dilation)


def _transposed_repr(layer) -> str:
    nd = len(layer.stride)
    s = f"{layer.in_channels}, {layer.out_channels}, kernel_size={layer.kernel_size}, stride={layer.stride}"
    if layer.padding != (0,) * nd:
        s += f", padding={layer.padding}"
    if layer.dilation != (1,) * nd:
        s += f", dilation={layer.dilation}"
    if layer.output_padding != (0,) * nd:
        s += f", output_padding={layer.output_padding}"
    if layer.groups != 1:
        s += f", groups={layer.groups}"
    if layer.bias is None:
        s += ", bias=False"
    return s


def _as_single(value, name, minimum):
    return (_single(value, name, minimum),)


class ConvTranspose2d(Module):
    """Apply ``F.conv_transpose2d`` with a learnable ``weight`` ``(in_channels, out_channels / groups,
    kH, kW)`` and optional ``bias`` ``(out_channels,)`` over ``(N, C, H, W)`` (or unbatched ``(C, H, W)``)
    input; torch's arguments (note ``groups`` before ``bias`` and ``dilation`` last) and init (as
    :class:`Conv2d`, with ``fan_in = out_channels / groups * kH * kW``). Only ``padding_mode="zeros"``.

    ``forward(input, output_size=None)``: ``output_size`` picks the output padding that gives that size
    (a stride above 1 leaves ``stride`` sizes possible, e.g. to undo a strided ``Conv2d``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> up = nn.ConvTranspose2d(4, 2, kernel_size=3, stride=2, padding=1)
        >>> up
        ConvTranspose2d(4, 2, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))
        >>> up(na.ones(1, 4, 5, 5)).shape, up(na.ones(1, 4, 5, 5), output_size=[10, 10]).shape
        ((1, 2, 9, 9), (1, 2, 10, 10))
        >>> up.weight.shape
        (4, 2, 3, 3)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None):
        super().__init__()
        _setup_transposed(self, "ConvTranspose2d", _pair, in_channels, out_channels, kernel_size, stride,
                          padding, output_padding, groups, bias, dilation, padding_mode, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_conv_parameters(self.weight, self.bias)

    def forward(self, x, output_size=None):
        x = x if isinstance(x, Tensor) else Tensor(x)
        output_padding = _transposed_padding(self, "ConvTranspose2d", x, output_size)
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, output_padding,
                                  self.groups, self.dilation)

    def extra_repr(self) -> str:
        return _transposed_repr(self)


class ConvTranspose1d(Module):
    """Apply ``F.conv_transpose1d`` with a learnable ``weight`` ``(in_channels, out_channels / groups,
    kernel_size)`` and optional ``bias`` ``(out_channels,)`` over ``(N, C, L)`` (or unbatched ``(C, L)``)
    input; torch's arguments and init, ``forward(input, output_size=None)`` as :class:`ConvTranspose2d`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> up = nn.ConvTranspose1d(4, 6, kernel_size=4, stride=2, padding=1)
        >>> up
        ConvTranspose1d(4, 6, kernel_size=(4,), stride=(2,), padding=(1,))
        >>> up(na.ones(2, 4, 8)).shape, up.weight.shape
        ((2, 6, 16), (4, 6, 4))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None):
        super().__init__()
        _setup_transposed(self, "ConvTranspose1d", _as_single, in_channels, out_channels, kernel_size, stride,
                          padding, output_padding, groups, bias, dilation, padding_mode, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_conv_parameters(self.weight, self.bias)

    def forward(self, x, output_size=None):
        x = x if isinstance(x, Tensor) else Tensor(x)
        output_padding = _transposed_padding(self, "ConvTranspose1d", x, output_size)
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding, output_padding,
                                  self.groups, self.dilation)

    def extra_repr(self) -> str:
        return _transposed_repr(self)
