"""``parameters_to_vector`` / ``vector_to_parameters``: one flat vector for a list of parameters,
and back (torch's ``nn.utils.convert_parameters``).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> layer = nn.Linear(3, 2, dtype=np.float64)
    >>> vec = nn.utils.parameters_to_vector(layer.parameters())
    >>> vec.shape                                   # 2 * 3 weights + 2 biases
    (8,)
    >>> nn.utils.vector_to_parameters(vec * 0, layer.parameters())
    >>> float(abs(layer.weight.data).sum())
    0.0
"""

from __future__ import annotations

from neural_arch.core.ops_shape import concatenate
from neural_arch.core.tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def _as_list(parameters) -> list:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _check_same_device(params, who: str) -> None:
    devices = {str(p.device) for p in params}
    if len(devices) > 1:
        raise ValueError(f"{who}: the parameters are on several devices ({sorted(devices)}); move them to one")


def parameters_to_vector(parameters) -> Tensor:
    """Concatenate every parameter, flattened, in order, into one 1-D Tensor (differentiable).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> p, q = nn.Parameter(np.ones((2, 2))), nn.Parameter(np.zeros(1))
        >>> nn.utils.parameters_to_vector([p, q]).tolist()
        [1.0, 1.0, 1.0, 1.0, 0.0]
    """
    params = _as_list(parameters)
    _check_same_device(params, "parameters_to_vector")
    return concatenate([p.reshape(-1) for p in params])


def vector_to_parameters(vec, parameters) -> None:
    """Copy consecutive slices of the 1-D ``vec`` into ``parameters``, in place (their arrays, dtypes
    and devices stay: an optimizer holding them sees the new values).

    ``vec`` must hold exactly as many elements as the parameters together: a vector that is too
    short or too long is an error rather than a silent partial copy.

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> from neural_arch.core.tensor import Tensor
        >>> p = nn.Parameter(np.zeros((2, 2)))
        >>> nn.utils.vector_to_parameters(Tensor(np.arange(4.0)), [p]); p.data.tolist()
        [[0.0, 1.0], [2.0, 3.0]]
    """
    if not isinstance(vec, Tensor):
        raise TypeError(f"vector_to_parameters: expected a Tensor, but got: {type(vec).__name__}")
    params = _as_list(parameters)
    _check_same_device(params, "vector_to_parameters")
    data = vec.data
    if data.ndim != 1:
        raise ValueError(f"vector_to_parameters: expected a 1-D vector, got shape {tuple(data.shape)}")
    total = sum(int(p.data.size) for p in params)
    if data.shape[0] != total:
        raise ValueError(
            f"vector_to_parameters: the vector has {data.shape[0]} elements but the parameters hold {total}"
        )
    start = 0
    for p in params:
        n = int(p.data.size)
        p.data[...] = data[start:start + n].reshape(p.data.shape).astype(p.data.dtype, copy=False)
        start += n
