"""bfloat16 (ml_dtypes) through the backends: all_reduce, broadcast and all_gather on 2 real ranks.

Oracle: every rank builds the same global data from a fixed seed; values are chosen exactly
representable in bfloat16 (small integers and halves), so the results must be exact on gloo
(which reduces in bfloat16) and on MPI (which reduces in float32 and rounds once).
"""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(120)]


def bf16_round_trip(seed: int):
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.comm.work import ReduceOp

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(seed)
    data = (rng.integers(-8, 8, size=(world, 5, 3)) / 2).astype(BF16)   # exact in bfloat16
    out = {}
    for name, op in (("sum", ReduceOp.SUM), ("avg", ReduceOp.AVG), ("max", ReduceOp.MAX)):
        t = Tensor(data[rank].copy())
        dist.all_reduce(t, op)
        out[name] = (str(t.data.dtype), t.data.astype(np.float32).tolist())
    raw = data[rank].copy()                          # backend level, a raw array
    dist.all_reduce(raw)
    out["raw_sum"] = raw.astype(np.float32).tolist()
    b = Tensor(data[rank].copy())
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = (str(b.data.dtype), b.data.astype(np.float32).tolist())
    parts = dist.all_gather(Tensor(data[rank].copy()))
    out["all_gather"] = [(str(p.data.dtype), p.data.astype(np.float32).tolist()) for p in parts]
    return out


def _expected(seed: int, world: int = 2):
    rng = np.random.default_rng(seed)
    data = (rng.integers(-8, 8, size=(world, 5, 3)) / 2).astype(BF16).astype(np.float32)
    return data


@pytest.fixture(scope="module", params=["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def pool2(request):
    with RankPool(2, backend=request.param, timeout=60.0) as pool:
        yield pool


@pytest.mark.parametrize("seed", [0, 7])
def test_bf16_all_reduce_broadcast_all_gather(pool2, seed):
    data = _expected(seed)
    mean = (data.sum(0) / 2).astype(BF16).astype(np.float32)
    for out in pool2.run(bf16_round_trip, seed):
        assert out["sum"] == ("bfloat16", data.sum(0).tolist())
        assert out["avg"] == ("bfloat16", mean.tolist())
        assert out["max"] == ("bfloat16", data.max(0).tolist())
        assert out["raw_sum"] == data.sum(0).tolist()
        assert out["broadcast"] == ("bfloat16", data[1].tolist())
        assert out["all_gather"] == [("bfloat16", data[r].tolist()) for r in range(2)]


def test_bf16_is_accepted_at_the_call_and_other_void_dtypes_are_not():
    from neural_arch.distributed.comm.local import LocalBackend

    backend = LocalBackend()
    x = np.ones(3, BF16)
    backend.allreduce(x, "avg")                                  # a floating dtype for AVG
    assert x.dtype == BF16 and x.astype(np.float32).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(TypeError, match="bfloat16"):             # the error lists it as supported
        backend.allreduce(np.zeros(2, np.complex64))
    with pytest.raises(TypeError, match="cannot be communicated"):
        backend.allreduce(np.zeros(2, dtype="V4"))
