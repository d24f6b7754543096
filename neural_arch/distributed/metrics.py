"""Distributed training metrics: per-rank and global step time, throughput, communication.

:class:`DistributedMetrics` times steps on every rank and, from the spans the runtime emits
(:mod:`neural_arch.profiler.events`), measures the communication of each step:

* ``comm_time_s``: time during which at least one collective was running (union of spans);
* ``exposed_comm_s``: the part of it not hidden behind compute, i.e. not covered by a compute span
  (``record_function`` categories forward/backward/optimizer/compute) or covered by a ``wait``
  span (code that blocks on communication says so with one; a synchronous collective -- its span's
  ``blocking`` arg, set by the runtime -- is one: its caller computed nothing while it ran, even
  inside a forward span, as FSDP's gathers are; for DDP, the time from the last bucket becoming ready
  to the last bucket done counts as waiting: backward has no compute left then);
* ``comm_overhead_pct`` = 100 * exposed / step time; ``bytes_sent``: the collectives' ``bytes``.

:meth:`~DistributedMetrics.global_summary` combines every rank's numbers with **one** all-reduce
(each rank writes its row of a ``world x metrics`` table; the sum is the whole table), so means,
maxima (the slowest rank) and sums all come from it. Seed 004's collector pattern works as
written (``update_metric(name, value)`` locally, ``compute_global_metrics()`` for the means)::

    metrics = DistributedMetrics()
    for x, y in loader:
        with metrics.step(samples=len(y)):
            ...                                  # forward, backward, optimizer step
        metrics.update_metric("loss", loss.item())
    stats = metrics.global_summary()             # collective: every rank calls it
    metrics.log_to_tensorboard(writer, step)     # tensorboardX.SummaryWriter (pip install tensorboardX)
    metrics.write_json("metrics.json")

>>> m = DistributedMetrics(watch_spans=False)
>>> m.record_step(0.5, samples=32, comm_time=0.1, exposed_comm_time=0.05, bytes_sent=4096)
>>> s = m.summary()
>>> s["samples_per_s"], s["comm_overhead_pct"], s["bytes_sent"]
(64.0, 10.0, 4096.0)
"""
from __future__ import annotations

import csv
import json
import os
import zlib
from collections.abc import Iterable

import numpy as np

from neural_arch.profiler import events
from neural_arch.profiler.recorder import COMPUTE_CATEGORIES

__all__ = ["DistributedMetrics", "DistributedMetricsCollector", "exposed_time", "union_length"]

