"""Data parallelism: :class:`DistributedDataParallel` (:mod:`.distributed_data_parallel`), its
gradient :mod:`.reducer` (on the shared buckets of :mod:`neural_arch.distributed.bucketing`) and
its overlap observer (:mod:`.overlap_stats`), uneven inputs (:mod:`.join`), the communication hooks' base
(:mod:`neural_arch.distributed.algorithms.ddp_comm_hooks`), ``SyncBatchNorm`` and expert gradients (:mod:`.expert_grads`).

Example::

    from neural_arch.distributed.ddp import DistributedDataParallel as DDP
    model = DDP(model)
"""

from neural_arch.distributed.ddp.distributed_data_parallel import DistributedDataParallel, no_sync
from neural_arch.distributed.ddp.join import Join
from neural_arch.distributed.ddp.sync_batchnorm import SyncBatchNorm

__all__ = ["DistributedDataParallel", "Join", "SyncBatchNorm", "no_sync"]
