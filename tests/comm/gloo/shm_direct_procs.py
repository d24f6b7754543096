"""Rank-side helpers for test_shm_direct.py (imported by the pool's rank processes).

Each returns plain data (or raises): the test compares across ranks.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

import gloo_checks as C
import numpy as np
from gloo_procs import backend


def uses_direct():
    b = backend()
    return b._direct is not None


def mixed_sequence(seed, rounds):
    """Many direct collectives back to back, sizes across the small path, one chunk and many chunks,
    so consecutive ops reuse the segment's buffers in every combination. Returns every result's
    bytes (the test checks that all ranks got the same bits)."""
    b = backend()
    assert b._direct is not None, "the direct path is not active"
    rng = np.random.default_rng(seed)
    digests = []
    kinds = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"]
    for i in range(rounds):
        kind = kinds[int(rng.integers(len(kinds)))]
        dtype = ["float32", "float64", "int32", "int64", "float16"][int(rng.integers(5))]
        n = int(rng.choice([1, 3, 200, 1000, 5000, 40000]))
        seed_i = seed * 1000 + i
        if kind == "all_reduce":
            op = C.ops_for(dtype)[int(rng.integers(len(C.ops_for(dtype))))]
            data = C.global_array(seed_i, b.size, (n,), dtype, op)
            mine = np.array(data[b.rank])
            b.allreduce(mine, op)
            C.assert_close(mine, C.oracle(data, op), dtype, f"step {i} all_reduce {op} {n} {dtype}")
            digests.append(mine.tobytes())
        elif kind == "reduce_scatter":
            op = "sum" if dtype != "float16" else "max"
            data = C.global_array(seed_i, b.size, (n * b.size,), dtype, op)
            out = np.empty(n, dtype)
            b.reduce_scatter(out, np.array(data[b.rank]), op)
            C.assert_close(out, C.oracle(data, op)[b.rank * n:(b.rank + 1) * n], dtype, f"step {i} rs {n}")
            digests.append(b"")
        elif kind == "all_gather":
            data = C.global_array(seed_i, b.size, (n,), dtype)
            out = np.empty_like(data)
            b.allgather(out, np.array(data[b.rank]))
            np.testing.assert_array_equal(out, data)
            digests.append(out.tobytes())
        elif kind == "broadcast":
            root = int(rng.integers(b.size))
            data = C.global_array(seed_i, b.size, (n,), dtype)
            mine = np.array(data[b.rank])
            b.broadcast(mine, root)
            np.testing.assert_array_equal(mine, data[root])
            digests.append(mine.tobytes())
        elif kind == "reduce":
            root = int(rng.integers(b.size))
            data = C.global_array(seed_i, b.size, (n,), dtype, "sum")
            mine = np.array(data[b.rank])
            b.reduce(mine, root, "sum")
            if b.rank == root:
                C.assert_close(mine, C.oracle(data, "sum"), dtype, f"step {i} reduce")
            else:
                np.testing.assert_array_equal(mine, data[b.rank])
            digests.append(b"")
        else:
            b.barrier()
            digests.append(b"")
    return [hashlib.sha256(d).hexdigest() for d in digests]


def float_sum_bits(n):
    """A float32 sum whose rounding depends on the order: every rank must still get the same bits."""
    b = backend()
    rng = np.random.default_rng(7 + b.rank)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    b.allreduce(x, "sum")
    return x.tobytes()


def mismatch(kind):
    """Rank 0 and the others call different collectives at the same sequence number; every rank must
    raise (never return data), and the group must be poisoned afterwards."""
    from neural_arch.distributed.errors import DistributedError, GroupPoisonedError

    b = backend()
    b.allreduce(np.ones(4, np.float32))           # everyone in step first
    first = b.rank == 0
    try:
        if kind == "op":
            if first:
                b.broadcast(np.ones(64, np.float32), 0)
            else:
                b.allreduce(np.ones(64, np.float32))
        elif kind == "dtype":
            b.allreduce(np.ones(64, np.float32 if first else np.float64))
        elif kind == "size":
            b.allreduce(np.ones(64 if first else 65, np.float32))
        elif kind == "size_large":      # small path on one rank, pipelined path on the others
            b.allreduce(np.ones(100 if first else 100000, np.float32))
        elif kind == "root":
            b.broadcast(np.ones(64, np.float32), 0 if first else 1)
        elif kind == "reduce_op":
            b.allreduce(np.ones(64, np.float32), "sum" if first else "max")
        elif kind == "order":           # same two ops, swapped
            if first:
                b.allreduce(np.ones(8, np.float32))
                b.allgather(np.empty((b.size, 8), np.float32), np.ones(8, np.float32))
            else:
                b.allgather(np.empty((b.size, 8), np.float32), np.ones(8, np.float32))
                b.allreduce(np.ones(8, np.float32))
        else:
            raise ValueError(kind)
    except DistributedError as exc:
        outcome = (type(exc).__name__, str(exc))
    else:
        return ("no error", "")
    try:
        b.allreduce(np.ones(4, np.float32))
    except GroupPoisonedError:
        return outcome
    return ("not poisoned",) + outcome[1:]


def kill_or_stop_last(how, nbytes, stop_s=0.0, done_dir=None):
    """The last rank SIGKILLs or SIGSTOPs itself before a direct all_reduce (a forked helper resumes
    a stopped rank once every other rank has reported, a file each in ``done_dir``, or after
    ``stop_s``, so the pool gets it back); the others report what they saw."""
    b = backend()
    b.allreduce(np.ones(2))
    if b.rank == b.size - 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        parent = os.getpid()
        if os.fork() == 0:      # the helper: wait, resume the stopped rank, vanish
            others = [os.path.join(done_dir, f"done-{r}") for r in range(b.size - 1)] if done_dir else []
            end = time.monotonic() + stop_s
            # how long the rank stays stopped: until its peers have seen the stop (the scenario)
            while time.monotonic() < end and not (others and all(map(os.path.exists, others))):
                time.sleep(0.05)
            os.kill(parent, signal.SIGCONT)
            os._exit(0)
        os.kill(parent, signal.SIGSTOP)
        os.wait()
        return ("stopped", "", 0.0)
    t0 = time.monotonic()
    try:
        b.allreduce(np.ones(nbytes // 4, np.float32))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = (type(exc).__name__, str(exc), time.monotonic() - t0)
    else:
        outcome = ("no error", "", time.monotonic() - t0)
    if done_dir:
        open(os.path.join(done_dir, f"done-{b.rank}"), "w").close()
    return outcome


def segment_files():
    """This rank's collective segments still in /dev/shm (should be none: unlinked once all mapped)."""
    backend()
    mine = f"na-{os.getpid()}-"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine) and n.endswith("-coll"))



