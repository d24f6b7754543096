"""The DDP examples and the seed 001/002 templates run unchanged under the launcher and mpiexec.

Each run is a subprocess with a hard timeout (a hang fails the test instead of stalling the suite;
under mpiexec, run_mpiexec kills the whole job). The launcher and plain-python runs are queued at
collection as background jobs (``tests/background.py``) and run beside the other tests.
"""

import os
import re
import sys

import background
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a run's 150 s limit, waited for in the background and once more if it failed there
pytestmark = [pytest.mark.timeout(330), pytest.mark.slow]


ONE_THREAD = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")


def _env():
    from neural_arch.distributed.testing import script_env

    return script_env(ONE_THREAD)  # a clean start, whatever the outer environment holds


def _command(how: str, script: str, *args):
    path = os.path.join(REPO, script)
    if how == "launcher":
        # --standalone: the launcher picks a free master port when it starts (the default 29500 may be
        # taken by another job on this machine)
        return [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2",
                path, *args]
    return [sys.executable, path, *args]


def _job(how: str, script: str, *args: str, timeout: float = 150) -> background.Job:
    """A run as a background job (``tests/background.py``); ``{workdir}`` in an argument is its folder."""
    job = background.Job(_job_name(how, script, args), [], cwd=REPO, env=_env(), timeout=timeout)
    job.argv = _command(how, script, *(a.format(workdir=job.workdir) for a in args))
    return job


def _job_name(how: str, script: str, args) -> str:
    return " ".join((how, script, *args))


#: the launcher and plain-python runs each test asks for (mpiexec runs stay in the test: run_mpiexec reaps
#: the whole job and its MPICH segments)
def _runs(item) -> list[tuple]:
    params = item.callspec.params if hasattr(item, "callspec") else {}
    how = params.get("how", "launcher")
    if item.originalname == "test_seed_templates_run_unchanged" and how == "launcher":
        return [(how, f"examples/seed_templates/{params['template']}", (), 120)]
    if item.originalname == "test_train_digits_ddp_reaches_95_percent" and how == "launcher":
        return [(how, "examples/train_digits_ddp.py", DIGITS_ARGS, 150)]
    if item.originalname == "test_train_gpt_ddp_loss_drops":
        return [("launcher", "examples/train_gpt_ddp.py", ("--steps", "80"), 150)]
    if item.originalname == "test_train_digits_world_of_one":
        return [("python", "examples/train_digits_ddp.py", WORLD_OF_ONE_ARGS, 150)]
    return []


def background_jobs(items):
    """Every launcher / plain-python run, queued at collection: they run beside the other tests."""
    return [_job(how, script, *args, timeout=timeout) for item in items for how, script, args, timeout in _runs(item)]


def _run(how, script, *args, timeout=150, folder=None):
    """Run ``script`` under the launcher, python or mpiexec; ``(stdout, stderr, folder)``, ``{workdir}`` in an
    argument being ``folder`` (the background job's own folder for the launcher and python runs)."""
    if how == "mpiexec":
        from neural_arch.distributed.testing import free_port, run_mpiexec

        # mpiexec still selects the mpi backend; a script asking for gloo (seed 001) rendezvous
        # here instead of on the default port 29500, which another job may hold.
        env = dict(ONE_THREAD, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        proc = run_mpiexec(os.path.join(REPO, script), 2, args=[a.format(workdir=folder) for a in args], env=env,
                           cwd=REPO, timeout=timeout)
        assert proc.returncode == 0, f"{how} {script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout, proc.stderr, folder
    job = background.result(_job_name(how, script, args), lambda: _job(how, script, *args, timeout=timeout))
    assert not job.timed_out, f"{how} {script} did not finish within {job.timeout:.0f} s:\n{job.stderr[-3000:]}"
    assert job.returncode == 0, f"{how} {script} failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-3000:]}"
    return job.stdout, job.stderr, job.workdir


HOW = ["launcher", pytest.param("mpiexec", marks=pytest.mark.mpi)]


DIGITS_ARGS = ("--checkpoint", "{workdir}/digits.npz")
WORLD_OF_ONE_ARGS = ("--epochs", "12", "--no-progress", "--checkpoint", "{workdir}/c.npz")


@pytest.mark.parametrize("how", HOW)
def test_train_digits_ddp_reaches_95_percent(how, tmp_path):
    out, err, folder = _run(how, "examples/train_digits_ddp.py", *DIGITS_ARGS, folder=tmp_path)
    m = re.search(r"held-out accuracy ([0-9.]+) on (\d+) samples.*2 rank\(s\).*throughput (\d+) samples/s", out)
    assert m, out
    assert float(m.group(1)) >= 0.95 and int(m.group(2)) == 359
    assert "step/s" in err  # rank 0's tqdm bar
    with np.load(os.path.join(folder, "digits.npz")) as z:
        assert "model/0.weight" in z.files and any(k.startswith("optim/state/") for k in z.files)
    assert not [f for f in os.listdir(folder) if f != "digits.npz"], "the atomic write left a temp file"


def test_train_digits_world_of_one():
    out, _, _ = _run("python", "examples/train_digits_ddp.py", *WORLD_OF_ONE_ARGS)
    assert "1 rank(s)" in out and float(re.search(r"accuracy ([0-9.]+)", out).group(1)) >= 0.9


def test_train_gpt_ddp_loss_drops():
    out, _, _ = _run("launcher", "examples/train_gpt_ddp.py", "--steps", "80")
    m = re.search(r"validation loss ([0-9.]+) -> ([0-9.]+)", out)
    assert m, out
    assert float(m.group(2)) < float(m.group(1)) - 0.3


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("template", ["seed001_template.py", "seed002_template.py"])
def test_seed_templates_run_unchanged(how, template):
    out, _, _ = _run(how, f"examples/seed_templates/{template}", timeout=120)
    for rank in (0, 1):
        assert f"Process {rank}/2" in out
        assert f"rank {rank} epoch 1 mean loss" in out
