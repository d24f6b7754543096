"""``SerialLane``: run submitted operations one after another, in submission order, on one thread.

A backend has one lane for its collectives (they must run in the same order on every rank) and
one lane per (direction, peer, tag) for asynchronous point-to-point operations (two ``isend`` to
the same peer and tag must arrive in the order they were issued, as in torch and MPI). The
thread starts on first use.

Example::

    lane = SerialLane("progress", execute=lambda work, fn: work._set_result(fn()))
    work = Work()
    lane.submit(work, lambda: 42)
    work.result()          # 42
    lane.close("done")
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional

from neural_arch.distributed.comm.work import Work
from neural_arch.distributed.errors import DistributedError

_log = logging.getLogger("neural_arch.distributed")


class SerialLane:
    """A FIFO of ``(work, fn)`` run by ``execute(work, fn)`` on one daemon thread.

    Example::

        >>> from neural_arch.distributed.comm.work import Work
        >>> lane = SerialLane("progress", execute=lambda work, fn: work._set_result(fn()))
        >>> work = Work()
        >>> lane.submit(work, lambda: 42)
        >>> work.wait(), work.result()
        (True, 42)
        >>> lane.close("done")
    """

    def __init__(self, name: str, execute: Callable[[Work, Callable[[], Any]], None]):
        self.name = name
        self._execute = execute
        self._queue: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._closed: Optional[str] = None
        #: operations submitted and not finished yet (a synchronous call must queue behind them)
        self.pending = 0

    def submit(self, work: Work, fn: Callable[[], Any]) -> None:
        with self._lock:
            if self._closed is not None:
                work._set_exception(DistributedError(f"{self._describe(work)} was not started: {self._closed}"))
                return
            self.pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name=self.name)
                self._thread.start()
            self._queue.put((work, fn))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, fn = item
            try:
                self._execute(work, fn)
            except BaseException as exc:  # noqa: BLE001 - execute stores errors; this is a last resort
                _log.exception("%s: unexpected error running %r", self.name, work)
                if not work.is_completed():
                    work._set_exception(exc)
            finally:
                with self._lock:
                    self.pending -= 1
            # Drop the finished op now: its closure holds its arrays (a whole FSDP unit's flat
            # gradients) until the next op arrives otherwise.
            del item, work, fn

    def close(self, reason: str, timeout: float = 5.0) -> None:
        """Fail every queued operation that has not started (with ``reason``) and stop the thread."""
        with self._lock:
            self._closed = reason
            thread = self._thread
            dropped = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    dropped.append(item[0])
                    self.pending -= 1
        for work in dropped:
            work._set_exception(DistributedError(f"{self._describe(work)} was not started: {reason}"))
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join(timeout)

    @staticmethod
    def _describe(work: Work) -> str:
        return work.info.describe() if work.info is not None else "an operation"
