"""``init_process_group("mpi", blocking_collectives=True)`` under a real ``mpiexec``, in one job:
ranks that disagree on the mode are refused on every rank; blocking all_reduces (sync on one rank,
async on the other) match NumPy; a rank that never arrives makes the waiting rank's watchdog abort
the whole job at the deadline, naming the op, its sequence number and the missing rank."""

from __future__ import annotations

import pytest

from neural_arch.distributed.testing import run_mpiexec

pytestmark = [pytest.mark.latency_bound, pytest.mark.mpi, pytest.mark.timeout(60)]

_SCRIPT = """
import time, numpy as np
import neural_arch.distributed as dist
from neural_arch.distributed.comm.mpi.allreduce import PERSISTENT_MAX_BYTES
from neural_arch.distributed.comm.mpi.backend import MPIBackend
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
try:
    MPIBackend.create(None, timeout=20, blocking_collectives=(rank == 0))
    refused = "no error"
except ValueError as exc:
    refused = str(exc)
dist.init_process_group(timeout=1.5, blocking_collectives=True)
rng = np.random.default_rng(3)
results = [refused]
for n in (5, PERSISTENT_MAX_BYTES // 8 + 1, 70000):
    data = rng.standard_normal((2, n))
    mine = data[rank].copy()
    work = dist.all_reduce(mine, async_op=(rank == 1))   # sync and async ranks must still match
    if rank == 1:
        work.wait()
    results.append(bool(np.array_equal(mine, data[0] + data[1])))
open(f"result_{rank}.txt", "w").write(repr(results))
if rank == 0:
    dist.all_reduce(np.ones(1000))           # rank 1 never joins: the watchdog aborts the job
    print("RETURNED", flush=True)
else:
    time.sleep(30)
"""


def test_blocking_collectives_agree_match_numpy_and_abort_the_job_at_the_deadline(tmp_path):
    script = tmp_path / "blocking.py"
    script.write_text(_SCRIPT)
    out = run_mpiexec(script, 2, timeout=50, cwd=tmp_path)
    elapsed, text = out.elapsed, out.output
    for r in (0, 1):
        refused, *matched = eval((tmp_path / f"result_{r}.txt").read_text())
        assert "blocking_collectives differs across ranks" in refused, text
        assert matched == [True, True, True], text
    assert out.returncode != 0 and "RETURNED" not in text, text
    assert "CollectiveTimeoutError: all_reduce #4 (shape (1000,), float64)" in out.stderr, text
    assert "ranks [1] did not arrive" in out.stderr and "aborting the MPI job" in out.stderr, text
    # not a speed assertion: the abort must come long before rank 1 wakes up (30 s)
    assert elapsed < 25, (elapsed, text)
