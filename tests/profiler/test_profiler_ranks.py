"""The profiler, metrics, stall inspector and topology on real ranks (3 gloo processes, one pool)."""
from __future__ import annotations

import json
import os

import profiler_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool, run_ranks

pytestmark = pytest.mark.timeout(120)
WORLD = 3


@pytest.fixture(scope="module")
def pool():
    with RankPool(WORLD, backend="gloo", timeout=60.0) as p:
        yield p


def _check_merged(path, world):
    with open(path) as f:
        doc = json.load(f)  # valid JSON
    evs = doc["traceEvents"]
    spans = [e for e in evs if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(range(world))
    names = {(e["pid"], e["args"]["name"]) for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(r, f"rank {r}") for r in range(world)}
    for e in spans:
        assert e["dur"] >= 0 and isinstance(e["ts"], float)
    return doc, spans


def test_profile_writes_one_merged_trace_with_a_row_per_rank(pool, tmp_path):
    out = pool.run(fns.profile_collectives, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["rank0.json", "rank1.json", "rank2.json", "trace.json"]
    assert out[0]["path"] == str(tmp_path / "trace.json")
    doc, spans = _check_merged(tmp_path / "trace.json", WORLD)
    # five forward spans per rank, on the "main" thread row
    for r in range(WORLD):
        fwd = [e for e in spans if e["pid"] == r and e["name"] == "forward"]
        assert len(fwd) == 5
    # one host: the clocks agree, so each estimate is within half its round trip of zero
    for o in out:
        assert abs(o["offset"]) <= o["rtt"] / 2 + 1e-6, o
    assert out[0]["offset"] == 0.0 and [m["rank"] for m in doc["otherData"]["ranks"]] == [0, 1, 2]
    # ranks ran their steps at the same time: their first spans start within a second on rank 0's clock
    firsts = [min(e["ts"] for e in spans if e["pid"] == r) for r in range(WORLD)]
    assert max(firsts) - min(firsts) < 1e6


def test_collective_spans_reach_the_trace(pool, tmp_path):
    out = pool.run(fns.profile_collectives, str(tmp_path))
    # the backend emits collective spans: their absence is a regression, not a skip
    assert all(o["instrumented"] for o in out), out
    _, spans = _check_merged(tmp_path / "trace.json", WORLD)
    for r in range(WORLD):
        coll = [e for e in spans if e["pid"] == r and e["cat"] == "collective"]
        assert len([e for e in coll if "all_reduce" in e["name"]]) >= 5
        assert all("seq" in e["args"] for e in coll)


def test_timeline_hooks_start_at_init_and_merge_at_destroy(pool, tmp_path):
    out = pool.run(fns.timeline_hooks, str(tmp_path))
    assert out[0] == (str(tmp_path / "trace.json"), WORLD)
    _, spans = _check_merged(tmp_path / "trace.json", WORLD)
    assert {e["name"] for e in spans} >= {"backward"}


def test_stall_inspector_names_the_rank_that_has_not_arrived(pool):
    reports = pool.run(fns.stall, 1.0, 2, 2.6)
    for rank in (0, 1):
        assert reports[rank], f"rank {rank} waited 2.6 s past a 1 s threshold and logged nothing"
        op, seq, group, missing, waiting, message = reports[rank][0]
        assert op == "all_reduce" and group == [0, 1, 2] and isinstance(seq, int)
        assert missing == [2] and waiting == [0, 1], message
        assert f"#{seq}" in message and "ranks [2] have not arrived" in message
    assert reports[2] == []  # the late rank never waited


def test_distributed_metrics_local_and_global(pool):
    out = pool.run(fns.metrics_two_steps)
    for rank, (local, _) in enumerate(out):
        assert local["steps"] == 2 and local["bytes_sent"] == 2000 and local["loss"] == rank
        assert 0.025 <= local["step_time_s"] < 1.0
        assert local["samples_per_s"] == pytest.approx(10 * (rank + 1) / local["step_time_s"])
        # ~20 ms of the ~30 ms step is communication that no compute span covers
        assert 0.015 <= local["exposed_comm_s"] <= local["comm_time_s"] <= local["step_time_s"]
        assert 30 <= local["comm_overhead_pct"] <= 100
    glob = out[0][1]
    assert all(o[1] == glob for o in out)  # every rank got the same numbers from the one all-reduce
    assert glob["world_size"] == WORLD and glob["loss"] == pytest.approx(1.0)
    assert glob["bytes_sent"] == 3 * 2000
    assert glob["samples_per_s"] == pytest.approx(sum(o[0]["samples_per_s"] for o in out))
    assert glob["step_time_s_max"] == pytest.approx(max(o[0]["step_time_s"] for o in out))


def test_seed004_collector_as_written_and_ours_agree(pool):
    out = pool.run(fns.seed004_collector)
    for theirs, ours in out:
        assert theirs == pytest.approx({"loss": 3.0, "acc": 0.5})
        assert ours == pytest.approx(theirs)


def test_topology_is_gathered_from_every_rank(pool):
    out = pool.run(fns.topology_layout)
    d, text, _ = out[0]
    assert all(o[0]["hosts"] == d["hosts"] for o in out)
    assert d["world_size"] == WORLD and len(d["hosts"]) == 1
    assert [r["local_rank"] for r in d["ranks"]] == [0, 1, 2]
    assert len({r["pid"] for r in d["ranks"]}) == WORLD
    assert "3 rank(s) on 1 host(s)" in text and "rank 2: local_rank 2/3" in text


@pytest.mark.mpi
def test_profile_under_mpiexec(tmp_path):
    results = run_ranks(fns.profile_collectives, 2, backend="mpi", args=(str(tmp_path),), timeout=60)
    assert all(r.ok for r in results), [r.error for r in results]
    _check_merged(tmp_path / "trace.json", 2)
