"""The profiler's parts in one process: the events seam, record_function, Chrome output, clock
offsets, the merge CLI, metrics arithmetic, stall reports and the topology's host numbering."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neural_arch.distributed.comm.local import LocalBackend
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.metrics import DistributedMetrics, exposed_time, union_length
from neural_arch.distributed.stall import StallInspector, warning_threshold
from neural_arch.distributed.topology import RankInfo, Topology, _cpulist, _ranges, numa_nodes
from neural_arch.profiler import Recorder, chrome, events, profile, record_function
from neural_arch.profiler.clock import offset_from_samples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _no_leftover_observers():
    yield
    assert not events.OBSERVERS and not events.BEGIN_OBSERVERS and not events.END_OBSERVERS


def test_nothing_is_built_when_nobody_listens():
    assert events.begin("x", "collective") is None
    events.end(None)  # ignored


def test_end_observers_see_the_pending_and_span_subscribers_the_span():
    ended, spans = [], []
    events.END_OBSERVERS.append(ended.append)
    try:
        tok = events.begin("all_reduce", "collective", "comm", {"seq": 1})
        events.end(tok, algorithm="ring")
        assert ended == [tok] and spans == []
        events.subscribe(spans.append)
        events.end(events.begin("b", "bucket"))
    finally:
        events.END_OBSERVERS.remove(ended.append)
        events.unsubscribe(spans.append)
    assert [s.name for s in spans] == ["b"]


def test_span_details_are_built_once_when_first_read_and_merge_the_end_extras():
    built, spans = [], []
    events.subscribe(spans.append)
    try:
        tok = events.begin("all_reduce", "collective", "comm", None,
                           lambda: built.append(1) or {"seq": 4, "algorithm": "?"})
        events.end(tok, algorithm="ring")
    finally:
        events.unsubscribe(spans.append)
    (span,) = spans
    assert built == []                       # not on the producer's thread
    assert span.args == {"seq": 4, "algorithm": "ring"} and built == [1]  # the end's value wins
    assert span.args is span.args and built == [1]                     # built once
    assert span == events.Span("all_reduce", "collective", span.start, span.end, "comm",
                               {"seq": 4, "algorithm": "ring"})
    assert "algorithm': 'ring'" in repr(span) and span.duration >= 0


def test_record_function_categories_lanes_and_decorator():
    @record_function("optimizer.step")
    def step():
        return 3

    with Recorder() as rec:
        with record_function("forward"):
            pass
        with record_function("my block", lane="io", args={"n": 2}):
            pass
        assert step() == 3
    assert [(s.name, s.category, s.lane) for s in rec.spans] == [
        ("forward", "forward", "main"), ("my block", "function", "io"), ("optimizer.step", "optimizer", "main")]
    assert rec.spans[1].args == {"n": 2} and all(s.end >= s.start for s in rec.spans)
    with pytest.raises(ValueError, match="non-empty string"):
        record_function("")


def test_chrome_events_rows_units_and_offsets():
    spans = [events.Span("a", "forward", 10.0, 10.002, "main"), events.Span("b", "collective", 10.001, 10.004, "comm",
                                                                          {"seq": 4, "shape": (2, 3)})]
    evs = chrome.spans_to_events(spans, rank=2, offset=5.0, epoch=4.0)
    x = [e for e in evs if e["ph"] == "X"]
    assert [(e["pid"], e["tid"], e["ts"], e["dur"]) for e in x] == [(2, 0, 1e6, 2000.0), (2, 1, 1001000.0, 3000.0)]
    threads = {e["tid"]: e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert threads == {0: "main", 1: "comm"} and x[1]["args"] == {"seq": 4, "shape": [2, 3]}
    json.dumps(evs)  # JSON-able


def test_merge_cli_joins_rank_files(tmp_path):
    for r in range(2):
        doc = chrome.trace_document(chrome.spans_to_events([events.Span("s", "c", 0.0, 1.0)], rank=r), {"rank": r})
        chrome.write_trace(str(tmp_path / f"rank{r}.json"), doc)
    out = tmp_path / "trace.json"
    subprocess.run([sys.executable, "-m", "neural_arch.profiler.chrome", str(tmp_path / "rank0.json"),
                    str(tmp_path / "rank1.json"), "-o", str(out)], check=True, cwd=REPO, timeout=60,
                   capture_output=True)
    doc = chrome.load_trace(str(out))
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {0, 1}
    assert [m["rank"] for m in doc["otherData"]["ranks"]] == [0, 1]


@given(offset=st.floats(-1e3, 1e3), delays=st.lists(st.tuples(st.floats(1e-6, 1e-2), st.floats(1e-6, 1e-2)),
                                                    min_size=1, max_size=8))
def test_clock_offset_error_is_at_most_half_the_best_round_trip(offset, delays):
    samples, t = [], 0.0
    for up, down in delays:  # rank r's clock = rank 0's + offset; the reply leaves 1 us after arrival
        t0 = t
        t1 = t0 + up + offset
        t2 = t1 + 1e-6
        t3 = t0 + up + 1e-6 + down
        samples.append((t0, t1, t2, t3))
        t = t3 + 1.0
    est, rtt = offset_from_samples(samples)
    assert rtt == pytest.approx(min(u + d for u, d in delays), abs=1e-9)
    assert abs(est - offset) <= rtt / 2 + 1e-9


def test_profile_alone_writes_its_trace_and_export(tmp_path):
    with profile(trace_dir=str(tmp_path)) as prof, record_function("forward"):
        pass
    assert prof.trace_path == str(tmp_path / "trace.json") and len(prof.spans) == 1
    assert prof.export_chrome_trace(str(tmp_path / "x.json"))
    assert chrome.load_trace(str(tmp_path / "x.json"))["otherData"]["world_size"] == 1


def test_profile_records_nothing_after_exit():
    with profile() as prof:
        pass
    events.emit(events.Span("late", "c", 0.0, 1.0))
    assert prof.spans == [] and prof.trace_path is None


def test_interval_arithmetic():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 3 + 1
    assert exposed_time([(0, 4)], compute=[(1, 2)]) == 3
    assert exposed_time([(0, 1), (0.5, 2)], compute=[]) == 2


def test_metrics_from_spans_count_ddp_wait_as_exposed():
    m2 = DistributedMetrics(watch_spans=False)
    m2._record_spans(0.0, 5.0, [events.Span("backward", "backward", 0.0, 4.0),
                                events.Span("bucket 1", "bucket", 2.5, 4.0),
                                events.Span("all_reduce", "collective", 1.0, 4.0)], 8, 0)
    assert m2.steps[0]["comm_time_s"] == 3.0 and m2.steps[0]["exposed_comm_s"] == 1.5


def test_a_synchronous_collective_inside_compute_is_exposed(world_of_one):
    """FSDP gathers inside forward with a synchronous call: its caller computes nothing meanwhile, so the
    forward span around it does not hide it; an asynchronous one inside forward is hidden."""
    import numpy as np

    from neural_arch.profiler import record_function

    for async_op, exposed_share in ((False, 1.0), (True, 0.0)):
        metrics = DistributedMetrics()
        with metrics.step(samples=1) as timer, record_function("forward"):
            work = world_of_one.all_reduce(np.ones(4), async_op=async_op)
            if async_op:
                work.wait()
        step = metrics.steps[0]
        [span] = [s for s in timer.spans if s.category == "collective"]
        assert span.args.get("blocking", False) is (not async_op)
        assert step["comm_time_s"] > 0
        assert abs(step["exposed_comm_s"] - exposed_share * step["comm_time_s"]) < 1e-12, (async_op, step)


def test_metrics_writers_and_bad_input(tmp_path):
    m = DistributedMetrics(watch_spans=False)
    m.record_step(0.25, samples=16, tokens=64, comm_time=0.05, bytes_sent=100)
    m.record_step(0.75, samples=16, tokens=64)
    s = m.summary()
    assert s["samples_per_s"] == 32.0 and s["tokens_per_s"] == 128.0 and s["comm_overhead_pct"] == 5.0

    class Writer:
        def __init__(self):
            self.rows = []

        def add_scalar(self, tag, value, step):
            self.rows.append((tag, value, step))
    w = Writer()
    m.log_to_tensorboard(w, step=7)
    assert ("distributed/samples_per_s", 32.0, 7) in w.rows
    with open(m.write_json(str(tmp_path / "m.json"))) as f:
        assert json.load(f)["summary"]["steps"] == 2
    with open(m.write_csv(str(tmp_path / "m.csv"))) as f:
        assert f.readline().startswith("step,step_time_s") and len(f.read().splitlines()) == 2
    with pytest.raises(ValueError, match="step_time"):
        m.record_step(0.0)
    with pytest.raises(TypeError, match="add_scalar"):
        m.log_to_tensorboard(object())


def test_tensorboardx_writer(tmp_path):
    tbx = pytest.importorskip("tensorboardX")
    m = DistributedMetrics(watch_spans=False)
    m.record_step(0.5, samples=4)
    w = tbx.SummaryWriter(str(tmp_path))
    m.log_to_tensorboard(w, step=1)
    w.close()
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))


def test_stall_threshold_env_and_report_without_store(monkeypatch):
    from neural_arch.distributed.state import STATE

    monkeypatch.setattr(STATE, "stores", {})  # no job store, whatever earlier tests in this process left
    assert warning_threshold({}) == 60.0 and warning_threshold({"NEURAL_ARCH_STALL_WARNING_S": "0"}) == 0.0
    with pytest.raises(ValueError, match="number of seconds"):
        warning_threshold({"NEURAL_ARCH_STALL_WARNING_S": "soon"})
    with pytest.raises(ValueError, match="> 0"):
        StallInspector(warning_s=0)
    ins = StallInspector(warning_s=0.2, store=None, rank=0, interval=10)
    b = LocalBackend()
    with ins:
        # what a backend's slot holds while an op runs; this one began a second ago (deadline = start + timeout)
        b._op_now = OpInfo("all_reduce", 3, [0, 1], 0, deadline=time.monotonic() + b.timeout - 1.0)
        reports = ins.check()
        b._op_now = None
        assert ins.check() == [] and not ins._open  # ended: forgotten
        b._p2p_now[0] = OpInfo("recv", 2, [0, 1], 0, root=1, deadline=time.monotonic() + b.timeout - 1.0)
        p2p = ins.check()
        b._p2p_now.clear()
    assert len(reports) == 1 and "all_reduce #3 of group [0, 1] has waited 1." in reports[0].message
    assert "no rendezvous store" in reports[0].message
    assert len(p2p) == 1 and p2p[0].missing == [1] and "waiting for rank 1, the sender" in p2p[0].message


def test_topology_numbers_hosts_like_rendezvous():
    infos = [RankInfo(r, h, h, 100 + r, 4, 2, [r], None) for r, h in enumerate(["b", "a", "b", "a"])]
    topo = Topology.from_infos(infos)
    assert topo.hosts == {"b": [0, 2], "a": [1, 3]} and topo.ranks_per_host == [2, 2]
    assert [(i.local_rank, i.node_rank) for i in topo.ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "4 rank(s) on 2 host(s)" in str(topo) and "rank 3: local_rank 1/2" in str(topo)
    assert _cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11] and _ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_numa_nodes_from_sysfs(tmp_path):
    for n, cpus in ((0, "0-1"), (1, "2-3")):
        (tmp_path / f"node{n}").mkdir()
        (tmp_path / f"node{n}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "node1" / "meminfo").write_text("Node 1 MemTotal:       1024 kB\n")
    assert numa_nodes(str(tmp_path)) == [{"id": 0, "cpus": [0, 1], "memory_bytes": None},
                                         {"id": 1, "cpus": [2, 3], "memory_bytes": 1024 * 1024}]


def test_topology_cli_under_the_launcher():
    from neural_arch.distributed.testing import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), "-m", "neural_arch.distributed.topology"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 rank(s) on 1 host(s)" in proc.stdout and "rank 1: local_rank 1/2" in proc.stdout


def test_stall_hooks_follow_the_env():
    from neural_arch.distributed.stall import start_stall_inspector, stop_stall_inspector

    assert start_stall_inspector(environ={"NEURAL_ARCH_STALL_WARNING_S": "0"}) is None
    ins = start_stall_inspector(environ={"NEURAL_ARCH_STALL_WARNING_S": "5"})
    try:
        assert ins.warning_s == 5.0 and ins.running and not events.BEGIN_OBSERVERS
        assert start_stall_inspector(environ={}) is ins  # one per job
    finally:
        stop_stall_inspector()
    assert ins._thread is None
