"""One rank of a multi-process NCCL test: ``python tests/gpu/nccl_worker.py SCENARIO``.

Started by ``test_nccl_gpu.py`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK and
NA_RESULT (where to write this rank's JSON result); NA_DEVICE forces a GPU ("cuda:0" puts every
rank on one device, to find out whether this NCCL accepts that). Every check is an oracle check:
each rank draws the same global data from a fixed seed and compares with NumPy on the whole.

Scenarios: ``collectives`` (every op, dtype and root), ``timeout`` (rank 1 skips an op),
``init_timeout`` (rank 1 never starts), ``ddp`` (a small MLP trained with DistributedDataParallel
vs a single-process reference), ``alltoallv`` (uneven all-to-all vs NumPy, counting the bytes NCCL moves).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

DTYPES = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8", "bool"]


def _env():
    return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ.get("NA_DEVICE") or None)


def _backend(timeout=60.0):
    from neural_arch.distributed.comm.nccl.backend import NCCLBackend
    from neural_arch.distributed.rendezvous.store import TCPStore
    rank, world, device = _env()
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                     is_master=(rank == 0), timeout=60)
    return NCCLBackend.create(store, rank, world, timeout=timeout, device=device), store


def _global(rng, dtype, shape):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("float"):
        return rng.uniform(-2, 2, shape).astype(dtype)
    return rng.integers(1, 3, shape).astype(dtype)      # 1..2: PROD cannot overflow int8 for 4 ranks


def scenario_collectives():
    import cupy as cp

    from neural_arch.distributed.comm import ReduceOp
    b, _store = _backend()            # keep the store alive: rank 0 hosts it
    n, me = b.size, b.rank
    fails = []

    def check(name, got, want, dtype):
        got = cp.asnumpy(got)
        tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == "float16" else {"rtol": 1e-5, "atol": 1e-6}
        try:
            if np.dtype(dtype).kind == "f":
                np.testing.assert_allclose(got.astype(np.float64), np.asarray(want).astype(np.float64), **tol)
            else:
                np.testing.assert_array_equal(got, want)
        except AssertionError as exc:
            fails.append(f"{name} {dtype}: {str(exc)[:300]}")

    reducers = {ReduceOp.SUM: np.sum, ReduceOp.PRODUCT: np.prod, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min,
                ReduceOp.AVG: np.mean}
    for dtype in DTYPES:
        for shape in [(), (0,), (7,), (n * 2, 3)]:
            rng = np.random.default_rng(zlib.crc32(repr((dtype, shape)).encode()))   # same on every rank
            data = np.stack([_global(rng, dtype, shape) for _ in range(n)])
            mine = data[me]
            ops = [ReduceOp.MAX, ReduceOp.MIN] if dtype == "bool" else list(reducers)
            for op in ops:
                if op is ReduceOp.AVG and np.dtype(dtype).kind != "f":
                    continue
                want = reducers[op](data.astype(np.float64) if op is ReduceOp.AVG else data, axis=0)
                a = cp.asarray(mine.copy())
                b.allreduce(a, op)
                check(f"allreduce {op.name} {shape}", a, np.asarray(want).astype(dtype), dtype)
                for root in range(n):
                    a = cp.asarray(mine.copy())
                    b.reduce(a, root=root, op=op)
                    check(f"reduce {op.name} root {root} {shape}", a,
                          np.asarray(want).astype(dtype) if me == root else mine, dtype)
            for root in range(n):
                a = cp.asarray(mine.copy())
                b.broadcast(a, root=root)
                check(f"broadcast root {root} {shape}", a, data[root], dtype)
            out = cp.zeros((n,) + shape, dtype=dtype)
            b.allgather(out, cp.asarray(mine))
            check(f"allgather {shape}", out, data, dtype)
            if len(shape) and shape[0] % n == 0:
                k = shape[0] // n
                if dtype != "bool":
                    out = cp.zeros((k,) + shape[1:], dtype=dtype)
                    b.reduce_scatter(out, cp.asarray(mine), ReduceOp.SUM)
                    check(f"reduce_scatter {shape}", out, data.sum(axis=0)[me * k:(me + 1) * k].astype(dtype), dtype)
                out = cp.zeros(shape, dtype=dtype)
                b.alltoall(out, cp.asarray(mine))
                want = np.concatenate([data[s][me * k:(me + 1) * k] for s in range(n)])
                check(f"alltoall {shape}", out, want, dtype)
            root = n - 1
            out = cp.zeros((n,) + shape, dtype=dtype) if me == root else None
            b.gather(out, cp.asarray(mine), root=root)
            if me == root:
                check(f"gather {shape}", out, data, dtype)
            src = cp.asarray(data) if me == 0 else None
            out = cp.zeros(shape, dtype=dtype)
            b.scatter(out, src, root=0)
            check(f"scatter {shape}", out, data[me], dtype)
            if me == 0:
                b.send(cp.asarray(data[0]), dst=n - 1)
            elif me == n - 1:
                out = cp.zeros(shape, dtype=dtype)
                b.recv(out, src=0)
                check(f"send/recv {shape}", out, data[0], dtype)
    b.barrier()
    # async ops complete in order and overlap with the caller
    works = [b.allreduce(cp.full(1000, float(i + me), cp.float32), async_op=True) for i in range(8)]
    for i, w in enumerate(works):
        check(f"async allreduce {i}", w.result(), np.full(1000, float(i * n + n * (n - 1) / 2)), "float32")
    # stream ordering: the input is written by a slow kernel on a side stream, then reduced at once
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        m = cp.ones((8192, 8192), dtype=cp.float32)
        for _ in range(4):
            m = m @ m / 8192              # stays all ones; tens of ms of work before the write
        a = cp.zeros(1 << 20, dtype=cp.float32) + m[0, 0] + me
        b.allreduce(a, ReduceOp.SUM)       # no synchronize before: the event must order it
    check("stream-ordered allreduce", a[:8], np.full(8, float(n + n * (n - 1) / 2)), "float32")
    # object collectives and sub-groups
    objs = b.allgather_object({"rank": me})
    if objs != [{"rank": r} for r in range(n)]:
        fails.append(f"allgather_object: {objs}")
    if b.broadcast_object(("from", me), root=n - 1) != ("from", n - 1):
        fails.append("broadcast_object")
    evens = list(range(0, n, 2))
    sub = b.new_group(evens)
    if (sub is None) != (me not in evens):
        fails.append(f"new_group membership: {sub}")
    if sub is not None:
        a = cp.full(3, float(me), cp.float32)
        sub.allreduce(a)
        check("sub-group allreduce", a, np.full(3, float(sum(evens))), "float32")
    b.barrier()
    info = {"nccl_version": list(b.nccl_version), "device": b.device, "split": b._use_split()}
    b.shutdown()
    return {"fails": fails, "info": info}


def scenario_timeout():
    import cupy as cp

    from neural_arch.distributed.errors import CollectiveTimeoutError
    b, _store = _backend(timeout=3.0)
    if b.rank == 1:
        time.sleep(8)           # never joins; exits after rank 0 gave up
        return {"skipped_op": True}
    start = time.monotonic()
    try:
        b.allreduce(cp.ones(16, cp.float32))
    except CollectiveTimeoutError as exc:
        return {"error": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


def scenario_init_timeout():
    """Only rank 0 of 2 is started: creating the communicator must fail at the timeout, not hang."""
    from neural_arch.distributed.errors import RendezvousError
    start = time.monotonic()
    try:
        _backend(timeout=3.0)
    except RendezvousError as exc:
        return {"error": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


def scenario_ddp():
    import cupy as cp  # noqa: F401 - fail early and clearly when CuPy is missing

    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    rank, world, _ = _env()
    dist.init_process_group("nccl", timeout=60)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 20)).astype(np.float32)
    y = rng.integers(0, 4, 64)

    def make():
        from neural_arch.core import rng as na_rng
        na_rng.manual_seed(1)
        return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))

    ref = make()                                        # single-process reference on the CPU
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    model = make()
    for p_ref, p in zip(ref.parameters(), model.parameters()):
        p.data[...] = p_ref.data                        # same start, whatever the RNG does
    model.to("cuda")
    ddp = dist.DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    shard = slice(rank * 64 // world, (rank + 1) * 64 // world)
    for _ in range(3):
        ref_opt.zero_grad()
        loss_fn(ref(Tensor(x)), Tensor(y)).backward()
        ref_opt.step()
        opt.zero_grad()
        loss_fn(ddp(Tensor(x[shard]).to("cuda")), Tensor(y[shard]).to("cuda")).backward()
        opt.step()
    diffs = [float(np.max(np.abs(p.numpy() - q.numpy()))) for p, q in zip(model.parameters(), ref.parameters())]
    sums = dist.get_default_group().backend.allgather_object(
        [float(p.numpy().astype(np.float64).sum()) for p in model.parameters()])
    dist.destroy_process_group()
    return {"max_diff": max(diffs), "param_sums": sums}


def alltoallv_counts(n: int) -> np.ndarray:
    """counts[s][d]: rows rank s sends rank d; zeros included, and rank 0 sends nothing at all."""
    counts = np.random.default_rng(31).integers(0, 4, (n, n))
    counts[0] = 0
    return counts


class _CountingComm:
    """The real communicator, with every ``send``'s (peer, elements) recorded and every call named."""

    def __init__(self, comm):
        self._comm, self.sent, self.calls = comm, [], []

    def send(self, buf, count, dtype, peer, stream):
        self.sent.append((peer, count))
        self.calls.append("send")
        return self._comm.send(buf, count, dtype, peer, stream)

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self._comm, name)


