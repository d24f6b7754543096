"""``examples/train_gpt_tp.py`` and ``examples/train_gpt_fsdp.py`` run unchanged under the launcher.

Each run is ``python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 ...`` as a
subprocess with a hard timeout (the launcher takes its ranks down with it when killed), with the
smallest flags that still exercise the parallel layout. The checks read the scripts' own output:
the exit code, the final line, and the per-rank parameter count that shows the model really is
split (tensor parallel: heads, MLP and vocabulary; FSDP: flat shards of every unit).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "NEURAL_ARCH_DISTRIBUTED_DEBUG"):
        env.pop(var, None)
    return env


def _launch(script: str, *flags: str) -> str:
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2",
           os.path.join(REPO, "examples", script), *flags]
    try:
        proc = subprocess.run(cmd, check=False, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish within 120 s\n--- stdout ---\n{exc.stdout}\n"
                    f"--- stderr ---\n{exc.stderr}")
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited with {proc.returncode}\n--- stdout ---\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}")
    return proc.stdout


def test_train_gpt_tp_under_launcher():
    out = _launch("train_gpt_tp.py", "--tp", "2", "--steps", "3", "--n-layer", "1", "--n-embd", "16",
                  "--batch-size", "4")
    m = re.search(r"GPT (\d+) parameters; (\d+) on each rank \(tp=2, dp=1\)", out)
    assert m, out[-3000:]
    full, local = int(m.group(1)), int(m.group(2))
    assert full // 2 <= local < full, f"tp=2 should hold about half the parameters per rank: {local} of {full}"
    assert re.search(r"final: 3 steps in [\d.]+ s; full state dict of \d+ tensors", out), out[-3000:]
    assert re.search(r"step    1  train loss \d", out), out[-3000:]


def test_train_gpt_fsdp_under_launcher():
    out = _launch("train_gpt_fsdp.py", "--steps", "3", "--n-layer", "2", "--n-embd", "16", "--batch-size", "4",
                  "--activation-checkpointing")
    m = re.search(r"GPT (\d+) parameters; 2 rank\(s\), FULL_SHARD: (\d+) parameters per rank", out)
    assert m, out[-3000:]
    full, shard = int(m.group(1)), int(m.group(2))
    # each unit's flat shard is ceil(unit / 2): at most one padding element per unit
    assert full / 2 <= shard <= full / 2 + 8, f"FULL_SHARD on 2 ranks: {shard} parameters per rank of {full}"
    m = re.search(r"final: train loss ([\d.]+) -> ([\d.]+); 3 steps in", out)
    assert m, out[-3000:]
