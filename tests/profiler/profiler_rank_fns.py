"""Functions the profiler tests run on every rank (module level: pickled by reference)."""
from __future__ import annotations

import os
import time

import numpy as np


def _instrumented_backend() -> bool:
    """Whether comm/backend.py emits collective spans yet (another engineer adds them)."""
    from neural_arch.profiler import events

    seen = []
    events.subscribe(seen.append)
    try:
        import neural_arch.distributed as dist

        dist.all_reduce(np.zeros(1))
    finally:
        events.unsubscribe(seen.append)
    return any(s.category == "collective" for s in seen)


def profile_collectives(trace_dir: str, n: int = 5):
    """Profile a few all_reduces and a record_function; return (rank, offset, rtt, categories seen)."""
    import neural_arch.distributed as dist
    from neural_arch.profiler import profile, record_function

    with profile(trace_dir=trace_dir) as prof:
        for i in range(n):
            with record_function("forward"):
                x = np.full(256, float(dist.get_rank() + i))
            dist.all_reduce(x)
    return {"rank": dist.get_rank(), "offset": prof.offset_s, "rtt": prof.rtt_s,
            "categories": sorted({s.category for s in prof.spans}), "path": prof.trace_path,
            "instrumented": _instrumented_backend()}


def timeline_hooks(trace_dir: str):
    """What groups.py's hooks do around a job, called by hand here: start at init, stop at destroy."""
    import neural_arch.distributed as dist
    from neural_arch.profiler import record_function, start_timeline_from_env, stop_timeline

    prof = start_timeline_from_env(environ={"NEURAL_ARCH_TIMELINE": trace_dir})
    with record_function("backward"):
        dist.all_reduce(np.ones(8))
    return stop_timeline(), prof.world_size


def stall(warning_s: float, sleeper: int, sleep_s: float):
    """Every rank joins an all_reduce; ``sleeper`` arrives ``sleep_s`` late. Returns the reports."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.stall import StallInspector

    inspector = StallInspector(warning_s=warning_s, interval=0.05).start()
    try:
        dist.barrier()
        if dist.get_rank() == sleeper:
            time.sleep(sleep_s)
        dist.all_reduce(np.ones(4))       # the synchronous fast path: found in the backend's op slot
    finally:
        inspector.stop()
    return [(r.op, r.seq, r.group, r.missing, r.waiting, r.message) for r in inspector.reports]


def metrics_two_steps():
    """DistributedMetrics over two steps with spans; returns (local summary, global summary)."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.metrics import DistributedMetrics
    from neural_arch.profiler import events, record_function

    m = DistributedMetrics()
    rank = dist.get_rank()
    for _ in range(2):
        with m.step(samples=10 * (rank + 1), tokens=100):
            with record_function("forward"):
                time.sleep(0.01)
            t0 = events.now()  # a collective that outlives compute by ~20 ms: exposed
            time.sleep(0.02)
            events.emit(events.Span("all_reduce", "collective", t0, events.now(), "comm", {"bytes": 1000}))
        m.update_metric("loss", float(rank))
    return m.summary(), m.global_summary()


def seed004_collector():
    """Seed 004's DistributedMetricsCollector, as the guide writes it, with torch -> neural_arch."""
    import neural_arch as torch
    import neural_arch.distributed as dist

    class DistributedMetricsCollector:
        """Collect and aggregate metrics across distributed processes."""

        def __init__(self, rank, world_size):
            self.rank = rank
            self.world_size = world_size
            self.metrics = {}

        def update_metric(self, name, value):
            """Update a metric value."""
            if name not in self.metrics:
                self.metrics[name] = []
            self.metrics[name].append(value)

        def compute_global_metrics(self):
            """Compute global metrics across all processes."""

            global_metrics = {}

            for name, values in self.metrics.items():
                local_mean = torch.tensor(sum(values) / len(values))

                # Gather means from all processes
                gathered_means = [torch.zeros_like(local_mean) for _ in range(self.world_size)]
                dist.all_gather(gathered_means, local_mean)

                # Compute global mean
                global_mean = sum(gathered_means) / self.world_size
                global_metrics[name] = global_mean.item()

            return global_metrics

    from neural_arch.distributed.metrics import DistributedMetricsCollector as Ours

    rank, world = dist.get_rank(), dist.get_world_size()
    theirs, ours = DistributedMetricsCollector(rank, world), Ours(rank, world)
    for c in (theirs, ours):
        c.update_metric("loss", 1.0 + rank)
        c.update_metric("loss", 3.0 + rank)
        c.update_metric("acc", 0.5)
    return theirs.compute_global_metrics(), ours.compute_global_metrics()


def topology_layout():
    from neural_arch.distributed.topology import discover

    topo = discover()
    return topo.to_dict(), str(topo), os.environ.get("NEURAL_ARCH_HOST_ID")