_STEP_KEYS = ("step_time_s", "samples", "tokens", "comm_time_s", "exposed_comm_s", "bytes_sent")


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``intervals``. ``union_length([(0, 2), (1, 3), (5, 6)]) == 4``.

    Example::

        >>> union_length([(0, 2), (1, 3), (5, 6)])
        4.0
    """
    return float(sum(b - a for a, b in _union(intervals)))


def _subtract(base: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for a, b in base:
        pieces = [(a, b)]
        for c, d in cut:
            pieces = [p for x, y in pieces for p in ((x, min(y, c)), (max(x, d), y)) if p[1] > p[0]]
        out.extend(pieces)
    return out


def exposed_time(comm, compute, waits=()) -> float:
    """Seconds of ``comm`` intervals not covered by ``compute`` minus ``waits``.

    >>> exposed_time([(0, 4)], compute=[(0, 3)])            # 1 s of comm after compute ended
    1.0
    >>> exposed_time([(0, 4)], compute=[(0, 4)], waits=[(2, 4)])   # backward waited 2 s for it
    2.0
    """
    busy = _subtract(_union(compute), _union(waits))
    return union_length(_subtract(_union(comm), _union(busy)))


class _StepTimer:
    __slots__ = ("metrics", "samples", "spans", "t0", "tokens")

    def __init__(self, metrics, samples, tokens):
        self.metrics, self.samples, self.tokens = metrics, samples, tokens
        self.spans: list = []

    def __enter__(self):
        if self.metrics.watch_spans:
            events.subscribe(self.spans.append)
        self.t0 = events.now()
        return self

    def __exit__(self, exc_type, *exc):
        t1 = events.now()
        if self.metrics.watch_spans:
            events.unsubscribe(self.spans.append)
        if exc_type is None:
            self.metrics._record_spans(self.t0, t1, self.spans, self.samples, self.tokens)


class DistributedMetrics:
    """Per-rank step metrics, and global ones from one all-reduce.

    Args:
        group: process group to combine over (default: the world; a world of one without init).
        watch_spans: measure communication from the spans emitted during :meth:`step`.

    Example::

        >>> metrics = DistributedMetrics()
        >>> metrics.record_step(0.5, samples=32)     # or: with metrics.step(samples=32): train_step()
        >>> metrics.summary()["samples_per_s"]
        64.0
    """

    def __init__(self, group=None, watch_spans: bool = True):
        self.group = group
        self.watch_spans = bool(watch_spans)
        self.metrics: dict[str, list[float]] = {}  # seed 004's name: user metrics, name -> values
        self.steps: list[dict[str, float]] = []

    # -- recording ------------------------------------------------------------------------------
    def step(self, samples: int = 0, tokens: int = 0) -> _StepTimer:
        """``with metrics.step(samples=n, tokens=t): ...`` times one training step."""
        return _StepTimer(self, samples, tokens)

    def record_step(self, step_time: float, samples: int = 0, tokens: int = 0, comm_time: float = 0.0,
                    exposed_comm_time: float | None = None, bytes_sent: int = 0) -> None:
        """Record a step measured elsewhere (``exposed_comm_time`` defaults to ``comm_time``)."""
        if not step_time > 0:
            raise ValueError(f"record_step: step_time={step_time!r} must be > 0 seconds")
        if samples < 0 or tokens < 0 or comm_time < 0 or bytes_sent < 0:
            raise ValueError("record_step: samples, tokens, comm_time and bytes_sent must be >= 0")
        exposed = comm_time if exposed_comm_time is None else exposed_comm_time
        self.steps.append({"step_time_s": float(step_time), "samples": float(samples), "tokens": float(tokens),
                           "comm_time_s": float(comm_time), "exposed_comm_s": float(min(exposed, step_time)),
                           "bytes_sent": float(bytes_sent)})

    def _record_spans(self, t0: float, t1: float, spans, samples, tokens) -> None:
        comm, compute, waits, sent = [], [], [], 0
        ready, done = [], []
        for s in spans:
            a, b = max(s.start, t0), min(s.end, t1)
            if s.category == "collective":
                comm.append((a, b))
                args = s.args
                sent += int(args.get("bytes", 0) or 0)
                if args.get("blocking"):
                    # a synchronous collective: the thread that called it (inside forward, say) computed
                    # nothing while it ran, so the compute span around it does not hide it
                    waits.append((a, b))
            elif s.category in COMPUTE_CATEGORIES:
                compute.append((a, b))
            elif s.category == "wait":
                waits.append((a, b))
            elif s.category == "bucket":
                ready.append(s.start)
                done.append(s.end)
        if ready:
            # DDP buckets span ready -> done. Backward's compute ends about when its last gradient
            # is ready; from there to the last bucket's done, backward only waits for the buckets.
            waits.append((max(ready), max(done)))
        self.record_step(t1 - t0, samples, tokens, union_length(comm), exposed_time(comm, compute, waits), sent)

    def update_metric(self, name: str, value: float) -> None:
        """Seed 004: append ``value`` to the metric ``name`` (this rank only; no communication)."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def reset(self) -> None:
        self.metrics.clear()
        self.steps.clear()

    # -- this rank ------------------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        """This rank's numbers: mean step time, throughput, communication, and user metric means."""
        out: dict[str, float] = {"steps": float(len(self.steps))}
        if self.steps:
            tot = {k: sum(s[k] for s in self.steps) for k in _STEP_KEYS}
            t = tot["step_time_s"]
            out.update({"step_time_s": t / len(self.steps), "samples_per_s": tot["samples"] / t,
                        "tokens_per_s": tot["tokens"] / t, "comm_time_s": tot["comm_time_s"] / len(self.steps),
                        "exposed_comm_s": tot["exposed_comm_s"] / len(self.steps),
                        "comm_overhead_pct": 100.0 * tot["exposed_comm_s"] / t,
                        "bytes_sent": tot["bytes_sent"], "bytes_per_step": tot["bytes_sent"] / len(self.steps)})
        for name, values in self.metrics.items():
            out[name] = sum(values) / len(values) if values else 0.0
        return out

    # -- every rank -----------------------------------------------------------------------------
    def _group(self):
        if self.group is not None:
            return self.group
        from neural_arch.distributed.state import STATE

        return STATE.world

    def gather_summaries(self) -> list[dict[str, float]]:
        """Every rank's :meth:`summary` (collective, one all-reduce). The metric names must match."""
        mine = self.summary()
        pg = self._group()
        if pg is None or pg.size() == 1:
            return [mine]
        names = sorted(mine)
        crc = float(zlib.crc32("\0".join(names).encode()))
        width = len(names) + 2
        table = np.zeros((pg.size(), width), dtype=np.float64)
        table[pg.rank(), 0], table[pg.rank(), 1] = crc, len(names)
        table[pg.rank(), 2:] = [mine[n] for n in names]
        pg.backend.allreduce(table.reshape(-1))
        bad = [pg.ranks[r] for r in range(pg.size()) if table[r, 0] != crc or table[r, 1] != len(names)]
        if bad:
            raise ValueError(f"DistributedMetrics: ranks {bad} recorded different metric names than rank "
                             f"{pg.ranks[pg.rank()]} ({names}); call update_metric()/step() with the same names "
                             "on every rank before combining")
        return [dict(zip(names, table[r, 2:].tolist())) for r in range(pg.size())]

    def compute_global_metrics(self) -> dict[str, float]:
        """Seed 004: the mean over ranks of every metric (collective)."""
        rows = self.gather_summaries()
        return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}

    def global_summary(self) -> dict[str, float]:
        """Means over ranks, plus ``*_max`` (the slowest rank) for times, and job totals:
        ``samples_per_s``/``tokens_per_s``/``bytes_sent`` are summed over ranks (they run at once).
        Also ``world_size``. Collective: every rank calls it."""
        rows = self.gather_summaries()
        out = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        for k in ("step_time_s", "comm_time_s", "exposed_comm_s", "comm_overhead_pct"):
            if k in rows[0]:
                out[f"{k}_max"] = max(r[k] for r in rows)
        for k in ("samples_per_s", "tokens_per_s", "bytes_sent", "bytes_per_step"):
            if k in rows[0]:
                out[k] = sum(r[k] for r in rows)
        out["world_size"] = float(len(rows))
        return out

    def print_metrics(self) -> None:
        """Seed 004's printout: rank 0 prints the global means. Collective (every rank calls it)."""
        pg = self._group()
        stats = self.compute_global_metrics()
        if pg is None or pg.rank() == 0:
            print("\nGlobal Metrics:")
            for name, value in stats.items():
                print(f"  {name}: {value:.6f}")

    # -- writers --------------------------------------------------------------------------------
    def log_to_tensorboard(self, writer, step: int | None = None, prefix: str = "distributed/",
                           global_: bool = True) -> dict[str, float]:
        """``writer.add_scalar`` for every number (``global_summary()`` by default, a collective: call it
        on every rank; only rank 0 writes when ``writer`` is None elsewhere). Returns the numbers.

        ``writer`` is a ``tensorboardX.SummaryWriter`` (``pip install 'neural_arch[tensorboard]'``) or
        anything with ``add_scalar(tag, value, global_step)``.
        """
        stats = self.global_summary() if global_ else self.summary()
        if writer is not None:
            if not callable(getattr(writer, "add_scalar", None)):
                raise TypeError(f"log_to_tensorboard: writer must have add_scalar(tag, value, step) "
                                f"(e.g. tensorboardX.SummaryWriter), got {type(writer).__name__}")
            step = len(self.steps) if step is None else step
            for name, value in stats.items():
                writer.add_scalar(f"{prefix}{name}", value, step)
        return stats

    def write_json(self, path: str, global_: bool = False) -> str:
        """This rank's summary and per-step rows (or, ``global_=True``, the global summary) as JSON."""
        doc = {"summary": self.global_summary() if global_ else self.summary(), "steps": self.steps}
        _makedirs(path)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        return path

    def write_csv(self, path: str) -> str:
        """One row per recorded step (``step, step_time_s, samples, ...``)."""
        _makedirs(path)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", *_STEP_KEYS])
            for i, s in enumerate(self.steps):
                w.writerow([i, *(s[k] for k in _STEP_KEYS)])
        return path


def _makedirs(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)


class DistributedMetricsCollector(DistributedMetrics):
    """Seed 004's constructor (``DistributedMetricsCollector(rank, world_size)``) on the default group.

    >>> c = DistributedMetricsCollector(0, 1)
    >>> c.update_metric("loss", 2.0); c.update_metric("loss", 1.0)
    >>> c.compute_global_metrics()["loss"]
    1.5
    """

    def __init__(self, rank: int, world_size: int, group=None):
        super().__init__(group=group, watch_spans=False)
        self.rank, self.world_size = int(rank), int(world_size)

    def summary(self) -> dict[str, float]:
        # the seed's collector reports its own metrics only
        return {name: (sum(v) / len(v) if v else 0.0) for name, v in self.metrics.items()}
