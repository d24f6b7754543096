"""Two-rank MPI all_reduces of 16-32 KiB run as one pairwise exchange (comm/mpi/backend.py), under a real
``mpiexec``: results equal NumPy's ``op(rank 0's, rank 1's)`` bit for bit on both ranks at every
dtype and op, on both sides of the window and through the general path (float16, async); ranks
that disagree on the window are refused; a stale watchdog wake-up never ends a later exchange; a
size mismatch inside the window is an error on both ranks; a missing peer is a timeout naming the
op and the rank; a two-member sub-group of three ranks takes the exchange too."""

from __future__ import annotations

import hashlib

import pytest

from neural_arch.distributed.testing import run_mpiexec

pytestmark = [pytest.mark.latency_bound, pytest.mark.mpi, pytest.mark.timeout(90)]

_SCRIPT = """
import time, numpy as np
import neural_arch.distributed as dist
from neural_arch.distributed.comm.mpi.backend import MPIBackend
from neural_arch.distributed.comm.mpi.allreduce import PAIRWISE_MIN_BYTES, PAIRWISE_MAX_BYTES
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.resolve import _resolve_group
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
out = {}
try:
    MPIBackend.create(None, timeout=20, pairwise_max_bytes=0 if rank == 0 else 1 << 16)
    out["refused"] = "no error"
except ValueError as exc:
    out["refused"] = str(exc)
dist.init_process_group(timeout=3.0)
backend = _resolve_group(None, "test").backend
out["window"] = (backend._pairwise.min_bytes, backend._pairwise.max_bytes)
rng = np.random.default_rng(11)
ufuncs = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}
wrong, digest = [], []
sizes = [PAIRWISE_MIN_BYTES - 8, PAIRWISE_MIN_BYTES, 100000, PAIRWISE_MAX_BYTES, PAIRWISE_MAX_BYTES + 8]
cases = [(nbytes, dtype, op) for nbytes in sizes for dtype in ("float32", "float64", "int64")
         for op in ("sum", "avg", "max", "min", "product") if not (op == "avg" and dtype == "int64")]
cases += [(40000, "float16", "sum"), (40000, "float16", "avg"), (65536, "bool", "max"), (65536, "bool", "min")]
for i, (nbytes, dtype, op) in enumerate(cases):
    n = nbytes // np.dtype(dtype).itemsize
    data = (rng.standard_normal((2, n)) * 3)
    data = data > 0 if dtype == "bool" else data.astype(dtype)
    mine = data[rank].copy().reshape(2, -1) if n % 2 == 0 else data[rank].copy()
    if dtype == "float16":                     # widened to float32 on the host, rounded back once
        want = ufuncs[op](data[0].astype(np.float32), data[1].astype(np.float32))
        want = (want / 2 if op == "avg" else want).astype(np.float16)
    else:
        want = ufuncs[op](data[0], data[1])
        want = want / 2 if op == "avg" else want
    work = dist.all_reduce(mine, ReduceOp.coerce(op), async_op=(rank == 1 and i % 3 == 0))  # sync meets async
    if work is not None and work is not mine:
        work.wait()
    if not np.array_equal(mine.reshape(-1), want):
        wrong.append((nbytes, dtype, op))
    digest.append(mine.tobytes())
zeros = np.tile(np.array([0.0, -0.0] if rank == 0 else [-0.0, 0.0]), 4096)   # the operand order decides
for op in (ReduceOp.MAX, ReduceOp.MIN):
    z = zeros.copy()
    dist.all_reduce(z, op)
    digest.append(z.tobytes())
out["wrong"], out["used"] = wrong, len(backend._pairwise.views) > 0
# a wake-up the watchdog fired for an op that already finished must not end a later exchange
watchdog = backend._watchdog
slot = watchdog._slot()
slot.fired = OpInfo("all_reduce", 0, [0, 1], rank, deadline=time.monotonic() - 1)
watchdog.comm.Send(np.ones(1, np.int64), watchdog.me, slot.tag)
stale = []
for _ in range(3):
    y = np.full(8192, float(rank + 1))
    dist.all_reduce(y)
    stale.append(bool((y == 3.0).all()))
out["stale"] = stale
# a size mismatch inside the window: an error on both ranks (on a group of its own)
pair = dist.new_group([0, 1])
try:
    dist.all_reduce(np.ones(8192 if rank == 0 else 16384, np.float32), group=pair)
    out["mismatch"] = "no error"
except Exception as exc:
    out["mismatch"] = type(exc).__name__ + ": " + str(exc)
open(f"result_{rank}.txt", "w").write(repr(out))
open(f"digest_{rank}.bin", "wb").write(b"".join(digest))
if rank == 0:
    try:
        dist.all_reduce(np.ones(8192))          # rank 1 never joins
        print("RETURNED", flush=True)
    except Exception as exc:
        print("RAISED", type(exc).__name__, exc, flush=True)
else:
    time.sleep(20)
"""

_SUBGROUP = """
import numpy as np
import neural_arch.distributed as dist
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
dist.init_process_group(timeout=20.0)
pair = dist.new_group([0, 2])
x = np.full(4096, float(rank + 1))   # 32 KiB: inside the pairwise window
seen = []
if rank != 1:
    dist.all_reduce(x, group=pair)
    seen.append((bool((x == 4.0).all()), len(pair.backend._pairwise.views) > 0))
world = np.full(8192, 1.0)
dist.all_reduce(world)                          # three ranks: MPICH's Iallreduce
seen.append((bool((world == 3.0).all()), dist.group.WORLD.backend._pairwise is None))
open(f"seen_{rank}.txt", "w").write(repr(seen))   # (one file per rank: ranks' stdout lines interleave)
dist.destroy_process_group()
"""


def test_pairwise_all_reduce_matches_numpy_bitwise_and_fails_clearly(tmp_path):
    script = tmp_path / "pairwise.py"
    script.write_text(_SCRIPT)
    done = run_mpiexec(script, 2, timeout=60, cwd=tmp_path)
    text = done.output
    results = [eval((tmp_path / f"result_{r}.txt").read_text()) for r in (0, 1)]
    for out in results:
        assert "pairwise_max_bytes (NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES) differs across ranks" in out["refused"], text
        assert out["window"] == (16 << 10, 32 << 10)
        assert out["wrong"] == [] and out["used"], out
        assert out["stale"] == [True, True, True]
    digests = [hashlib.sha256((tmp_path / f"digest_{r}.bin").read_bytes()).hexdigest() for r in (0, 1)]
    assert digests[0] == digests[1]                       # the same bits on both ranks, every case
    for out in results:   # the call check: the same error on both ranks, naming both byte counts
        assert out["mismatch"].startswith("CollectiveMismatchError: all_reduce #1"), out["mismatch"]
        assert "(32768 bytes)" in out["mismatch"] and "(65536 bytes)" in out["mismatch"], out["mismatch"]
    assert "RAISED CollectiveTimeoutError" in done.stdout and "RETURNED" not in text, text
    assert "all_reduce #" in done.stdout and "ranks [1] did not arrive" in done.stdout, text


def test_a_two_member_subgroup_of_three_ranks_takes_the_exchange(tmp_path):
    script = tmp_path / "subgroup.py"
    script.write_text(_SUBGROUP)
    done = run_mpiexec(script, 3, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.output
    seen = [eval((tmp_path / f"seen_{r}.txt").read_text()) for r in (0, 1, 2)]
    assert seen == [[(True, True), (True, True)], [(True, True)], [(True, True), (True, True)]], done.output
