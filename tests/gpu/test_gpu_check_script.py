"""benchmarks/gpu_check.py, the one GPU check: its plan, and its honest answer on a machine without a GPU.

(On a GPU machine the script itself is the test: run it there and record its JSON.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from neural_arch.backend import gpu_unavailable_reason

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_plan_names_every_step_within_eight_minutes():
    proc = _run("--plan")
    assert proc.returncode == 0, proc.stderr
    for step in ("pytest-gpu", "bench-gpu", "digits-nccl-1", "gpt-nccl-1", "digits-gloo-2", "gpt-gloo-2"):
        assert step in proc.stdout
    total = int(proc.stdout.rsplit("total limit", 1)[1].split()[0])
    assert total <= 8 * 60, proc.stdout


def test_unknown_step_is_a_clear_error():
    proc = _run("--only", "pytest-gpu,warp-drive")
    assert proc.returncode == 2 and "unknown step(s) ['warp-drive']" in proc.stderr, proc.stderr


def test_without_a_gpu_every_step_says_why_and_require_gpu_fails(tmp_path):
    missing = gpu_unavailable_reason()
    if not missing:   # a GPU machine: the full check is run by hand there (docs/gpu.md)
        return
    out = tmp_path / "check.json"
    proc = _run("--out", str(out), "--only", "pytest-gpu,gpt-gloo-2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    assert summary["result"] == "no GPU"
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [("pytest-gpu", "skipped"), ("gpt-gloo-2", "skipped")]
    assert all(missing in s["reason"] for s in summary["steps"])
    assert _run("--out", str(out), "--only", "pytest-gpu", "--require-gpu").returncode == 1
