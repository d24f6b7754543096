"""Rank-side functions for the multi-rank API and fault tests (picklable: module level)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
from polling import pid_alive, wait_for

import neural_arch.distributed as dist
from neural_arch.core.tensor import Tensor


def _catch(fn):
    """Run ``fn``; return ("ok", value) or (exception class name, message, seconds taken)."""
    start = time.monotonic()
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return (type(exc).__name__, str(exc), time.monotonic() - start)


# ---------------------------------------------------------------------------------- API, many ranks
def seed_snippets_fn():
    """Seed 001's communication-primitives snippet, verbatim semantics, on every rank."""
    r, n = dist.get_rank(), dist.get_world_size()
    tensor = Tensor(np.array([1.0, 2.0, 3.0]) * (r + 1))
    reduced = dist.all_reduce(tensor, dist.ReduceOp.SUM)
    gathered = dist.all_gather(Tensor(np.array([float(r)])))
    b = dist.broadcast(Tensor(np.array([float(r)])), src=0)
    data = np.arange(n * 2 * 3, dtype=np.float32).reshape(n * 2, 3) * (r + 1)
    scattered = dist.reduce_scatter(Tensor(data), dist.ReduceOp.AVERAGE)
    info = dist.get_distributed_info()
    return (reduced.data.tolist(), [g.data.tolist() for g in gathered], b.data.tolist(),
            scattered.shape, scattered.data.tolist(), (info["rank"], info["world_size"], info["transport"]))


def bad_inputs_fn():
    """Every bad input raises at the call, on every rank, without touching the network."""
    r, n = dist.get_rank(), dist.get_world_size()
    t = Tensor(np.ones((n + 1, 2), np.float32))
    cases = {
        "non_divisible_reduce_scatter": lambda: dist.reduce_scatter(t),
        "src_out_of_range": lambda: dist.broadcast(t, src=n),
        "dst_out_of_range": lambda: dist.reduce(t, dst=n + 3),
        "all_gather_bad_shapes": lambda: dist.all_gather([Tensor(np.ones(2, np.float32))] * n, t),
        "gather_bad_dtype": lambda: dist.gather(t, [Tensor(np.ones((n + 1, 2)))] * n, dst=r),
        "non_contiguous": lambda: dist.all_reduce(np.ones((2, 4))[:, ::2]),
        "wrong_dtype": lambda: dist.all_reduce(np.ones(2, np.complex64)),
        "all_to_all_not_divisible": lambda: dist.all_to_all(t),
    }
    out = {name: _catch(fn)[0] for name, fn in cases.items()}
    # the group is still healthy afterwards
    ok = dist.all_reduce(Tensor(np.ones(1))).data.tolist()
    return out, ok


def non_member_fn():
    """new_group([0, 1]) on all ranks; a rank outside it calling a collective on it does nothing
    (torch: returns None with a warning)."""
    r = dist.get_rank()
    g = dist.new_group([0, 1])
    if g is dist.GroupMember.NON_GROUP_MEMBER:
        return dist.all_reduce(Tensor(np.ones(1)), group=g), "noop"
    src_outside = _catch(lambda: dist.broadcast(Tensor(np.ones(1)), src=2, group=g))[:2]
    total = dist.all_reduce(Tensor(np.ones(1) * (r + 1)), group=g).data.tolist()
    dist.destroy_process_group(g)
    return src_outside, total


def reinit_fn():
    """destroy + init again on the same MASTER_PORT, twice, then communicate."""
    for _ in range(2):
        dist.destroy_process_group()
        dist.init_process_group()
    return dist.all_reduce(Tensor(np.ones(2))).data.tolist()


# ---------------------------------------------------------------------------------- faults
def kill_peer_fn(victim: int):
    """One all_reduce works (it also tells every rank the others' pids); then ``victim`` SIGKILLs
    itself and the others, once it is dead, all_reduce again."""
    r = dist.get_rank()
    pids = np.zeros(dist.get_world_size())
    pids[r] = os.getpid()
    victim_pid = int(dist.all_reduce(Tensor(pids)).data[victim])
    if r == victim:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)  # never reached: SIGKILL is not deferred
    assert wait_for(lambda: not pid_alive(victim_pid), 10), "the victim outlived its SIGKILL"
    return _catch(lambda: dist.all_reduce(Tensor(np.ones(1000))))


def mismatch_fn():
    """Debug mode: rank r all_reduces shape (r + 1,) -> CollectiveMismatchError on every rank."""
    r = dist.get_rank()
    first = _catch(lambda: dist.all_reduce(Tensor(np.ones(r + 1, np.float32))))
    return first[:2]


def rendezvous_fn(absent: int, rendezvous_timeout: float):
    """Rank ``absent`` never calls init_process_group; the others must be told it is missing."""
    rank = int(os.environ["RANK"])
    if rank == absent:
        return ("absent",)
    return _catch(lambda: dist.init_process_group(rendezvous_timeout=rendezvous_timeout))


