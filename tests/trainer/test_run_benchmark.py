"""``benchmarks/run_benchmark.py`` (seed 003's ``--gpus ... --strategies ... --batch-sizes ...``): a rank's
worker reports the trainer's metrics, and the driver turns per-rank numbers into the table, the
JSON and the plot (the launcher runs of the driver are the benchmark itself, not repeated here)."""

from __future__ import annotations

import importlib.util
import json
import math
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    spec = importlib.util.spec_from_file_location("run_benchmark_script", os.path.join(REPO, "benchmarks",
                                                                                      "run_benchmark.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worker_and_driver(tmp_path, monkeypatch, capsys):
    rb = _module()
    out = tmp_path / "perf.json"
    assert rb.main(["--worker", "--strategy", "ddp", "--batch-size", "4", "--steps", "2", "--warmup", "1",
                    "--out", str(out)]) == 0
    (perf,) = json.loads(out.read_text())
    assert perf["samples_per_second_per_gpu"] > 0 and perf["steps"] == 2 and perf["world_size"] == 1

    calls = []

    def fake_run(procs, strategy, batch, steps, warmup, timeout):
        calls.append((procs, strategy, batch))
        per_rank = 100.0 if procs == 1 else 80.0          # 80% weak-scaling efficiency at 2
        return [{"samples_per_second_per_gpu": per_rank, "communication_overhead_percent": 10.0 * (procs - 1)}] * procs

    monkeypatch.setattr(rb, "run_config", fake_run)
    assert rb.main(["--gpus", "2", "1", "--strategies", "ddp", "fsdp", "--batch-sizes", "8", "--steps", "3",
                    "--results", str(tmp_path / "res")]) == 0
    assert calls == [(1, "ddp", 8), (2, "ddp", 8), (1, "fsdp", 8), (2, "fsdp", 8)]
    table = capsys.readouterr().out
    assert "| 2 | fsdp | 8 | 160 | 80 | 80% | 10.0% |" in table, table
    rows = json.loads((tmp_path / "res" / "run_benchmark.json").read_text())["rows"]
    assert [r["efficiency"] for r in rows] == [100.0, 80.0, 100.0, 80.0] and not any(math.isnan(r["throughput"]) for r in rows)
    assert (tmp_path / "res" / "run_benchmark.png").stat().st_size > 0
    assert table.strip() in (tmp_path / "res" / "run_benchmark.md").read_text()
