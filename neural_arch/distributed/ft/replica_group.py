"""A process group across replicas that is rebuilt for every new quorum (torchft's ``ProcessGroupGloo``).

The job's default group (``init_process_group``) has a fixed membership. The replicas of a
fault-tolerant job do not: a quorum may lose a member or gain a replacement at any step. So the
:class:`~neural_arch.distributed.ft.manager.Manager` owns this object and calls
``ProcessGroupGloo.configure`` whenever the quorum's id changes: the old backend is aborted
(peers still blocked in it fail at once, the gloo backend's poisoning, as
``elastic.in_process`` does before it re-forms the default group) and shut down, and a fresh
:class:`~neural_arch.distributed.comm.gloo.backend.GlooBackend` is connected through the
lighthouse's store under a key prefix of its own (``ft/pg/{quorum_id}/``). Every operation has
the group's timeout, so a hung peer ends in ``CollectiveTimeoutError``, never a hang.

Example::

    pg = ProcessGroupGloo(timeout=10.0)
    pg.configure(store, "ft/pg/3/", rank=1, world_size=2)   # what Manager.start_quorum does
    pg.allreduce(grads)                                      # sum across the quorum
    pg.shutdown()
"""

from __future__ import annotations

import logging

from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.rendezvous.base import PrefixStore

__all__ = ["ProcessGroupGloo"]

log = logging.getLogger("neural_arch.distributed.ft")


class ProcessGroupGloo:
    """A reconfigurable gloo group: one backend per quorum, replaced by ``configure``.

    Args:
        timeout: seconds any one operation may take (a dead or hung peer fails it then, or at once
            when its socket closes).
        transport: ``"auto"``, ``"shm"`` or ``"tcp"`` (the gloo backend's choice; None: its default).

    Example::

        pg = ProcessGroupGloo(timeout=5.0, transport="tcp")
        pg.configure(store, "ft/pg/1/", rank=0, world_size=3)
        pg.allreduce(array)            # in place, ReduceOp.SUM
    """

    def __init__(self, timeout: float = 60.0, transport: str | None = None):
        self.timeout, self.transport = float(timeout), transport
        self.backend = None
        self.prefix: str | None = None

    def configure(self, store, prefix: str, rank: int, world_size: int, auth_token=None) -> None:
        """Abort and drop the current backend, then connect ``world_size`` ranks under ``store``/``prefix``."""
        from neural_arch.distributed.comm.gloo.backend import GlooBackend

        self.abort(f"the quorum changed (new process group {prefix!r})")
        self.prefix = prefix
        self.backend = GlooBackend.create(PrefixStore(prefix, store), int(rank), int(world_size), self.timeout,
                                          transport=self.transport, auth_token=auth_token)
        # the quorum's prefix names this incarnation alike on every replica (the flight recorder's and
        # the stall inspector's group id): two quorums of the same replicas are two groups
        self.backend.group_id = prefix.rstrip("/")

    def abort(self, reason: str = "the replica left the quorum") -> None:
        """Poison the current backend on every peer (best effort) and shut it down here."""
        backend, self.backend = self.backend, None
        if backend is None:
            return
        try:
            backend.abort(reason)
        except Exception as exc:  # noqa: BLE001 - a dead peer cannot be told; it is gone anyway
            log.debug("ft: abort of the old process group: %s", exc)
        try:
            backend.shutdown()
        except Exception as exc:  # noqa: BLE001 - the group is being dropped either way
            log.debug("ft: shutdown of the old process group: %s", exc)

    shutdown = abort

    def _live(self):
        if self.backend is None:
            raise RuntimeError("ProcessGroupGloo: not configured; Manager.start_quorum() configures it")
        return self.backend

    def rank(self) -> int:
        return self._live().rank

    def size(self) -> int:
        return self._live().size

    def allreduce(self, array, op: ReduceOp = ReduceOp.SUM) -> None:
        """Reduce ``array`` (a NumPy array) in place across the group."""
        self._live().allreduce(array, op)

    def send(self, array, dst: int, tag: int = 0) -> None:
        self._live().send(array, dst, tag)

    def recv(self, array, src: int, tag: int = 0) -> None:
        self._live().recv(array, src, tag)
