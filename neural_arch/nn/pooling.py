"""Pooling layers: ``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d`` and their 1-d forms over
``(N, C, L)`` signals, ``MaxPool1d``, ``AvgPool1d``, ``AdaptiveAvgPool1d`` (torch's arguments).

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> x = na.randn(2, 3, 8, 8)
    >>> nn.MaxPool2d(2)(x).shape, nn.AvgPool2d(3, stride=2, padding=1)(x).shape
    ((2, 3, 4, 4), (2, 3, 4, 4))
    >>> nn.AdaptiveAvgPool2d((1, 1))(x).shape
    (2, 3, 1, 1)
    >>> from neural_arch.nn.pooling import MaxPool1d
    >>> MaxPool1d(2)(na.randn(2, 3, 8)).shape
    (2, 3, 4)
"""

from __future__ import annotations

from neural_arch.core.ops_conv import _pool1d_args, _single, adaptive_avg_pool1d, avg_pool1d, max_pool1d
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.module import Module

__all__ = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AvgPool1d", "AvgPool2d", "MaxPool1d", "MaxPool2d"]


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


class MaxPool2d(Module):
    """Max over ``kernel_size`` windows (``stride`` defaults to ``kernel_size``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.MaxPool2d(2)(na.arange(16).reshape(1, 1, 4, 4).astype(na.float32)).tolist()
        [[[[5.0, 7.0], [13.0, 15.0]]]]
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = bool(return_indices), bool(ceil_mode)

    def forward(self, x):
        return F.max_pool2d(_t(x), self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Mean over ``kernel_size`` windows (``stride`` defaults to ``kernel_size``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.AvgPool2d(2)(na.ones(1, 1, 4, 4)).shape
        (1, 1, 2, 2)
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, x):
        return F.avg_pool2d(_t(x), self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Average-pool to a fixed ``output_size`` whatever the input size (``None`` keeps a dim).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> nn.AdaptiveAvgPool2d((1, 1))(na.ones(2, 3, 7, 5)).shape
        (2, 3, 1, 1)
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(_t(x), self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class MaxPool1d(Module):
    """Max over ``kernel_size`` windows of ``(N, C, L)`` (or ``(C, L)``) input (``stride`` defaults to
    ``kernel_size``): :func:`~neural_arch.core.ops_conv.max_pool1d`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.pooling import MaxPool1d
        >>> MaxPool1d(2)(na.tensor([[[1.0, 3.0, 2.0, 5.0]]])).tolist()
        [[[3.0, 5.0]]]
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False):
        super().__init__()
        _pool1d_args(kernel_size, stride, padding, dilation, "MaxPool1d")  # bad arguments: an error now
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = bool(return_indices), bool(ceil_mode)

    def forward(self, x):
        return max_pool1d(_t(x), self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool1d(Module):
    """Mean over ``kernel_size`` windows of ``(N, C, L)`` (or ``(C, L)``) input (``stride`` defaults to
    ``kernel_size``): :func:`~neural_arch.core.ops_conv.avg_pool1d`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.pooling import AvgPool1d
        >>> AvgPool1d(2)(na.tensor([[[1.0, 3.0, 2.0, 6.0]]])).tolist()
        [[[2.0, 4.0]]]
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__()
        k, s, p, _ = _pool1d_args(kernel_size, stride, padding, 1, "AvgPool1d")  # bad arguments: an error now
        self.kernel_size, self.stride, self.padding = (k,), (s,), (p,)  # 1-tuples, as torch's AvgPool1d
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)

    def forward(self, x):
        return avg_pool1d(_t(x), self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool1d(Module):
    """Average-pool ``(N, C, L)`` (or ``(C, L)``) input to ``output_size`` bins whatever ``L``:
    :func:`~neural_arch.core.ops_conv.adaptive_avg_pool1d`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.pooling import AdaptiveAvgPool1d
        >>> AdaptiveAvgPool1d(1)(na.ones(2, 3, 7)).shape
        (2, 3, 1)
    """

    def __init__(self, output_size):
        super().__init__()
        _single(output_size, "output_size", 1)  # a bad size: an error now
        self.output_size = output_size

    def forward(self, x):
        return adaptive_avg_pool1d(_t(x), self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
