"""Sharded data parallelism: ZeRO-1/2 (:mod:`.zero`) and FSDP (:mod:`.fsdp`).

=====================  ==========================================================================
module                 what
=====================  ==========================================================================
``flat``               ``FlatLayout``: tensors end to end in one padded flat buffer
``reducer``            ``ShardedGradReducer``: bucketed reduce-scatter of gradients during backward (ZeRO-2)
``owner_reducer``      ``OwnerGradReducer``: each gradient reduced to its owners, no flat copy (FSDP)
``zero``               ``ZeroRedundancyOptimizer`` (stage 1: torch's; stage 2: sharded gradients)
``api``                FSDP's enums, configs and wrap policies (torch's names)
``unit``               ``FlatParamUnit``: one wrapped module's flat shard, gather/free
``plan``               which modules become units; shard / replicate groups
``state_dict``         FSDP's full and sharded state dicts (a mixin)
``fsdp``               ``FullyShardedDataParallel``: the gather/free schedule and its hooks
``grad_scaler``        ``ShardedGradScaler``: found-inf agreed over the ranks
=====================  ==========================================================================
"""

from neural_arch.distributed.parallel.sharded.api import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ModuleWrapPolicy,
    ShardingStrategy,
    StateDictType,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from neural_arch.distributed.parallel.sharded.fsdp import FullyShardedDataParallel
from neural_arch.distributed.parallel.sharded.grad_scaler import ShardedGradScaler
from neural_arch.distributed.parallel.sharded.zero import ZeroRedundancyOptimizer

__all__ = [
    "BackwardPrefetch", "CPUOffload", "FullyShardedDataParallel", "MixedPrecision", "ModuleWrapPolicy",
    "ShardedGradScaler", "ShardingStrategy", "StateDictType", "ZeroRedundancyOptimizer", "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
