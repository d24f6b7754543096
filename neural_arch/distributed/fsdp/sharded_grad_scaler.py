"""``ShardedGradScaler``: a GradScaler for sharded gradients (torch's FSDP name).

Each rank only sees its own gradient shards, so an inf/NaN on one rank must skip the step on
*every* rank (or the replicas diverge): the found-inf flag is OR-ed over the process group
(an all-reduce MAX of one number) before the step is taken or skipped.

Example::

    scaler = ShardedGradScaler()
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
"""

from __future__ import annotations

import numpy as np

from neural_arch.amp.grad_scaler import GradScaler
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.resolve import _resolve_group

__all__ = ["ShardedGradScaler"]


class ShardedGradScaler(GradScaler):
    """``GradScaler`` whose inf/NaN check is agreed over ``process_group`` (default: the world).

    Example::

        scaler = ShardedGradScaler()
        scaler.scale(loss).backward()
        scaler.step(opt)        # skipped on every rank when any rank's shard has inf/NaN
        scaler.update()
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0**16, backoff_factor: float = 0.5,
                 growth_factor: float = 2.0, growth_interval: int = 2000, enabled: bool = True,
                 process_group=None):
        self.process_group = _resolve_group(process_group, "ShardedGradScaler")
        super().__init__(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled,
                         found_inf_reducer=self._any_rank)

    def _any_rank(self, found: bool) -> bool:
        flag = np.array([1.0 if found else 0.0])
        self.process_group.backend.allreduce(flag, ReduceOp.MAX)
        return bool(flag[0] > 0)
