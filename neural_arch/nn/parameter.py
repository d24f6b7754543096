"""``Parameter``: a Tensor that a :class:`~neural_arch.nn.Module` registers as learnable.

Example::

    >>> import numpy as np
    >>> from neural_arch.nn import Parameter
    >>> w = Parameter(np.zeros((2, 3), dtype=np.float32))
    >>> w.requires_grad
    True
"""

from __future__ import annotations

from neural_arch.core.tensor import Tensor

__all__ = ["Parameter"]


class Parameter(Tensor):
    """A Tensor that requires a gradient by default and is picked up by ``Module.__setattr__``.

    ``data`` may be a NumPy/CuPy array, a nested list, or a Tensor (its raw array is used, the
    autograd history is dropped: a parameter is always a leaf).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> p = nn.Parameter(np.zeros(3))
        >>> p.requires_grad, type(p).__name__
        (True, 'Parameter')
    """

    def __init__(self, data, requires_grad: bool = True, dtype=None, device=None):
        if isinstance(data, Tensor):
            # A parameter is a leaf: keep the array, never the graph it came from.
            if device is None:
                device = data.device
            data = data.data
        super().__init__(data, requires_grad=requires_grad, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
