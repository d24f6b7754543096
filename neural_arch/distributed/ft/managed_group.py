"""``ManagedProcessGroup``: the cross-replica lane as a group a sharded strategy can reduce over
(torchft's ``ManagedProcessGroup``).

ZeRO-2 inside each fault-tolerant replica reduce-scatters the gradients over the replica's own
ranks, then averages each shard over the ranks holding the same shard index in the other
replicas: that second reduction is this shard's *lane*, which only the replica's
:class:`~neural_arch.distributed.ft.manager.Manager` (``shard=(index, count)``) knows, and which
it re-forms at every quorum. This object is the adapter: its ``backend.allreduce`` is
:meth:`Manager.allreduce <neural_arch.distributed.ft.manager.Manager.allreduce>`, so a failure
in the lane is recorded as the step's failure (never raised into backward: the replica's own
collectives stay in step) and ``should_commit()`` is False on every member::

    manager = ft.Manager(..., replica_id="replica_a", shard=(group.rank(), group.size()))
    opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, process_group=group, stage=2,
                                  replicate_group=ft.ManagedProcessGroup(manager), lr=1e-3)

``fully_shard`` takes it the same way (``fully_shard(model, replicate_group=ft.ManagedProcessGroup(manager))``):
each module's reduce-scattered gradient shard is averaged over the lane, in place of HSDP's
replicate dimension, whose size would be fixed.
"""

from __future__ import annotations

from neural_arch.distributed.comm.work import ReduceOp

__all__ = ["ManagedProcessGroup"]


class ManagedProcessGroup:
    """The quorum's replicas, seen from one shard of one replica, as a process group.

    ``size()`` is the number of replicas in the current quorum and ``rank()`` this replica's place
    in it; ``backend`` is the group itself. ``allreduce(array, op)`` averages (``ReduceOp.AVG``) or
    sums (``ReduceOp.SUM``) ``array`` in place across this shard's lane, through the manager: after a
    failure in the step it does nothing, and the step is not committed anywhere.

    Example::

        lane = ManagedProcessGroup(manager)
        lane.backend.allreduce(grad_shard, ReduceOp.AVG)     # what ZeRO-2's reducer calls
        manager.should_commit()                              # False if any lane failed this step
    """

    def __init__(self, manager):
        self.manager = manager

    @property
    def backend(self) -> ManagedProcessGroup:
        """The group itself, since the strategies call ``group.backend.allreduce(...)``."""
        return self

    def size(self) -> int:
        """Replicas in the current quorum."""
        return self.manager.num_participants()

    def rank(self) -> int:
        """This replica's index in the current quorum."""
        return self.manager.participating_rank()

    def allreduce(self, array, op: ReduceOp = ReduceOp.SUM, async_op: bool = False) -> None:
        """Reduce ``array`` in place across the lane (AVG or SUM); a failure is the manager's to record."""
        if async_op:
            raise NotImplementedError("ManagedProcessGroup.allreduce(async_op=True): the lane reduces synchronously")
        if op not in (ReduceOp.AVG, ReduceOp.SUM):
            raise ValueError(f"ManagedProcessGroup.allreduce supports ReduceOp.AVG and ReduceOp.SUM, not {op}")
        self.manager.allreduce(array)        # the average over the quorum (a no-op after a failure)
        if op == ReduceOp.SUM and self.manager.errored() is None:
            array *= self.manager.num_participants()
