"""torch's ``nn.Bilinear``: ``y = x1^T A x2 + b`` with one ``(in1, in2)`` matrix per output feature,
over :func:`neural_arch.nn.functional.bilinear`.

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> layer = nn.Bilinear(3, 4, 2)
    >>> layer(na.ones(5, 3), na.ones(5, 4)).shape, layer.weight.shape
    ((5, 2), (2, 3, 4))
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["Bilinear"]


class Bilinear(Module):
    """``y = x1^T A x2 + b`` (torch's ``nn.Bilinear(in1_features, in2_features, out_features, bias=True)``):
    ``weight`` ``(out, in1, in2)`` and ``bias`` ``(out,)``, both initialised ``U(-1/sqrt(in1), 1/sqrt(in1))``
    as torch.

    Example::

        >>> from neural_arch import nn
        >>> [name for name, _ in nn.Bilinear(2, 3, 4).named_parameters()]
        ['weight', 'bias']
    """

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=np.float32):
        super().__init__()
        if min(int(in1_features), int(in2_features), int(out_features)) <= 0:
            raise ValueError(f"Bilinear: feature sizes must be positive, got {in1_features}, {in2_features}, "
                             f"{out_features}")
        self.in1_features = int(in1_features)
        self.in2_features = int(in2_features)
        self.out_features = int(out_features)
        self.weight = Parameter(np.empty((self.out_features, self.in1_features, self.in2_features), dtype=dtype),
                                device=device)
        if bias:
            self.bias = Parameter(np.empty((self.out_features,), dtype=dtype), device=device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
