"""``examples/production_train.py`` (seed 003's command line) runs under the launcher on 2 ranks with
FSDP, CPU offload, activation checkpointing, accumulation and clipping, then resumes its checkpoint
in one plain ``python`` process with ZeRO-2 and bf16 autocast (another world size and strategy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "production_train.py")
pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]


def _run(cmd, tmp_path) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish within 120 s\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_production_train_fsdp_then_resume_on_one_process(tmp_path):
    common = ["--epochs", "2", "--samples", "512", "--gradient-accumulation-steps", "2", "--no-progress",
              "--checkpoint-dir", str(tmp_path / "ckpt")]
    out = _run([sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2",
                SCRIPT, "--strategy", "fsdp", "--gradient-clip-val", "1.0", "--activation-checkpointing",
                "--cpu-offload", "--log-dir", str(tmp_path / "logs"), *common], tmp_path)
    final = re.search(r"final: epoch=1 eval_accuracy=([\d.]+) .* steps=8 world=2", out)
    assert final, out
    assert os.path.exists(tmp_path / "logs" / "training_log.csv")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step_00000004", "step_00000008"]
    # one process, another strategy, bf16 autocast: resumes at epoch 2 from the 2-rank FSDP checkpoint
    out = _run([sys.executable, SCRIPT, "--strategy", "zero2", "--mixed-precision", "--resume",
                *common[:1], "3", *common[2:]], tmp_path)
    final = re.search(r"final: epoch=2 eval_accuracy=([\d.]+) .* steps=15 world=1", out)
    assert final and float(final.group(1)) > 0.8, out
