"""``examples/train_gpt_3d.py`` runs unchanged under the launcher (pp=2 x dp=2 with interleaved zero
bubble, pp=2 x tp=2, and
pp=2 x dp=2 x tp=2 on 8 ranks with the zero-bubble schedule) and
mpiexec (pp=2 interleaved, pp=4 1F1B, pp=2 x tp=2), and its ``--verify`` mode finds it equal to single-process training
(float64, <= 1e-10). Each run is a subprocess with a hard timeout; the launcher runs are background jobs
(``tests/background.py``: self-contained, they run beside the other tests and the test judges their output)."""

import os
import re
import sys

import background
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "train_gpt_3d.py")
pytestmark = [pytest.mark.timeout(200), pytest.mark.slow]


ONE_THREAD = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")


def _check(cmd, proc):
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    match = re.search(r"verify: max \|pipeline - single process\| over all parameters = (\S+)", proc.stdout)
    assert match, proc.stdout[-3000:]
    return float(match.group(1)), proc.stdout


LAUNCHER_CASES = [
    (["--pp", "2", "--dp", "2", "--schedule", "izb", "--virtual", "2", "--n-layer", "4"], 4),  # 4 stages x 2
    (["--pp", "2", "--tp", "2", "--schedule", "gpipe"], 4),
    (["--pp", "2", "--dp", "2", "--tp", "2", "--schedule", "zbh1"], 8),   # 3-D, zero bubble, oversubscribed
]


def _job(flags, nproc: int) -> background.Job:
    from neural_arch.distributed.testing import script_env

    return background.Job(_name(flags, nproc), _command(flags, nproc), cwd=REPO, env=script_env(ONE_THREAD),
                          timeout=150)


def _command(flags, nproc: int) -> list[str]:
    # --standalone: the launcher picks a free master port when the job starts, not when it is queued
    return [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", str(nproc),
            SCRIPT, "--n-layer", "2", *flags, "--steps", "3", "--n-embd", "16", "--verify"]


def _name(flags, nproc: int) -> str:
    """The job's name, without building it (a Job makes its folder, which only the queue removes)."""
    return " ".join(_command(flags, nproc)[3:])


def background_jobs(items):
    """The launcher runs the collected tests ask for, queued at collection."""
    return [_job(item.callspec.params["flags"], item.callspec.params["nproc"]) for item in items
            if item.originalname == "test_launcher_runs_and_matches_single_process"]


@pytest.mark.parametrize("flags, nproc", LAUNCHER_CASES, ids=["pp2xdp2-izb", "pp2xtp2", "pp2xdp2xtp2-zbh1"])
def test_launcher_runs_and_matches_single_process(flags, nproc):
    job = background.result(_name(flags, nproc), lambda: _job(flags, nproc))
    assert not job.timed_out, f"{job.name} did not finish within {job.timeout:.0f} s:\n{job.stderr[-3000:]}"
    diff, out = _check(job.name, job)
    assert diff <= 1e-10, out[-2000:]
    assert "step    2  loss" in out


@pytest.mark.mpi
@pytest.mark.parametrize("n, flags, shown", [
    (2, ["--pp", "2", "--schedule", "interleaved", "--n-layer", "4"], "Interleaved1F1B"),
    (4, ["--pp", "4", "--schedule", "1f1b", "--n-layer", "4"], "1F1B"),
    (4, ["--pp", "2", "--tp", "2", "--n-layer", "2"], "tp=2"),
    (2, ["--pp", "2", "--schedule", "zbv", "--n-layer", "4"], "ZB-V"),
], ids=["pp2-interleaved", "pp4-1f1b", "pp2xtp2", "pp2-zbv"])
def test_mpiexec_matches_single_process(n, flags, shown):
    from neural_arch.distributed.testing import run_mpiexec

    proc = run_mpiexec(SCRIPT, n, args=[*flags, "--steps", "3", "--n-embd", "16", "--verify"], env=ONE_THREAD,
                       cwd=REPO, timeout=150)
    diff, out = _check(proc.args, proc)
    assert diff <= 1e-10, out[-2000:]
    assert shown in out
