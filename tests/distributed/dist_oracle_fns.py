"""Rank-side functions for the distributed tests (module level, so RankPool can pickle them).

Oracle convention (DESIGN habit 8): every rank regenerates the same *global* array
``G`` of shape ``(world, *shape)`` from a shared seed with :func:`global_array`, contributes
row ``G[rank]``, and returns what the collective gave it. The test process then compares
each rank's answer with NumPy applied to the whole of ``G``.

Example::

    results = pool.run(all_reduce_fn, seed, (3, 2), "float32", "sum")
    expected = reduce_np(global_array(seed, pool.world_size, (3, 2), "float32"), "sum")
"""

from __future__ import annotations

import numpy as np

import neural_arch.distributed as dist
from neural_arch.core.tensor import Tensor


def global_array(seed: int, n: int, shape, dtype) -> np.ndarray:
    """The global array every rank agrees on: small integers for int dtypes (no overflow even
    for a product over 5 ranks), standard normals for floats."""
    rng = np.random.default_rng(seed)
    full = (n,) + tuple(shape)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(full).astype(dtype)
    return rng.integers(-3, 4, size=full).astype(dtype)


def reduce_np(g: np.ndarray, op: str, axis: int = 0) -> np.ndarray:
    """NumPy's answer for a reduction over ``axis``, computed in float64/int64, cast back."""
    wide = g.astype(np.float64 if g.dtype.kind == "f" else np.int64)
    fn = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min, "product": np.prod}[op]
    return fn(wide, axis=axis).astype(g.dtype)


def _rank_world():
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------------------------- collectives
def all_reduce_fn(seed, shape, dtype, op, async_op=False):
    r, n = _rank_world()
    t = Tensor(global_array(seed, n, shape, dtype)[r].copy())
    out = dist.all_reduce(t, op, async_op=async_op)
    if async_op:
        out = out.result()
    assert out is t, "all_reduce must return the tensor it reduced in place"
    return t.data


def all_reduce_raw_fn(seed, shape, dtype, op):
    """The same on a raw numpy array (what DDP buckets pass)."""
    r, n = _rank_world()
    a = np.array(global_array(seed, n, shape, dtype)[r])  # a 0-d array, not a numpy scalar
    assert dist.all_reduce(a, op) is a
    return a


def broadcast_fn(seed, shape, dtype, src):
    r, n = _rank_world()
    t = Tensor(global_array(seed, n, shape, dtype)[r].copy())
    assert dist.broadcast(t, src=src) is t
    return t.data


def reduce_fn(seed, shape, dtype, op, dst):
    r, n = _rank_world()
    t = Tensor(global_array(seed, n, shape, dtype)[r].copy())
    assert dist.reduce(t, dst=dst, op=op) is t
    return t.data


def all_gather_fn(seed, shape, dtype, torch_form):
    r, n = _rank_world()
    t = Tensor(global_array(seed, n, shape, dtype)[r].copy())
    if torch_form:
        outs = [Tensor(np.zeros(shape, dtype)) for _ in range(n)]
        assert dist.all_gather(outs, t) is outs
    else:
        outs = dist.all_gather(t)
    assert all(isinstance(o, Tensor) for o in outs)
    return [o.data for o in outs]


def gather_fn(seed, shape, dtype, dst, torch_form):
    r, n = _rank_world()
    t = Tensor(global_array(seed, n, shape, dtype)[r].copy())
    if torch_form and r == dst:
        outs = [Tensor(np.zeros(shape, dtype)) for _ in range(n)]
        got = dist.gather(t, outs, dst=dst)
        assert got is outs
    else:
        got = dist.gather(t, dst=dst)
    if r != dst:
        assert got is None
        return None
    return [o.data for o in got]


def scatter_fn(seed, shape, dtype, src):
    r, n = _rank_world()
    g = global_array(seed, n, shape, dtype)
    out = Tensor(np.zeros(shape, dtype))
    items = [Tensor(g[i].copy()) for i in range(n)] if r == src else None
    assert dist.scatter(out, items, src=src) is out
    return out.data


def reduce_scatter_fn(seed, shape, dtype, op, form):
    """``shape`` is this rank's input; dim 0 is divisible by the world size. ``form``: "seed" (the seeds'
    ``reduce_scatter(tensor, op)``), "list" (torch's list of inputs) or "tensor" (``reduce_scatter_tensor``)."""
    r, n = _rank_world()
    mine = global_array(seed, n, shape, dtype)[r].copy()
    chunk = shape[0] // n
    if form == "list":
        out = Tensor(np.zeros((chunk,) + tuple(shape[1:]), dtype))
        inputs = [Tensor(mine[i * chunk:(i + 1) * chunk].copy()) for i in range(n)]
        assert dist.reduce_scatter(out, inputs, op) is out
        return out.data
    if form == "tensor":
        out = Tensor(np.zeros((chunk,) + tuple(shape[1:]), dtype))
        dist.reduce_scatter_tensor(out, Tensor(mine), op)
        return out.data
    return dist.reduce_scatter(Tensor(mine), op).data


