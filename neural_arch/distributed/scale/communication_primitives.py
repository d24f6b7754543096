"""Seed 000's ``AdvancedCollectiveOps``: the collectives as methods of one object.

Every method calls the project's collective of the same name (``neural_arch.distributed``'s
``all_reduce``, ``broadcast`` ...), so the choice between the flat and the hierarchical
all-reduce is the one ``dist.all_reduce`` makes (:mod:`~neural_arch.distributed.algorithms.hierarchical_auto`:
hierarchical on gloo groups spanning machines, from 1 MiB up); nothing is re-implemented here.
Methods take Tensors or NumPy/CuPy arrays and work in place where torch does.

``world_size`` and ``rank`` are checked against the initialised group: a mismatch is a
``ValueError`` at construction. Without a group the object may still be built (the seed's quick
start builds one for 8 ranks in a single process), but a collective then needs ``world_size=1``,
where every collective returns its input, as the project's world of one does.

Example (every rank of a 2-rank job)::

    ops = AdvancedCollectiveOps(world_size=2, rank=dist.get_rank(), topology=topology)
    ops.all_reduce(np.ones(3))        # array([2., 2., 2.]) on both ranks
"""

from __future__ import annotations

import numpy as np  # noqa: F401 - the docstring examples use it

from neural_arch.core.tensor import Tensor
from neural_arch.distributed import collectives
from neural_arch.distributed.algorithms.hierarchical_auto import all_reduce_algorithm
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.groups import get_rank, get_world_size, is_initialized

__all__ = ["AdvancedCollectiveOps", "create_collective_ops"]


def _copy(tensor):
    """A new object of ``tensor``'s kind holding a copy of its values (a world of one's all_gather)."""
    if isinstance(tensor, Tensor):
        return Tensor(tensor.data.copy())
    return tensor.copy()