def scenario_alltoallv():
    import cupy as cp
    b, _store = _backend()
    n, me = b.size, b.rank
    counts = alltoallv_counts(n)
    at = [np.concatenate([[0], np.cumsum(counts[s])]) for s in range(n)]
    fails = []
    for dtype in ("float32", "float64", "int64"):
        rows = [(np.arange(counts[s].sum() * 3) + 1000 * s).astype(dtype).reshape(-1, 3) for s in range(n)]
        want = np.concatenate([rows[s][at[s][me]:at[s][me + 1]] for s in range(n)]).reshape(-1, 3)
        counting = b._comm = _CountingComm(b._comm)
        out = cp.full((int(counts[:, me].sum()), 3), -1, dtype=dtype)
        b.alltoallv(out, cp.asarray(rows[me]), counts[:, me].tolist(), counts[me].tolist())
        b._comm = counting._comm
        if not np.array_equal(cp.asnumpy(out), want):
            fails.append(f"{dtype}: rank {me} got {cp.asnumpy(out).tolist()}, want {want.tolist()}")
        # no padding: one send per peer that gets rows, of its rows' elements exactly, and no all-reduce
        real = sorted((d, int(counts[me][d]) * 3) for d in range(n) if d != me and counts[me][d])
        if sorted(counting.sent) != real or "allReduce" in counting.calls:
            fails.append(f"{dtype}: rank {me} sent {counting.sent} (calls {counting.calls}), want {real}")
    b.barrier()
    b.shutdown()
    return {"fails": fails, "counts": counts.tolist()}


def main():
    scenario = sys.argv[1]
    out = os.environ["NA_RESULT"]
    try:
        result = {"ok": True, **globals()[f"scenario_{scenario}"]()}
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which decides
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out, "w") as fh:
        json.dump(result, fh)
    sys.stdout.flush()
    os._exit(0)    # do not wait on NCCL threads of an aborted communicator


if __name__ == "__main__":
    main()
