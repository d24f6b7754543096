"""Spans -> Chrome trace JSON (``chrome://tracing``, https://ui.perfetto.dev), and merging ranks.

Layout of a trace: one *process* row per rank (``pid`` = rank, named "rank N"), one *thread* row
per lane (``tid`` numbered per rank in order of first appearance, named after the lane). Every
span is a complete event (``"ph": "X"``) with ``ts``/``dur`` in microseconds since a common
zero, so merging ranks is concatenation once each rank's times were shifted onto rank 0's clock.

>>> from neural_arch.profiler.events import Span
>>> from neural_arch.profiler.chrome import spans_to_events
>>> evs = spans_to_events([Span("all_reduce", "collective", 1.0, 1.5, "comm", {"seq": 3})],
...                       rank=1, epoch=1.0)
>>> [e for e in evs if e["ph"] == "X"][0]["dur"]
500000.0
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

from neural_arch.profiler.events import Span
from neural_arch.utils.atomic_file import atomic_write_bytes

__all__ = ["load_trace", "merge_files", "merge_traces", "spans_to_events", "trace_document", "write_trace"]


def _jsonable(value):
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    try:  # NumPy scalars and the like
        return _jsonable(value.item())
    except AttributeError:
        return str(value)


def spans_to_events(spans: Iterable[Span], rank: int = 0, offset: float = 0.0, epoch: float = 0.0,
                    label: str | None = None) -> list[dict]:
    """Chrome events for one rank: metadata rows + one ``"X"`` event per span.

    A span's time ``t`` (this rank's clock) becomes ``(t - offset - epoch) * 1e6`` µs: ``offset`` is
    this rank's clock minus rank 0's, ``epoch`` a time on rank 0's clock (the profile's start).

    Example::

        >>> from neural_arch.profiler.chrome import spans_to_events
        >>> from neural_arch.profiler.events import Span
        >>> events = spans_to_events([Span("all_reduce", "collective", 1.0, 1.5)], rank=2)
        >>> [e["name"] for e in events if e["ph"] == "X"], {e["pid"] for e in events}
        (['all_reduce'], {2})
    """
    lanes: dict[str, int] = {}
    body = []
    for s in spans:
        tid = lanes.setdefault(s.lane, len(lanes))
        body.append({"name": s.name, "cat": s.category, "ph": "X", "pid": rank, "tid": tid,
                     "ts": round((s.start - offset - epoch) * 1e6, 3),
                     "dur": round(max(0.0, s.end - s.start) * 1e6, 3),
                     "args": _jsonable(s.args) if s.args else {}})
    meta = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label or f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
    for lane, tid in lanes.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    return meta + body


def trace_document(trace_events: list[dict], metadata: dict | None = None) -> dict:
    """The JSON object format both viewers read: ``{"traceEvents": [...], ...}``.

    Example::

        >>> from neural_arch.profiler.chrome import trace_document
        >>> sorted(trace_document([], metadata={"job": "demo"}))
        ['displayTimeUnit', 'otherData', 'traceEvents']
    """
    doc = {"traceEvents": trace_events, "displayTimeUnit": "ms"}
    if metadata:
        doc["otherData"] = _jsonable(metadata)
    return doc


def merge_traces(docs: Sequence[dict]) -> dict:
    """One document from per-rank documents (already on a common clock): events concatenated,
    ``otherData`` kept per rank under ``"ranks"``.

    Example::

        >>> from neural_arch.profiler.chrome import merge_traces, trace_document
        >>> a = trace_document([{"name": "x", "ph": "X", "pid": 0, "ts": 0, "dur": 1}])
        >>> b = trace_document([{"name": "y", "ph": "X", "pid": 1, "ts": 0, "dur": 1}])
        >>> [e["name"] for e in merge_traces([a, b])["traceEvents"]]
        ['x', 'y']
    """
    merged, per_rank = [], []
    for doc in docs:
        merged.extend(doc.get("traceEvents", []))
        per_rank.append(doc.get("otherData", {}))
    return trace_document(merged, {"ranks": per_rank})


def write_trace(path: str, doc: dict) -> str:
    """Write ``doc`` as JSON atomically (temp file + rename): a reader never sees half a trace.

    Example::

        >>> import os, tempfile
        >>> from neural_arch.profiler.chrome import trace_document, write_trace
        >>> path = write_trace(os.path.join(tempfile.mkdtemp(), "rank0.json"), trace_document([]))
        >>> os.path.basename(path)
        'rank0.json'
    """
    atomic_write_bytes(path, json.dumps(doc, separators=(",", ":")).encode(), make_dirs=True)
    return path


def load_trace(path: str) -> dict:
    """Read a Chrome trace file (JSON object format) back into a dict.

    Example::

        >>> import os, tempfile
        >>> from neural_arch.profiler.chrome import load_trace, trace_document, write_trace
        >>> path = write_trace(os.path.join(tempfile.mkdtemp(), "t.json"), trace_document([]))
        >>> load_trace(path)["traceEvents"]
        []
    """
    with open(path) as f:
        return json.load(f)


def merge_files(paths: Sequence[str], out: str) -> str:
    """Merge per-rank trace files (e.g. ``trace_dir/rank*.json`` left by a job that never reached
    the merge) into ``out``. Their times are already on rank 0's clock. Example::

        python -m neural_arch.profiler.chrome trace_dir/rank*.json -o trace_dir/trace.json
    """
    return write_trace(out, merge_traces([load_trace(p) for p in paths]))


def _main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="merge per-rank Chrome traces into one file")
    p.add_argument("paths", nargs="+")
    p.add_argument("-o", "--out", required=True)
    args = p.parse_args(argv)
    print(merge_files(args.paths, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
