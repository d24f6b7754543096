"""Every collective reports one span to neural_arch.profiler.events, and costs nothing when no one listens.

The span test runs a real 2-rank gloo job (processes, loopback); the zero-cost test counts calls
into ``events.begin`` on a world of one.
"""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.comm.local import LocalBackend
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.testing import RankPool
from neural_arch.profiler import events

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(120)]


def spans_of_collectives():
    """On every rank: subscribe, run a sync all_reduce, an async broadcast and a failing-free
    all_gather of int64, unsubscribe; return the collective spans as plain dicts."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor

    seen = []
    events.subscribe(seen.append)
    try:
        dist.all_reduce(Tensor(np.ones(256, np.float32)))                    # 1 KiB, synchronous
        dist.broadcast(Tensor(np.zeros((3, 2))), src=1, async_op=True).wait()  # queued on the lane
        dist.all_gather(Tensor(np.arange(4, dtype=np.int64)))
    finally:
        events.unsubscribe(seen.append)
    return [{"name": s.name, "category": s.category, "lane": s.lane, "args": s.args, "ok": s.end >= s.start}
            for s in seen if s.category == "collective"]


@pytest.fixture(scope="module")
def pool2():
    with RankPool(2, backend="gloo", timeout=60.0) as pool:
        yield pool


def test_each_collective_is_one_span_with_its_fields(pool2):
    for rank, spans in enumerate(pool2.run(spans_of_collectives)):
        assert [s["name"] for s in spans] == ["all_reduce", "broadcast", "all_gather"], spans
        ar, bc, ag = spans
        assert all(s["ok"] and s["lane"] == "default" for s in spans), spans
        assert ar["args"]["op"] == "all_reduce" and ar["args"]["bytes"] == 1024
        assert ar["args"]["dtype"] == "float32" and ar["args"]["shape"] == (256,)
        assert ar["args"]["group"] == [0, 1] and ar["args"]["size"] == 2 and ar["args"]["rank"] == rank
        assert ar["args"]["backend"] == "gloo" and ar["args"]["reduce_op"] == "sum"
        assert ar["args"]["transport"] in ("shm", "tcp"), ar["args"]      # both ranks on this host
        assert bc["args"]["seq"] == ar["args"]["seq"] + 1 and ag["args"]["seq"] == ar["args"]["seq"] + 2
        assert bc["args"]["root"] == 1 and bc["args"]["bytes"] == 48 and bc["args"]["dtype"] == "float64"
        assert ag["args"]["bytes"] == 32 and ag["args"]["dtype"] == "int64"
        assert "error" not in ar["args"]


def test_no_subscriber_means_no_span_is_built(monkeypatch):
    calls = []
    monkeypatch.setattr(events, "begin", lambda *a, **k: calls.append(a))
    backend = LocalBackend()
    backend.allreduce(np.ones(4, np.float32))
    backend.broadcast(np.ones(4), async_op=True).wait()
    assert calls == []                       # nobody listens: begin is never even called


def test_a_failing_collective_ends_its_span_with_the_error():
    class Broken(LocalBackend):
        def _run(self, info, fn, async_op, lane=None):     # make the world-of-one no-op fail
            def boom():
                raise RuntimeError("reduction exploded")
            return super()._run(info, boom, async_op, lane)

    seen = []
    events.subscribe(seen.append)
    try:
        with pytest.raises(RuntimeError, match="exploded"):
            Broken().allreduce(np.ones(2), ReduceOp.MAX)
    finally:
        events.unsubscribe(seen.append)
    (span,) = [s for s in seen if s.category == "collective"]
    assert span.name == "all_reduce" and span.args["reduce_op"] == "max"
    assert "RuntimeError: reduction exploded" in span.args["error"]


@pytest.mark.mpi
def test_mpi_fast_path_reports_its_span_too():
    with RankPool(2, backend="mpi", timeout=60.0) as pool:
        for rank, spans in enumerate(pool.run(spans_of_collectives)):
            assert [s["name"] for s in spans] == ["all_reduce", "broadcast", "all_gather"], spans
            ar = spans[0]["args"]
            assert ar["backend"] == "mpi" and ar["transport"] == "mpi" and ar["bytes"] == 1024
            assert ar["group"] == [0, 1] and ar["rank"] == rank and spans[0]["lane"] == "default"
