"""Upsampling layers: torch's ``nn.Upsample`` and its two older fixed-mode forms, over
:func:`~neural_arch.nn.functional.resampling.interpolate`.

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn.upsample import Upsample
    >>> up = Upsample(scale_factor=2, mode="bilinear")
    >>> up
    Upsample(scale_factor=2.0, mode='bilinear')
    >>> up(na.randn(1, 3, 4, 5)).shape
    (1, 3, 8, 10)
"""

from __future__ import annotations

from neural_arch.core.tensor import Tensor
from neural_arch.nn.functional.resampling import interpolate
from neural_arch.nn.module import Module

__all__ = ["Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]


class Upsample(Module):
    """torch's ``nn.Upsample``: :func:`~neural_arch.nn.functional.resampling.interpolate` as a layer.

    Args:
        size: output spatial size (an int or one per dim); give this or ``scale_factor``.
        scale_factor: multiplier of the spatial size (stored as a float, or a tuple of floats).
        mode: ``'nearest'`` (default), ``'nearest-exact'``, ``'linear'``, ``'bilinear'``, ``'trilinear'``
            or ``'area'``; ``'bicubic'`` raises ``NotImplementedError`` when called.
        align_corners: linear modes only (see ``interpolate``).
        recompute_scale_factor: see ``interpolate``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.upsample import Upsample
        >>> Upsample(size=3, mode="linear", align_corners=True)(na.tensor([[[0.0, 2.0]]])).tolist()
        [[[0.0, 1.0, 2.0]]]
    """

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        # torch stores the factor as float(s); a factor of 0 or None means "not given"
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):
        """``interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners, ...)``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.upsample import Upsample
            >>> Upsample(scale_factor=3)(na.ones(1, 1, 2)).shape
            (1, 1, 6)
        """
        x = input if isinstance(input, Tensor) else Tensor(input)
        return interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                           recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """torch's ``nn.UpsamplingNearest2d``: ``Upsample(size, scale_factor, mode='nearest')`` (deprecated in
    torch in favour of ``Upsample``; kept so ported scripts run).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.upsample import UpsamplingNearest2d
        >>> UpsamplingNearest2d(scale_factor=2)(na.ones(1, 1, 2, 3)).shape
        (1, 1, 4, 6)
    """

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """torch's ``nn.UpsamplingBilinear2d``: ``Upsample(size, scale_factor, mode='bilinear',
    align_corners=True)`` (deprecated in torch in favour of ``Upsample``; kept so ported scripts run).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.upsample import UpsamplingBilinear2d
        >>> UpsamplingBilinear2d(size=(3, 3))(na.arange(4.0).reshape(1, 1, 2, 2)).tolist()[0][0][1]
        [1.0, 1.5, 2.0]
    """

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
