"""bench_mpi_backend.py keeps what a reader needs to trust its figures (issue 30): CPU time beside wall
time for every contender, every round of every rank, the commit and the load average, and the
``--windows`` A/B of the two-rank pairwise window.

Guards the harness, not the numbers. Example of the cells it checks::

    results["all_reduce:16384:window-0"]        # the backend with pairwise_max_bytes=0, seconds per call
    cpu_results["all_reduce:16384:mpi4py"]      # raw mpi4py's CPU seconds per call
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_cpu_time_rounds_and_window_contenders_are_recorded(tmp_path):
    out = tmp_path / "mpi_backend.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_mpi_backend.py"), "--rounds", "2",
                           "--size-list", "16384", "--windows", "0", "--timeout", "90", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = json.loads(out.read_text())
    for name in ("mpi", "mpi4py", "window-0"):
        key = f"all_reduce:16384:{name}"
        assert payload["results"][key] > 0 and payload["cpu_results"][key] > 0, name
        assert [len(rank["wall"][key]) for rank in payload["rounds_per_rank"]] == [2, 2], name
    assert payload["loadavg_1min_before"] >= 0 and "commit" in payload and "modified" in payload
    assert "mpi backend CPU us" in proc.stdout and "window 0" in proc.stdout
