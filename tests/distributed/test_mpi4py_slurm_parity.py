"""Issue 33's items for users coming from mpi4py, Slurm and torch 2.x: torch's RANK/LOCAL_RANK/...
exported by init_process_group under mpiexec and srun, sendrecv (mpi4py's Sendrecv) on gloo and MPI,
errors for mpi4py habits, the more-ranks-than-cores warning, and DDP(model, device_mesh=...)."""

from __future__ import annotations

import logging
import re

import parity_rank_fns as fns
import pytest

from neural_arch.distributed import groups, launch_env
from neural_arch.distributed.testing import LAUNCHER_VARS, RankPool, run_mpiexec

pytestmark = pytest.mark.timeout(120)

FAKE_SRUN = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1",
             "SLURM_JOB_ID": "4242", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost"}
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=90.0) as p:
        yield p


@pytest.fixture
def fake_srun(monkeypatch):
    for name in (*LAUNCHER_VARS, *TORCH_VARS, "NEURAL_ARCH_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_SRUN.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_srun_variables_become_torchs_and_leave_with_the_group(fake_srun):
    import os

    import neural_arch.distributed as dist

    fake_srun.setenv("SLURM_LOCALID", "0")
    dist.init_process_group()
    try:
        assert [os.environ.get(n) for n in TORCH_VARS] == ["0", "1", "0", "1"]
        assert int(os.environ["LOCAL_RANK"]) == launch_env.get_node_local_rank() == launch_env.get_local_rank() == 0
        assert launch_env.detect_launch_env()["source"] == "slurm"     # still srun's job, not a torchrun one
    finally:
        dist.destroy_process_group()
    assert not any(n in os.environ for n in TORCH_VARS)
    # A variable the job script set is the user's: kept, and kept after destroy
    fake_srun.setenv("LOCAL_RANK", "0")
    dist.init_process_group()
    dist.destroy_process_group()
    assert os.environ.get("LOCAL_RANK") == "0" and "RANK" not in os.environ


def test_more_local_ranks_than_cores_warns_once_on_local_rank_0(fake_srun, caplog):
    import neural_arch.distributed as dist

    fake_srun.setenv("SLURM_NTASKS_PER_NODE", "2")
    fake_srun.setattr(launch_env.os, "cpu_count", lambda: 1)
    fake_srun.setattr(groups, "_WARNED_OVERSUBSCRIBED", False)
    with caplog.at_level(logging.WARNING, logger=groups.log.name):
        for _ in range(2):
            dist.init_process_group()
            dist.destroy_process_group()
    said = [r.getMessage() for r in caplog.records if "ranks on" in r.getMessage()]
    assert len(said) == 1 and "2 ranks on 1 cores: every rank busy-polls" in said[0], said
    assert "expect a large slowdown" in said[0]
    assert launch_env.oversubscription_message(4, cpus=8) is None


def test_sendrecv_and_mpi4py_habits_on_gloo(pool):
    for rank, out in enumerate(pool.run(fns.sendrecv_run)):
        _check_sendrecv(rank, 2, out)


def _check_sendrecv(rank, world, out):
    left = (rank - 1) % world
    assert list(out["ring"]) == [float(left), float(left)]
    assert out["raw"] == [10 * left, 10 * left + 1, 10 * left + 2]
    assert out["self"] == [1.0, 1.0]
    assert out["summed"] == sum(range(world))
    errors = out["errors"]
    assert errors["all_reduce_recv"].startswith("all_reduce reduces in place"), errors
    assert "use all_reduce(tensor, op=...) (mpi4py's Allreduce(send, recv) becomes recv[...] = send; " \
           "all_reduce(recv))" in errors["all_reduce_recv"]
    for name in ("scalar", "broadcast_scalar"):
        assert "pass a numpy array or Tensor (np.array(x)), or use broadcast_object_list / " \
               "all_gather_object for Python objects" in errors[name], errors


def test_ddp_takes_a_1d_device_mesh(pool):
    for out in pool.run(fns.ddp_mesh_run):
        assert out["diff"] <= 1e-10 and out["mesh_kept"], out
        assert "pass process_group or device_mesh, not both" in out["errors"]["both"]
        assert "device_mesh must be 1-d" in out["errors"]["two_d"]


MPI_SCRIPT = """
import json, os, sys
import neural_arch.distributed as dist
sys.path.insert(0, os.getcwd())
before = {n: os.environ.get(n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
dist.init_process_group()
import parity_rank_fns
out = parity_rank_fns.sendrecv_run()
from neural_arch.distributed.launch_env import get_node_local_rank
out.update(before=before, after={n: os.environ.get(n) for n in before}, backend=dist.get_backend(),
           local=get_node_local_rank())
with open(f"out_{dist.get_rank()}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.mpi
def test_under_mpiexec_local_rank_is_exported_and_sendrecv_works(tmp_path):
    import json
    import pathlib
    import shutil

    shutil.copy(pathlib.Path(__file__).with_name("parity_rank_fns.py"), tmp_path)
    (tmp_path / "job.py").write_text(MPI_SCRIPT)
    done = run_mpiexec(tmp_path / "job.py", 2, cwd=tmp_path, timeout=90)
    assert done.returncode == 0, done.output
    for rank in range(2):
        out = json.loads((tmp_path / f"out_{rank}.json").read_text())
        assert out["backend"] == "mpi"
        assert set(out["before"].values()) == {None}, out["before"]   # mpiexec sets none of torch's names
        assert out["after"] == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                                "LOCAL_WORLD_SIZE": "2"}
        assert out["local"] == rank
        _check_sendrecv(rank, 2, out)
    assert not re.search(r"Traceback", done.stderr), done.stderr
