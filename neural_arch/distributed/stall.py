"""The stall inspector: when a collective waits too long, say which ranks have not arrived.

Long before a collective times out (``NEURAL_ARCH_TIMEOUT``, 300 s), a job stuck because one rank
is slow, crashed in user code or took another branch looks exactly like a slow step. Every
backend keeps the operation it is running in a slot (:func:`neural_arch.distributed.comm.spans.in_flight`:
two attribute stores per op, whether or not anyone watches); the inspector's thread reads those
slots every few moments, so a collective pays nothing for being watched:

* at half the threshold a rank *publishes* ``waiting at (group, seq, op)`` under one key per
  rank in the rendezvous store (one ``set``; nothing is written for collectives that finish in
  time); the key names the group by its members and its id (``ProcessGroup.group_id``), so two
  groups with the same members -- two live ones, or one made again -- never read each other's keys;
* at the threshold (``NEURAL_ARCH_STALL_WARNING_S``, default 60 s; ``0`` turns it off) it reads
  the other members' keys and logs a warning: ranks that published the same group at this
  sequence number (or later) are waiting too, the others **have not arrived**; the warning is
  repeated every threshold while the wait goes on.

Every waiting rank logs, so whichever log you read names the missing ranks::

    rank 0: all_reduce #12 of group [0, 1, 2] has waited 61.0 s (NEURAL_ARCH_STALL_WARNING_S=60):
    ranks [2] have not arrived (rank 2 last waited at all_reduce #11); ranks [0, 1] are waiting here

Example (``init_process_group`` starts one when the hook is in place; by hand)::

    inspector = StallInspector(warning_s=5.0).start()
    ...
    inspector.stop()

MPI jobs have no rendezvous store: there the inspector asks the MPI backend's presence threads what
each rank is doing (the same answers a timeout error quotes). A point-to-point ``send``/``recv`` that
waits names its peer (and, under MPI, says that a blocking send of a large message waits for its recv).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from neural_arch import config
from neural_arch.distributed.comm import spans as _spans
from neural_arch.distributed.comm.debug import _P2P_NAMES
from neural_arch.distributed.comm.mpi.progress import where  # how an MPI rank words its op (no mpi4py)

__all__ = [
    "DEFAULT_WARNING_S",
    "STALL_ENV",
    "StallInspector",
    "StallReport",
    "start_stall_inspector",
    "stop_stall_inspector",
    "warning_threshold",
]

STALL_ENV = "NEURAL_ARCH_STALL_WARNING_S"
DEFAULT_WARNING_S = 60.0
_log = logging.getLogger("neural_arch.distributed.stall")


def warning_threshold(environ=None) -> float:
    """Seconds from ``NEURAL_ARCH_STALL_WARNING_S`` (default 60; 0 = off); a clear error if unparsable.

    Example::

        >>> warning_threshold({"NEURAL_ARCH_STALL_WARNING_S": "5"})
        5.0
        >>> warning_threshold({})
        60.0
    """
    try:
        value = config.get(STALL_ENV, environ)
    except ValueError as exc:  # the table's message names the variable and its value
        raise ValueError(f"{exc}: must be a number of seconds (0 turns the stall inspector off)") from None
    if value < 0:
        raise ValueError(f"{STALL_ENV}={value!r} must be >= 0 (0 turns the stall inspector off)")
    return value


@dataclass
class StallReport:
    """One warning: what waited, how long, who is missing (global ranks).

    Example::

        for report in inspector.reports:
            print(report.op, report.seq, "missing:", report.missing)
    """

    rank: int
    op: str
    seq: int | None
    group: list[int]
    waited_s: float
    missing: list[int]
    waiting: list[int]
    last_seen: dict[int, str]
    message: str
    #: for each rank waiting in another collective at this sequence number, that collective (for
    #: example "broadcast #12"), a desync
    other_op: dict[int, str] = field(default_factory=dict)


class StallInspector:
    """Warn when a collective on this rank waits longer than ``warning_s``.

    Args:
        warning_s: threshold in seconds (default from ``NEURAL_ARCH_STALL_WARNING_S``, 60 s).
        store: rendezvous store to publish and read "waiting at" keys (default: the job's store).
        rank: this process's global rank (default: from the default group).
        namespace: key prefix in the store (default: per process-group generation).
        interval: how often the watcher looks (default ``min(1 s, warning_s / 4)``).

    ``reports`` keeps every :class:`StallReport` this inspector logged (tests read it).

    Example::

        >>> inspector = StallInspector(warning_s=5.0, store=None, rank=0)
        >>> with inspector:
        ...     inspector.running
        True
        >>> inspector.running, inspector.reports
        (False, [])
    """

    def __init__(self, warning_s: float | None = None, store=None, rank: int | None = None,
                 namespace: str | None = None, interval: float | None = None):
        self.warning_s = warning_threshold() if warning_s is None else float(warning_s)
        if self.warning_s <= 0:
            raise ValueError(f"StallInspector: warning_s={warning_s} must be > 0 (use {STALL_ENV}=0 only to keep "
                             "init_process_group from starting one)")
        from neural_arch.distributed.state import STATE

        world = STATE.world
        self.rank = int(rank) if rank is not None else (world.ranks[world.rank()] if world is not None else 0)
        self.store = store if store is not None else self._job_store(STATE)
        generation = world.generation if world is not None else 0
        self.namespace = namespace or f"neural_arch/stall/pg{generation}"
        self.interval = float(interval) if interval is not None else min(1.0, self.warning_s / 4)
        self.reports: list[StallReport] = []
        # id(info) -> [info, started (monotonic), published?, warnings issued]; the entry holds the
        # OpInfo, so its id cannot be reused by another op while it is here
        self._open: dict[int, list] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _job_store(state):
        stores = list(state.stores.values())
        return stores[0] if len(stores) == 1 else None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> StallInspector:
        """Start the watcher thread. Nothing is hooked into the backends: they keep the op they run
        in a slot (``comm.spans.in_flight``) whether or not anyone watches, so this costs them nothing."""
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="neural_arch-stall-inspector", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the watcher thread is on (between :meth:`start` and :meth:`stop`)."""
        return self._thread is not None

    def stop(self) -> None:
        """Stop the watcher thread and forget the operations it was timing (safe to call twice)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._open.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the watcher --------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - the inspector must never take the job down
                _log.debug("stall inspector check failed: %s", exc)

    def check(self) -> list[StallReport]:
        """One look at the operations in flight (the watcher calls it; tests may too)."""
        t = time.monotonic()
        live: dict[int, list] = {}
        for runner, info in _spans.in_flight():
            entry = self._open.get(id(info))
            if entry is None or entry[0] is not info:
                # started when its deadline was set (deadline = start + timeout); never later than now
                begun = info.deadline - runner.timeout
                entry = [info, min(begun, t), False, 0, runner]
            live[id(info)] = entry
        self._open = live                     # finished ops are forgotten
        made = []
        for entry in live.values():
            info, begun, published, warned, runner = entry
            age = t - begun
            if not published and age >= self.warning_s / 2:
                self._publish(info, runner)
                entry[2] = True
            if age >= self.warning_s * (warned + 1):
                entry[3] = warned + 1
                report = self._report(info, age, runner)
                self.reports.append(report)
                made.append(report)
                _log.warning("%s", report.message)
        return made

    def _key(self, group: list[int], rank: int, group_id: str | None = None) -> str:
        # the group's id keeps two groups with the same members apart (their numbers are unrelated)
        members = '-'.join(map(str, group))
        return f"{self.namespace}/{members}/{rank}" if group_id is None else \
            f"{self.namespace}/{members}@{group_id}/{rank}"

    def _publish(self, info, runner=None) -> None:
        # point-to-point ops are numbered per rank pair and direction: nothing to compare across the group
        if self.store is None or info.name in _P2P_NAMES:
            return
        self.store.set(self._key(list(info.group_ranks), self.rank, getattr(runner, "group_id", None)),
                       f"{int(info.seq)} {info.name}")

    def _report(self, info, age: float, runner=None) -> StallReport:
        group = [int(r) for r in info.group_ranks]
        seq = int(info.seq)
        head = (f"rank {self.rank}: {info.name} #{seq} of group {group} has waited {age:.1f} s "
                f"({STALL_ENV}={self.warning_s:g})")
        if info.name in _P2P_NAMES:
            peer = group[info.root] if info.root is not None and 0 <= info.root < len(group) else None
            role = "receiver" if info.name == "send" else "sender"
            message = (f"{head}: waiting for rank {peer}, the {role}; it is slow, stuck, or did not post the "
                       f"matching {'recv' if info.name == 'send' else 'send'} (look at its log/stack)")
            if info.name == "send" and getattr(runner, "name", None) == "mpi":
                message += (". Under MPI a blocking send of a large message returns only once the receiver posted "
                            "its recv (unlike gloo): ranks that both send before they recv deadlock; use isend() + "
                            "irecv() or batch_isend_irecv()")
            missing = [peer] if peer is not None else []
            return StallReport(self.rank, info.name, seq, group, age, missing, [self.rank], {}, message)
        missing, waiting, last_seen, other, past = [], [], {}, {}, []
        if self.store is None:
            return self._report_by_presence(info, age, runner, head, group, seq)
        self._publish(info, runner)  # refresh: this rank is certainly waiting here
        group_id = getattr(runner, "group_id", None)
        for r in group:
            key = self._key(group, r, group_id)
            if not self.store.check([key]):
                missing.append(r)
                continue
            text = self.store.get(key).decode(errors="replace")
            their_seq, _, their_op = text.partition(" ")
            last_seen[r] = f"{their_op} #{their_seq}"
            try:
                their = int(their_seq)
            except ValueError:      # not a key this inspector wrote: the rank is not known to be here
                missing.append(r)
                continue
            if their == seq and their_op != info.name:
                # the same number in another collective: it will never join this one (a desync)
                other[r] = last_seen[r]
                missing.append(r)
            elif their >= seq:
                (past if their > seq else waiting).append(r)
            else:
                missing.append(r)
        if not missing:
            message = (f"{head}: every rank of the group has reached it (ranks {sorted(waiting + past)}), none is "
                       "missing: it is only slow, or its transport makes no progress (look at the network/stacks)")
            return StallReport(self.rank, info.name, seq, group, age, [], sorted(waiting + past), last_seen, message)
        seen = "; ".join(f"rank {r} waits in {other[r]} instead" if r in other else
                         f"rank {r} last waited at {last_seen[r]}" for r in missing if r in last_seen)
        message = (f"{head}: ranks {missing} have not arrived" + (f" ({seen})" if seen else "") +
                   f"; ranks {waiting} are waiting here" +
                   (f" (ranks {past} already waited at a later op of this group)" if past else "") + ". ")
        if other:
            message += (f"Ranks {sorted(other)} called another collective as #{seq} of this group: the ranks' code "
                        "paths differ (look at the collectives each one calls)")
        else:
            message += ("A rank that has not arrived is slow, stuck outside collectives, or took a different code "
                        "path (look at its log/stack)")
        return StallReport(self.rank, info.name, seq, group, age, missing, sorted(waiting + past), last_seen,
                           message, other)

    def _report_by_presence(self, info, age: float, runner, head: str, group: list[int], seq: int) -> StallReport:
        """No rendezvous store (an MPI job): ask the other ranks' presence threads what they are doing
        (the MPI backend's ``Presence``), which names the ranks that are not in this op."""
        presence = getattr(runner, "_presence", None)
        others = [r for r in group if r != self.rank]
        answers = presence.ask(others) if presence is not None else {}
        if not answers:
            why = "no rendezvous store to ask the other ranks (mpi backend)"
            return StallReport(self.rank, info.name, seq, group, age, [], [], {}, f"{head}; {why}")
        mine = where(info)
        waiting = [self.rank] + [r for r in others if mine in (answers.get(r) or "")]
        missing = [r for r in others if r not in waiting]
        last_seen = {r: answers[r] or "did not answer" for r in missing}
        seen = "; ".join(f"rank {r} is {last_seen[r]}" for r in missing)
        if not missing:
            message = (f"{head}: every rank of the group is waiting in it (ranks {sorted(waiting)}), none is missing: "
                       "MPI makes no progress on it (a rank blocked inside MPI elsewhere?) or it is only slow")
            return StallReport(self.rank, info.name, seq, group, age, [], sorted(waiting), {}, message)
        message = (f"{head}: ranks {missing} have not arrived" + (f" ({seen})" if seen else "") +
                   f"; ranks {sorted(waiting)} are waiting here. A rank that has not arrived is slow, stuck outside "
                   "collectives, or took a different code path (look at its log/stack)")
        return StallReport(self.rank, info.name, seq, group, age, missing, sorted(waiting), last_seen, message)


_INSPECTOR: StallInspector | None = None


def start_stall_inspector(world=None, environ=None) -> StallInspector | None:
    """Hook for ``init_process_group()``: start the job's inspector unless ``NEURAL_ARCH_STALL_WARNING_S=0``
    or the world has one rank (nobody to wait for).

    Example::

        inspector = start_stall_inspector(world)      # None when turned off or a world of one
    """
    global _INSPECTOR
    threshold = warning_threshold(environ)
    if threshold <= 0 or _INSPECTOR is not None or (world is not None and world.size() < 2):
        return _INSPECTOR
    _INSPECTOR = StallInspector(warning_s=threshold).start()
    return _INSPECTOR


def stop_stall_inspector() -> None:
    """Hook for ``destroy_process_group()``: stop the job's inspector, if one runs.

    Example::

        stop_stall_inspector()          # a no-op when none runs
    """
    global _INSPECTOR
    inspector, _INSPECTOR = _INSPECTOR, None
    if inspector is not None:
        inspector.stop()
