"""Writing the ring out: one JSON file per rank, atomically, when something went wrong.

:func:`dump` is called on a collective timeout, when a group is poisoned, when a peer's failure
reaches this rank (all three are ``OpRunner._failed``: the first failure of each group) and on
``SIGUSR1`` (the handler :func:`install_signal_handler` puts in place when the first backend is
created, unless the program already handles that signal). Where it goes:

* ``NEURAL_ARCH_FLIGHT_RECORDER_DIR`` when set (MPI jobs have no store: set it there):
  ``DIR/rank<R>.json``, written through :mod:`neural_arch.utils.atomic_file`, so a reader never
  sees half a dump;
* else the rendezvous store, when the world group has one, under ``flight_recorder/rank<R>``
  (zlib-compressed JSON; :func:`fetch_from_store` writes those out as files for the analyzer);
* else nowhere (a log line says to set ``NEURAL_ARCH_FLIGHT_RECORDER_DIR``): stray files in the
  temporary folder of every job that ever failed would be worse than no dump.

A rank idle in user code (a hang outside any collective) sees no failure of its own, so the first
rank whose collective fails also **asks every rank to dump** (:func:`request_dumps`: a request file
in the dump folder, else a key in the rendezvous store), and every rank runs a daemon thread,
:class:`DumpWatcher`, that checks for a request every ``NEURAL_ARCH_FLIGHT_RECORDER_POLL_S``
seconds and dumps once per request (unless it dumped for this failure already): torch's
watchdog polls its store for the same reason. ``SIGUSR1`` stays the operator's way in.

Example::

    >>> import json, os, tempfile
    >>> from neural_arch.distributed.flight_recorder.buffer import FlightRecorder
    >>> rec = FlightRecorder(size=8); rec.rank, rec.world_size = 0, 1
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = dump("example", recorder=rec, folder=folder)
    ...     with open(path) as f:
    ...         json.load(f)["reason"], os.path.basename(path)
    ('example', 'rank0.json')
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import zlib

from neural_arch import config
from neural_arch.distributed.flight_recorder import buffer
from neural_arch.utils.atomic_file import atomic_write_bytes

__all__ = ["DIR_ENV", "POLL_ENV", "REQUEST_FILE", "REQUEST_KEY", "STORE_PREFIX", "DumpWatcher", "dump",
           "dump_payload", "fetch_from_store", "install_signal_handler", "request_dumps", "start_dump_watcher"]

DIR_ENV = "NEURAL_ARCH_FLIGHT_RECORDER_DIR"
POLL_ENV = "NEURAL_ARCH_FLIGHT_RECORDER_POLL_S"
STORE_PREFIX = "flight_recorder/rank"
REQUEST_KEY = "flight_recorder/request"
REQUEST_FILE = ".dump_request"
# A rank that dumped this long before a peer's request took part in the same failure (its own
# timeout or the poisoning): its dump says more than a requested one would, so it is kept.
_SAME_FAILURE_S = 2.0
FORMAT_VERSION = 1
_log = logging.getLogger("neural_arch.distributed")
# A store whose host died must not hold the failing rank's error back for the store's timeout.
_STORE_WAIT_S = 2.0
_dump_lock = threading.Lock()


def dump_payload(reason: str, recorder: buffer.FlightRecorder | None = None) -> dict:
    """What a dump holds: who (rank, world size, backend, host, pid), why, when, and the records.

    Example::

        >>> from neural_arch.distributed.flight_recorder.buffer import FlightRecorder
        >>> sorted(dump_payload("why", FlightRecorder(size=1)))[:4]
        ['backend', 'entries', 'host', 'pid']
    """
    rec = buffer.RECORDER if recorder is None else recorder
    return {"version": FORMAT_VERSION, "rank": rec.rank, "world_size": rec.world_size, "backend": rec.backend,
            "host": socket.gethostname(), "pid": os.getpid(), "reason": reason, "time": time.time(),
            "ring_size": rec.size, "entries": rec.snapshot()}


def dump(reason: str, recorder: buffer.FlightRecorder | None = None, folder: str | None = None) -> str | None:
    """Write this rank's records (see the module docstring for where); returns the file's path,
    ``"store:<key>"``, or None when the recorder is off. Never raises: a dump is a diagnostic on a
    path that is already failing.

    Example::

        path = dump("operator asked")        # what the SIGUSR1 handler does
    """
    rec = buffer.RECORDER if recorder is None else recorder
    if rec.ring is None:
        return None
    try:
        with _dump_lock:
            data = json.dumps(dump_payload(reason, rec)).encode()
            rank = rec.rank if rec.rank is not None else f"pid{os.getpid()}"
            folder = folder or config.get(DIR_ENV)
            store = None if folder else rec.rendezvous_store()
            if store is not None:
                key = f"{STORE_PREFIX}{rank}"
                # compressed: a thousand ranks' histories all land on the store's host
                if _store_set(store, key, zlib.compress(data, 1)):
                    rec.last_dump = time.time()
                    return f"store:{key}"
            if not folder:
                # nowhere to write: a test suite or a job must not find stray files in <tmp>
                (_log.warning if reason == "SIGUSR1" else _log.info)(
                    "flight recorder: not dumped (%s): set %s (MPI jobs have no store)", reason, DIR_ENV)
                return None
            path = os.path.join(folder, f"rank{rank}.json")
            os.makedirs(folder, exist_ok=True)
            atomic_write_bytes(path, data)
            rec.last_dump = time.time()
            return path
    except Exception as exc:  # noqa: BLE001 - the failure being reported matters more than its dump
        _log.warning("flight recorder: could not dump (%s): %s", reason, exc)
        return None


def _store_set(store, key: str, data: bytes) -> bool:
    done = []

    def put():
        try:
            store.set(key, data)
            done.append(True)
        except Exception as exc:  # noqa: BLE001 - falls back to a file
            _log.debug("flight recorder: store.set(%s) failed: %s", key, exc)
    t = threading.Thread(target=put, name="neural_arch-flight-recorder-dump", daemon=True)
    t.start()
    t.join(_STORE_WAIT_S)
    return bool(done)


def fetch_from_store(store, world_size: int, folder: str, wait: float = 0.0) -> list:
    """Write the dumps ranks put in ``store`` as ``folder/rank<R>.json`` (for the analyzer);
    returns the ranks found. A rank that never dumped is simply absent.

    Example::

        # on any process that can reach the job's store, after a failure
        fetch_from_store(store, world_size=8, folder="fr_dumps")
        # then: python -m neural_arch.distributed.flight_recorder fr_dumps
    """
    found = []
    os.makedirs(folder, exist_ok=True)
    for r in range(world_size):
        key = f"{STORE_PREFIX}{r}"
        try:
            if not store.check([key]):
                continue
            data = store.get(key)
        except Exception as exc:  # noqa: BLE001 - a missing key is a missing rank
            _log.debug("flight recorder: no dump of rank %d in the store: %s", r, exc)
            continue
        atomic_write_bytes(os.path.join(folder, f"rank{r}.json"), zlib.decompress(bytes(data)))
        found.append(r)
    return found


def request_dumps(reason: str, recorder: buffer.FlightRecorder | None = None,
                  folder: str | None = None) -> str | None:
    """Ask every rank to dump (see the module docstring): ``folder/.dump_request`` when there is a
    dump folder, else the rendezvous store's ``flight_recorder/request`` key. Returns where the
    request went, or None. Never raises.

    Example::

        >>> import json, os, tempfile
        >>> rec = buffer.FlightRecorder(size=4); rec.rank = 0
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     where = request_dumps("all_reduce #3 timed out", recorder=rec, folder=folder)
        ...     with open(where) as f:
        ...         json.load(f)["rank"]
        0
    """
    rec = buffer.RECORDER if recorder is None else recorder
    if rec.ring is None:
        return None
    try:
        data = json.dumps({"rank": rec.rank, "time": time.time(), "pid": os.getpid(), "reason": reason}).encode()
        folder = folder or config.get(DIR_ENV)
        if folder:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, REQUEST_FILE)
            atomic_write_bytes(path, data)
            return path
        store = rec.rendezvous_store()
        if store is not None and _store_set(store, REQUEST_KEY, data):
            return f"store:{REQUEST_KEY}"
    except Exception as exc:  # noqa: BLE001 - a diagnostic on a path that is already failing
        _log.debug("flight recorder: could not ask the peers to dump: %s", exc)
    return None


class DumpWatcher:
    """A daemon thread that dumps this rank's records when a peer asks (:func:`request_dumps`).

    Every ``interval`` seconds it reads the request (the dump folder's ``.dump_request`` file, else
    the rendezvous store's key); a request it has not answered, made after the watcher started
    (older ones belong to another run), by another rank, more than a moment after this rank's own
    last dump, is answered with ``dump("requested by rank R: ...")``. A store that stops answering
    (its host is gone) is given up after a few tries; a folder keeps being read.

    Example::

        >>> w = DumpWatcher(interval=0)      # 0: not started
        >>> w.thread is None
        True
    """

    _MAX_STORE_ERRORS = 3

    def __init__(self, interval: float | None = None, recorder: buffer.FlightRecorder | None = None):
        self.interval = float(config.get(POLL_ENV) if interval is None else interval)
        self.recorder = recorder
        self.started = time.time()
        self.answered: set = set()
        self._store_errors = 0
        self._stop = threading.Event()
        self.thread = None
        if self.interval > 0:
            self.thread = threading.Thread(target=self._run, name="neural_arch-flight-recorder-watcher", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _read(self):
        rec = buffer.RECORDER if self.recorder is None else self.recorder
        folder = config.get(DIR_ENV)
        if folder:
            try:
                with open(os.path.join(folder, REQUEST_FILE), "rb") as fh:
                    return json.loads(fh.read())
            except (OSError, ValueError):
                return None
        store = rec.rendezvous_store()
        if store is None or self._store_errors >= self._MAX_STORE_ERRORS:
            return None
        try:
            if not store.check([REQUEST_KEY]):
                self._store_errors = 0
                return None
            request = json.loads(bytes(store.get(REQUEST_KEY)))
            self._store_errors = 0
            return request
        except Exception as exc:  # noqa: BLE001 - the store's host may be gone: stop asking after a few tries
            self._store_errors += 1
            _log.debug("flight recorder: dump request not readable from the store: %s", exc)
            return None

    def poll(self) -> str | None:
        """Check once; returns where this rank dumped, or None."""
        request = self._read()
        if not isinstance(request, dict):
            return None
        rec = buffer.RECORDER if self.recorder is None else self.recorder
        when, who = float(request.get("time", 0.0)), request.get("rank")
        key = (who, when)
        if key in self.answered or when < self.started or (who is not None and who == rec.rank):
            return None
        self.answered.add(key)
        if rec.last_dump >= when - _SAME_FAILURE_S:
            return None
        return dump(f"requested by rank {who}: {request.get('reason', '')}"[:2000], recorder=self.recorder)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a watcher must never take the process down
                _log.debug("flight recorder: dump watcher: %s", exc)


_watcher: DumpWatcher | None = None


def start_dump_watcher() -> DumpWatcher | None:
    """Start this process's :class:`DumpWatcher` once (``OpRunner`` does this when the first
    backend with peers is created); None when ``NEURAL_ARCH_FLIGHT_RECORDER_POLL_S`` is 0 or the
    recorder is off.

    Example::

        start_dump_watcher()
    """
    global _watcher
    if _watcher is None and buffer.RECORDER.ring is not None:
        watcher = DumpWatcher()
        if watcher.thread is not None:
            _watcher = watcher
    return _watcher


_installed = False


def install_signal_handler() -> bool:
    """Dump on ``SIGUSR1`` (``kill -USR1 <pid>`` on a hung rank), unless the program handles that
    signal itself or this is not the main thread (where Python allows handlers). Returns whether
    the handler is in place. The dump runs between two bytecodes of the main thread, so a rank
    blocked in a C call (a collective's wait) dumps once it returns to Python; a rank busy or
    sleeping in Python code dumps at once.

    Example::

        install_signal_handler()       # OpRunner does this when the first backend is created
    """
    global _installed
    if _installed:
        return True
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return False
        signal.signal(signal.SIGUSR1, _on_signal)
    except (ValueError, OSError):
        return False
    _installed = True
    return True


def _on_signal(signum, frame) -> None:
    path = dump("SIGUSR1")
    _log.warning("flight recorder: SIGUSR1: dumped to %s", path)
