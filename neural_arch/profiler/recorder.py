"""Collect the spans of one process, and mark your own code as spans (``record_function``).

A :class:`Recorder` subscribes to :mod:`.events` and keeps every :class:`~.events.Span` it is
handed, from any thread (``list.append`` is atomic under the GIL, so no lock on the hot path).
:func:`record_function` is torch's name for "this block of my code is one span": use it for
forward, backward and the optimizer step so the timeline shows compute beside communication.

>>> from neural_arch.profiler.recorder import Recorder, record_function
>>> rec = Recorder()
>>> with rec:
...     with record_function("forward"):
...         pass
>>> [(s.name, s.category) for s in rec.spans]
[('forward', 'forward')]
"""
from __future__ import annotations

from neural_arch.profiler import events

__all__ = ["COMPUTE_CATEGORIES", "Recorder", "record_function"]

#: Categories counted as compute when metrics decide how much communication was hidden.
COMPUTE_CATEGORIES = frozenset({"forward", "backward", "optimizer", "compute"})

# Names whose category is obvious: record_function("backward") lands in "backward".
_NAMED_CATEGORIES = {"forward": "forward", "backward": "backward", "optimizer.step": "optimizer",
                     "optimizer_step": "optimizer", "step": "optimizer"}


class Recorder:
    """Keeps every span emitted while it is started; ``with rec:`` = ``start()`` ... ``stop()``.

    ``spans`` is a plain list of :class:`~.events.Span` in emission order (end time order per
    thread). ``clear()`` drops them. Starting twice is harmless (subscription is idempotent).

    Example::

        >>> from neural_arch.profiler.recorder import Recorder, record_function
        >>> with Recorder() as rec:
        ...     with record_function("forward"):
        ...         pass
        >>> [(s.name, s.category) for s in rec.spans]
        [('forward', 'forward')]
    """

    def __init__(self) -> None:
        self.spans: list[events.Span] = []
        self._append = self.spans.append  # the subscribed callable: one bound method, cheap

    @property
    def active(self) -> bool:
        return self._append in events.OBSERVERS

    def start(self) -> Recorder:
        events.subscribe(self._append)
        return self

    def stop(self) -> Recorder:
        events.unsubscribe(self._append)
        return self

    def clear(self) -> None:
        del self.spans[:]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class record_function:
    """Mark a block (or a function, as a decorator) as one span named ``name``.

    ``category`` defaults from the name ("forward", "backward", "optimizer.step" -> "optimizer",
    anything else -> "function"); ``lane`` is the timeline row ("main" by default). Costs one list
    test when nothing records. Example::

        with record_function("forward"):
            loss = F.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer.step"):
            opt.step()
    """

    __slots__ = ("_token", "args", "category", "lane", "name")

    def __init__(self, name: str, category: str | None = None, lane: str = "main", args: dict | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"record_function: name must be a non-empty string, got {name!r}")
        self.name = name
        self.category = category or _NAMED_CATEGORIES.get(name, "function")
        self.lane = lane
        self.args = args
        self._token = None

    def __enter__(self):
        self._token = events.begin(self.name, self.category, self.lane, self.args)
        return self

    def __exit__(self, *exc) -> None:
        token, self._token = self._token, None
        events.end(token)

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            with record_function(self.name, self.category, self.lane, self.args):
                return fn(*a, **kw)
        return wrapper
