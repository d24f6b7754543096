"""``with profile(trace_dir=...)``: record every rank's spans and write one merged Chrome trace.

On entry (collective over the group: every rank enters) the ranks estimate their clock offsets
to rank 0 (:mod:`.clock`) and agree on a common zero; then each rank records every span the
runtime emits (collectives, DDP buckets, pipeline actions, ``record_function`` blocks). On exit
each rank writes ``trace_dir/rank{R}.json`` and rank 0 gathers them over the group into
``trace_dir/trace.json``, which opens in ``chrome://tracing`` or https://ui.perfetto.dev with one
process row per rank and one thread row per lane.

Without a process group (or in a world of one) it records this process alone. Setting
``NEURAL_ARCH_TIMELINE=dir`` does the same for a whole job, from ``init_process_group()`` to
``destroy_process_group()`` (:func:`start_timeline_from_env` / :func:`stop_timeline` are the
hooks ``groups.py`` calls).

>>> import tempfile, os
>>> from neural_arch.profiler import profile, record_function
>>> with tempfile.TemporaryDirectory() as d:
...     with profile(trace_dir=d) as prof:
...         with record_function("forward"):
...             pass
...     sorted(os.listdir(d)), len(prof.spans)
(['rank0.json', 'trace.json'], 1)

The profiler never imports ``neural_arch.distributed`` (it sits below it): it finds the running
job's default group through ``sys.modules`` only when the distributed package is loaded.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import sys

import numpy as np

from neural_arch import config
from neural_arch.profiler import chrome, events
from neural_arch.profiler.clock import DEFAULT_ROUNDS, estimate_offsets
from neural_arch.profiler.recorder import Recorder

__all__ = ["TIMELINE_ENV", "current_timeline", "profile", "start_timeline_from_env", "stop_timeline"]

TIMELINE_ENV = "NEURAL_ARCH_TIMELINE"
MERGED_NAME = "trace.json"
_TAG = 7302
_log = logging.getLogger("neural_arch.profiler")


def _default_group():
    """The running job's world group, or None (no distributed package loaded / not initialised)."""
    state = sys.modules.get("neural_arch.distributed.state")
    world = getattr(getattr(state, "STATE", None), "world", None)
    if world is None or getattr(world, "destroyed", False):
        return None
    return world


class profile:
    """Record spans on this rank; on exit write per-rank and merged Chrome traces.

    Args:
        trace_dir: folder for ``rank{R}.json`` and (rank 0) ``trace.json``; None keeps spans in
            memory only (read ``prof.spans`` / call ``prof.export_chrome_trace(path)``).
        group: the process group to synchronise clocks and merge over (default: the world, when
            one is initialised). Every rank of it must enter and leave the block together.
        merge: gather the ranks' traces to rank 0 on exit (a collective).
        clock_rounds: ping-pong exchanges per rank for the clock offset (minimum-RTT one is kept).

    After exit: ``prof.spans`` (this rank's spans), ``prof.offset_s`` / ``prof.rtt_s`` (this rank's
    clock minus rank 0's, and the round trip that bounds its error), ``prof.trace_path`` (the merged
    trace on rank 0, this rank's file elsewhere).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.profiler import profile, record_function
        >>> with profile(merge=False) as prof:         # spans kept in memory (no trace_dir)
        ...     with record_function("forward"):
        ...         y = na.ones(2) * 2
        >>> [s.name for s in prof.spans]
        ['forward']
    """

    def __init__(self, trace_dir: str | None = None, group=None, merge: bool = True,
                 clock_rounds: int = DEFAULT_ROUNDS):
        self.trace_dir = os.fspath(trace_dir) if trace_dir is not None else None
        self._group_arg = group
        self.merge = bool(merge)
        self.clock_rounds = int(clock_rounds)
        self.recorder = Recorder()
        self.group = None
        self.rank, self.world_size, self.global_rank = 0, 1, 0
        self.offset_s, self.rtt_s, self.epoch = 0.0, 0.0, 0.0
        self.offsets: list[float] = [0.0]
        self.trace_path: str | None = None
        self._running = False

    @property
    def spans(self) -> list[events.Span]:
        return self.recorder.spans

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> profile:
        if self._running:
            raise RuntimeError("profile.start(): this profile is already running")
        pg = self._group_arg if self._group_arg is not None else _default_group()
        self.group = pg if pg is not None and pg.size() > 1 else None
        if pg is not None:
            self.rank, self.world_size = pg.rank(), pg.size()
            self.global_rank = pg.ranks[pg.rank()] if hasattr(pg, "ranks") else pg.rank()
        epoch = np.array([events.now()], dtype=np.float64)
        if self.group is not None:
            backend = self.group.backend
            self.offsets, rtts = estimate_offsets(backend, self.clock_rounds)
            self.offset_s, self.rtt_s = self.offsets[self.rank], rtts[self.rank]
            backend.broadcast(epoch, 0)  # rank 0's "now" is every rank's zero
        self.epoch = float(epoch[0])
        self.recorder.start()
        self._running = True
        return self

    def stop(self, merge: bool | None = None) -> str | None:
        """Stop recording, write the traces; returns ``trace_path``. ``merge=False`` skips the
        collective gather (what an exception inside the block does: peers may not be there)."""
        if not self._running:
            return self.trace_path
        self.recorder.stop()
        self._running = False
        doc = self.chrome_trace()
        if self.trace_dir is not None:
            self.trace_path = chrome.write_trace(os.path.join(self.trace_dir, f"rank{self.global_rank}.json"), doc)
        merge = self.merge if merge is None else merge
        if merge and self.group is not None:
            docs = self._gather(doc)
            if docs is not None and self.trace_dir is not None:
                self.trace_path = chrome.write_trace(os.path.join(self.trace_dir, MERGED_NAME),
                                                     chrome.merge_traces(docs))
        elif self.trace_dir is not None and self.world_size == 1:
            self.trace_path = chrome.write_trace(os.path.join(self.trace_dir, MERGED_NAME),
                                                 chrome.merge_traces([doc]))
        return self.trace_path

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(merge=None if exc_type is None else False)

    # -- output ------------------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        """This rank's spans as a Chrome trace document (on rank 0's clock)."""
        meta = {"rank": self.global_rank, "world_size": self.world_size, "clock_offset_s": self.offset_s,
                "clock_rtt_s": self.rtt_s, "host": socket.gethostname(), "pid": os.getpid()}
        evs = chrome.spans_to_events(self.spans, self.global_rank, self.offset_s, self.epoch)
        return chrome.trace_document(evs, meta)

    def export_chrome_trace(self, path: str) -> str:
        """torch's name: write this rank's trace to ``path``."""
        return chrome.write_trace(path, self.chrome_trace())

    def _gather(self, doc: dict) -> list[dict] | None:
        """Every rank's document on group rank 0 (p2p: the others send JSON bytes), None elsewhere."""
        import json

        backend = self.group.backend
        if self.rank != 0:
            payload = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8).copy()
            backend.send(np.array([payload.size], dtype=np.int64), 0, tag=_TAG)
            backend.send(payload, 0, tag=_TAG)
            return None
        docs = [doc]
        for r in range(1, self.world_size):
            n = np.zeros(1, dtype=np.int64)
            backend.recv(n, r, tag=_TAG)
            buf = np.empty(int(n[0]), dtype=np.uint8)
            backend.recv(buf, r, tag=_TAG)
            docs.append(json.loads(buf.tobytes().decode()))
        return docs


