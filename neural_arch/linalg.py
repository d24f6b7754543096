"""``neural_arch.linalg``: torch's ``torch.linalg`` names that the core implements.

Only the norms a training script calls so far: :func:`vector_norm` (torch's
``torch.linalg.vector_norm``, also ``Tensor.norm`` / ``neural_arch.norm`` for a vector ``p``).

Example::

    >>> import neural_arch as na
    >>> float(na.linalg.vector_norm(na.tensor([3.0, 4.0])))
    5.0
    >>> na.linalg.vector_norm(na.tensor([[1.0, -2.0], [3.0, 0.0]]), ord=float("inf"), dim=1).tolist()
    [2.0, 3.0]
"""

from neural_arch.core.ops_reduce import vector_norm

__all__ = ["vector_norm"]
