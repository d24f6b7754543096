"""``neural_arch.distributed.fsdp``: torch's ``torch.distributed.fsdp`` names.

Example::

    from neural_arch.distributed.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                              MixedPrecision, CPUOffload, ModuleWrapPolicy)
"""

from neural_arch.distributed.parallel.sharded import (
    BackwardPrefetch,
    CPUOffload,
    FullyShardedDataParallel,
    MixedPrecision,
    ModuleWrapPolicy,
    ShardedGradScaler,
    ShardingStrategy,
    StateDictType,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

FSDP = FullyShardedDataParallel

__all__ = [
    "FSDP",
    "BackwardPrefetch",
    "CPUOffload",
    "FullyShardedDataParallel",
    "MixedPrecision",
    "ModuleWrapPolicy",
    "ShardedGradScaler",
    "ShardingStrategy",
    "StateDictType",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
