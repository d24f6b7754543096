"""examples/train_digits_cnn_ddp.py (CNN + BatchNorm -> SyncBatchNorm under DDP) reaches >= 97% held-out
accuracy on 2 ranks, started by our launcher and by a real mpiexec.

Four epochs (the example's default is 12) already reach 97%: the test proves the CNN, SyncBatchNorm and
both starters, not the length of the schedule, and the suite has a time budget. The launcher run is a
background job (``tests/background.py``: it runs beside the other tests, in its own folder); the mpiexec run
stays in the test (run_mpiexec reaps the whole job and its MPICH segments)."""

import os
import re
import sys

import background
import pytest

from neural_arch.distributed.testing import run_mpiexec, script_env

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_digits_cnn_ddp.py")
pytestmark = pytest.mark.timeout(180)


def _accuracy(stdout: str) -> float:
    found = re.search(r"held-out accuracy ([0-9.]+) on 359 samples; ", stdout.replace(",", ";"))
    assert found, stdout
    return float(found.group(1))


def _args(folder) -> list[str]:
    return [os.path.abspath(EXAMPLE), "--no-progress", "--epochs", "4", "--checkpoint", os.path.join(folder, "c.npz")]


def _job() -> background.Job:
    job = background.Job("cnn example: launcher", [], env=script_env(), timeout=170)
    job.argv = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2",
                *_args(str(job.workdir))]
    return job


def background_jobs(items):
    return [_job() for item in items if getattr(item, "callspec", None) and item.callspec.params["how"] == "launcher"]


@pytest.mark.parametrize("how", ["launcher", pytest.param("mpiexec", marks=pytest.mark.mpi)])
def test_cnn_with_sync_batchnorm_learns_digits(tmp_path, how):
    if how == "launcher":
        done = background.result("cnn example: launcher", _job)
        assert not done.timed_out, done.stderr[-3000:]
        folder = done.workdir
    else:
        done = run_mpiexec(os.path.abspath(EXAMPLE), 2, args=_args(str(tmp_path))[1:], timeout=170, cwd=tmp_path)
        folder = tmp_path
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 rank(s)" in done.stdout
    assert _accuracy(done.stdout) >= 0.97
    assert (folder / "c.npz").exists()
