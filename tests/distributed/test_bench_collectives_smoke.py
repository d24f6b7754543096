"""The collective benchmark runs end to end for its contenders (tiny sweep, no plot).

Guards the harness, not the numbers: e.g. both mpiexec ranks printing their JSON report into
one shared stdout used to interleave and crash the orchestrator (JSONDecodeError).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "bench_collectives.py")

# a timed benchmark's ranks wait on each other: run after the background queue (tests/background.py)
pytestmark = pytest.mark.latency_bound


def _run(contenders: str, tmp_path) -> dict:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--contenders", contenders, "--ops", "all_reduce,broadcast",
                           "--sizes", "1K", "--no-plot", "--timeout", "90", "--repeat", "2", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@pytest.mark.timeout(180)
def test_gloo_contenders_report(tmp_path):
    payload = _run("gloo,gloo-tcp", tmp_path)
    assert payload["skipped"] == {}, payload["skipped"]
    for kind in ("gloo", "gloo-tcp"):
        assert set(payload["results"][kind]) == {"all_reduce", "broadcast"}
        assert payload["results"][kind]["all_reduce"]["1024"] > 0
        assert len(payload["samples"][kind]["all_reduce"]["1024"]) == 2   # every interleaved repetition kept
    assert payload["environment"]["commit"] and len(payload["environment"]["load_average"]) == 3


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_mpi_contenders_report_once_per_rank(tmp_path):  # the mpi marker skips it without mpi4py/mpiexec
    payload = _run("mpi,mpi4py", tmp_path)
    assert payload["skipped"] == {}, payload["skipped"]
    for kind in ("mpi", "mpi4py"):
        assert payload["results"][kind]["all_reduce"]["1024"] > 0


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_mpi_backend_benchmark_reports_every_contender(tmp_path):
    """bench_mpi_backend.py: the backend, raw mpi4py and the probes, interleaved in one mpiexec job."""
    out = tmp_path / "mpi_backend.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_mpi_backend.py"), "--rounds", "2",
                           "--size-list", "1024,4096", "--probes", "--timeout", "90", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    for size in (1024, 4096):
        for name in ("mpi", "mpi4py", "nb-wait", "nb-waitany", "persistent", "blocking", "pairwise", "unpaired"):
            assert results[f"all_reduce:{size}:{name}"] > 0, (size, name)
