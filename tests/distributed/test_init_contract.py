"""init_process_group's contracts with its surroundings: the launcher's ready markers, the job
token derived from mpiexec/srun, and what get_distributed_info reports (node layout, devices)."""

from __future__ import annotations

import importlib.util
import logging
import os

import dist_fault_fns as F
import pytest

import neural_arch.distributed as dist
from neural_arch.distributed import groups as G
from neural_arch.distributed.testing import free_port, run_ranks

# clean_job_env (conftest.py): no job variables, no process group left behind
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_job_env")]


# ---------------------------------------------------------------------------------- ready marker
def test_ready_marker_written_after_init(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_READY_DIR", str(tmp_path))
    dist.init_process_group()
    assert os.listdir(tmp_path) == ["rank_0"]
    assert os.path.getsize(tmp_path / "rank_0") == 0


def test_no_ready_marker_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dist.init_process_group()
    assert os.listdir(tmp_path) == []


def test_unwritable_ready_dir_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    missing = tmp_path / "no" / "such" / "dir"
    monkeypatch.setenv("NEURAL_ARCH_READY_DIR", str(missing))
    with caplog.at_level(logging.WARNING, logger="neural_arch.distributed"):
        dist.init_process_group()
    assert dist.is_initialized()
    assert "ready marker" in caplog.text and "NEURAL_ARCH_READY_DIR" in caplog.text


def test_no_ready_marker_when_rendezvous_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_READY_DIR", str(tmp_path))
    with pytest.raises(dist.DistributedError):   # rank 1 never comes
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=2, rank=0,
                                rendezvous_timeout=1.0)
    assert os.listdir(tmp_path) == []


def test_every_rank_writes_its_ready_marker(tmp_path):
    results = run_ranks(F.ready_marker_fn, 3, args=(str(tmp_path),), init=False, timeout=60)
    for r in results:
        assert r.ok, r.traceback
        assert r.value == (True, ["rank_0", "rank_1", "rank_2"])


# ---------------------------------------------------------------------------------- job token
def _capture_store_token(monkeypatch):
    seen = {}

    def fake_make_store(init_method, rank, world_size, timeout, token, launch):
        seen["token"] = token
        raise RuntimeError("stop here")  # the token is all this test needs
    monkeypatch.setattr(G, "_make_store", fake_make_store)
    return seen


def test_job_token_derived_from_the_job_id_when_none_is_given(monkeypatch):
    # Imported, not looked up: a missing derive_job_token fails this test instead of skipping it.
    from neural_arch.distributed.launch_env import derive_job_token

    monkeypatch.delenv("NEURAL_ARCH_AUTH_TOKEN", raising=False)
    tokens = []
    for job in ("4242", "4243"):  # two concurrent jobs must get different tokens
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_STEP_ID", "0")
        seen = _capture_store_token(monkeypatch)
        with pytest.raises(RuntimeError, match="stop here"):
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", world_size=2, rank=0)
        # the job id separates jobs; it is public, so it is never the token (docs/security.md)
        assert seen["token"].token is None
        assert isinstance(seen["token"].job_id, str) and len(seen["token"].job_id) == 32
        assert seen["token"].job_id == derive_job_token(os.environ)
        tokens.append(seen["token"].job_id)
    assert tokens[0] != tokens[1]


def test_explicit_auth_token_wins_over_the_derived_one(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("NEURAL_ARCH_AUTH_TOKEN", "5ec7e7" * 6)
    seen = _capture_store_token(monkeypatch)
    with pytest.raises(RuntimeError, match="stop here"):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", world_size=2, rank=0)
    assert seen["token"].token == "5ec7e7" * 6


def test_no_job_id_no_token(monkeypatch):
    seen = _capture_store_token(monkeypatch)
    with pytest.raises(RuntimeError, match="stop here"):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", world_size=2, rank=0)
    assert seen["token"].token is None and seen["token"].job_id is None


# ---------------------------------------------------------------------------------- get_distributed_info
def test_host_layout():
    hosts = ["a", "b", "a", "c", "b"]
    assert [G._host_layout(hosts, r) for r in (0, 2, 4)] == [
        {"local_rank": 0, "local_world_size": 2, "node_rank": 0, "num_nodes": 3},
        {"local_rank": 1, "local_world_size": 2, "node_rank": 0, "num_nodes": 3},
        {"local_rank": 1, "local_world_size": 2, "node_rank": 1, "num_nodes": 3}]


@pytest.mark.parametrize("split_hosts", [False, True], ids=["one-host", "two-hosts"])
def test_tcp_init_reports_the_measured_node_layout(split_hosts):
    method = f"tcp://127.0.0.1:{free_port()}"
    results = run_ranks(F.layout_fn, 2, args=(method, split_hosts), init=False, timeout=60)
    for r in results:
        assert r.ok, r.traceback
        info = r.value
        rank = info["rank"]
        if split_hosts:
            assert (info["local_rank"], info["local_world_size"], info["node_rank"]) == (0, 1, rank)
            assert info["transport"] == "tcp"
        else:
            assert (info["local_rank"], info["local_world_size"], info["node_rank"]) == (rank, 2, 0)
            assert info["transport"] == "shm"


def test_devices_lists_only_usable_ones():
    dist.init_process_group("gloo", world_size=1, rank=0)
    devices = dist.get_distributed_info()["devices"]
    assert devices[0] == "cpu"
    if importlib.util.find_spec("cupy") is None:
        assert devices == ["cpu"]
    else:
        from neural_arch.backend import is_cupy_available

        assert ("cuda" in devices) == is_cupy_available()
