"""The cluster path for real: jobs on a Slurm cluster started on this host train to the launcher's result.

The scenario (``slurm_scenario.py``: start ``munged`` + ``slurmctld`` + two ``slurmd`` node names, run every
job at once, stop and reap it all) runs as one background job beside the suite (``tests/background.py``);
the tests judge what it recorded:

* ``examples/slurm/train.sbatch`` with ``srun -n 2`` (``MODE=srun``: rank, world and rendezvous from
  ``SLURM_*``) and with one launcher per node on two nodes (``MODE=launcher``, ``--nnodes 2``): final
  parameters bitwise equal to the launcher's run of the same script without Slurm;
* seed 003's ``launch_training.sh`` under ``srun`` on two nodes: the same final loss and accuracy as its
  run without Slurm;
* ``init_process_group()`` in 4 ranks started by ``srun`` on two nodes: a gloo group forms from Slurm's
  variables, and ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are exported;
* ``create_slurm_manager()``: ``submit`` a two-node ``TrainingJobSpec``, ``wait``/``status`` to
  ``COMPLETED``, ``logs``, its parameters equal to the launcher's; a one-node ``backend="mpi"`` spec, whose
  ranks srun starts through PMI-2 (``mpi`` marker); ``cancel`` a running job: ``CANCELLED``.

Skipped only where Slurm's packages are absent (Debian: ``apt-get install -y --no-install-recommends
slurmctld slurmd slurm-client munge``, which ``.ci/run`` runs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import background
import numpy as np
import pytest
from slurm_cluster import missing_binaries

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOB = "the Slurm scenario"

_MISSING = missing_binaries()
if _MISSING:
    pytest.skip(f"Slurm not installed (slurmctld/slurmd/munge): missing {', '.join(_MISSING)}",
                allow_module_level=True)

# the scenario's own limit waited for once in the background and, should it fail there, once again
pytestmark = pytest.mark.timeout(630)


def _job() -> background.Job:
    job = background.Job(JOB, [], cwd=REPO, timeout=300)
    job.argv = [sys.executable, str(HERE / "slurm_scenario.py"), str(job.workdir / "scenario")]
    return job


def background_jobs(items):
    """The scenario, queued at collection: its jobs run beside the other tests, at their priority."""
    return [_job()] if items else []


@pytest.fixture(scope="module")
def scenario():
    job = background.result(JOB, _job)
    assert not job.timed_out, f"the Slurm scenario took more than {job.timeout:.0f} s:\n{job.stderr[-3000:]}"
    assert job.returncode == 0, f"the Slurm scenario failed ({job.returncode}):\n{job.stderr[-6000:]}"
    work = job.workdir / "scenario"
    return json.loads((work / "results.json").read_text()), work


def _params(path: Path) -> dict:
    with np.load(path) as data:
        return {k: data[k].copy() for k in data.files}


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def _completed(results: dict, name: str) -> str:
    job = results["jobs"][name]
    assert job["state"] == "completed", job["output"]
    return job["output"]


@pytest.mark.parametrize("mode", ["srun", "launcher"])
def test_train_sbatch_trains_as_the_launcher_does(scenario, mode):
    """srun -n 2 on one node, or one launcher per node on two nodes: the launcher's result, bitwise."""
    results, work = scenario
    out = _completed(results, mode)
    assert f"mode {mode}" in out and "final loss" in out, out
    if mode == "launcher":
        assert "2 nodes" in out and "[rank1]: rank 1/2" in out, out
    assert results["local"]["restart"]["returncode"] == 0, results["local"]["restart"]["output"]
    _assert_bitwise_equal(_params(work / f"{mode}.npz"), _params(work / "local.npz"))


def _final_line(text: str) -> str:
    """``epoch=0 eval_accuracy=... eval_loss=... steps=7 world=2`` of the ``final:`` line (timings left out)."""
    line = next(line for line in text.splitlines() if "final:" in line)
    return " ".join(w for w in line.split("final:")[1].split() if not w.startswith(("samples_", "communication_")))


def test_seed_003_launch_training_under_slurm(scenario):
    results, _ = scenario
    out = _completed(results, "launch_training")
    assert "node 0 of 2" in out and "node 1 of 2" in out, out
    local = results["local"]["launch_training"]
    assert local["returncode"] == 0, local["output"]
    assert _final_line(out) == _final_line(local["output"])
    assert "world=2" in _final_line(out)


def _probe_lines(results: dict, backend: str) -> list[dict]:
    lines = [json.loads(line) for line in _completed(results, "probe").splitlines() if line.startswith("{")]
    return sorted((r for r in lines if r["backend"] == backend), key=lambda r: r["rank"])


def test_init_process_group_under_srun_reads_slurm_variables(scenario):
    """4 ranks started by srun on two nodes form a gloo group from SLURM_* alone and export torch's variables."""
    results, _ = scenario
    gloo = _probe_lines(results, "gloo")
    assert [r["rank"] for r in gloo] == [0, 1, 2, 3], results["jobs"]["probe"]["output"]
    for r in gloo:
        assert (r["world"], r["sum_of_ranks"]) == (4, 6.0)
        assert (r["RANK"], r["WORLD_SIZE"], r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) == \
            (str(r["rank"]), "4", str(r["rank"] % 2), "2")
    if len(results["nodes"]) == 2:   # two node names: ranks 0-1 on the first, 2-3 on the second
        assert gloo[0]["node"] == gloo[1]["node"] != gloo[2]["node"] == gloo[3]["node"]


@pytest.mark.mpi
def test_slurm_manager_runs_an_mpi_job_through_srun(scenario):
    """A ``backend="mpi"`` spec on one node: srun starts one task per rank through PMI-2 (the mpich
    wheel's MPI speaks it), and the ranks form an mpi group."""
    results, _ = scenario
    job = results["manager"]["mpi"]
    assert job["final"] == "completed", job["logs"]
    ranks = sorted((json.loads(line) for line in job["logs"].splitlines() if line.startswith("{")),
                   key=lambda r: r["rank"])
    assert [(r["backend"], r["rank"], r["world"], r["sum_of_ranks"]) for r in ranks] == \
        [("mpi", 0, 2, 1.0), ("mpi", 1, 2, 1.0)], job["logs"]
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "2"), ("1", "2")]
    assert ranks[0]["node"] == ranks[1]["node"]      # one node, two tasks (see slurm_scenario)


def test_slurm_manager_submits_and_follows_a_training_job(scenario):
    results, work = scenario
    train = results["manager"]["train"]
    assert train["final"] == "completed", train["logs"]
    assert train["status_after"] == "completed"     # from the controller's record, once the job left the queue
    assert "[rank0]: final loss" in train["logs"] and "[rank1]: rank 1/2" in train["logs"], train["logs"]
    _assert_bitwise_equal(_params(work / "manager.npz"), _params(work / "local.npz"))


def test_slurm_manager_cancels_a_running_job(scenario):
    results, _ = scenario
    cancel = results["manager"]["cancel"]
    assert cancel["while_running"] == "running" and "sleeping" in cancel["logs_before_cancel"], cancel
    assert cancel["final"] == "cancelled"