_SUB: dict = {}


def subgroup():
    """This rank's sub-group of the world (cached): every rank but rank 0 on 3+ ranks (group ranks then
    differ from world ranks), the two ranks on 2; None on rank 0 of a 3+ world."""
    b = backend()
    if "sub" not in _SUB:
        _SUB["sub"] = b.new_group(list(range(1, b.size)) if b.size > 2 else [0, 1])
    return _SUB["sub"]


def subgroup_checks(calls):
    """Runs gloo_checks ``calls`` on the sub-group. Returns (mapped before the first collective, the
    algorithm chosen for a 1 MiB all_reduce, mapped after, the checks' results), or None off the group."""
    sub = subgroup()
    if sub is None:
        return None
    before = sub._direct is not None
    algo = sub.chosen_algorithm("all_reduce", np.ones(1 << 18, np.float32))
    results = [getattr(C, name)(sub, *args) for name, args in calls]
    return before, algo, sub._direct is not None, results


def subgroup_direct_equals_ring(seed):
    """The same int64 all_reduce / reduce_scatter on the sub-group through the direct path and through
    the ring plan: bitwise equal (integers) -- and a nested sub-group of it (its first two ranks) too."""
    sub = subgroup()
    if sub is None:
        return None
    nested = sub.new_group([0, 1])
    out = []
    for g in (sub, nested) if nested is not None else (sub,):
        rng = np.random.default_rng(seed + g.rank)
        x = rng.integers(-1000, 1000, 50001).astype(np.int64)
        res = {}
        for algo in ("direct", "ring"):
            a = x.copy()
            rs = np.empty(x.size // g.size, np.int64)
            with g.forced_algorithm(algo):
                g.allreduce(a)
                g.reduce_scatter(rs, x[:rs.size * g.size].copy())
            res[algo] = a.tobytes() + rs.tobytes()
        out.append((g.size, g._direct is not None, res["direct"] == res["ring"]))
    return out


def kill_while_peer_waits_in_subgroup():
    """Sub-group [0, 1] runs direct; rank 2 SIGKILLs itself; rank 0 then fails in a world all_reduce
    (rank 2's pid is dead) while rank 1 waits for rank 0 in the sub-group's shared-memory barrier:
    rank 0's failure must wake it (poisoning every segment of rank 0's process), long before the
    timeout. Returns (error type, message, seconds) on ranks 0 and 1."""
    b = backend()
    sub = b.new_group([0, 1])
    if sub is not None:
        sub.allreduce(np.ones(8))         # maps the sub-group's segment
        sub.barrier()                     # (the sub-group's next op is #3: told apart from the world's #2)
    b.allreduce(np.ones(8))              # everyone in step
    if b.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        if b.rank == 0:
            b.allreduce(np.ones(1 << 10, np.float32))
        else:
            sub.allreduce(np.ones(1 << 10, np.float32))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return (type(exc).__name__, str(exc), time.monotonic() - t0)
    return ("no error", "", time.monotonic() - t0)
