"""Oracle checks shared by the in-process and the multi-process gloo tests.

Every rank draws the same global array from a fixed seed, takes its own slice, runs one
collective, and compares with NumPy on the whole array. Each check returns a short string
(handy in pool results) and raises AssertionError on a wrong answer.
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.comm.work import OpInfo

FLOATS = ("float16", "float32", "float64")
INTS = ("int32", "int64")
DTYPES = FLOATS + INTS
OPS = ("sum", "avg", "max", "min", "product")


def ops_for(dtype):
    return OPS if np.dtype(dtype).kind == "f" else tuple(o for o in OPS if o != "avg")


def global_array(seed, size, shape, dtype, op=None):
    rng = np.random.default_rng(seed)
    full = (size,) + tuple(shape)
    if op == "product":  # keep products in range for every dtype
        vals = rng.choice([-1.0, 1.0, 2.0, 0.5] if np.dtype(dtype).kind == "f" else [-1, 1, 2], size=full)
    elif np.dtype(dtype).kind == "f":
        vals = rng.uniform(-4, 4, size=full)
    else:
        vals = rng.integers(-100, 100, size=full)
    return np.ascontiguousarray(vals.astype(dtype))


def oracle(data, op):
    acc = data.astype(np.float64) if data.dtype.kind == "f" else data
    out = {"sum": lambda: acc.sum(axis=0), "avg": lambda: acc.mean(axis=0), "max": lambda: acc.max(axis=0),
           "min": lambda: acc.min(axis=0), "product": lambda: acc.prod(axis=0)}[op]()
    return np.asarray(out)


def assert_close(got, want, dtype, ctx=""):
    dtype = np.dtype(dtype)
    assert got.dtype == dtype, f"{ctx}: dtype {got.dtype} != {dtype}"
    assert got.shape == np.shape(want), f"{ctx}: shape {got.shape} != {np.shape(want)}"
    if dtype.kind == "f":
        tol = {2: 2e-2, 4: 1e-5, 8: 1e-12}[dtype.itemsize]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 8, err_msg=ctx)
    else:
        np.testing.assert_array_equal(got, want, err_msg=ctx)


def check_allreduce(b, seed, shape, dtype, op, algo=None):
    """``algo`` is forced for this one call (gloo's testing seam; None: chosen by size)."""
    data = global_array(seed, b.size, shape, dtype, op)
    mine = np.array(data[b.rank])
    with b.forced_algorithm(algo):
        b.allreduce(mine, op)
    assert_close(mine, oracle(data, op), dtype, f"all_reduce {op} {shape} {dtype} algo={algo}")
    return "ok"


def check_broadcast(b, seed, shape, dtype, root):
    data = global_array(seed, b.size, shape, dtype)
    mine = np.array(data[b.rank])
    b.broadcast(mine, root)
    np.testing.assert_array_equal(mine, data[root])
    return "ok"


def check_allgather(b, seed, shape, dtype):
    data = global_array(seed, b.size, shape, dtype)
    out = np.empty_like(data)
    b.allgather(out, np.array(data[b.rank]))
    np.testing.assert_array_equal(out, data)
    return "ok"


def check_reduce_scatter(b, seed, shape, dtype, op):
    shape = (b.size * shape[0],) + tuple(shape[1:])
    data = global_array(seed, b.size, shape, dtype, op)
    mine = np.array(data[b.rank])
    out = np.empty((shape[0] // b.size,) + tuple(shape[1:]), dtype=dtype)
    b.reduce_scatter(out, mine, op)
    np.testing.assert_array_equal(mine, data[b.rank])           # input untouched
    n = out.shape[0]
    assert_close(out, oracle(data, op)[b.rank * n:(b.rank + 1) * n], dtype, f"reduce_scatter {op} {shape}")
    return "ok"


def check_reduce(b, seed, shape, dtype, op, root):
    data = global_array(seed, b.size, shape, dtype, op)
    mine = np.array(data[b.rank])
    b.reduce(mine, root, op)
    if b.rank == root:
        assert_close(mine, oracle(data, op), dtype, f"reduce {op} {shape} root={root}")
    else:
        np.testing.assert_array_equal(mine, data[b.rank])
    return "ok"


def check_alltoall(b, seed, shape, dtype):
    shape = (b.size * shape[0],) + tuple(shape[1:])
    data = global_array(seed, b.size, shape, dtype)
    out = np.empty(shape, dtype=dtype)
    b.alltoall(out, np.array(data[b.rank]))
    n = shape[0] // b.size
    want = np.concatenate([data[s][b.rank * n:(b.rank + 1) * n] for s in range(b.size)])
    np.testing.assert_array_equal(out, want)
    return "ok"


def check_gather_scatter(b, seed, shape, dtype, root):
    data = global_array(seed, b.size, shape, dtype)
    out = np.empty_like(data) if b.rank == root else None
    b.gather(out, np.array(data[b.rank]), root)
    if b.rank == root:
        np.testing.assert_array_equal(out, data)
    got = np.empty(shape, dtype=dtype)
    b.scatter(got, data.copy() if b.rank == root else None, root)
    np.testing.assert_array_equal(got, data[b.rank])
    return "ok"


def check_p2p_ring(b, seed, shape, dtype, tag=5):
    data = global_array(seed, b.size, shape, dtype)
    nxt, prv = (b.rank + 1) % b.size, (b.rank - 1) % b.size
    got = np.empty(shape, dtype=dtype)
    w = b.send(np.array(data[b.rank]), nxt, tag=tag, async_op=True)
    b.recv(got, prv, tag=tag)
    w.wait()
    np.testing.assert_array_equal(got, data[prv])
    # and the header-checked sendrecv primitive
    got2 = np.empty(shape, dtype=dtype)
    b._sendrecv(np.array(data[b.rank]), nxt, got2, prv, tag + 1, OpInfo("sendrecv", 1, deadline=_far()))
    np.testing.assert_array_equal(got2, data[prv])
    return "ok"


def check_p2p_mismatch(b):
    """Rank 0 sends 3 floats, rank 1 expects 4: a clear ValueError naming both shapes, and the group
    is poisoned on rank 1 (bytes had moved): its next op fails at once naming the first failure."""
    from neural_arch.distributed.errors import GroupPoisonedError

    if b.rank == 0:
        b.send(np.ones(3, np.float32), 1, tag=2)
        return "sent"
    if b.rank == 1:
        try:
            b.recv(np.empty(4, np.float32), 0, tag=2)
        except ValueError as exc:
            msg = str(exc)
            assert "shape (3,)" in msg and "shape (4,)" in msg, msg
        else:
            raise AssertionError("a mismatched recv did not raise")
        try:
            b.recv(np.empty(4, np.float32), 0, tag=2)
        except GroupPoisonedError as exc:
            assert "shape (3,)" in str(exc) and "destroy" in str(exc), str(exc)
        else:
            raise AssertionError("a poisoned group ran another op")
        return "raised"
    return "idle"


def check_groups(b):
    """Split into evens and odds, reduce inside each, then a nested group of the evens' first two."""
    evens = list(range(0, b.size, 2))
    odds = list(range(1, b.size, 2))
    ge = b.new_group(evens)
    go = b.new_group(odds) if odds else None
    mine = ge if b.rank % 2 == 0 else go
    x = np.array([float(b.rank)])
    mine.allreduce(x)
    members = evens if b.rank % 2 == 0 else odds
    assert x[0] == sum(members), (b.rank, x, members)
    if b.rank % 2 == 0 and len(evens) >= 2:
        sub = ge.new_group([0, 1])
        if sub is not None:
            y = np.array([b.rank], dtype=np.int64)
            sub.allreduce(y)
            assert y[0] == evens[0] + evens[1]
    b.barrier()
    z = np.ones(3)
    b.allreduce(z)                                   # the world still works afterwards
    assert (z == b.size).all()
    return mine.group_ranks


def check_async_and_objects(b):
    arrays = [np.full(1000 * (i + 1), float(b.rank + i)) for i in range(4)]
    works = [b.allreduce(a, "sum", async_op=True) for a in arrays]
    for w in works:
        w.wait()
    for i, a in enumerate(arrays):
        assert (a == sum(r + i for r in range(b.size))).all()
    obj = b.broadcast_object({"rank": b.rank, "x": [1, 2]} if b.rank == 0 else None, 0)
    assert obj == {"rank": 0, "x": [1, 2]}
    assert b.allgather_object(f"r{b.rank}") == [f"r{r}" for r in range(b.size)]
    b.barrier()
    return "ok"


def check_bool(b, seed):
    data = global_array(seed, b.size, (9,), "int32") > 0
    mx, mn = np.array(data[b.rank]), np.array(data[b.rank])
    b.allreduce(mx, "max")
    b.allreduce(mn, "min")
    np.testing.assert_array_equal(mx, data.any(axis=0))
    np.testing.assert_array_equal(mn, data.all(axis=0))
    return "ok"


def _far():
    import time

    return time.monotonic() + 30.0


def check_sendrecv_mismatch(b):
    """Two ranks exchange, rank 1 with a wrong receive buffer: both payloads travel, rank 1 raises,
    and a following exchange still works on both."""
    if b.rank > 1:
        return "idle"
    peer = 1 - b.rank
    info = OpInfo("sendrecv", 1, deadline=_far())
    wrong = np.empty(5 if b.rank == 1 else 3, np.float32)
    try:
        b._sendrecv(np.arange(3, dtype=np.float32), peer, wrong, peer, 9, info)
    except ValueError as exc:
        assert b.rank == 1 and "shape (3,)" in str(exc) and "shape (5,)" in str(exc), str(exc)
        outcome = "raised"
    else:
        outcome = "ok"
    got = np.empty(2, np.int64)
    b._sendrecv(np.array([b.rank, 7]), peer, got, peer, 9, OpInfo("sendrecv", 2, deadline=_far()))
    assert got.tolist() == [peer, 7]
    return outcome
