"""The world of one: every collective is a correct no-op.

``init_process_group()`` with nothing in the environment gives this backend, so one
script runs unchanged in a notebook, under ``python``, under ``mpiexec`` or under the
launcher. The public methods of :class:`~neural_arch.distributed.comm.backend.Backend` already
short-cut ``size == 1``; the
primitives below are only reached through sub-groups of one.

Example::

    backend = LocalBackend()
    backend.allreduce(np.ones(3))      # unchanged: the sum over one rank
"""

from __future__ import annotations

from typing import List

from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.errors import DistributedError


class LocalBackend(Backend):
    """The backend of a world of one (``size == 1``): collectives leave their buffers as they are.

    Example::

        >>> import numpy as np
        >>> backend = LocalBackend()
        >>> out = np.zeros((1, 2))
        >>> backend.allgather(out, np.array([1.0, 2.0])).wait()
        True
        >>> out
        array([[1., 2.]])
    """

    name = "local"
    devices = ("cpu", "cuda")

    def __init__(self, timeout: float = 300.0, global_rank: int = 0, debug=None):
        super().__init__(0, 1, timeout, group_ranks=[global_rank], debug=debug)

    @classmethod
    def create(cls, store=None, rank: int = 0, world_size: int = 1, timeout: float = 300.0, **options):
        if world_size != 1:
            raise ValueError(f"the local backend is a world of one; got world_size={world_size}")
        return cls(timeout=timeout)

    def _allreduce(self, array, op, info) -> None:
        pass

    def _broadcast(self, array, root, info) -> None:
        pass

    def _allgather(self, output, input, info) -> None:
        output[0] = input

    def _send(self, array, dst, tag, info) -> None:  # unreachable: base rejects dst == self
        raise DistributedError("a world of one has no peer to send to")

    def _recv(self, array, src, tag, info) -> None:
        raise DistributedError("a world of one has no peer to receive from")

    def _new_group(self, ranks: List[int]) -> Backend:
        return LocalBackend(self.timeout, self.group_ranks[0], self.debug)