class AdvancedCollectiveOps:
    """The collectives of a job of ``world_size`` ranks, seen from ``rank``.

    ``topology``: a :class:`~neural_arch.distributed.topology.Topology` (from
    ``HardwareTopologyManager().discover_topology()``); kept for the caller and shown by
    ``describe()``. The flat/hierarchical choice needs no topology: it is the group's own
    (``algorithm(nbytes)`` says which form an all-reduce of a given size takes).

    Example::

        >>> ops = AdvancedCollectiveOps(world_size=1, rank=0)     # no group: a world of one
        >>> ops.all_reduce(np.arange(3.0))
        array([0., 1., 2.])
        >>> [a.tolist() for a in ops.all_gather(np.ones(2))]
        [[1.0, 1.0]]
    """

    def __init__(self, world_size: int, rank: int, topology=None, group=None) -> None:
        self.world_size, self.rank = int(world_size), int(rank)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"AdvancedCollectiveOps(world_size={world_size}, rank={rank}): need "
                             "world_size >= 1 and 0 <= rank < world_size")
        self.topology, self.group = topology, group
        if is_initialized():
            self._check_group()

    # -- which group, and does it match ------------------------------------------------------
    def _check_group(self) -> None:
        size, me = get_world_size(self.group), get_rank(self.group)
        if (size, me) != (self.world_size, self.rank):
            raise ValueError(f"AdvancedCollectiveOps(world_size={self.world_size}, rank={self.rank}) but the "
                             f"initialised group has world_size={size} and this process is rank {me}; pass "
                             "world_size=dist.get_world_size(), rank=dist.get_rank()")

    def _live(self, op: str) -> bool:
        """True: run the real collective; False: a world of one without a group (identity)."""
        if is_initialized():
            self._check_group()
            return True
        if self.world_size == 1:
            return False
        raise RuntimeError(f"AdvancedCollectiveOps.{op}: built for world_size={self.world_size}, but no process "
                           "group is initialised in this process; call init_process_group() on every rank "
                           "first (the launcher or mpiexec starts the ranks)")

    # -- the collectives -------------------------------------------------------------------------
    def all_reduce(self, tensor, op=ReduceOp.SUM):
        """Reduce ``tensor`` over the ranks, in place; returns it (``dist.all_reduce``: flat or
        hierarchical, as the group decides).

        Example::

            >>> AdvancedCollectiveOps(1, 0).all_reduce(np.ones(2), op="avg")
            array([1., 1.])
        """
        if self._live("all_reduce"):
            collectives.all_reduce(tensor, op=ReduceOp.coerce(op), group=self.group)
        return tensor

    def broadcast(self, tensor, src: int = 0):
        """Copy rank ``src``'s ``tensor`` into every rank's, in place; returns it.

        Example::

            >>> AdvancedCollectiveOps(1, 0).broadcast(np.arange(2.0), src=0)
            array([0., 1.])
        """
        if self._live("broadcast"):
            collectives.broadcast(tensor, src=src, group=self.group)
        return tensor

    def reduce(self, tensor, dst: int = 0, op=ReduceOp.SUM):
        """Reduce ``tensor`` into rank ``dst``'s (in place there); returns it.

        Example::

            >>> AdvancedCollectiveOps(1, 0).reduce(np.ones(2), dst=0)
            array([1., 1.])
        """
        if self._live("reduce"):
            collectives.reduce(tensor, dst=dst, op=ReduceOp.coerce(op), group=self.group)
        return tensor

    def all_gather(self, tensor) -> list:
        """Every rank's ``tensor``, in rank order (a new list of the same kind as ``tensor``).

        Example::

            >>> [a.tolist() for a in AdvancedCollectiveOps(1, 0).all_gather(np.zeros(1))]
            [[0.0]]
        """
        if self._live("all_gather"):
            return collectives.all_gather(tensor, group=self.group)
        return [_copy(tensor)]

    def reduce_scatter(self, tensor, op=ReduceOp.SUM):
        """Reduce ``tensor`` (dim 0 divisible by ``world_size``) and return this rank's chunk of dim 0.

        Example::

            >>> AdvancedCollectiveOps(1, 0).reduce_scatter(np.ones(4)).shape
            (4,)
        """
        if self._live("reduce_scatter"):
            return collectives.reduce_scatter(tensor, ReduceOp.coerce(op), group=self.group)
        return _copy(tensor)

    def barrier(self) -> None:
        """Wait until every rank has reached the barrier.

        Example::

            >>> AdvancedCollectiveOps(1, 0).barrier()
        """
        if self._live("barrier"):
            collectives.barrier(group=self.group)

    # -- what it runs ------------------------------------------------------------------------------
    def algorithm(self, nbytes: int) -> str:
        """The form an all-reduce of ``nbytes`` takes: ``"flat"``, ``"leader"`` or ``"2d"``
        (collective the first time a large size is asked on a group spanning hosts: call it on every rank).

        Example::

            >>> AdvancedCollectiveOps(1, 0).algorithm(64 << 20)
            'flat'
        """
        if not self._live("algorithm"):
            return "flat"
        return all_reduce_algorithm(int(nbytes), group=self.group)

    def describe(self) -> str:
        """One line: ranks, hosts (from the topology, when given).

        Example::

            >>> AdvancedCollectiveOps(8, 0).describe()
            'AdvancedCollectiveOps: rank 0 of 8; topology not given'
        """
        where = "topology not given"
        if self.topology is not None:
            where = f"topology: {self.topology.world_size} rank(s) on {self.topology.num_hosts} host(s)"
        return f"AdvancedCollectiveOps: rank {self.rank} of {self.world_size}; {where}"

    __repr__ = describe


def create_collective_ops(world_size: int | None = None, rank: int | None = None, topology=None,
                          group=None) -> AdvancedCollectiveOps:
    """An :class:`AdvancedCollectiveOps`; ``world_size``/``rank`` default to the initialised group's
    (1 and 0 without one).

    Example::

        >>> create_collective_ops().world_size
        1
    """
    live = is_initialized()
    if world_size is None:
        world_size = get_world_size(group) if live else 1
    if rank is None:
        rank = get_rank(group) if live else 0
    return AdvancedCollectiveOps(world_size, rank, topology, group)

