"""Seed 003's trainer: ``DistributedTrainer`` / ``EnhancedDistributedTrainer`` and ``DistributedMonitor``.

=====================  ==========================================================================================
module                 what
=====================  ==========================================================================================
``strategies``         the strategy table (ddp, zero1, zero2, fsdp, fully_shard, tp, pp, dp x tp / dp x pp meshes)
``trainer``            ``DistributedTrainer``: micro-batch steps, accumulation, amp, checkpoints, fit
``pipeline_window``    strategy ``pp``: this rank's pipeline stages; a window's micro-batches run by a schedule
``monitor``            ``DistributedMonitor``: CSV + TensorBoard per-step log on rank 0
=====================  ==========================================================================================

Example::

    from neural_arch.distributed.trainer import EnhancedDistributedTrainer, DistributedMonitor
    trainer = EnhancedDistributedTrainer(model, strategy="fsdp", gradient_accumulation_steps=4,
                                         checkpoint_dir="ckpt")
"""

from neural_arch.distributed.trainer.monitor import DistributedMonitor
from neural_arch.distributed.trainer.strategies import STRATEGIES, Strategy, resolve_strategy
from neural_arch.distributed.trainer.trainer import DistributedTrainer, EnhancedDistributedTrainer

__all__ = ["STRATEGIES", "DistributedMonitor", "DistributedTrainer", "EnhancedDistributedTrainer", "Strategy",
           "resolve_strategy"]
