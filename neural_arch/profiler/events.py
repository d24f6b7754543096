"""The one seam between the runtime and whoever records what it does.

Code that does work worth seeing on a timeline (a collective, a DDP bucket, a pipeline action,
an optimizer step) reports a :class:`Span` here; the profiler, metrics and the stall inspector
subscribe. When nobody subscribes, the cost is one truthiness test of a list, so the runtime can
call this on every collective.

Producers write::

    from neural_arch.profiler import events
    if events.OBSERVERS:                      # near-zero cost when off
        t0 = events.now()
        ...                                   # the work
        events.emit(events.Span("all_reduce", "collective", t0, events.now(),
                                lane="default", args={"seq": 7, "bytes": 4096}))

Consumers write::

    events.subscribe(my_callback)             # my_callback(span) on the producing thread
    ...
    events.unsubscribe(my_callback)

>>> seen = []
>>> events_ = __import__("neural_arch.profiler.events", fromlist=["x"])
>>> events_.subscribe(seen.append)
>>> events_.emit(events_.Span("step", "optimizer", 0.0, 1.0))
>>> events_.unsubscribe(seen.append)
>>> seen[0].name, seen[0].duration
('step', 1.0)
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BEGIN_OBSERVERS",
    "END_OBSERVERS",
    "OBSERVERS",
    "Pending",
    "Span",
    "begin",
    "emit",
    "end",
    "now",
    "subscribe",
    "unsubscribe",
]

#: Subscribed callables; producers test ``if OBSERVERS:`` before building a Span.
OBSERVERS: list[Callable[[Span], None]] = []

#: Callables told when a span *starts* (``observer(pending)``): what the stall inspector watches.
BEGIN_OBSERVERS: list[Callable[[Pending], None]] = []

#: Callables told when a span started by :func:`begin` *ends* (``observer(pending)``, before the
#: Span is emitted): lets the stall inspector forget a collective without subscribing to every Span.
END_OBSERVERS: list[Callable[[Pending], None]] = []

#: The one clock every span uses (monotonic, seconds, float).
now = time.perf_counter


@dataclass(frozen=True)
class Span:
    """One interval of work on one rank.

    name: what ran ("all_reduce", "bucket 3", "F1 mb0", "optimizer.step").
    category: "collective", "bucket", "pipeline", "optimizer", "forward", "backward", ...
    start, end: ``now()`` values on this process.
    lane: the thread row it belongs to on a timeline (a comm lane, "main", ...).
    args: small JSON-able details. Collectives use these keys (the profiler, metrics and the stall
        inspector read them): ``seq`` (the group's collective number), ``group`` (the group's global
        ranks, a list), ``bytes`` (bytes this rank sent), ``algorithm``, ``transport``, ``shape``,
        ``dtype``; DDP buckets: ``bucket``, ``phase`` ("ready", "launched", "done").
    """

    name: str
    category: str
    start: float
    end: float
    lane: str = "main"
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


class Pending:
    """A span that has started and not ended (what :func:`begin` returns).

    ``args`` may be built lazily (``make_args``): with only the stall inspector listening, a
    collective pays for a few attribute stores, and the details are assembled only for the rare op
    that waits long enough to be reported, or when a recorder emits the span.
    """

    __slots__ = ("name", "category", "start", "lane", "_args", "_make")

    def __init__(self, name: str, category: str, start: float, lane: str = "main", args: dict | None = None,
                 make_args: Callable[[], dict] | None = None) -> None:
        self.name, self.category, self.start, self.lane = name, category, start, lane
        self._args, self._make = args, make_args

    @property
    def args(self) -> dict[str, Any]:
        if self._args is None:
            self._args = self._make() if self._make is not None else {}
        return self._args

    def __repr__(self) -> str:
        return f"Pending({self.name!r}, {self.category!r}, start={self.start:.6f}, lane={self.lane!r})"


def begin(name: str, category: str, lane: str = "main", args: dict | None = None,
          make_args: Callable[[], dict] | None = None) -> Pending | None:
    """Start a span; returns ``None`` (and costs nothing more) when nobody listens.

    ``args`` is kept as given (not copied: do not change it afterwards); ``make_args`` builds it
    only when someone reads it. Pair with :func:`end` in a ``finally``:
    ``tok = begin(...); try: ... finally: end(tok)``.
    """
    if not (OBSERVERS or BEGIN_OBSERVERS or END_OBSERVERS):
        return None
    pending = Pending(name, category, now(), lane, args, make_args)
    for observer in BEGIN_OBSERVERS:
        try:
            observer(pending)
        except Exception:  # noqa: BLE001, S110 - an observer must never break the runtime
            pass
    return pending


def end(pending: Pending | None, **more_args: Any) -> None:
    """Finish a span started by :func:`begin` (``None`` is ignored) and emit it."""
    if pending is None:
        return
    for observer in END_OBSERVERS:
        try:
            observer(pending)
        except Exception:  # noqa: BLE001, S110 - an observer must never break the runtime
            pass
    if not OBSERVERS:
        return
    args = dict(pending.args, **more_args) if more_args else pending.args
    emit(Span(pending.name, pending.category, pending.start, now(), pending.lane, args))


def emit(span: Span) -> None:
    """Hand ``span`` to every subscriber; a failing subscriber never breaks the runtime."""
    for observer in tuple(OBSERVERS):
        try:
            observer(span)
        except Exception:  # noqa: BLE001, S110 - observability must not take training down
            pass


def subscribe(observer: Callable[[Span], None]) -> None:
    """Start calling ``observer(span)`` for every emitted span (idempotent)."""
    if observer not in OBSERVERS:
        OBSERVERS.append(observer)


def unsubscribe(observer: Callable[[Span], None]) -> None:
    """Stop calling ``observer`` (no error if it was not subscribed)."""
    try:
        OBSERVERS.remove(observer)
    except ValueError:
        pass
