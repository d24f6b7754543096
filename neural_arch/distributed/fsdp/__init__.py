"""``neural_arch.distributed.fsdp``: fully sharded data parallelism at torch's path.

Example::

    from neural_arch.distributed.fsdp import fully_shard          # FSDP2 (per-parameter DTensor shards)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)

    from neural_arch.distributed.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                              MixedPrecision, CPUOffload, ModuleWrapPolicy)
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerBlock}))

=================================  ======================================================================
module                             what
=================================  ======================================================================
``api``                            FSDP's enums and configs (torch's names)
``wrap``                           the auto-wrap policies (torch's names)
``plan``                           which modules become units; shard / replicate groups
``unit``                           ``FlatParamUnit``: one wrapped module's flat shard, gather/free
``storage``                        releasing and restoring a gathered buffer's memory
``owner_reducer``                  ``OwnerGradReducer``: each gradient reduced to its owners, no flat copy
``state_dict``                     ``FSDPStateDicts``: full and sharded state dicts (a component FSDP holds)
``fully_sharded_data_parallel``    ``FullyShardedDataParallel``: the gather/free schedule and its hooks
``sharded_grad_scaler``            ``ShardedGradScaler``: found-inf agreed over the ranks
``_fully_shard``                   FSDP2 (torch's ``_fully_shard`` files): ``fully_shard`` and ``FSDPModule``
                                   (per-parameter ``DTensor(Shard(0))`` shards, no flat units; see
                                   ``docs/fully_shard.md``)
``_fsdp_param_group``              FSDP2's ``FSDPParamGroup``: one module's parameters, one collective each way
``_fsdp_param``                    FSDP2's ``FSDPParam``: one parameter, sharded (a DTensor) and unsharded
``_fsdp_api``                      FSDP2's ``MixedPrecisionPolicy``, ``OffloadPolicy``, ``CPUOffloadPolicy``
=================================  ======================================================================

The flat layout (:mod:`neural_arch.distributed.flat_param`) and the gradient buckets
(:mod:`neural_arch.distributed.bucketing`) are shared with ZeRO
(:mod:`neural_arch.distributed.optim`).
"""

from neural_arch.distributed.fsdp._fsdp_api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from neural_arch.distributed.fsdp._fully_shard import FSDPModule, UnshardHandle, fully_shard
from neural_arch.distributed.fsdp.api import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
    StateDictType,
)
from neural_arch.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
from neural_arch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from neural_arch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

FSDP = FullyShardedDataParallel

__all__ = [
    "FSDP", "BackwardPrefetch", "CPUOffload", "CPUOffloadPolicy", "FSDPModule", "FullyShardedDataParallel",
    "MixedPrecision", "MixedPrecisionPolicy", "ModuleWrapPolicy", "OffloadPolicy", "ShardedGradScaler",
    "ShardingStrategy", "StateDictType", "UnshardHandle", "fully_shard", "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