def all_to_all_fn(seed, shape, dtype, form):
    r, n = _rank_world()
    mine = global_array(seed, n, shape, dtype)[r].copy()
    chunk = shape[0] // n
    if form == "list":
        inputs = [Tensor(mine[i * chunk:(i + 1) * chunk].copy()) for i in range(n)]
        outputs = [Tensor(np.zeros((chunk,) + tuple(shape[1:]), dtype)) for _ in range(n)]
        assert dist.all_to_all(outputs, inputs) is outputs
        return np.concatenate([o.data for o in outputs]) if n else None
    if form == "pair":
        out = Tensor(np.zeros(shape, dtype))
        assert dist.all_to_all(out, Tensor(mine)) is out
        return out.data
    return dist.all_to_all(Tensor(mine)).data


def ring_fn(seed, shape, dtype, tag, blocking):
    """Send row r to rank r+1, receive row r-1 from rank r-1 (nonblocking both ways)."""
    r, n = _rank_world()
    g = global_array(seed, n, shape, dtype)
    if n == 1:
        return g[0]
    out = Tensor(np.zeros(shape, dtype))
    if blocking and n == 2:
        # blocking pair exchange: lower rank sends first
        if r == 0:
            dist.send(Tensor(g[0].copy()), 1, tag=tag)
            assert dist.recv(out, 1, tag=tag) is out
        else:
            dist.recv(out, 0, tag=tag)
            dist.send(Tensor(g[1].copy()), 0, tag=tag)
        return out.data
    s = dist.isend(Tensor(g[r].copy()), (r + 1) % n, tag=tag)
    w = dist.irecv(out, (r - 1) % n, tag=tag)
    assert w.result() is out
    s.wait()
    return out.data


def subgroup_fn(seed, shape, dtype, members, op, src):
    """All ranks call new_group(members); members reduce, broadcast from global ``src`` and gather."""
    r, n = _rank_world()
    g = global_array(seed, n, shape, dtype)
    group = dist.new_group(members)
    if r not in members:
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(group) == -1
        return None
    assert dist.get_world_size(group) == len(members)
    assert dist.get_rank(group) == sorted(members).index(r)
    red = dist.all_reduce(Tensor(g[r].copy()), op, group=group).data
    bc = dist.broadcast(Tensor(g[r].copy()), src=src, group=group).data
    gathered = [t.data for t in dist.all_gather(Tensor(g[r].copy()), group=group)]
    dist.barrier(group=group)
    dist.destroy_process_group(group)
    return red, bc, gathered


def objects_fn(seed, src):
    r, n = _rank_world()
    objs = [{"seed": seed, "from": r}, ("tuple", r)] if r == src else [None, None]
    dist.broadcast_object_list(objs, src=src)
    everyone = [None] * n
    dist.all_gather_object(everyone, {"rank": r, "payload": "x" * (r * 7 + seed % 5)})
    gathered = dist.gather_object(r * 10, dst=src)
    out = [None]
    dist.scatter_object_list(out, [f"item{i}" for i in range(n)] if r == src else None, src=src)
    return objs, everyone, gathered, out[0]


def async_many_fn(seed, shape, dtype, k):
    """k asynchronous all_reduces in flight at once, then a broadcast: all complete, in order."""
    r, n = _rank_world()
    tensors = [Tensor(global_array(seed + i, n, shape, dtype)[r].copy()) for i in range(k)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    last = dist.broadcast(Tensor(np.full(2, float(r))), src=n - 1)
    results = [w.result().data for w in works]
    return results, last.data


def algorithms_fn():
    """After one all_reduce, reduce and broadcast of 100 float64: the segment size the executor
    streams with, and for each collective whether its compiled plan ran pipelined (ring/chain)."""
    from neural_arch.distributed.comm.gloo import executor as gloo_algorithms

    backend = dist.get_default_group().backend
    x = np.ones(100)
    dist.all_reduce(x)
    dist.reduce(x, dst=0)
    dist.broadcast(x, src=0)
    used = {p.op: p.pipelined for p in backend.compiled_plans() if p.nelems == 100}
    return gloo_algorithms.PIPELINE_SEGMENT_BYTES, used


def all_reduce_repeated_fn(seed, shape, dtype, op, times=3):
    """``times`` all_reduces of one shape and dtype, each on fresh data (seed + i): the first call
    plans, later ones take the backend's cached fast path (gloo: the whole-buffer exchange path)."""
    r, n = _rank_world()
    out = []
    for i in range(times):
        a = np.array(global_array(seed + i, n, shape, dtype)[r])
        dist.all_reduce(a, op)
        out.append(a)
    return out
