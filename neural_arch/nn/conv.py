"""``Conv2d``: 2-D convolution over ``(N, C, H, W)`` images, with torch's arguments and init.

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
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.ops_conv import _conv_padding, _pair
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["Conv2d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


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
        if int(in_channels) <= 0 or int(out_channels) <= 0:
            raise ValueError(f"Conv2d: channels must be positive, got {in_channels}, {out_channels}")
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(
                f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                f"divisible by groups ({groups})"
            )
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"Conv2d: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
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
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

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
