"""torch's ``torch.distributed.tensor.experimental``: context parallelism (sequence-sharded attention).

See :mod:`neural_arch.distributed.tensor.experimental._attention` for the algorithms and layouts.

Example::

    from neural_arch.distributed.tensor.experimental import context_parallel, ring_attention
"""

from neural_arch.distributed.tensor.experimental._attention import (
    ContextParallelAttention,
    context_parallel,
    context_parallel_unshard,
    ring_attention,
    ring_stats,
    sequence_positions,
    set_rotate_method,
    shard_sequence,
    ulysses_attention,
    unshard_sequence,
)

__all__ = ["ContextParallelAttention", "context_parallel", "context_parallel_unshard", "ring_attention",
           "ring_stats", "sequence_positions", "set_rotate_method", "shard_sequence", "ulysses_attention",
           "unshard_sequence"]
