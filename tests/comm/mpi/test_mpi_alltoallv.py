"""The MPI backend's two-rank all_to_allv (``comm/mpi/alltoallv.py``: receives posted before the call
check, sends after its verdict) under a real ``mpiexec``, in one job: uneven exchanges on both sides
of MPICH's eager limit and with empty blocks equal NumPy's, through the fused synchronous path and
the general one (async); a split mismatch and a rank in another collective each raise
``CollectiveMismatchError`` on both ranks naming the op, leave the output untouched and cancel the
posted receive (a later message with the blocks' tag reaches a fresh receive, not the old output);
a peer that never arrives is a ``CollectiveTimeoutError`` naming the op and the missing rank."""

from __future__ import annotations

import pytest

from neural_arch.distributed.testing import run_mpiexec

pytestmark = [pytest.mark.latency_bound, pytest.mark.mpi, pytest.mark.timeout(90)]

_SCRIPT = """
import time, numpy as np
import neural_arch.distributed as dist
from neural_arch.distributed.comm.mpi.alltoallv import _TAG
from neural_arch.distributed.resolve import _resolve_group
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
dist.init_process_group(timeout=20.0)      # generous on a loaded machine; the missing peer's group: 1 s
world = _resolve_group(None, "test").backend
short = dist.new_group([0, 1], timeout=1.0)
out = {"wrong": []}

def rows(r, n, width, seed):          # rank r's n rows (every rank can rebuild any rank's)
    return np.random.default_rng(seed * 10 + r).standard_normal((n, width)).astype(np.float32)

# (counts[s][d]: rows rank s sends rank d) -- tiny, empty blocks, a block past the eager limit
for seed, counts, width in [(1, [[1, 2], [3, 0]], 4), (2, [[0, 0], [0, 5]], 3), (3, [[0, 0], [0, 0]], 2),
                            (4, [[40, 96], [64, 32]], 1024), (5, [[2, 300], [0, 1]], 512)]:
    for async_op in (False, True):
        x = rows(rank, sum(counts[rank]), width, seed)
        recv = [counts[s][rank] for s in range(2)]
        y = np.empty((sum(recv), width), np.float32)
        work = world.alltoallv(y, x, recv, counts[rank], async_op=async_op)
        work.wait()
        want = np.concatenate([rows(s, sum(counts[s]), width, seed)[sum(counts[s][:rank]):sum(counts[s][:rank + 1])]
                               for s in range(2)])
        if not np.array_equal(y, want.reshape(y.shape)):
            out["wrong"].append((seed, async_op))

# the fused synchronous path records the op as _run does (the last two: sync, then async through _run)
from neural_arch.distributed.flight_recorder.buffer import RECORDER
mine = [r for r in RECORDER.snapshot() if r["op"] == "all_to_allv" and r["group"] == [0, 1]]
out["recorded"] = [(r["seq"], r["state"], r["shape"]) for r in mine[-2:]]

def cancelled(group):
    # the posted receive from rank 1 was cancelled: a message with the blocks' tag on the same private
    # communicator reaches a fresh receive (a receive still posted would have taken it)
    comm = group.backend._a2av.comm
    if rank == 1:
        comm.Send(np.full(3, 7.0), 0, _TAG)
        return True
    got = np.zeros(3)
    req = comm.Irecv(got, 1, _TAG)
    deadline = time.monotonic() + 5
    while not req.Test() and time.monotonic() < deadline:
        time.sleep(0.001)
    return bool((got == 7.0).all())

# a split mismatch: rank 0 expects 2 rows from rank 1, which sends 1
split = dist.new_group([0, 1])
split.backend.alltoallv(np.zeros((2, 2)), np.ones((2, 2)), [1, 1], [1, 1])   # builds the plan
y = np.full((3 if rank == 0 else 2, 2), -1.0)
try:
    split.backend.alltoallv(y, np.ones((2, 2)), [1, 2] if rank == 0 else [1, 1], [1, 1])
    out["split"] = "no error"
except Exception as exc:
    out["split"] = type(exc).__name__ + ": " + str(exc)
out["split_untouched"] = bool((y == -1.0).all())
failed = [r for r in RECORDER.snapshot() if r["op"] == "all_to_allv" and r["state"] == "failed"]
out["split_recorded"] = bool(failed) and "CollectiveMismatchError" in failed[-1]["error"]
try:                                            # the error poisoned the group, as _run's would
    split.backend.alltoallv(np.zeros((2, 2)), np.ones((2, 2)), [1, 1], [1, 1])
    out["poisoned"] = "no error"
except Exception as exc:
    out["poisoned"] = type(exc).__name__
out["split_cancelled"] = cancelled(split)

# a rank in another collective: rank 0 in all_to_allv, rank 1 in all_reduce
other = dist.new_group([0, 1])
other.backend.alltoallv(np.zeros((2, 2)), np.ones((2, 2)), [1, 1], [1, 1])
y = np.full((2, 2), -1.0)
try:
    if rank == 0:
        other.backend.alltoallv(y, np.ones((2, 2)), [1, 1], [1, 1])
    else:
        other.backend.allreduce(np.ones(4))
    out["other"] = "no error"
except Exception as exc:
    out["other"] = type(exc).__name__ + ": " + str(exc)
out["other_untouched"] = bool((y == -1.0).all())
out["other_cancelled"] = cancelled(other)
open(f"result_{rank}.txt", "w").write(repr(out))
if rank == 0:
    try:
        short.backend.alltoallv(np.empty((2, 2)), np.ones((2, 2)), [1, 1], [1, 1])     # rank 1 never joins
        print("RETURNED", flush=True)
    except Exception as exc:
        print("RAISED", type(exc).__name__, exc, flush=True)
else:
    time.sleep(20)
"""


def test_two_rank_alltoallv_matches_numpy_checks_splits_and_times_out(tmp_path):
    script = tmp_path / "alltoallv.py"
    script.write_text(_SCRIPT)
    done = run_mpiexec(script, 2, timeout=60, cwd=tmp_path)
    text = done.output
    assert all((tmp_path / f"result_{r}.txt").exists() for r in (0, 1)), text
    results = [eval((tmp_path / f"result_{r}.txt").read_text()) for r in (0, 1)]
    for rank, out in enumerate(results):
        assert out["wrong"] == [], (rank, out)
        assert out["split"].startswith("CollectiveMismatchError: all_to_allv #2"), (rank, out["split"])
        assert "rank 1 sends 1 rows to rank 0, which expects 2" in out["split"], (rank, out["split"])
        # each rank names its own op first, and both ranks' calls
        own = ("all_to_allv #2", "all_reduce #2")[rank]
        assert out["other"].startswith(f"CollectiveMismatchError: {own}"), (rank, out["other"])
        assert "all_to_allv #2" in out["other"] and "all_reduce #2" in out["other"], (rank, out["other"])
        assert out["split_untouched"] and out["other_untouched"], (rank, out)
        (seq_a, state_a, _), (seq_b, state_b, shape_b) = out["recorded"]   # the last two exchanges (sync, async)
        assert seq_b == seq_a + 1 and state_a == state_b == "completed", (rank, out["recorded"])
        assert shape_b == [[302, 512], [1, 512]][rank], (rank, out["recorded"])     # this rank's input
        assert out["split_recorded"] and out["poisoned"] == "GroupPoisonedError", (rank, out)
        assert out["split_cancelled"] and out["other_cancelled"], (rank, out)
    assert "RAISED CollectiveTimeoutError" in done.stdout and "RETURNED" not in text, text
    assert "all_to_allv #" in done.stdout and "ranks [1] did not arrive" in done.stdout, text
