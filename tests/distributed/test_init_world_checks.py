"""Issue 27, "never silently wrong" at init: every rank is told the same clear story.

* ranks that disagree on WORLD_SIZE are told so at the rendezvous, on every rank, within its timeout;
* a rank that loses the store while waiting for a rank that never came names that rank, not the host;
* the store's host waits (bounded) at destroy until every rank has left, so a clean exit of rank 0
  cannot fail a slower peer with "lost the rendezvous store";
* a backend's requirements are checked before the rendezvous (nccl without CuPy: an ImportError at
  once, on every rank, never a "could not reach the store" on the others);
* init_process_group("mpi") in a process a non-MPI launcher started refuses to make a world of one.

One 2-rank pool (started once) serves the rendezvous tests; the last two need no peer.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import init_world_fns as F
import pytest

import neural_arch.distributed as dist
from neural_arch.distributed.run.child_env import free_port, rank_env
from neural_arch.distributed.testing import RankPool, script_env

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pool2():
    with RankPool(2, backend="gloo", init=False, timeout=40.0) as pool:
        yield pool


def test_ranks_that_disagree_on_world_size_are_told_so_on_every_rank(pool2):
    results = pool2.run(F.world_disagreement, free_port(), [2, 3])
    for rank, (kind, message, seconds) in enumerate(results):
        assert kind == "RendezvousError", (rank, kind, message)
        assert "disagree on the world size" in message, message
        assert "WORLD_SIZE=2" in message and "WORLD_SIZE=3" in message, message
        assert seconds < 4.5, (rank, seconds)  # within the rendezvous timeout, not the transport's


def test_a_rank_that_loses_the_store_names_the_rank_that_never_came(pool2):
    (kind0, msg0, _), (kind1, msg1, s1) = pool2.run(F.lost_store_while_waiting, free_port())
    assert kind0 == "RendezvousError" and "ranks [2] never arrived" in msg0, msg0
    assert kind1 == "RendezvousError", (kind1, msg1)
    assert "ranks [2]" in msg1 and "never arrived" in msg1, msg1   # today: "lost the store ... rank 0 exited"
    assert s1 < 6, s1


def test_the_store_host_waits_for_a_slower_rank_before_closing(pool2):
    (_, _, waited), (kind1, msg1, _) = pool2.run(F.clean_exit_race, free_port())
    assert kind1 == "ok", msg1           # today: PeerFailureError: lost the rendezvous store
    assert 0.5 < waited < 8, waited      # rank 0's destroy waited for rank 1 to leave, bounded


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_nccl_requirements_are_checked_before_the_rendezvous(monkeypatch):
    # rank 1 of 2, with no store host anywhere: today it waits for the store, then blames rank 0
    for key, value in rank_env({}, rank=1, world_size=2, master_port=free_port(), token="9c4e" * 10).items():
        if key not in ("PYTHONPATH",):
            monkeypatch.setenv(key, value)
    t0 = time.monotonic()
    with pytest.raises(ImportError, match=r"gpu"):
        dist.init_process_group("nccl", rendezvous_timeout=3)
    assert time.monotonic() - t0 < 1.5
    assert not dist.is_initialized()


@pytest.mark.mpi
def test_mpi_backend_under_a_non_mpi_launcher_refuses_a_world_of_one():
    env = script_env(rank_env({}, rank=1, world_size=2, master_port=free_port(), token="9c4e" * 10, backend="mpi"))
    code = "import neural_arch.distributed as d; d.init_process_group('mpi'); print('size', d.get_world_size())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode != 0, done.stdout            # today: "size 1", exit 0
    assert "mpiexec -n 2" in done.stderr and "WORLD_SIZE=2" in done.stderr, done.stderr
