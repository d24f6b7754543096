"""examples/train_digits_cnn_ddp.py (CNN + BatchNorm -> SyncBatchNorm under DDP) reaches >= 97% held-out
accuracy on 2 ranks, started by our launcher and by a real mpiexec.

Four epochs (the example's default is 12) already reach 97%: the test proves the CNN, SyncBatchNorm and
both starters, not the length of the schedule, and the suite has a time budget."""

import os
import re
import subprocess
import sys

import pytest

from neural_arch.distributed.testing import run_mpiexec, script_env

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_digits_cnn_ddp.py")
pytestmark = pytest.mark.timeout(180)


def _accuracy(stdout: str) -> float:
    found = re.search(r"held-out accuracy ([0-9.]+) on 359 samples; ", stdout.replace(",", ";"))
    assert found, stdout
    return float(found.group(1))


@pytest.mark.parametrize("how", ["launcher", pytest.param("mpiexec", marks=pytest.mark.mpi)])
def test_cnn_with_sync_batchnorm_learns_digits(tmp_path, how):
    args = [os.path.abspath(EXAMPLE), "--no-progress", "--epochs", "4", "--checkpoint", str(tmp_path / "c.npz")]
    if how == "launcher":
        cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2"]
        done = subprocess.run(cmd + args, check=False, capture_output=True, text=True, timeout=170, cwd=tmp_path,
                              stdin=subprocess.DEVNULL, env=script_env())
    else:
        done = run_mpiexec(args[0], 2, args=args[1:], timeout=170, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 rank(s)" in done.stdout
    assert _accuracy(done.stdout) >= 0.97
    assert (tmp_path / "c.npz").exists()
