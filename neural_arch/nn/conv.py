"""``Conv1d`` and ``Conv2d``: convolution over ``(N, C, L)`` signals and ``(N, C, H, W)`` images, with
torch's arguments and init.

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
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.ops_conv import _conv_padding, _pair, _single, conv1d, pad
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["Conv1d", "Conv2d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _check_conv_args(who: str, in_channels, out_channels, groups, padding_mode: str) -> None:
    """torch's constructor checks, shared by the convolution layers."""
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
            return conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

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
