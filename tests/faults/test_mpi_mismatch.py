"""The MPI backend is never silently wrong (issue 27), under a real ``mpiexec``:

* ranks whose collectives differ in kind, byte count, dtype, reduce op or root at one sequence
  number all raise CollectiveMismatchError -- a seeded Hypothesis property over per-rank calls of
  all_reduce, broadcast, all_gather and reduce_scatter, many examples in one pool of ranks: every
  example either raises on every rank or returns NumPy's result on every rank;
* an uncaught exception on one rank ends the whole job at once (MPI_Abort from an excepthook);
* a timeout where both ranks wait names neither as idle, and a send that deadlocks says why
  (MPI's blocking send of a large message waits for its recv) and what to use instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.testing import RankPool, run_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]

KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
# inside the call check (<= 2 KiB), MPICH's Iallreduce, the two-rank pairwise window, above it
COUNTS = (0, 1, 3, 100, 255, 256, 257, 1000, 1200, 2049, 5000, 100_000, 120_000, 1_000_000, 1_200_000)
DTYPES = ("float32", "float64", "int32", "int64", "float16")
OPS = ("sum", "avg", "max", "min", "product")
_UFUNC = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}


def _valid(call, world):
    """The call as the ranks make it: an op its dtype takes (integers have no avg), a root inside the
    group; only reductions have an op and only broadcast a root (else calls differing there are equal)."""
    kind, count, dtype, op, root = call
    if op == "avg" and dtype.startswith("int"):
        op = "sum"
    reduces = kind in ("all_reduce", "reduce_scatter")
    return (kind, count, dtype, op if reduces else "-", root % world if kind == "broadcast" else 0)


def _data(example, r, count, dtype):
    # small integers: every op is exact in every dtype, so results compare bit for bit
    return np.random.default_rng([example, r]).integers(-3, 4, size=count).astype(dtype)


def _expected(calls, example, rank, world):
    kind, count, dtype, op, root = calls[rank]
    if kind == "broadcast":
        return _data(example, root, count, dtype)
    if kind == "all_gather":
        return np.stack([_data(example, r, count, dtype) for r in range(world)])
    n = count * world if kind == "reduce_scatter" else count
    rows = [_data(example, r, n, dtype).astype(np.float32 if dtype == "float16" else dtype) for r in range(world)]
    if op == "avg" and dtype == "float16":   # pre-multiplied sum (comm/backend.py), exact for these values
        rows = [row * np.float32(0.5 if world == 2 else 1.0 / world) for row in rows]
    out = rows[0]
    for row in rows[1:]:
        out = _UFUNC[op](out, row)
    if op == "avg" and dtype != "float16":
        out = out / world
    out = out.astype(dtype)
    return out[rank * count:(rank + 1) * count] if kind == "reduce_scatter" else out


def _call(backend, call, example, rank, world):
    kind, count, dtype, op, root = call
    reduce_op = ReduceOp.coerce(op) if op != "-" else None
    if kind == "all_reduce":
        x = _data(example, rank, count, dtype)
        backend.allreduce(x, reduce_op)
        return x
    if kind == "broadcast":
        x = _data(example, rank, count, dtype)
        backend.broadcast(x, root)
        return x
    if kind == "all_gather":
        out = np.zeros((world, count), dtype)
        backend.allgather(out, _data(example, rank, count, dtype))
        return out
    out = np.zeros(count, dtype)
    backend.reduce_scatter(out, _data(example, rank, count * world, dtype), reduce_op)
    return out


def random_calls_never_wrong(max_examples: int):
    """Seeded Hypothesis, run by every rank alike: each example draws one call per rank (the same
    for all, or with fields changed on some ranks); each rank makes its own call on a group of the
    world and records ("raised", error type) or ("ok", result == NumPy's). After a raise the ranks
    move to a fresh group (the old one is poisoned). Returns [(calls, outcome, every rank drew them), ...]."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    import neural_arch.distributed as dist
    from neural_arch.distributed.resolve import _resolve_group

    rank, world = dist.get_rank(), dist.get_world_size()
    world_backend = _resolve_group(None, "test").backend
    fresh = lambda: dist.new_group(list(range(world))).backend
    state = {"backend": fresh(), "example": 0}
    record = []
    call = st.tuples(st.sampled_from(KINDS), st.sampled_from(COUNTS), st.sampled_from(DTYPES),
                     st.sampled_from(OPS), st.integers(0, world - 1))

    @st.composite
    def per_rank_calls(draw):
        base = draw(call)
        if draw(st.booleans()):
            return [_valid(base, world)] * world
        calls = []
        for _ in range(world):
            mine = list(base)
            for field in draw(st.sets(st.integers(0, 4), max_size=2)):   # change 0-2 fields on this rank
                mine[field] = draw(call)[field]
            calls.append(_valid(tuple(mine), world))
        return calls

    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(per_rank_calls())
    def examples(calls):
        example = state["example"] = state["example"] + 1
        try:
            got = _call(state["backend"], calls[rank], example, rank, world)
            outcome = ("ok", bool(np.array_equal(got, _expected(calls, example, rank, world))))
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcome = ("raised", type(exc).__name__)
        # every rank learns whether any rank raised (and that all drew the same example)
        digest = zlib.crc32(repr(calls).encode())      # (not hash(): string hashes differ per process)
        flags = np.array([outcome[0] == "raised", digest, -digest], np.int64)
        world_backend.allreduce(flags, ReduceOp.MAX)
        if flags[0]:
            state["backend"] = fresh()
        record.append((calls, outcome, int(flags[1]) == -int(flags[2])))

    examples()
    return record


def test_random_per_rank_calls_raise_on_every_rank_or_return_the_right_result():
    with RankPool(2, backend="mpi", timeout=20.0) as pool:
        records = pool.run(random_calls_never_wrong, 120)
    assert len(records[0]) == len(records[1]) >= 100
    mismatched = agreed = 0
    for step, ((calls, mine0, same0), (calls1, mine1, same1)) in enumerate(zip(*records)):
        assert calls == calls1 and same0 and same1, (step, calls, calls1)
        if calls[0] == calls[1]:
            agreed += 1
            assert mine0 == mine1 == ("ok", True), (step, calls, mine0, mine1)
        else:
            mismatched += 1
            assert mine0 == mine1 == ("raised", "CollectiveMismatchError"), (step, calls, mine0, mine1)
    assert agreed >= 20 and mismatched >= 20, (agreed, mismatched)


_CRASH = textwrap.dedent("""
    import time, numpy as np
    import neural_arch.distributed as dist
    dist.init_process_group("mpi", timeout=60.0)
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails in user code")
    dist.all_reduce(np.ones(4))          # rank 0 waits here: without the hook, for the whole timeout
    print("RETURNED", flush=True)
""")


def test_an_uncaught_exception_on_one_rank_ends_the_job_at_once(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(_CRASH)
    done = run_mpiexec(script, 2, timeout=50)
    out = done.output
    assert done.returncode != 0 and "RETURNED" not in out, out
    assert "RuntimeError: rank 1 fails in user code" in out, out
    assert "rank 1 ended with an uncaught RuntimeError; aborting the MPI job" in out, out
    assert done.elapsed < 20, (done.elapsed, out)


def test_the_abort_hook_is_installed_unless_turned_off():
    code = textwrap.dedent("""
        import sys
        from neural_arch.distributed.comm.mpi.failure import abort_on_uncaught_exception
        before = sys.excepthook
        off = abort_on_uncaught_exception({"NEURAL_ARCH_MPI_ABORT_ON_EXCEPTION": "0"})
        unchanged = sys.excepthook is before
        on = abort_on_uncaught_exception({})
        print(off, unchanged, on, sys.excepthook is not before)
    """)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True", "True", "True"], done.stdout + done.stderr


_DIAGNOSES = textwrap.dedent("""
    import numpy as np
    import neural_arch.distributed as dist
    dist.init_process_group("mpi", timeout=1.8)
    rank = dist.get_rank()
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    try:   # both ranks wait in all_reduce #1 of a group [0, 1]: each on its own one (same members, other ids)
        dist.all_reduce(np.ones(4), group=a if rank == 0 else b)
    except Exception as exc:
        open(f"collective_{rank}.txt", "w").write(f"{type(exc).__name__}: {exc}")
    try:   # both send 1 MiB first: MPI's send waits for the matching recv
        dist.send(np.ones(1 << 17), dst=1 - rank)
        dist.recv(np.ones(1 << 17), src=1 - rank)
    except Exception as exc:
        open(f"send_{rank}.txt", "w").write(f"{type(exc).__name__}: {exc}")
""")


def test_timeouts_say_what_the_ranks_were_doing(tmp_path):
    script = tmp_path / "diagnoses.py"
    script.write_text(_DIAGNOSES)
    # (the stall inspector warns before the timeouts: under MPI it asks the ranks' presence threads).
    # The two groups have the same members and each rank waits in #1 of its own: the answers carry the
    # group's id (pg<generation>/group<n>, in creation order), so each rank names the other as missing
    # and where it is (before ids, both read "every rank of the group is waiting in it": a wrong verdict)
    done = run_mpiexec(script, 2, timeout=50, cwd=tmp_path, env={"NEURAL_ARCH_STALL_WARNING_S": "0.6"})
    for rank in (0, 1):
        assert (f"rank {rank}: all_reduce #1 of group [0, 1] has waited" in done.stderr
                and f"ranks [{1 - rank}] have not arrived (rank {1 - rank} is in all_reduce #1 (shape (4,), float64) "
                    f"on group pg1/group{2 - rank} [0, 1])" in done.stderr), done.output
    assert "every rank of the group is waiting in it" not in done.stderr, done.output
    assert "no rendezvous store" not in done.stderr, done.output
    assert "Under MPI a blocking send of a large message returns only once the receiver posted" in done.stderr, \
        done.output
    for rank in (0, 1):
        collective = (tmp_path / f"collective_{rank}.txt").read_text()
        assert collective.startswith("CollectiveTimeoutError: all_reduce #1"), done.output
        # (the other rank may have timed out already: then it answers "idle ...; it timed out ... in all_reduce #1
        # ... on group <its group>", still another place than this one)
        assert f"ranks [{1 - rank}] did not arrive" in collective, collective
        assert f"on group pg1/group{2 - rank} [0, 1]" in collective, collective     # where the other one waits
        send = (tmp_path / f"send_{rank}.txt").read_text()
        assert send.startswith(f"CollectiveTimeoutError: send #1 (shape (131072,), float64) to rank {1 - rank} "), send
        assert "root" not in send and "batch_isend_irecv" in send and "receiver" in send, send
        sentences = [s.strip() for s in send.split(". ")]
        assert len(sentences) == len(set(sentences)), send       # no sentence twice
