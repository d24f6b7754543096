"""The multi-process harness every distributed test relies on: results, failures, deaths, hangs, reaping."""

from __future__ import annotations

import os
import signal
import time

import pytest
from polling import wait_for

from neural_arch.distributed.testing import RankFailure, RankPool, run_ranks

pytestmark = pytest.mark.timeout(90)


def rank_and_pid(x):
    return int(os.environ["RANK"]), os.getpid(), x


def fail_on_rank_one():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one says no")
    return "fine"


def kill_rank_one():
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def hang_on_rank_zero():
    if os.environ["RANK"] == "0":
        time.sleep(600)
    return os.getpid()


def mpi_identity():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _alive(pid):
    """Unlike ``polling.pid_alive``, a zombie counts: these tests check that the pool *reaped* its ranks."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_pool_runs_many_functions_on_the_same_ranks():
    with RankPool(3, init=False) as pool:
        first = pool.run(rank_and_pid, "a")
        second = pool.run(rank_and_pid, "b")
    assert [r for r, _, _ in first] == [0, 1, 2]
    assert [p for _, p, _ in first] == [p for _, p, _ in second]  # same processes
    assert [x for _, _, x in second] == ["b"] * 3
    assert not any(_alive(p) for _, p, _ in first)  # reaped on exit: close() waits for its ranks


def test_a_raising_rank_is_reported_with_its_traceback_and_the_pool_survives():
    with RankPool(2, init=False) as pool:
        with pytest.raises(RankFailure) as info:
            pool.run(fail_on_rank_one)
        assert "ranks [1]" in str(info.value) and "rank one says no" in str(info.value)
        assert "Traceback" in str(info.value)
        assert [r for r, _, _ in pool.run(rank_and_pid, 0)] == [0, 1]


def test_a_dead_rank_is_reported_with_its_exit_code():
    results = run_ranks(kill_rank_one, 2, init=False)
    assert results[0].ok and results[0].value == "survived"
    assert not results[1].ok and results[1].exc_type == "Died" and results[1].exitcode == -signal.SIGKILL


def test_a_hung_rank_times_out_and_every_process_is_reaped():
    start = time.monotonic()
    with RankPool(2, init=False, timeout=3) as pool:
        pids = [p for _, p, _ in pool.run(rank_and_pid, 0)]
        # the per-call timeout (not the pool's 3 s) bounds this call: the wait is the test's cost
        results = pool.run_detailed(hang_on_rank_zero, timeout=1.5)
    assert time.monotonic() - start < 30
    assert results[0].exc_type == "Timeout" and "no answer within 2 s" in results[0].error
    assert results[1].ok
    assert not any(_alive(p) for p in pids)  # close() killed and reaped them: nothing to wait for


@pytest.mark.mpi
def test_mpi_pool_runs_under_a_real_mpiexec():
    with RankPool(3, backend="mpi", init=False) as pool:
        assert pool.run(mpi_identity) == [(0, 3), (1, 3), (2, 3)]


def test_ranks_end_when_the_pool_process_is_sigkilled(tmp_path):
    # The pool's ranks arm the parent-death watch (run/parent_watch.py): no orphans even without close().
    import subprocess
    import sys

    code = ("import os, sys, time\n"
            "from neural_arch.distributed.testing import RankPool\n"
            "pool = RankPool(2, init=False)\n"
            "print(' '.join(str(p) for p in pool.run(os.getpid)), flush=True)\n"
            "time.sleep(60)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # TMPDIR: the SIGKILLed pool cannot remove its log folder; it stays in tmp_path, not in the session's
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    pids = []
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait(10)
        assert wait_for(lambda: not any(_alive(p) for p in pids), 5), "pool ranks outlived their SIGKILLed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
