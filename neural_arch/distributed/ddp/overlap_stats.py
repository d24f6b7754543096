"""How much of DDP's gradient communication overlapped backward: an observer of the reducer.

The :class:`~neural_arch.distributed.ddp.reducer.Reducer` tells a :class:`BucketTimingObserver`
what happens to each bucket (its last gradient arrived: *ready*; handed to the comm hook:
*launched*; its reduction finished: *done*) and when backward starts and ends. From those
instants the observer keeps, per synchronised backward:

* a **timeline** of events in time order (:meth:`~neural_arch.distributed.ddp.distributed_data_parallel.DistributedDataParallel.bucket_timeline`);
* one **record** per bucket: ready, launched, started, done, seconds of communication and the
  part of it before backward's end ("hidden") (:meth:`~neural_arch.distributed.ddp.distributed_data_parallel.DistributedDataParallel.bucket_stats`);
* **totals** over all synchronised backwards (:meth:`~neural_arch.distributed.ddp.distributed_data_parallel.DistributedDataParallel.comm_stats`).

A bucket's reduction *started* when the backend says (the Work's ``started_at``) or, if it does
not, at max(its launch, the previous bucket's end): a group's collectives run one after another.
The part of started -> done before backward's end is hidden; the rest is exposed (backward's end
had to wait for it). The same four instants are emitted to :mod:`neural_arch.profiler.events`
as one span per bucket (``"bucket i"``, category ``"bucket"``, ready -> done) when something
subscribes.

Example::

    >>> obs = BucketTimingObserver([4096, 1024])
    >>> obs.comm_stats()["backwards"], obs.comm_stats()["bucket_comm_s"]
    (0, [0.0, 0.0])
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from neural_arch.profiler import events

__all__ = ["BucketTimingObserver"]


class BucketTimingObserver:
    """Timeline, per-bucket records and overlap totals of one DDP reducer's buckets.

    Args:
        bucket_nbytes: the size in bytes of each bucket, in launch order.

    Example::

        observer = BucketTimingObserver([b.flat.nbytes for b in buckets])
        observer.bucket_ready(0); observer.bucket_launched(0)
        observer.bucket_done(0, work)            # when bucket 0's all-reduce completed
        observer.backward_ended()
    """

    def __init__(self, bucket_nbytes: Sequence[int]):
        self.nbytes = [int(n) for n in bucket_nbytes]
        n = len(self.nbytes)
        # perf_counter times of this backward, per bucket: last gradient in, handed to the hook,
        # reduction started (as the backend reports it; 0.0 if it does not), reduction done
        self.t_ready = [0.0] * n
        self.t_launch = [0.0] * n
        self.t_start = [0.0] * n
        self.t_done = [0.0] * n
        #: totals over synchronised backwards (see :meth:`comm_stats`)
        self.stats = {"backwards": 0, "comm_s": 0.0, "exposed_s": 0.0, "launched_before_end": 0, "buckets": 0}
        #: per bucket, summed like ``stats``: seconds of communication, and the part of it before backward's end
        self.bucket_comm_s = np.zeros(n)
        self.bucket_hidden_s = np.zeros(n)
        #: [(event, bucket index or None, perf_counter time)] of the latest synchronised backward
        self.timeline: list = []
        #: one dict per bucket of the latest synchronised backward (see :meth:`_bucket_records`)
        self.records: list[dict] = []

    # -- what the reducer reports ------------------------------------------------------------------
    def iteration_started(self, event: str | None = None) -> None:
        """A new reduction begins: forget this backward's instants; ``event`` (``"backward_start"``
        or ``"manual_sync"``) starts a new timeline."""
        n = len(self.nbytes)
        self.t_ready, self.t_launch, self.t_start, self.t_done = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        if event is not None:
            self.timeline = [(event, None, time.perf_counter())]

    def bucket_ready(self, b: int) -> None:
        self.t_ready[b] = time.perf_counter()

    def bucket_launched(self, b: int) -> None:
        t = self.t_launch[b] = time.perf_counter()
        if not self.t_ready[b]:
            self.t_ready[b] = t  # filled at backward's end (gradients that never arrived)
        self.timeline.append(("launch", b, t))

    def bucket_done(self, b: int, work) -> None:
        self.t_done[b] = getattr(work, "completed_at", None) or time.perf_counter()
        # when the backend started it, if it says (else estimated from the serial lane)
        self.t_start[b] = getattr(work, "started_at", None) or 0.0

    def backward_ended(self) -> float:
        t = time.perf_counter()
        self.timeline.append(("backward_end", None, t))
        return t

    def waited(self, t_end: float, launched_before_end: int, record: bool = True) -> None:
        """Every result is in. ``record=False`` (join's shadow backward) keeps it out of the statistics."""
        self.timeline.append(("waited", None, time.perf_counter()))
        if record:
            self._record(t_end, launched_before_end)

    # -- what DDP reads ------------------------------------------------------------------------------
    def comm_stats(self) -> dict:
        """Totals over all synchronised backwards (see :meth:`~neural_arch.distributed.ddp.distributed_data_parallel.DistributedDataParallel.comm_stats`)."""
        s = dict(self.stats)
        s["hidden_fraction"] = 1.0 - s["exposed_s"] / s["comm_s"] if s["comm_s"] > 0 else 0.0
        s["bucket_comm_s"] = self.bucket_comm_s.tolist()
        s["bucket_hidden_fraction"] = [float(h / c) if c > 0 else 0.0
                                       for h, c in zip(self.bucket_hidden_s, self.bucket_comm_s)]
        return s

    def reset(self) -> None:
        """Zero the totals."""
        for k in self.stats:
            self.stats[k] = 0 if isinstance(self.stats[k], int) else 0.0
        self.bucket_comm_s[:] = 0.0
        self.bucket_hidden_s[:] = 0.0

    # -- the arithmetic --------------------------------------------------------------------------------
    def _bucket_records(self, t_end: float) -> list[dict]:
        """Per bucket of this backward: when it was ready, launched, started, done (perf_counter),
        its bytes, and how much of its communication ran before backward's end (hidden).

        A backend runs a group's collectives one after another on its progress lane, so a bucket
        starts at max(its launch, the previous bucket's end) unless the Work says when it started."""
        records, prev_done = [], 0.0
        for b, nbytes in enumerate(self.nbytes):
            start = self.t_start[b] or max(self.t_launch[b], prev_done)
            done = max(self.t_done[b], start)
            comm = done - start
            hidden = min(max(t_end - start, 0.0), comm)
            records.append({"index": b, "bytes": nbytes, "ready": self.t_ready[b],
                            "launched": self.t_launch[b], "started": start, "done": done, "comm_s": comm,
                            "hidden_s": hidden, "hidden_fraction": hidden / comm if comm > 0 else 1.0})
            prev_done = done
        return records

    def _record(self, t_end: float, launched_before_end: int) -> None:
        # "Hidden" communication ran while backward still computed; the rest is "exposed": the
        # end of backward had to wait for it.
        records = self.records = self._bucket_records(t_end)
        for r in records:
            self.timeline.append(("ready", r["index"], r["ready"]))
            self.timeline.append(("done", r["index"], r["done"]))
        self.timeline.sort(key=lambda e: e[2])  # stable: events at the same instant keep their order
        comm = sum(r["comm_s"] for r in records)
        hidden = sum(r["hidden_s"] for r in records)
        self.bucket_comm_s += [r["comm_s"] for r in records]
        self.bucket_hidden_s += [r["hidden_s"] for r in records]
        s = self.stats
        s["backwards"] += 1
        s["comm_s"] += comm
        s["exposed_s"] += comm - hidden
        s["launched_before_end"] += launched_before_end
        s["buckets"] += len(records)
        if events.OBSERVERS:
            # One span per bucket, ready -> done (it overlaps backward when communication was hidden).
            for r in records:
                events.emit(events.Span(f"bucket {r['index']}", "bucket", r["ready"], r["done"], lane="ddp buckets",
                                        args={"index": r["index"], "bytes": r["bytes"], "ready": r["ready"],
                                              "launched": r["launched"], "started": r["started"], "done": r["done"],
                                              "hidden_fraction": round(r["hidden_fraction"], 4)}))
