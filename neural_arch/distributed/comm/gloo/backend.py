"""The gloo backend: collectives in pure Python + NumPy over shared memory or TCP.

``GlooBackend`` runs the schedules of :mod:`neural_arch.distributed.comm.gloo.plans` (ring, recursive
doubling, trees, chains; see :mod:`neural_arch.distributed.comm.gloo.executor` for which one
when, and the measurements behind the thresholds) over one :class:`~neural_arch.distributed.comm.gloo.transport.engine.Transport`
per process: shared memory between ranks of one host, TCP between hosts
(``NEURAL_ARCH_GLOO_TRANSPORT=auto|shm|tcp``). CuPy arrays are staged through host memory.

When every rank of a group is on this host (shared-memory links), all_reduce, reduce,
reduce_scatter, all_gather, broadcast, barrier and the uneven all_to_allv of that group skip the
messages: they run on one shared segment (:mod:`neural_arch.distributed.comm.gloo.shm_direct`). The world group maps
its segment during this rendezvous; a sub-group whose members are all shared-memory peers maps
its own at its first collective that would use it (lazily: jobs create many groups that never run
one, and every member reaches that collective in the same order, so the store exchange there is
deterministic), under a store key made of the group's creation path, so groups never collide.
A sub-group that spans hosts (the hierarchical all-reduce's cross-host groups), CuPy arrays,
other dtypes and the remaining ops use the plans; ``NEURAL_ARCH_GLOO_DIRECT=0`` turns the direct
path off, ``NEURAL_ARCH_GLOO_ALGO=direct|ring|...`` forces one algorithm (measurements, tests).

Sub-groups reuse the world's transport on their own channels, so creating one opens no
sockets. Point-to-point messages carry a small header (shape, dtype, tag) before the payload;
a receive whose buffer does not match fails with an error naming both sides.

Example::

    store = TCPStore("127.0.0.1", port, world_size=2, is_master=(rank == 0))
    backend = GlooBackend.create(store, rank, 2, timeout=30.0)
    x = np.full(4, float(rank + 1), np.float32)
    backend.allreduce(x)              # x == [3, 3, 3, 3] on both ranks
    sub = backend.new_group([0])      # rank 0: a group of one; rank 1: None
    backend.shutdown()
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from neural_arch import config
from neural_arch.backend import to_device_like, to_host
from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.dtypes import SUPPORTED_DTYPES
from neural_arch.distributed.comm.gloo.executor import PlanExecutor, force_algo_from_env
from neural_arch.distributed.comm.gloo.shm_direct import (
    DIRECT_DTYPES,
    DIRECT_OPS,
    alltoallv_fits,
    direct_for_every_size,
)
from neural_arch.distributed.comm.gloo.shm_direct import choose as choose_direct
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.errors import DistributedError, PeerFailureError

TRANSPORT_ENV = "NEURAL_ARCH_GLOO_TRANSPORT"
#: "0" turns the direct shared-memory collectives off (the plans then run over the shm rings)
DIRECT_ENV = "NEURAL_ARCH_GLOO_DIRECT"

# Channel layout: every group owns a block of channels; inside it, channel 0 carries the
# group's collectives and the others carry point-to-point messages, one per tag.
# Groups are numbered by their creation path ((), (1,), (1, 2), ...), which every member
# agrees on without talking (all ranks of a parent create its sub-groups in the same order);
# the path is hashed into the block number.
_GROUP_BITS = 24
_TAG_BITS = 20
_TAG_OFFSET = 1 << (_TAG_BITS - 1)          # tags in [-2**19, 2**19) map one-to-one

# p2p header: int64[16] = magic, tag, dtype code, ndim, nbytes, dims[0..10]
_MAGIC = 0x6E61676C6F6F              # "naglo o"
_HDR_LEN = 16
_MAX_HDR_DIMS = _HDR_LEN - 5
_DTYPES = sorted(str(d) for d in SUPPORTED_DTYPES)
_DTYPE_CODE = {name: i + 1 for i, name in enumerate(_DTYPES)}
_DTYPE_NAME = {i + 1: name for i, name in enumerate(_DTYPES)}
# the same codes keyed by the dtype itself: a header per message, and str(dtype) is a Python call
_DTYPE_CODE_OF = {np.dtype(d): _DTYPE_CODE[str(d)] for d in SUPPORTED_DTYPES}


def _group_block(path: Tuple[int, ...]) -> int:
    if not path:
        return 0
    digest = hashlib.blake2b(repr(path).encode(), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "little") % ((1 << _GROUP_BITS) - 1)


class GlooBackend(Backend):
    """Collectives over the neural_arch transport (see the module docstring).

    Build it with :meth:`create`; sub-groups come from
    :meth:`~neural_arch.distributed.comm.backend.Backend.new_group`. It holds ``plans``, the
    :class:`~neural_arch.distributed.comm.gloo.executor.PlanExecutor` that runs every collective the
    direct shared-memory path does not, and offers its testing seam under the same names
    (:meth:`forced_algorithm`, :meth:`chosen_algorithm`, :meth:`compiled_plans`).

    Example::

        store = TCPStore("10.0.0.1", 29500, world_size=4, is_master=(rank == 0))
        world = GlooBackend.create(store, rank, world_size=4, transport="auto")
        world.allreduce(grads, ReduceOp.AVG)
        world.shutdown()
    """

    name = "gloo"
    devices = ("cpu", "cuda")

    def __init__(self, transport, rank: int, size: int, timeout: float = 300.0,
                 group_ranks: Optional[Sequence[int]] = None, debug: Optional[bool] = None,
                 peers: Optional[Sequence[int]] = None, path: Tuple[int, ...] = (),
                 owns_transport: bool = True, direct=None, store=None, lazy_direct: bool = False,
                 segments: Optional[list] = None):
        super().__init__(rank, size, timeout, group_ranks=group_ranks, debug=debug)
        self._t = transport
        #: the direct shared-memory collectives (shm_direct.DirectCollectives) when every rank of
        #: this group is on this host and the transport is shared memory; None otherwise
        self._direct = direct
        self._direct_always = direct is not None and direct_for_every_size(size)
        #: whether all_to_allv's split table fits the segment's slots (see shm_direct.alltoallv_fits)
        self._a2av_fits = alltoallv_fits(size)
        #: the rendezvous store (sub-groups map their segments through it) and whether this group
        #: maps one at its first direct collective (see :meth:`_connect_lazy`)
        self._store = store
        self._direct_lazy = lazy_direct and direct is None
        #: every live DirectCollectives of this process (the world's and its sub-groups', one list
        #: shared by all groups of the transport): a failure poisons them all, see _poison_peers
        self._segments: list = segments if segments is not None else []
        if direct is not None:
            self._segments.append(direct)
        #: group rank -> transport (world) rank
        self._peers: List[int] = list(peers) if peers is not None else list(range(size))
        self._path = path
        self._block = _group_block(path)
        self._coll_channel = self._block << _TAG_BITS
        self._owns_transport = owns_transport
        self._children = 0
        #: runs the collectives as plans over the transport (owns the plan cache and scratch buffers)
        self.plans = PlanExecutor(transport, self._peers, rank, size, self._coll_channel, force_algo_from_env())
        self._p2p_locks: Dict[Tuple[str, int, int], threading.Lock] = {}
        self._p2p_locks_guard = threading.Lock()

    @classmethod
    def create(cls, store, rank: int, world_size: int, timeout: float = 300.0, transport: Optional[str] = None,
               auth_token=None, group_ranks: Optional[Sequence[int]] = None, debug: Optional[bool] = None,
               **opts) -> "GlooBackend":
        """Connect to the other ``world_size - 1`` ranks through ``store`` and return the world group.

        ``transport``: ``"auto"`` (shared memory on one host, TCP otherwise), ``"shm"`` or
        ``"tcp"``; default from ``NEURAL_ARCH_GLOO_TRANSPORT``, else ``"auto"``.
        Other keyword options are accepted and ignored (other backends' options).
        """
        mode = (transport or config.get(TRANSPORT_ENV) or "auto").strip().lower()
        if mode not in ("auto", "shm", "tcp"):
            raise ValueError(f"gloo transport {mode!r} is unknown; use 'auto', 'shm' or 'tcp' "
                             f"(argument transport= or ${TRANSPORT_ENV})")
        t = None
        if world_size > 1:
            from neural_arch.distributed.comm.gloo.transport.engine import (
                connect_transport,  # the transport imports sockets/shm machinery
            )

            t = connect_transport(store, rank, world_size, timeout, mode=mode, auth_token=auth_token)
            try:
                direct = _connect_direct(store, t, rank, world_size, timeout, group_ranks)
            except BaseException:
                t.close()
                raise
        else:
            direct = None
        return cls(t, rank, world_size, timeout, group_ranks=group_ranks, debug=debug, direct=direct,
                   store=store)

    # -- the plans' testing seam (see PlanExecutor) --------------------------------------------------
    @contextlib.contextmanager
    def forced_algorithm(self, algo: Optional[str]) -> Iterator["GlooBackend"]:
        """:meth:`PlanExecutor.forced_algorithm <neural_arch.distributed.comm.gloo.executor.PlanExecutor.forced_algorithm>`
        for this group (``"direct"`` also decides the shared-memory path); yields the backend.

        >>> with backend.forced_algorithm("ring"):          # doctest: +SKIP
        ...     backend.allreduce(x)                        # the ring, whatever the size
        """
        with self.plans.forced_algorithm(algo):
            yield self

    def compiled_plans(self) -> list:
        """The plans this group compiled so far, oldest first (:meth:`PlanExecutor.compiled_plans
        <neural_arch.distributed.comm.gloo.executor.PlanExecutor.compiled_plans>`).

        >>> [p.algorithm for p in backend.compiled_plans()]   # doctest: +SKIP
        ['recursive_doubling_allreduce']
        """
        return self.plans.compiled_plans()

    # -- point to point ------------------------------------------------------------------------------
    def _tag_channel(self, tag: int) -> int:
        if not -_TAG_OFFSET <= tag < _TAG_OFFSET - 1:
            raise ValueError(f"tag={tag} is out of range for the gloo backend; use a tag in "
                             f"[0, {_TAG_OFFSET - 2}] (negative tags are reserved)")
        return self._coll_channel + 1 + tag + _TAG_OFFSET

    def _validate_tag(self, tag: int) -> None:
        super()._validate_tag(tag)
        self._tag_channel(int(tag))   # range check, in the caller, before any I/O

    def _poison_peers(self, info: OpInfo, exc: BaseException) -> None:
        # The transport is shared by every group of this process: its abort message reaches all
        # ranks, and every group on every rank then fails naming this first failure.
        # A timeout too: the op's first frames may already sit in a late peer's stream, and that
        # peer would otherwise take them for its own op and return data. A dead peer is already
        # propagated by the transport's abort message.
        why = (f"{info.describe()} on group {self.group_ranks} failed on rank "
               f"{self.group_ranks[self._rank]}: {type(exc).__name__}: {exc}")
        # Ranks waiting in a shared-memory barrier read no socket: the segments' flags wake them --
        # every segment of this process, not only this group's: a peer may be waiting for this
        # rank in another group's barrier (the world's, or a host group's during a hierarchical
        # all-reduce), and it would otherwise wait for the full timeout.
        for direct in list(self._segments):
            direct.seg.poison(why)
        if isinstance(exc, PeerFailureError):
            return
        if self._t is not None:
            self._t.poison(why)

    def _p2p_lock(self, kind: str, peer: int, channel: int) -> threading.Lock:
        # Header and payload must travel back to back even if two threads send on one tag.
        key = (kind, peer, channel)
        with self._p2p_locks_guard:
            lock = self._p2p_locks.get(key)
            if lock is None:
                lock = self._p2p_locks[key] = threading.Lock()
        return lock

    @staticmethod
    def _header(array, tag: int) -> np.ndarray:
        hdr = np.full(_HDR_LEN, -1, dtype=np.int64)
        hdr[0], hdr[1] = _MAGIC, tag
        code = _DTYPE_CODE_OF.get(array.dtype)
        hdr[2] = code if code is not None else _DTYPE_CODE.get(str(array.dtype), 0)
        hdr[3] = array.ndim
        hdr[4] = array.nbytes
        shape = array.shape[:_MAX_HDR_DIMS]
        hdr[5:5 + len(shape)] = shape
        return hdr

    @staticmethod
    def _describe_header(hdr: np.ndarray) -> str:
        ndim = int(hdr[3])
        shape = tuple(int(d) for d in hdr[5:5 + min(ndim, _MAX_HDR_DIMS)])
        return f"shape {shape} {_DTYPE_NAME.get(int(hdr[2]), '?')} ({int(hdr[4])} bytes)"

    def _send(self, array, dst: int, tag: int, info: OpInfo) -> None:
        channel = self._tag_channel(tag)
        host = to_host(array)  # device arrays are staged through the host
        peer = self._peers[dst]
        with self._p2p_lock("send", peer, channel):
            self._t.send(peer, self._header(host, tag), channel, info)
            if host.nbytes:
                self._t.send(peer, _bytes(host), channel, info)

    def _recv(self, array, src: int, tag: int, info: OpInfo) -> None:
        channel = self._tag_channel(tag)
        peer = self._peers[src]
        host = array if isinstance(array, np.ndarray) else np.empty(array.shape, array.dtype)
        with self._p2p_lock("recv", peer, channel):
            hdr = np.empty(_HDR_LEN, dtype=np.int64)
            self._t.recv_into(peer, hdr, channel, info)
            self._check_header(hdr, host, src, tag, peer, channel, info)
            if host.nbytes:
                self._t.recv_into(peer, _bytes(host), channel, info)
        if host is not array:
            to_device_like(host, array, out=array)

    def _mismatch(self, hdr, host, src, tag, info) -> Optional[str]:
        """None when the incoming header matches ``host``; else the error message naming both sides."""
        if int(hdr[0]) != _MAGIC:
            raise DistributedError(f"{info.describe()}: rank {self.global_rank(src)} sent a message that is "
                                   "not a gloo point-to-point header; the two ranks disagree about the "
                                   "order of send/recv calls")
        expected = self._header(host, tag)
        # bytes, not np.array_equal: a recv's hot path, where array_equal's Python layers cost more
        # than the comparison (and many times more on a process's first message)
        if hdr[1:].tobytes() == expected[1:].tobytes():
            return None
        return (f"{info.describe()}: rank {self.global_rank(src)} sent {self._describe_header(hdr)} with tag "
                f"{int(hdr[1])}, but this rank ({self.group_ranks[self._rank]}) receives into "
                f"{self._describe_header(expected)} with tag {tag}; make the recv buffer match the send "
                "(same shape and dtype)")

    @staticmethod
    def _drain_buffer(hdr) -> Optional[np.ndarray]:
        # Receiving the sender's payload anyway keeps the stream in step: later messages still match.
        nbytes = int(hdr[4])
        return np.empty(nbytes, np.uint8) if 0 < nbytes <= (1 << 34) else None

    def _check_header(self, hdr, host, src, tag, peer, channel, info) -> None:
        problem = self._mismatch(hdr, host, src, tag, info)
        if problem is not None:
            drain = self._drain_buffer(hdr)
            if drain is not None:
                self._t.recv_into(peer, drain, channel, info)
            raise ValueError(problem)

    def _sendrecv(self, send_array, dst: int, recv_array, src: int, tag: int, info: OpInfo) -> None:
        """Header exchange, then payload exchange, both concurrent (no deadlock in rings).

        On a shape/dtype mismatch both payloads still travel (the wrong one is drained), then
        ValueError: the peers stay in step and can go on communicating.
        """
        if dst == self._rank or src == self._rank:
            raise ValueError("sendrecv: a rank cannot exchange with itself")
        channel = self._tag_channel(tag)
        host_out = to_host(send_array)
        host_in = recv_array if isinstance(recv_array, np.ndarray) else np.empty(recv_array.shape,
                                                                               recv_array.dtype)
        pd, ps = self._peers[dst], self._peers[src]
        hdr = np.empty(_HDR_LEN, dtype=np.int64)
        with self._p2p_lock("send", pd, channel), self._p2p_lock("recv", ps, channel):
            self._t.sendrecv(pd, self._header(host_out, tag), ps, hdr, channel, info)
            problem = self._mismatch(hdr, host_in, src, tag, info)
            incoming = _bytes(host_in) if problem is None else self._drain_buffer(hdr)
            if incoming is not None and not incoming.nbytes:
                incoming = None
            if host_out.nbytes and incoming is not None:
                self._t.sendrecv(pd, _bytes(host_out), ps, incoming, channel, info)
            elif host_out.nbytes:
                self._t.send(pd, _bytes(host_out), channel, info)
            elif incoming is not None:
                self._t.recv_into(ps, incoming, channel, info)
        if problem is not None:
            raise ValueError(problem)
        if host_in is not recv_array:
            to_device_like(host_in, recv_array, out=recv_array)

    # -- direct shared-memory collectives (falling back to the plans) ----------------------------------
    def _use_direct(self, array, nbytes: int) -> bool:
        """Whether ``array`` takes the direct path (true also for a sub-group that has not mapped its
        segment yet: the op then calls :meth:`_connect_lazy` first)."""
        if not self._has_direct() or type(array) is not np.ndarray or array.dtype not in DIRECT_DTYPES:
            return False
        force = self.plans.force
        if force:    # an algorithm forced for measurements/tests: "direct", or a plan
            return "direct" in force
        return self._direct_always or choose_direct(self._size, nbytes) == "direct"

    def chosen_algorithm(self, op: str, array=None, root: int = 0) -> str:
        """``"direct"`` where the shared-memory collectives would run ``op`` on ``array``, else the
        plan's name (see :meth:`PlanExecutor.chosen_algorithm
        <neural_arch.distributed.comm.gloo.executor.PlanExecutor.chosen_algorithm>`).

        >>> backend.chosen_algorithm("all_reduce", np.ones(16, np.float32))   # doctest: +SKIP
        'direct'
        """
        if op == "all_to_allv" and self._size > 1 and type(array) is np.ndarray and self._use_direct_alltoallv():
            return "direct"
        if op in DIRECT_OPS and self._size > 1 and (op == "barrier" or array.size):
            # the same tests as the collectives below
            if op == "barrier":
                if self._has_direct() and (not self.plans.force or "direct" in self.plans.force):
                    return "direct"
            elif self._use_direct(array, array.nbytes):
                return "direct"
        return self.plans.chosen_algorithm(op, array, root)

    def _has_direct(self) -> bool:
        return self._direct is not None or self._direct_lazy

    def _prepare_direct(self, info: OpInfo) -> None:
        """Before a direct collective: fail if another group of this process broke the shared
        transport, and map this sub-group's segment if it has none yet (:meth:`_connect_lazy`)."""
        # another group of this process (sharing the transport) failed: the world fails too, as it
        # would over the transport
        if getattr(self._t, "_abort", None) is not None:
            raise self._t._abort_error(info)
        if self._direct is None:
            self._connect_lazy(info)

    def _connect_lazy(self, info: OpInfo) -> None:
        """Map this sub-group's segment (every member runs this at the same collective: the group's
        first one that takes the direct path, which the same tests decide on every rank)."""
        from neural_arch.distributed.comm.gloo.shm_direct import DirectCollectives
        from neural_arch.distributed.comm.gloo.transport.shm_segment import ShmSegment
        from neural_arch.distributed.errors import RendezvousError

        # one key namespace per creation path (the world's is "gloo/direct"): never shared
        prefix = "gloo/direct/g" + ".".join(str(i) for i in self._path)
        try:
            t = self._t     # every rank of the job on this host competes for its cores, not only ours
            local = 1 + sum(1 for p in range(t.size) if p != t.rank and t.peer_kind(p) == "shm")
            seg = ShmSegment.connect(self._store, self._rank, self._size, info.deadline,
                                     names=self.group_ranks, prefix=prefix, local_ranks=local,
                                     pids=_peer_pids(t, self._peers))
        except RendezvousError as exc:
            raise RendezvousError(f"{info.describe()} on group {self.group_ranks}: {exc}") from None
        self._direct = DirectCollectives(seg)
        self._direct_lazy = False
        self._direct_always = direct_for_every_size(self._size)
        self._segments.append(self._direct)

    def _allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        # the latency-critical path: the checks of _use_direct/_prepare_direct inlined
        if (self._direct_always and not self.plans.force and type(array) is np.ndarray
                and array.dtype in DIRECT_DTYPES):
            if self._t._abort is not None:
                raise self._t._abort_error(info)
            if array.size:
                self._direct.all_reduce(array if array.ndim == 1 else array.reshape(-1), op, info)
            return
        if self._use_direct(array, array.nbytes):
            self._prepare_direct(info)
            if array.size:
                self._direct.all_reduce(array.reshape(-1), op, info)
            return
        self.plans.allreduce(array, op, info)

    def _reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        if self._use_direct(array, array.nbytes):
            self._prepare_direct(info)
            if array.size:
                flat = array.reshape(-1)
                buf = flat if self._rank == root else np.copy(flat)   # non-roots keep their input
                self._direct.all_reduce(buf, op, info, root=root)
            return
        self.plans.reduce(array, root, op, info)

    def _broadcast(self, array, root: int, info: OpInfo) -> None:
        if self._use_direct(array, array.nbytes):
            self._prepare_direct(info)
            if array.size:
                self._direct.broadcast(array.reshape(-1), root, info)
            return
        self.plans.broadcast(array, root, info)

    def _allgather(self, output, input, info: OpInfo) -> None:
        if self._use_direct(input, input.nbytes) and type(output) is np.ndarray:
            self._prepare_direct(info)
            if input.size:
                self._direct.all_gather(output.reshape(-1), input.reshape(-1), info)
            else:
                output.reshape(-1)[:] = input.reshape(-1)
            return
        self.plans.allgather(output, input, info)

    def _reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        if self._use_direct(input, input.nbytes) and type(output) is np.ndarray:
            self._prepare_direct(info)
            if output.size:
                self._direct.reduce_scatter(output.reshape(-1), input.reshape(-1), op, info)
            return
        self.plans.reduce_scatter(output, input, op, info)

    def _alltoall(self, output, input, info: OpInfo) -> None:
        self.plans.alltoall(output, input, info)

    def _alltoallv(self, output, input, output_splits: list, input_splits: list, info: OpInfo) -> None:
        # host arrays of any dtype on a same-host group: the segment (bytes move, nothing is reduced);
        # every rank decides the same (array kinds, group size and forced algorithm agree across ranks)
        if type(input) is np.ndarray and type(output) is np.ndarray:
            direct = self._direct
            if direct is not None and not self.plans.force and self._a2av_fits:
                # the mixture of experts' latency path: _prepare_direct's abort check, inline
                if self._t._abort is not None:
                    raise self._t._abort_error(info)
                direct.alltoallv(output, input, output_splits, input_splits, info.nbytes, info)
                return
            if self._use_direct_alltoallv():
                self._prepare_direct(info)
                self._direct.alltoallv(output, input, output_splits, input_splits, info.nbytes, info)
                return
        self.plans.alltoallv(output, input, output_splits, input_splits, info)

    def _use_direct_alltoallv(self) -> bool:
        """Whether this group's all_to_allv of host arrays runs on the shared segment."""
        if not self._has_direct() or not self._a2av_fits:
            return False
        force = self.plans.force
        return not force or "direct" in force

    def _barrier(self, info: OpInfo) -> None:
        if self._has_direct() and (not self.plans.force or "direct" in self.plans.force):
            self._prepare_direct(info)
            self._direct.barrier(info)
            return
        self.plans.barrier(info)

    # -- groups and teardown --------------------------------------------------------------------------
    def _new_group(self, ranks: List[int]) -> Optional["GlooBackend"]:
        # Every rank of this group calls new_group in the same order, so the counter (and with
        # it the child's channel block) agrees everywhere without a message.
        self._children += 1
        path = self._path + (self._children,)
        if self._rank not in ranks:
            return None
        peers = [self._peers[r] for r in ranks]
        # No I/O here: a same-host group maps its segment at its first direct collective
        lazy = self._store is not None and _direct_possible(self._t, peers, self._peers[self._rank])
        return GlooBackend(self._t, ranks.index(self._rank), len(ranks), self.timeout,
                           group_ranks=[self.group_ranks[r] for r in ranks], debug=self.debug,
                           peers=peers, path=path, owns_transport=False, store=self._store,
                           lazy_direct=lazy, segments=self._segments)

    def interrupt_waits(self) -> None:
        for direct in [self._direct, *(self._segments if self._owns_transport else ())]:
            if direct is not None:
                direct.seg.interrupt_waits()
        if self._owns_transport and self._t is not None:    # a sub-group shares the world's links: not its call
            self._t.interrupt_waits()

    def _shutdown(self) -> None:
        self.plans.clear()
        self._direct_lazy = False
        if self._direct is not None:
            try:
                self._segments.remove(self._direct)
            except ValueError:
                pass
            self._direct.close()
            self._direct = None
        if self._owns_transport:
            # the world goes last (destroy_process_group shuts sub-groups first); a sub-group left
            # open by hand loses its segment with the transport
            for direct in list(self._segments):
                direct.close()
            self._segments.clear()
            if self._t is not None:
                self._t.close()

    def transport_kinds(self) -> Dict[int, str]:
        """``{group rank: "shm" | "tcp"}`` for every peer (useful to check what ``auto`` picked)."""
        return {r: self._t.peer_kind(p) for r, p in enumerate(self._peers) if r != self._rank}


def _connect_direct(store, transport, rank: int, size: int, timeout: float, group_ranks):
    """The direct shared-memory collectives of the world group, or None: only when every peer is a
    shared-memory link (one host), the machine supports it, and ``NEURAL_ARCH_GLOO_DIRECT`` is not 0.
    Every rank takes the same decision (the transport kinds and the environment agree across ranks)."""
    import time

    from neural_arch.distributed.comm.gloo.shm_direct import DirectCollectives
    from neural_arch.distributed.comm.gloo.transport.shm_segment import ShmSegment

    if not _direct_possible(transport, range(size), rank):
        return None
    names = list(group_ranks) if group_ranks is not None else list(range(size))
    seg = ShmSegment.connect(store, rank, size, time.monotonic() + timeout, names=names,
                             pids=_peer_pids(transport, range(size)))
    return DirectCollectives(seg)


def _peer_pids(transport, peers) -> dict[int, int]:
    """``{group rank: pid}`` of the members that are shared-memory peers of ``transport`` (their links
    know the pid): the segment's set-up watches them, so a member that dies there is named at once."""
    out = {}
    for i, p in enumerate(peers):
        pid = getattr(transport.links.get(p), "pid", None) if hasattr(transport, "links") else None
        if pid:
            out[i] = pid
    return out


def _direct_possible(transport, peers, me: int) -> bool:
    """Whether a group of the transport ranks ``peers`` (``me`` among them) can run the direct
    collectives: more than one rank, every other one a shared-memory link, the machine supports
    it, and ``NEURAL_ARCH_GLOO_DIRECT`` is not 0. Every member decides the same (link kinds are
    symmetric, the environment agrees across ranks)."""
    from neural_arch.distributed.comm.gloo.transport.shm_segment import direct_supported

    others = [p for p in peers if p != me]
    if not others or transport is None or not config.get(DIRECT_ENV) or not direct_supported():
        return False
    return all(transport.peer_kind(p) == "shm" for p in others)


def _bytes(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view (every dtype, bool and float16 included, travels as raw bytes)."""
    return array.reshape(-1).view(np.uint8)
