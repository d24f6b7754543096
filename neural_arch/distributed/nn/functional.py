"""Differentiable collectives under torch's name ``torch.distributed.nn.functional``.

The implementation lives in :mod:`neural_arch.distributed.autograd`; this module re-exports it.

Example::

    import neural_arch.distributed.nn.functional as dist_fn
    y = dist_fn.all_reduce(x)                  # backward all-reduces the gradient
    z = dist_fn.all_gather(x, dim=-1)          # backward reduce-scatters it
"""

from neural_arch.distributed.autograd import (
    all_gather,
    all_reduce,
    all_to_all,
    all_to_all_single,
    broadcast,
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter,
    scatter_to_tensor_model_parallel_region,
)

__all__ = [
    "all_gather", "all_reduce", "all_to_all", "all_to_all_single", "broadcast",
    "copy_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region", "reduce_scatter", "scatter_to_tensor_model_parallel_region",
]
