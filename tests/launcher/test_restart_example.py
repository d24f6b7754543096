"""examples/restart_from_checkpoint.py (a DDP job): crash on attempt 0, restart, resume, same parameters.

Each launcher run is a background job (``tests/background.py``: self-contained, they run beside the other
tests); its files go to the job's own folder, and the tests judge what the runs left there."""

from __future__ import annotations

import os
import re
import sys

import background
import numpy as np
import pytest
from launcher_helpers import ROOT, child_env

EXAMPLE = os.path.join(ROOT, "examples", "restart_from_checkpoint.py")

#: job name -> the launcher's arguments after the example ({dir}: the job's folder)
RUNS = {
    "restart example: crash": ["--standalone", "--nproc_per_node=2", "--max_restarts=1", EXAMPLE,
                               "--ckpt-dir", "{dir}/a", "--out", "{dir}/a.npz"],
    "restart example: straight": ["--standalone", "--nproc_per_node=2", EXAMPLE, "--no-crash",
                                  "--ckpt-dir", "{dir}/b", "--out", "{dir}/b.npz"],
    "restart example: six steps": ["--standalone", "--nproc_per_node=2", EXAMPLE, "--no-crash", "--steps", "6",
                                   "--ckpt-dir", "{dir}/c", "--out", "{dir}/six.npz"],
}
#: which runs each test reads
WANTS = {"test_crash_restart_resume_matches_uninterrupted_run": ["restart example: crash", "restart example: straight"],
         "test_resuming_without_optimizer_state_would_differ": ["restart example: six steps"]}


def _job(name: str) -> background.Job:
    job = background.Job(name, [], timeout=80)
    # the launcher's temporary files (its ready folder) go to the job's folder too
    job.env = child_env({"TMPDIR": str(job.workdir)})
    job.argv = [sys.executable, "-m", "neural_arch.distributed.launcher",
                *(a.format(dir=job.workdir) for a in RUNS[name])]
    return job


def background_jobs(items):
    return [_job(name) for item in items for name in WANTS.get(item.originalname, [])]


def _run(name: str):
    job = background.result(name, lambda: _job(name))
    assert not job.timed_out, f"{name} did not finish within {job.timeout:.0f} s: {job.stderr[-3000:]}"
    return job


@pytest.mark.timeout(180)
def test_crash_restart_resume_matches_uninterrupted_run():
    crashed = _run("restart example: crash")
    a_dir = crashed.workdir
    assert crashed.returncode == 0, crashed.stdout + crashed.stderr
    assert "crashing on purpose at step 7" in crashed.stdout
    # Rank 1 dies before step 7's all_reduce; rank 0 may or may not have saved the checkpoint of
    # step 6 -> 7 before the launcher stopped it, so the restart resumes from step 6 or 7 - and
    # must end identically. Every rank loads the same checkpoint.
    resumed = re.findall(r"\[rank(\d)\]: rank \d/2 attempt 1: resuming from step (\d+)", crashed.stdout)
    assert len(resumed) == 2 and len({s for _, s in resumed}) == 1, crashed.stdout
    assert 6 <= int(resumed[0][1]) <= 7
    assert "restarting the group (restart 1 of 1)" in crashed.stderr

    straight = _run("restart example: straight")
    assert straight.returncode == 0, straight.stdout + straight.stderr
    with np.load(a_dir / "a.npz") as a, np.load(straight.workdir / "b.npz") as b:
        assert sorted(a.files) == sorted(b.files) and len(a.files) == 4  # two Linear layers
        for key in a.files:  # bit-identical: the same steps from the same model+optimizer state
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
    names = os.listdir(a_dir / "a")
    assert len(names) == 20 and not any(".tmp-" in n for n in names)
    with np.load(a_dir / "a" / "step_000020.npz") as last:  # optimizer state is checkpointed
        assert any(k.startswith("optim/") and "momentum" in k for k in last.files)


@pytest.mark.timeout(120)
def test_resuming_without_optimizer_state_would_differ():
    # Guards the test above: momentum matters, so a resume that dropped it could not pass.
    res = _run("restart example: six steps")
    ckpt = res.workdir / "c"
    assert res.returncode == 0, res.stderr
    with np.load(ckpt / "step_000006.npz") as data:
        assert any(k.startswith("optim/") and np.abs(data[k]).max() > 0 for k in data.files)
