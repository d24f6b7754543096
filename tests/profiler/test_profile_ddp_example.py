"""examples/profile_ddp.py under the launcher: a merged trace of 2-rank DDP training.

Checks the trace is valid JSON with spans from both ranks, collective spans, and DDP bucket spans
whose all-reduces start while backward is still running (the overlap DDP exists for).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neural_arch.distributed.testing import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]


def _env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NEURAL_ARCH_TIMELINE")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_profile_ddp_writes_a_merged_trace_with_overlapping_buckets(tmp_path):
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node", "2", "--master_port",
           str(free_port()), os.path.join(REPO, "examples", "profile_ddp.py"), "--trace-dir", str(tmp_path),
           "--steps", "8", "--warmup", "2"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "overhead" in proc.stdout and "samples/s" in proc.stdout
    with open(tmp_path / "trace.json") as f:
        doc = json.load(f)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["summary"]["steps"] == 8
    for rank in (0, 1):
        mine = [e for e in spans if e["pid"] == rank]
        backward = [e for e in mine if e["name"] == "backward"]
        assert len(backward) == 8 and len([e for e in mine if e["name"] == "forward"]) == 8
        coll = [e for e in mine if e["cat"] == "collective"]
        assert coll, f"rank {rank}: no collective spans in the trace"
        assert all({"seq", "group", "bytes"} <= set(e["args"]) for e in coll)
        buckets = [e for e in mine if e["cat"] == "bucket"]
        assert buckets, f"rank {rank}: the DDP reducer emitted no bucket spans"
        assert len(buckets) >= 8 * 2, "--bucket-cap-mb 0.1 should make several buckets per step"

        def inside(e, b):
            return b["ts"] <= e["ts"] <= b["ts"] + b["dur"]
        # every bucket becomes ready during a backward, and in some step an all-reduce starts
        # before that backward ends: communication overlapped with compute
        assert all(any(inside(k, b) for b in backward) for k in buckets)
        assert any(inside(c, b) for c in coll for b in backward), "no all-reduce started during backward"
