"""How one operation runs: numbered, on its lane or inline, checked, timed, poisoned on failure.

:class:`OpRunner` is the base class of every :class:`~neural_arch.distributed.comm.backend.Backend`:
it owns a group's identity (rank, size, global ranks, timeout), its sequence numbers, its progress
lanes and its failure state, and runs each operation the same way:

* ``_new_info`` numbers the op per group (``info.seq``; point-to-point ops have their own counter);
* ``_run`` runs it inline on the caller's thread when the call is synchronous and its lane is idle
  (the latency-critical path: no lock, Event or thread hop), else queues it on its lane
  (:class:`~neural_arch.distributed.comm.lanes.SerialLane`), whose thread calls ``_execute``;
* with ``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL`` it first compares the op's fingerprint across ranks
  (``_debug_check``, through the backend's ``_allgather``);
* when someone listens, the op is one ``"collective"`` profiler span
  (:mod:`neural_arch.distributed.comm.spans`);
* while it runs, the op sits in the backend's slot (``_op_now``, or ``_p2p_now`` for point-to-point
  ops), where the stall inspector finds it (``spans.in_flight``) without any per-op record;
* an op that fails once data may have moved **poisons** the group (``_failed``): every later op
  here fails naming that first failure, and ``_poison_peers`` (the backend's) tells the other ranks.
* each op is one record in the flight recorder's ring (``_fr``;
  :mod:`neural_arch.distributed.flight_recorder`; its group field is ``_fr_group``, the members
  and the group's :attr:`~OpRunner.group_id`), built in the caller's thread and moved from
  queued to started to completed or failed; a group's first failure dumps the ring
  (``_failed``), for ``python -m neural_arch.distributed.flight_recorder``.

Example (any backend; the world of one runs everything inline)::

    >>> import numpy as np
    >>> from neural_arch.distributed.comm.local import LocalBackend
    >>> b = LocalBackend()
    >>> w = b.allreduce(np.ones(2)); (w.is_completed(), w.info.seq)
    (True, 1)
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from neural_arch import config
from neural_arch.distributed.comm import spans as _spans
from neural_arch.distributed.comm.debug import (
    _P2P_NAMES,
    FINGERPRINT_LEN,
    OP_CODES,
    describe_fingerprint,
    fingerprint,
    wire_word,
)
from neural_arch.distributed.comm.dtypes import _dtype_name
from neural_arch.distributed.comm.lanes import SerialLane
from neural_arch.distributed.comm.work import OpInfo, Work
from neural_arch.distributed.errors import CollectiveMismatchError, DistributedError, GroupPoisonedError
from neural_arch.distributed.flight_recorder import buffer as _fr
from neural_arch.distributed.flight_recorder.writer import dump as _fr_dump
from neural_arch.distributed.flight_recorder.writer import install_signal_handler
from neural_arch.distributed.flight_recorder.writer import request_dumps as _fr_request
from neural_arch.distributed.flight_recorder.writer import start_dump_watcher
from neural_arch.profiler import events as _events

__all__ = ["DEBUG_ENV", "OpRunner", "debug_mode_from_env"]

DEBUG_ENV = "NEURAL_ARCH_DISTRIBUTED_DEBUG"
_log = logging.getLogger("neural_arch.distributed")
_INF = float("inf")
_monotonic = time.monotonic
_QUEUED, _STARTED, _COMPLETED = _fr.QUEUED, _fr.STARTED, _fr.COMPLETED
_STATE, _T_START, _T_END, _INDEX = _fr.STATE, _fr.T_START, _fr.T_END, _fr.INDEX   # a record's fields
_fr_failed = _fr.mark_failed


def debug_mode_from_env() -> bool:
    """Whether ``NEURAL_ARCH_DISTRIBUTED_DEBUG`` is ``DETAIL`` (check every collective across ranks).

    Example::

        # NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL torchrun-style launch ... python train.py
        if debug_mode_from_env():
            print("every collective is compared across ranks first")
    """
    return str(config.get(DEBUG_ENV) or "").strip().upper() == "DETAIL"


class OpRunner(abc.ABC):
    """A group's identity, numbering, lanes and failure state (see the module docstring).

    Subclasses provide ``_allgather`` (the debug check gathers fingerprints with it) and may
    override ``_poison_peers`` (tell the other ranks that this group failed).

    Example::

        >>> import numpy as np
        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> runner = LocalBackend()                    # every backend is an OpRunner
        >>> [runner.allreduce(np.ones(2)).info.seq for _ in range(3)]
        [1, 2, 3]
    """

    #: registry name ("gloo", "mpi", "nccl", "local")
    name: str = "base"

    def __init__(self, rank: int, size: int, timeout: float = 300.0,
                 group_ranks: Sequence[int] | None = None, debug: bool | None = None):
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank={rank} must be in [0, size={size})")
        self._rank = rank
        self._size = size
        self.timeout = float(timeout)
        #: this group's members as *global* ranks, for error messages
        self.group_ranks: list[int] = list(group_ranks) if group_ranks is not None else list(range(size))
        self._global_rank = self.group_ranks[rank]
        self._cpu = "cpu" in getattr(self, "devices", ())   # moves NumPy arrays (asked on every call)
        self._debug = debug_mode_from_env() if debug is None else bool(debug)
        self._seq = 0
        self._p2p_seq = 0
        # collectives run in order on one lane; async point-to-point ops on one lane per
        # (direction, peer, tag), so that messages between two ranks keep their order
        self._lane = SerialLane(f"neural_arch-{self.name}-progress", self._execute)
        self._p2p_lanes: dict = {}
        self._lock = threading.Lock()
        self._closed = False
        self._fatal: BaseException | None = None
        # The op running now, for the stall inspector (spans.in_flight reads these when it looks):
        # collectives run one at a time per group, so one slot; point-to-point ops one per lane.
        self._op_now: OpInfo | None = None
        #: the fused all_reduce path's OpInfo, reused while nobody else holds it (Backend.allreduce)
        self._fast_info: OpInfo | None = None
        self._p2p_now: dict = {}
        # The flight recorder's ring (None: off), and the records of ops queued on a lane until
        # the lane runs them (keyed by their Work's id: Work has no slot to spare)
        self._fr = _fr.RECORDER.ring
        self._fr_caller = _fr.RECORDER.caller
        self._fr_queued: dict = {}
        # what every record's group field points at: the members and the group's id (named by the
        # ProcessGroup, the parent backend or the FT replica group once it is made; see group_id)
        self._fr_group = _fr.GroupIdentity(self.group_ranks)
        # sub-communicators made from this one so far (Backend.new_group numbers their ids with it)
        self._fr_subgroups = 0
        if self._fr is not None:
            _fr.RECORDER.attach(self)
            install_signal_handler()
            if self._size > 1:
                start_dump_watcher()
        _spans.register(self)
        self._refresh_fast()

    # -- the fused synchronous path's one test ----------------------------------------------------
    @property
    def debug(self) -> bool:
        """``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL`` for this group: compare every collective across ranks."""
        return self._debug

    @debug.setter
    def debug(self, on: bool) -> None:
        self._debug = bool(on)
        self._refresh_fast()

    def _refresh_fast(self) -> None:
        # What the fused synchronous path (Backend.allreduce) needs and that changes rarely, folded
        # into one attribute: host arrays, a group of two or more, no debug mode, healthy and open.
        # Recomputed wherever one of them changes (debug's setter, _failed, shutdown).
        self._fast = (self._cpu and self._size > 1 and not self._debug and not self._closed
                      and self._fatal is None)

    # -- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def global_rank(self, group_rank: int) -> int:
        return self.group_ranks[group_rank]

    @property
    def group_id(self) -> str | None:
        """This group's id (torch's ``pg_name``), the same on every member and different between two
        groups with the same members; the flight recorder's records and the stall inspector's keys
        carry it. None until whoever made the group names it (``ProcessGroup``, ``Backend.new_group``,
        the FT replica group).

        Example::

            >>> from neural_arch.distributed.comm.local import LocalBackend
            >>> b = LocalBackend()
            >>> b.group_id = "pg1/WORLD"
            >>> b.group_id
            'pg1/WORLD'
        """
        return self._fr_group.group_id

    @group_id.setter
    def group_id(self, value: str | None) -> None:
        # set on the one object every record of this backend points at: records made before the
        # name (a backend's own set-up ops) read it too
        self._fr_group.group_id = None if value is None else str(value)

    @classmethod
    def is_available(cls) -> bool:
        """Whether this backend's requirements are installed (cheap; never starts anything)."""
        return True

    @abc.abstractmethod
    def _allgather(self, output, input, info: OpInfo) -> None: ...

    # -- execution ----------------------------------------------------------------------------
    def _new_info(self, name: str, array=None, root=None, op=None, p2p=False) -> OpInfo:
        if p2p:
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._seq += 1
            seq = self._seq
        red = None if op is None else op._value_   # _value_: Enum's .value is a slow descriptor
        if array is None:
            shape = dtype = None
            nbytes = 0
        else:
            shape, dtype = array.shape, _dtype_name(array.dtype)
            # point-to-point: 0 (unchecked in the frames; the backend's own header checks the sizes)
            nbytes = 0 if p2p else array.nbytes
        # the members as the group's identity (a list that also carries group_id): MPI's presence
        # answers and timeout errors then tell apart two groups with the same members (progress.where)
        return OpInfo(name, seq, self._fr_group, self._global_rank, shape, dtype, root, red,
                      _INF, None, None, nbytes)   # wire=None: computed when a transport first reads it

    def _run(self, info: OpInfo, fn: Callable[[], Any], async_op: bool,
             lane: SerialLane | None = None) -> Work:
        """Run ``fn`` now (idle lane, synchronous call) or after every earlier op of its lane."""
        if self._closed or self._fatal is not None:
            self._check_usable(info)
        if lane is None:
            lane = self._lane
        ring = self._fr
        rec = None
        if ring is not None:
            # the flight recorder's record of this op (the fields of flight_recorder.buffer, by index): built here, in the
            # caller's thread, where the caller's file:line is
            code, offset = self._fr_caller()
            index = ring.next_index()
            rec = ring.slots[index % ring.size]
            rec[:] = (self._fr_group, info.seq, info.name, info.shape, info.dtype, info.reduce_op, info.root,
                      _QUEUED, 0.0, 0.0, code, offset, None, lane is not self._lane, index)
        observed = _events.OBSERVERS or _events.BEGIN_OBSERVERS or _events.END_OBSERVERS
        if observed and not async_op:
            info.extra["blocking"] = True          # the caller waits through it (metrics: not hidden)
        if async_op or lane.pending:
            work = Work(info)
            if rec is not None:
                self._fr_queued[id(work)] = (rec, index)
            lane.submit(work, fn)
            if not async_op:
                work.wait()
            return work
        # The synchronous fast path, inline (one call layer less on every small collective): run on
        # the caller's thread, raise in it, return a done Work. Same checks, spans and poisoning as
        # _execute; the Work needs no lock or Event because no other thread has seen it.
        now = _monotonic()
        info.deadline = now + self.timeout
        if rec is not None:
            rec[_STATE] = _STARTED
            rec[_T_START] = now
        span = None
        if observed:
            span = _spans.begin(self, info, "default" if lane is self._lane else lane.name)
        collective = lane is self._lane
        self._op_start(info, collective)
        try:
            if self._debug and info.name in OP_CODES:
                self._debug_check(info)
            result = fn()
        except BaseException as exc:
            self._op_done(info, collective)
            if rec is not None:
                _fr_failed(rec, exc)
            self._failed(info, exc, span)
            raise
        self._op_done(info, collective)
        if rec is not None:
            rec[_STATE] = _COMPLETED
            rec[_T_END] = _monotonic()
        if span is not None:
            _spans.end(span, info)
        return Work.completed(result, info)

    def _op_start(self, info: OpInfo, collective: bool) -> None:
        """Put the op in its slot, where the stall inspector looks (see ``__init__``)."""
        if collective:
            self._op_now = info
        else:
            self._p2p_now[id(info)] = info

    def _op_done(self, info: OpInfo, collective: bool) -> None:
        """Empty the op's slot (see ``__init__``)."""
        if collective:
            self._op_now = None
        else:
            self._p2p_now.pop(id(info), None)

    def _check_usable(self, info: OpInfo) -> None:
        if self._closed:
            raise DistributedError(f"{info.describe()}: the process group was destroyed; "
                                   "call init_process_group() again before communicating")
        if self._fatal is not None:
            raise self._poisoned_error(info, "cannot run")

    def _poisoned_error(self, info: OpInfo, verb: str) -> GroupPoisonedError:
        first = self._fatal
        return GroupPoisonedError(
            f"{info.describe()} {verb} on rank {self.group_ranks[self._rank]}: the group "
            f"{self.group_ranks} is unusable: an earlier operation on this group failed after data had "
            "started to move, so its streams may be out of step and it never returns data again; destroy the "
            "process group (destroy_process_group()) and create it again (init_process_group(...)) on "
            f"every rank. First failure: {type(first).__name__}: {first}")

    def _execute(self, work: Work, fn: Callable[[], Any]) -> None:
        """Run one queued op on its lane's thread; the outcome goes into ``work``."""
        info = work.info
        now = _monotonic()
        info.deadline = now + self.timeout
        work.started_at = time.perf_counter()
        rec = None
        if self._fr_queued:
            rec, index = self._fr_queued.pop(id(work), (None, -1))
            if rec is not None and rec[_INDEX] != index:
                rec = None          # its slot was taken again while it waited: N newer ops ran
        if self._fatal is not None:
            # queued behind an op that failed: peers are mid-protocol, so running it could
            # match a late message from the failed op and return wrong data
            exc = self._poisoned_error(info, "was not run")
            if rec is not None:
                _fr_failed(rec, exc)
            work._set_exception(exc)
            return
        if rec is not None:
            rec[_STATE] = _STARTED
            rec[_T_START] = now
        span = None
        if _events.OBSERVERS or _events.BEGIN_OBSERVERS or _events.END_OBSERVERS:
            span = _spans.begin(self, info, _spans.lane_label(threading.current_thread().name))
        collective = info.name not in _P2P_NAMES
        self._op_start(info, collective)
        try:
            if self._debug and info.name in OP_CODES:
                self._debug_check(info)
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - stored, raised by Work.wait()
            self._op_done(info, collective)
            if rec is not None:
                _fr_failed(rec, exc)
            self._failed(info, exc, span)
            work._set_exception(exc)
        else:
            self._op_done(info, collective)
            if rec is not None:
                rec[_STATE] = _COMPLETED
                rec[_T_END] = _monotonic()
            if span is not None:
                _spans.end(span, info)
            work._set_result(result)

    def _failed(self, info: OpInfo, exc: BaseException, span) -> None:
        # Everything that can be checked before I/O was checked by the public method, in the
        # caller; whatever fails in here failed with peers possibly mid-message (a size or
        # header mismatch, a reduction into a bad buffer, a timeout). Trusting the group after
        # that is how a later, correct collective returns a neighbour's stale bytes: poison it
        # here and on every other rank.
        if span is not None:
            _spans.fail(span, exc)
        if self._fatal is None:
            self._fatal = exc
            self._fast = False
            try:
                self._poison_peers(info, exc)
            except Exception as poison_exc:  # noqa: BLE001 - best effort: the local error matters more
                _log.debug("could not tell the peers that %s failed: %s", info.describe(), poison_exc)
            # after telling the peers (they fail, and dump, sooner): this rank's history for the
            # flight recorder's analyzer -- a timeout, a mismatch, a peer's failure or an abort
            if self._fr is not None and self._size > 1:     # (a world of one cannot desync)
                reason = f"{info.describe()} on group {self.group_ranks} failed: {type(exc).__name__}: {exc}"[:2000]
                # and every other rank's, also one idle in user code that will never fail on its own;
                # not when this dump found nowhere to go (no folder, the store's host gone: the request
                # would wait out the store's grace a second time before the error is raised)
                if _fr_dump(reason) is not None:
                    _fr_request(reason)

    def abort(self, reason: str) -> None:
        """Make this group unusable here and on every other rank, naming ``reason`` (torch's
        ``ProcessGroup.abort``): what a layer above calls when it stopped half-way through a
        protocol of its own (a pipeline step), so no rank can run a later op out of step.

        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> b = LocalBackend()
        >>> b.abort("stage 2 failed")
        >>> b.allreduce(np.ones(1))
        Traceback (most recent call last):
        ...
        neural_arch.distributed.errors.GroupPoisonedError: ...First failure: RuntimeError: stage 2 failed
        """
        if self._fatal is not None:
            return
        info = OpInfo("abort", 0, tuple(self.group_ranks), self.group_ranks[self._rank])
        self._failed(info, RuntimeError(reason), None)

    def _poison_peers(self, info: OpInfo, exc: BaseException) -> None:
        """Tell the other ranks that this group failed (override: the transport's abort message).
        The default does nothing: their next operation then fails by timeout instead of at once."""

    def _debug_check(self, info: OpInfo) -> None:
        """Compare (op, shape, dtype, root, reduce op) across ranks; raise on every rank if they differ."""
        mine = fingerprint(info)
        table = np.zeros((self._size, FINGERPRINT_LEN), dtype=np.int64)
        name = f"debug check of {info.name}"
        check = OpInfo(name, info.seq, info.group_ranks, info.rank, deadline=info.deadline,
                       wire=wire_word(name, info.seq, None, None))
        self._allgather(table, mine, check)
        if not (table == mine).all():
            rows = {self.group_ranks[r]: describe_fingerprint(table[r]) for r in range(self._size)}
            lines = "; ".join(f"rank {r}: {d}" for r, d in rows.items())
            raise CollectiveMismatchError(
                f"collective #{info.seq} differs across ranks of group {self.group_ranks}: {lines}. "
                "Every rank must call the same collectives, with the same shapes, dtypes and roots, "
                "in the same order.")

    def _run_p2p(self, info: OpInfo, fn, async_op: bool, lane_key: tuple) -> Work:
        # Point-to-point ops do not join the collective lane: an isend followed by a recv on
        # both sides would deadlock there once payloads outgrow socket buffers. Each (direction,
        # peer, tag) gets its own lane, which keeps two isends to one peer in issue order.
        with self._lock:
            lane = self._p2p_lanes.get(lane_key)
            if lane is None:
                lane = self._p2p_lanes[lane_key] = SerialLane(
                    f"neural_arch-{self.name}-{lane_key[0]}-{lane_key[1]}-{lane_key[2]}", self._execute)
        return self._run(info, fn, async_op, lane)

    def _close_lanes(self, reason: str) -> None:
        """Fail every queued op with ``reason`` and stop the lanes' threads."""
        for lane in [self._lane, *self._p2p_lanes.values()]:
            lane.close(reason)
        self._fr_queued.clear()
