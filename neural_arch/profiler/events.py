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


class Span:
    """One interval of work on one rank (a read-only record: build a new one rather than change it).

    * ``name``: what ran ("all_reduce", "bucket 3", "F1 mb0", "optimizer.step").
    * ``category``: "collective", "bucket", "pipeline", "optimizer", "forward", "backward", ...
    * ``start``, ``end``: ``now()`` values on this process.
    * ``lane``: the thread row it belongs to on a timeline (a comm lane, "main", ...).
    * ``args``: small JSON-able details. Collectives use these keys (the profiler, metrics and the
      stall inspector read them): ``seq`` (the group's collective number), ``group`` (the group's
      global ranks, a list), ``bytes`` (bytes this rank sent), ``algorithm``, ``transport``,
      ``shape``, ``dtype``; DDP buckets: ``bucket``, ``phase`` ("ready", "launched", "done").

    Why a slotted class and not a frozen dataclass: a span is built on the producer's thread for
    every collective while a recorder runs (often the communication thread, while backward
    waits on it); a frozen dataclass's ``__init__`` (``object.__setattr__`` per field) costs several times this one's. The
    ``args`` of a span ended by :func:`end` are assembled when first read (an export, a metrics
    step), not on that thread.

    >>> s = Span("all_reduce", "collective", 1.0, 1.5, "comm", {"seq": 3})
    >>> s.duration, s.args["seq"], s == Span("all_reduce", "collective", 1.0, 1.5, "comm", {"seq": 3})
    (0.5, 3, True)
    """

    __slots__ = ("_args", "_source", "category", "end", "lane", "name", "start")

    def __init__(self, name: str, category: str, start: float, end: float, lane: str = "main",
                 args: dict[str, Any] | None = None) -> None:
        self.name, self.category, self.start, self.end, self.lane = name, category, start, end, lane
        self._args = {} if args is None else args
        self._source = None

    @property
    def args(self) -> dict[str, Any]:
        args = self._args
        if args is None:             # ended by end(): the started span's details, plus the end's
            source = self._source    # one read: (the started span, the end's extra details)
            if source is None:       # another thread built them between our two reads
                return self._args
            pending, more = source
            args = {**pending.args, **more} if more else pending.args
            self._args = args        # first, then drop the source (a reader in between finds _args)
            self._source = None
        return args

    @property
    def duration(self) -> float:
        return self.end - self.start

    def _key(self) -> tuple:
        return self.name, self.category, self.start, self.end, self.lane, self.args

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, Span) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (args is a dict, as with the frozen dataclass it replaced)

    def __repr__(self) -> str:
        return (f"Span(name={self.name!r}, category={self.category!r}, start={self.start!r}, end={self.end!r}, "
                f"lane={self.lane!r}, args={self.args!r})")


class Pending:
    """A span that has started and not ended (what :func:`begin` returns).

    ``args`` may be built lazily (``make_args``): with only the stall inspector listening, a
    collective pays for a few attribute stores, and the details are assembled only for the rare op
    that waits long enough to be reported, or when a recorder emits the span.

    Example::

        >>> from neural_arch.profiler import events
        >>> seen = []
        >>> events.subscribe(seen.append)
        >>> pending = events.begin("bucket 0", "bucket")
        >>> type(pending).__name__, pending.name
        ('Pending', 'bucket 0')
        >>> events.end(pending)
        >>> events.unsubscribe(seen.append)
    """

    __slots__ = ("_args", "_make", "category", "lane", "name", "start")

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

    Example::

        >>> from neural_arch.profiler import events
        >>> events.begin("step", "optimizer") is None          # nobody listens: nothing is recorded
        True
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
    """Finish a span started by :func:`begin` (``None`` is ignored) and emit it.

    Example::

        >>> from neural_arch.profiler import events
        >>> seen = []
        >>> events.subscribe(seen.append)
        >>> events.end(events.begin("forward", "forward"), tokens=128)
        >>> events.unsubscribe(seen.append)
        >>> seen[0].name, seen[0].args["tokens"], seen[0].end >= seen[0].start
        ('forward', 128, True)
    """
    if pending is None:
        return
    for observer in END_OBSERVERS:
        try:
            observer(pending)
        except Exception:  # noqa: BLE001, S110 - an observer must never break the runtime
            pass
    if not OBSERVERS:
        return
    span = Span(pending.name, pending.category, pending.start, now(), pending.lane)
    span._args, span._source = None, (pending, more_args)   # details built when read
    emit(span)


def emit(span: Span) -> None:
    """Hand ``span`` to every subscriber; a failing subscriber never breaks the runtime.

    Example::

        >>> from neural_arch.profiler import events
        >>> seen = []
        >>> events.subscribe(seen.append)
        >>> events.emit(events.Span("step", "optimizer", 0.0, 1.0))
        >>> events.unsubscribe(seen.append)
        >>> [s.name for s in seen]
        ['step']
    """
    for observer in tuple(OBSERVERS):
        try:
            observer(span)
        except Exception:  # noqa: BLE001, S110 - observability must not take training down
            pass


def subscribe(observer: Callable[[Span], None]) -> None:
    """Start calling ``observer(span)`` for every emitted span (idempotent).

    Example::

        >>> from neural_arch.profiler import events
        >>> names = []
        >>> def observer(span):
        ...     names.append(span.name)
        >>> events.subscribe(observer)
        >>> events.end(events.begin("all_reduce", "collective"))
        >>> events.unsubscribe(observer)
        >>> names
        ['all_reduce']
    """
    if observer not in OBSERVERS:
        OBSERVERS.append(observer)


def unsubscribe(observer: Callable[[Span], None]) -> None:
    """Stop calling ``observer`` (no error if it was not subscribed).

    Example::

        >>> from neural_arch.profiler import events
        >>> events.unsubscribe(print)          # never subscribed: no error
    """
    try:
        OBSERVERS.remove(observer)
    except ValueError:
        pass
