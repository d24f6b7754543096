"""The DDP examples and the seed 001/002 templates run unchanged under the launcher and mpiexec.

Each run is a subprocess with a hard timeout (a hang fails the test instead of stalling the suite;
under mpiexec, run_mpiexec kills the whole job).
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.timeout(200), pytest.mark.slow]


ONE_THREAD = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")


def _env():
    from neural_arch.distributed.testing import script_env

    return script_env(ONE_THREAD)  # a clean start, whatever the outer environment holds


def _command(how: str, script: str, *args):
    path = os.path.join(REPO, script)
    if how == "launcher":
        from neural_arch.distributed.testing import free_port

        # A free port: the default 29500 may be taken by another job on this machine.
        return [sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node", "2",
                "--master_port", str(free_port()), path, *args]
    return [sys.executable, path, *args]


def _run(how, script, *args, timeout=150):
    if how == "mpiexec":
        from neural_arch.distributed.testing import free_port, run_mpiexec

        # mpiexec still selects the mpi backend; a script asking for gloo (seed 001) rendezvous
        # here instead of on the default port 29500, which another job may hold.
        env = dict(ONE_THREAD, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        proc = run_mpiexec(os.path.join(REPO, script), 2, args=args, env=env, cwd=REPO, timeout=timeout)
    else:
        proc = subprocess.run(_command(how, script, *args), check=False, cwd=REPO, env=_env(), capture_output=True,
                              text=True, timeout=timeout)
    assert proc.returncode == 0, f"{how} {script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout, proc.stderr


HOW = ["launcher", pytest.param("mpiexec", marks=pytest.mark.mpi)]


@pytest.mark.parametrize("how", HOW)
def test_train_digits_ddp_reaches_95_percent(how, tmp_path):
    ckpt = tmp_path / "digits.npz"
    out, err = _run(how, "examples/train_digits_ddp.py", "--checkpoint", str(ckpt))
    m = re.search(r"held-out accuracy ([0-9.]+) on (\d+) samples.*2 rank\(s\).*throughput (\d+) samples/s", out)
    assert m, out
    assert float(m.group(1)) >= 0.95 and int(m.group(2)) == 359
    assert "step/s" in err  # rank 0's tqdm bar
    with np.load(ckpt) as z:
        assert "model/0.weight" in z.files and any(k.startswith("optim/state/") for k in z.files)
    assert not [f for f in os.listdir(tmp_path) if f != "digits.npz"], "the atomic write left a temp file"


def test_train_digits_world_of_one(tmp_path):
    out, _ = _run("python", "examples/train_digits_ddp.py", "--epochs", "12", "--no-progress",
                  "--checkpoint", str(tmp_path / "c.npz"))
    assert "1 rank(s)" in out and float(re.search(r"accuracy ([0-9.]+)", out).group(1)) >= 0.9


def test_train_gpt_ddp_loss_drops():
    out, _ = _run("launcher", "examples/train_gpt_ddp.py", "--steps", "80")
    m = re.search(r"validation loss ([0-9.]+) -> ([0-9.]+)", out)
    assert m, out
    assert float(m.group(2)) < float(m.group(1)) - 0.3


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("template", ["seed001_template.py", "seed002_template.py"])
def test_seed_templates_run_unchanged(how, template):
    out, _ = _run(how, f"examples/seed_templates/{template}", timeout=120)
    for rank in (0, 1):
        assert f"Process {rank}/2" in out
        assert f"rank {rank} epoch 1 mean loss" in out
