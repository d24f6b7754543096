"""Uneven inputs for DistributedDataParallel: ``with model.join(): ...``.

The protocol, one *round* per forward of the ranks that still train:

* a training rank all-reduces ``[1, will_sync]`` before each forward (``will_sync``: this
  forward's backward will all-reduce gradients);
* a rank that left its loop (``__exit__``) all-reduces ``[0, 0]`` in a loop: while the sum says
  some ranks still train, it runs the same bucket all-reduces with zeros (when ``will_sync``);
  once the sum is ``[0, 0]`` every rank is done and they leave together;
* finally every rank takes the parameters and buffers of the rank that ran the most rounds
  (its optimizer saw every step), so all replicas end identical.

Example::

    with ddp.join():
        for x, y in my_uneven_batches:
            loss_fn(ddp(x), y).backward()
            opt.step(); opt.zero_grad()
"""

from __future__ import annotations

import numpy as np

from neural_arch.backend import to_host
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.ddp.replicas import broadcast_arrays

__all__ = ["Join"]


class Join:
    """Context manager returned by
    :meth:`~neural_arch.distributed.ddp.distributed_data_parallel.DistributedDataParallel.join`
    (see the module docstring).

    Example::

        with ddp.join():                         # ranks may run different numbers of batches
            for x, y in my_uneven_batches:
                loss_fn(ddp(x), y).backward()
    """

    def __init__(self, ddp, enable: bool = True, throw_on_early_termination: bool = False):
        self.ddp = ddp
        self.enable = bool(enable) and ddp._backend.size > 1
        self.throw = bool(throw_on_early_termination)
        self.rounds = 0

    def __enter__(self):
        if self.enable:
            if self.ddp._join is not None:
                raise RuntimeError("DistributedDataParallel.join() blocks cannot be nested")
            self.ddp._join = self
        return self

    # called by DDP.forward on a rank that still trains
    def before_forward(self, will_sync: bool) -> None:
        flag = self._allreduce_flag(1, int(will_sync))
        self.rounds += 1
        if self.throw and flag[0] < self.ddp._backend.size:
            raise RuntimeError(f"DistributedDataParallel.join(throw_on_early_termination=True): "
                               f"{self.ddp._backend.size - int(flag[0])} rank(s) ran out of inputs; "
                               "stopping every rank")

    def __exit__(self, exc_type, exc, tb):
        if not self.enable:
            return False
        try:
            if exc_type is not None:
                return False  # the other ranks will fail on the backend's timeout, loudly
            self._shadow_until_all_done()
            self._sync_final_model()
        finally:
            self.ddp._join = None
        return False

    def _allreduce_flag(self, active: int, will_sync: int) -> np.ndarray:
        """SUM over ranks of [still training, will sync]; on the buckets' device, returned on the host."""
        flag = self.ddp.reducer.xp.asarray([active, will_sync], dtype=np.int64)
        self.ddp._backend.allreduce(flag, ReduceOp.SUM)
        return to_host(flag)

    def _shadow_until_all_done(self) -> None:
        while True:
            flag = self._allreduce_flag(0, 0)
            if flag[0] == 0:
                return
            if self.throw:
                raise RuntimeError("DistributedDataParallel.join(throw_on_early_termination=True): "
                                   "this rank ran out of inputs while others still train; stopping every rank")
            if flag[1] > 0:
                self.ddp.reducer.shadow_backward()

    def _sync_final_model(self) -> None:
        backend = self.ddp._backend
        xp = self.ddp.reducer.xp
        rounds = xp.zeros((backend.size, 1), dtype=np.int64)
        backend.allgather(rounds, xp.asarray([self.rounds], dtype=np.int64))
        authority = int(xp.argmax(rounds[:, 0]))  # first rank among those that trained longest
        broadcast_arrays([p.data for p in self.ddp._params], backend, root=authority)
        buffers = [b.data for _, b in self.ddp.module.named_buffers() if b is not None]
        if buffers:
            broadcast_arrays(buffers, backend, root=authority)