def timeout_fn(late: int, timeout: float):
    """Rank ``late`` skips a collective; the others time out with a message naming it."""
    dist.init_process_group(timeout=timeout)
    r = dist.get_rank()
    dist.all_reduce(Tensor(np.ones(1)))  # everyone is up and connected
    if r == late:
        return ("skipped",)
    return _catch(lambda: dist.all_reduce(Tensor(np.ones((3, 4), np.float32))))


def mpi_world_mismatch_fn():
    """An explicit world_size under MPI: ignored with a warning (torch's rule); MPI's world stands."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group(backend="mpi", world_size=7)
    try:
        return dist.get_world_size(), [str(w.message) for w in caught if "are ignored" in str(w.message)]
    finally:
        dist.destroy_process_group()


def init_method_fn(method: str):
    """init_process_group with an explicit tcp:// or file:// init method (no MASTER_ADDR needed)."""
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=method, world_size=2, rank=rank, rendezvous_timeout=20)
    total = dist.all_reduce(Tensor(np.ones(2) * (rank + 1))).data.tolist()
    info = dist.get_distributed_info()
    return total, info["init_method"], dist.get_backend()


def p2p_timeout_fn(timeout: float):
    """Rank 0 waits for a message rank 1 never sends: a timeout error naming rank 1, not a hang."""
    dist.init_process_group(timeout=timeout)
    dist.barrier()
    if dist.get_rank() == 1:
        return ("silent",)
    return _catch(lambda: dist.recv(Tensor(np.zeros(5, np.int32)), src=1, tag=3))


# ---------------------------------------------------------------------------------- init contract
_LAYOUT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
                "MASTER_PORT")


def layout_fn(method: str, host_id_per_rank: bool):
    """tcp:// init with explicit rank/world and *no* launcher variables: what get_distributed_info
    says about the node layout (measured at rendezvous). ``host_id_per_rank``: pretend every rank
    is on its own host (NEURAL_ARCH_HOST_ID)."""
    rank = int(os.environ["RANK"])
    for var in _LAYOUT_VARS:
        os.environ.pop(var, None)
    if host_id_per_rank:
        os.environ["NEURAL_ARCH_HOST_ID"] = f"host{rank}"
    dist.init_process_group("gloo", init_method=method, world_size=2, rank=rank, rendezvous_timeout=20)
    info = dist.get_distributed_info()
    dist.destroy_process_group()
    return {k: info[k] for k in ("rank", "local_rank", "local_world_size", "node_rank", "transport", "devices")}


def ready_marker_fn(folder: str):
    """init_process_group with NEURAL_ARCH_READY_DIR set: this rank's marker exists right after."""
    os.environ["NEURAL_ARCH_READY_DIR"] = folder
    dist.init_process_group()
    mine = os.path.exists(os.path.join(folder, f"rank_{dist.get_rank()}"))
    dist.barrier()
    return mine, sorted(os.listdir(folder))


# ------------------------------------------------------------------ destroy while an op is in flight
def destroy_in_flight_fn(flag_dir: str, ops: list):
    """For each op: rank 0 runs it while rank 1 stays away, and another thread of rank 0 calls
    destroy_process_group() once the op is waiting; rank 1 leaves once rank 0 wrote its flag file.
    Returns rank 0's (op, error class, message, seconds from the destroy call to the error) per op."""
    rank, out = int(os.environ["RANK"]), []
    for i, op in enumerate(ops):
        dist.init_process_group(timeout=30)
        dist.barrier()
        flag = os.path.join(flag_dir, f"{op}-{i}")
        if rank == 1:
            assert wait_for(lambda f=flag: os.path.exists(f), timeout=30), "rank 0 wrote no flag file"
            dist.destroy_process_group()
        else:
            out.append(_destroy_during(op, flag))
    return out


def _destroy_during(op: str, flag: str) -> tuple:
    """Rank 0's half of :func:`destroy_in_flight_fn` for one op."""
    import threading

    from neural_arch.distributed.groups import GroupMember

    backend = GroupMember.WORLD.backend
    called = {}

    def destroy_when_waiting():
        # the scenario: the op must be waiting (its slot filled) when the destroy comes
        wait_for(lambda: backend._op_now is not None or bool(backend._p2p_now), timeout=30, interval=0.01)
        called["at"] = time.monotonic()
        dist.destroy_process_group()
    helper = threading.Thread(target=destroy_when_waiting)
    helper.start()
    x = Tensor(np.zeros(300_000 if op == "all_reduce_large" else 4, np.float32))
    run = {"recv": lambda: dist.recv(x, src=1), "all_reduce": lambda: dist.all_reduce(x),
           "all_reduce_large": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, src=1)}[op]
    kind, message = _catch(run)[:2]     # ("ok", value) if it completed after all
    ended = time.monotonic()
    with open(flag, "w"):
        pass
    helper.join(30)
    return (op, kind, str(message), ended - called.get("at", float("nan")))
