"""neural_arch.profiler: spans of work on every rank -> Chrome traces and metrics.

``events`` is the seam the runtime reports to (see :mod:`neural_arch.profiler.events`);
:class:`profile` records them on every rank and writes one merged Chrome trace;
:class:`record_function` marks your own code (forward, backward, optimizer step) as spans.

Example::

    from neural_arch import profiler
    with profiler.profile(trace_dir="traces"):
        for x, y in loader:
            with profiler.record_function("forward"):
                loss = F.cross_entropy(ddp(x), y)
            with profiler.record_function("backward"):
                loss.backward()
    # traces/trace.json on rank 0: open it in chrome://tracing or ui.perfetto.dev
"""
from neural_arch.profiler import events
from neural_arch.profiler.profiler import (
    TIMELINE_ENV,
    current_timeline,
    profile,
    start_timeline_from_env,
    stop_timeline,
)
from neural_arch.profiler.recorder import Recorder, record_function

__all__ = [
    "TIMELINE_ENV",
    "Recorder",
    "current_timeline",
    "events",
    "profile",
    "record_function",
    "start_timeline_from_env",
    "stop_timeline",
]