# -- NEURAL_ARCH_TIMELINE: a job-long profile started at init and finished at destroy ------------------
_TIMELINE: profile | None = None


def current_timeline() -> profile | None:
    """The job-long profile started from ``NEURAL_ARCH_TIMELINE`` (None when off).

    Example::

        >>> from neural_arch.profiler.profiler import current_timeline
        >>> current_timeline() is None        # NEURAL_ARCH_TIMELINE unset: no job-long profile
        True
    """
    return _TIMELINE


def start_timeline_from_env(group=None, environ=None) -> profile | None:
    """Hook for ``init_process_group()``: start a job-long profile when ``NEURAL_ARCH_TIMELINE``
    names a folder (collective: every rank calls it right after rendezvous). No-op otherwise.

    Example::

        >>> from neural_arch.profiler.profiler import start_timeline_from_env
        >>> start_timeline_from_env(environ={}) is None        # no NEURAL_ARCH_TIMELINE: no-op
        True
    """
    global _TIMELINE
    folder = config.get(TIMELINE_ENV, environ)
    if not folder or _TIMELINE is not None:
        return _TIMELINE
    _TIMELINE = profile(trace_dir=folder, group=group).start()
    return _TIMELINE


def stop_timeline(merge: bool = True) -> str | None:
    """Hook for ``destroy_process_group()`` (before the backends shut down): write and merge the
    job-long trace. Safe to call when no timeline runs.

    Example::

        >>> from neural_arch.profiler.profiler import stop_timeline
        >>> stop_timeline() is None                           # no timeline running: nothing written
        True
    """
    global _TIMELINE
    prof, _TIMELINE = _TIMELINE, None
    if prof is None:
        return None
    try:
        return prof.stop(merge=merge)
    except Exception as exc:  # noqa: BLE001 - a failed merge must not fail the job's teardown
        _log.warning("%s: merging the timeline failed (%s); per-rank files are in %s (merge them with "
                     "python -m neural_arch.profiler.chrome %s/rank*.json -o %s/trace.json)",
                     TIMELINE_ENV, exc, prof.trace_dir, prof.trace_dir, prof.trace_dir)
        return None


@atexit.register
def _write_unfinished_timeline() -> None:
    # A job that exits without destroy_process_group(): keep this rank's spans (no collective at exit).
    if _TIMELINE is not None:
        stop_timeline(merge=False)
