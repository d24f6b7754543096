"""``SKLinear``: a linear layer whose weight is kept in a randomized sketched (low-rank) form.

The math. A dense layer computes ``y = x W^T + b`` with ``W`` of shape ``(out, in)``. ``SKLinear``
keeps instead

* ``S`` of shape ``(k, in)``: a random Gaussian sketching matrix, entries ``N(0, 1/k)``, held as a
  **buffer** (not trained; drawn once from the seeded global generator, so every rank that
  built the model after ``manual_seed(s)`` holds the same ``S``; DDP's buffer broadcast keeps it so);
* ``U`` of shape ``(out, k)``: the trained factor, initialised as the sketch ``U = W0 S^T`` of a
  dense torch-style initialisation ``W0`` (``E[S^T S] = I``, so ``E[U S] = W0``);

and represents ``W ≈ U S`` (rank at most ``k = sketch_size``). The forward pass never forms ``W``::

    y = (x S^T) U^T + b          # first sketch the input to k features, then map k -> out

Cost versus ``Linear(in, out)`` for a batch of ``B`` rows:

=====================  ====================  ==============================
                       Linear                SKLinear
=====================  ====================  ==============================
trained parameters     ``out*in``            ``out*k``
buffer (not trained)   0                     ``k*in``
forward FLOPs          ``2*B*in*out``        ``2*B*k*(in + out)``
=====================  ====================  ==============================

so it saves parameters (and gradient/optimizer memory) whenever ``k < in``, and FLOPs whenever
``k < in*out/(in+out)``.

Example::

    >>> import numpy as np
    >>> from neural_arch.nn.sketched import SKLinear
    >>> layer = SKLinear(16, 4, sketch_size=8)
    >>> layer(np.ones((2, 16), dtype=np.float32)).shape
    (2, 4)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.core.rng import numpy_generator
from neural_arch.core.tensor import Tensor, no_grad
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["SKLinear"]


class SKLinear(Module):
    """Sketched linear layer ``y = (x S^T) U^T + b``, ``W ≈ U S`` (see the module docstring).

    Args:
        in_features, out_features: as :class:`~neural_arch.nn.Linear`.
        sketch_size: ``k``, the rank of the sketch (``1 <= k``; ``k < in_features`` to save memory).
        bias: learn an additive bias.
        dtype, device: of the parameters and the sketch buffer.
        generator: a ``numpy.random.Generator`` to draw ``W0`` and ``S`` from (default: the seeded
            global generator, so same seed -> same sketch on every rank).

    Attributes: ``weight_u`` (Parameter ``(out, k)``), ``bias`` (``(out,)`` or None) and the buffer
    ``sketch_matrix`` (``(k, in)``). :meth:`dense_weight` returns ``U S`` for checks.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> layer = nn.SKLinear(64, 32, sketch_size=8)
        >>> layer(na.ones(4, 64)).shape
        (4, 32)
    """

    def __init__(self, in_features: int, out_features: int, sketch_size: int, bias: bool = True,
                 dtype=np.float32, device=None, generator=None):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features),
                            ("sketch_size", sketch_size)):
            if int(value) <= 0:
                raise ValueError(f"SKLinear: {name} must be a positive integer, got {value}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.sketch_size = int(sketch_size)
        rng = numpy_generator(generator)
        # The dense init W0 is drawn exactly like Linear's (kaiming_uniform(a=sqrt(5)) bounds).
        bound = 1.0 / math.sqrt(self.in_features)
        w0 = rng.uniform(-bound, bound, size=(self.out_features, self.in_features))
        sketch = rng.normal(0.0, 1.0 / math.sqrt(self.sketch_size), size=(self.sketch_size, self.in_features))
        self.weight_u = Parameter((w0 @ sketch.T).astype(dtype), device=device)
        self.register_buffer("sketch_matrix", Tensor(sketch.astype(dtype), device=device))
        if bias:
            self.bias = Parameter(np.empty((self.out_features,), dtype=dtype), device=device)
            init.uniform_(self.bias, -bound, bound, generator=rng)
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        sketched = F.linear(x, self.sketch_matrix)          # (..., k): no grad flows into the buffer
        return F.linear(sketched, self.weight_u, self.bias)

    def dense_weight(self) -> Tensor:
        """The dense ``(out, in)`` weight ``U S`` this layer represents (no graph)."""
        with no_grad():
            return F.matmul(self.weight_u, self.sketch_matrix)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"sketch_size={self.sketch_size}, bias={self.bias is not None}")
