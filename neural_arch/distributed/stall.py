"""The stall inspector: when a collective waits too long, say which ranks have not arrived.

Long before a collective times out (``NEURAL_ARCH_TIMEOUT``, 300 s), a job stuck because one rank
is slow, crashed in user code or took another branch looks exactly like a slow step. The
inspector watches every collective span that starts (``events.BEGIN_OBSERVERS``) and ends
(``events.END_OBSERVERS``). A watcher thread looks at the open ones every few moments:

* at half the threshold a rank *publishes* ``waiting at (group, seq, op)`` under one key per
  rank in the rendezvous store (one ``set``; nothing is written for collectives that finish in
  time);
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

MPI jobs have no rendezvous store: there the warning names the op and how long it waited only.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from neural_arch.distributed import config
from neural_arch.profiler import events

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
    """Seconds from ``NEURAL_ARCH_STALL_WARNING_S`` (default 60; 0 = off); a clear error if unparsable."""
    try:
        value = config.get(STALL_ENV, environ)
    except ValueError as exc:  # the table's message names the variable and its value
        raise ValueError(f"{exc}: must be a number of seconds (0 turns the stall inspector off)") from None
    if value < 0:
        raise ValueError(f"{STALL_ENV}={value!r} must be >= 0 (0 turns the stall inspector off)")
    return value


@dataclass
class StallReport:
    """One warning: what waited, how long, who is missing (global ranks)."""

    rank: int
    op: str
    seq: int | None
    group: list[int]
    waited_s: float
    missing: list[int]
    waiting: list[int]
    last_seen: dict[int, str]
    message: str


def _group_of(pending) -> list[int] | None:
    g = pending.args.get("group", pending.args.get("ranks"))
    try:
        return [int(r) for r in g] if g is not None else None
    except TypeError:
        return None


class StallInspector:
    """Warn when a collective on this rank waits longer than ``warning_s``.

    Args:
        warning_s: threshold in seconds (default from ``NEURAL_ARCH_STALL_WARNING_S``, 60 s).
        store: rendezvous store to publish and read "waiting at" keys (default: the job's store).
        rank: this process's global rank (default: from the default group).
        namespace: key prefix in the store (default: per process-group generation).
        interval: how often the watcher looks (default ``min(1 s, warning_s / 4)``).

    ``reports`` keeps every :class:`StallReport` this inspector logged (tests read it).
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
        self._open: dict[int, list] = {}  # id(pending) -> [pending, published?, warnings issued]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _job_store(state):
        stores = list(state.stores.values())
        return stores[0] if len(stores) == 1 else None

    # -- observers (the producing thread: keep them tiny) ------------------------------------------------
    def _on_begin(self, pending) -> None:
        if pending.category == "collective":
            self._open[id(pending)] = [pending, False, 0]

    def _on_end(self, pending) -> None:
        self._open.pop(id(pending), None)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> StallInspector:
        if self._thread is not None:
            return self
        if self._on_begin not in events.BEGIN_OBSERVERS:
            events.BEGIN_OBSERVERS.append(self._on_begin)
        if self._on_end not in events.END_OBSERVERS:
            events.END_OBSERVERS.append(self._on_end)
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="neural_arch-stall-inspector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        for registry, fn in ((events.BEGIN_OBSERVERS, self._on_begin), (events.END_OBSERVERS, self._on_end)):
            try:
                registry.remove(fn)
            except ValueError:
                pass
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
        """One look at the open collectives (the watcher calls it; tests may too)."""
        t = events.now()
        made = []
        for entry in list(self._open.values()):
            pending, published, warned = entry
            age = t - pending.start
            if not published and age >= self.warning_s / 2:
                self._publish(pending)
                entry[1] = True
            if age >= self.warning_s * (warned + 1):
                entry[2] = warned + 1
                report = self._report(pending, age)
                self.reports.append(report)
                made.append(report)
                _log.warning("%s", report.message)
        return made

    def _key(self, group: list[int], rank: int) -> str:
        return f"{self.namespace}/{'-'.join(map(str, group))}/{rank}"

    def _publish(self, pending) -> None:
        group = _group_of(pending)
        if self.store is None or group is None:
            return
        seq = pending.args.get("seq")
        self.store.set(self._key(group, self.rank), f"{-1 if seq is None else int(seq)} {pending.name}")

    def _report(self, pending, age: float) -> StallReport:
        group = _group_of(pending) or []
        seq = pending.args.get("seq")
        seq = None if seq is None else int(seq)
        where = f"{pending.name} #{seq}" if seq is not None else pending.name
        head = (f"rank {self.rank}: {where} of group {group or '?'} has waited {age:.1f} s "
                f"({STALL_ENV}={self.warning_s:g})")
        missing, waiting, last_seen = [], [], {}
        if self.store is None or not group or seq is None:
            why = ("no rendezvous store to ask the other ranks (mpi backend)" if self.store is None
                   else "the span does not name its group and sequence number")
            return StallReport(self.rank, pending.name, seq, group, age, [], [], {}, f"{head}; {why}")
        self._publish(pending)  # refresh: this rank is certainly waiting here
        for r in group:
            key = self._key(group, r)
            if not self.store.check([key]):
                missing.append(r)
                continue
            text = self.store.get(key).decode(errors="replace")
            their_seq, _, their_op = text.partition(" ")
            last_seen[r] = f"{their_op} #{their_seq}"
            (waiting if int(their_seq) >= seq else missing).append(r)
        seen = "; ".join(f"rank {r} last waited at {last_seen[r]}" for r in missing if r in last_seen)
        message = (f"{head}: ranks {missing} have not arrived" + (f" ({seen})" if seen else "") +
                   f"; ranks {waiting} are waiting here. A rank that has not arrived is slow, stuck outside "
                   "collectives, or took a different code path (look at its log/stack)")
        return StallReport(self.rank, pending.name, seq, group, age, missing, waiting, last_seen, message)


_INSPECTOR: StallInspector | None = None


def start_stall_inspector(world=None, environ=None) -> StallInspector | None:
    """Hook for ``init_process_group()``: start the job's inspector unless ``NEURAL_ARCH_STALL_WARNING_S=0``
    or the world has one rank (nobody to wait for)."""
    global _INSPECTOR
    threshold = warning_threshold(environ)
    if threshold <= 0 or _INSPECTOR is not None or (world is not None and world.size() < 2):
        return _INSPECTOR
    _INSPECTOR = StallInspector(warning_s=threshold).start()
    return _INSPECTOR


def stop_stall_inspector() -> None:
    """Hook for ``destroy_process_group()``."""
    global _INSPECTOR
    inspector, _INSPECTOR = _INSPECTOR, None
    if inspector is not None:
        inspector.stop()
