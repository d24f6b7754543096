"""fully_shard (FSDP2): per-parameter DTensor(Shard(0)) shards, one all-gather / reduce-scatter per
module, equal to single-process training on the global batch (float64 <= 1e-10, Adam, 3 steps):
plain (4 ranks: uneven torch.chunk rows down to zero), gradient accumulation through
set_requires_gradient_sync, reshard_after_forward=False, HSDP on a 2x2 mesh, FSDP over the dp
dimension of a 2x2 (dp, tp) mesh whose tp dimension is tensor parallel, a tiny nn.GPT, mixed
precision (with the dtype of every collective of a step checked), and one case on MPI with 3 ranks.

Every reshard overwrites the gathered buffer with NaN (see fully_shard_rank_fns), so a backward that
read parameters without re-gathering them would fail the comparison.
"""

import fully_shard_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


def _check(results, tol=1e-10):
    for rank, out in enumerate(results):
        assert not out["nan"], f"rank {rank}: NaN parameters (a backward read a resharded buffer)"
        assert out["worst"] <= tol, f"rank {rank}: parameters differ from single-process training by {out['worst']}"
        assert out["all_dtensor"] and out["sharded_between_steps"] and out["is_fsdp"], out
    return results


def _reductions(records):
    return [(op, dt) for op, dt in records if op in ("reduce_scatter", "all_reduce")]


def _check_clip(results):
    """clip_grad_norm_ on the DTensor-sharded gradients: the single-process global norm and clipped
    gradients (the first step's, float64)."""
    for rank, out in enumerate(results):
        got, want = out["clip_norm"]
        assert want > 0.05 and abs(got - want) <= 1e-10 * want, (rank, got, want)   # the clip is active
        assert out["clip_grad_worst"] <= 1e-10, (rank, out["clip_grad_worst"])


def test_fully_shard_equals_single_process(pool):
    results = _check(pool.run(fns.train_run, {"clip": 0.05}))
    _check_clip(results)
    out = results[0]
    assert out["placements"] == ["(Shard(dim=0),)"]
    # one step: 3 module forwards, then the last block re-gathered when its backward starts and the
    # one before it prefetched at once (before the last block's reduce-scatter); one reduce-scatter
    # per module
    assert out["records"] == [("all_gather", "float64")] * 5 + [("reduce_scatter", "float64")] * 3, out["records"]


def test_a_tiny_gpt_equals_single_process(pool):
    worst = pool.run(fns.gpt_run)
    assert max(worst) <= 1e-10, worst


def test_gradient_accumulation_and_reshard_after_forward_false(pool):
    out = _check(pool.run(fns.train_run, {"micro": 2}))[0]
    assert all(out["grad_after_unsynced"]), "an unsynced backward left sharded gradients"
    assert len(_reductions(out["records"])) == 3, out["records"]        # only the synced backward reduces
    out = _check(pool.run(fns.train_run, {"reshard_after_forward": False}))[0]
    assert [op for op, _ in out["records"]].count("all_gather") == 3, out["records"]   # no re-gather


def test_hsdp_on_a_2x2_mesh(pool):
    out = _check(pool.run(fns.train_run, {"kind": "hsdp", "offload": True}))[0]
    assert out["placements"] == ["(Replicate(), Shard(dim=0))"]
    assert _reductions(out["records"]) == [("reduce_scatter", "float64"), ("all_reduce", "float64")] * 3


def test_fully_shard_over_dp_of_a_tensor_parallel_2x2_mesh(pool):
    from neural_arch.distributed.tensor import Replicate, Shard
    from neural_arch.distributed.tensor.placement_types import _StridedShard

    results = _check(pool.run(fns.train_run, {"kind": "tp", "micro": 2, "clip": 0.05}))
    _check_clip(results)
    # the block's fc1 (column parallel, 6 x 7): the dp chunk inside the tp chunk; fc2 (row parallel,
    # 7 x 6): dp rows x tp columns, its bias dp rows, replicated over tp; all on the 2x2 root mesh
    want = {"2.0.weight": ((_StridedShard(0, split_factor=2), Shard(0)), (6, 7)),
            "2.0.bias": ((_StridedShard(0, split_factor=2), Shard(0)), (6,)),
            "2.2.weight": ((Shard(0), Shard(1)), (7, 6)), "2.2.bias": ((Shard(0), Replicate()), (7,))}
    for rank, out in enumerate(results):
        got = {n: (pl, shape) for n, (pl, mesh, shape) in out["tp_layout"].items()}
        assert got == want, (rank, got)
        assert all(mesh == [[0, 1], [2, 3]] for _, mesh, _ in out["tp_layout"].values()), (rank, out["tp_layout"])


def test_mixed_precision_reduces_in_reduce_dtype(pool):
    # float64 master parameters, float32 compute and reduction: equal to one process making the same
    # casts up to float32 rounding of the sum over ranks (measured 6e-8 after 3 Adam steps)
    out = _check(pool.run(fns.train_run, {"param_dtype": "float32", "reduce_dtype": "float32"}), tol=1e-6)[0]
    gathers = [dt for op, dt in out["records"] if op == "all_gather"]
    assert gathers and set(gathers) == {"float32"}, out["records"]
    assert _reductions(out["records"]) == [("reduce_scatter", "float32")] * 3, out["records"]


@pytest.mark.mpi
def test_fully_shard_on_mpi_with_3_ranks():
    with RankPool(3, backend="mpi", timeout=120.0) as p:
        _check(p.run(fns.train_run, {"micro": 2}))


def test_errors_name_the_argument(world_of_one):
    from neural_arch import nn
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    model = fns.build()
    with pytest.raises(ValueError, match="mesh=.*3 dimensions"):
        fully_shard(model, mesh=init_device_mesh("cpu", (1, 1, 1)))
    with pytest.raises(TypeError, match="mesh must be a DeviceMesh"):
        fully_shard(model, mesh="dp")
    with pytest.raises(TypeError, match="reshard_after_forward=2"):
        fully_shard(model, reshard_after_forward=2)
    with pytest.raises(TypeError, match="mp_policy"):
        fully_shard(model, mp_policy="bf16")
    with pytest.raises(TypeError, match="param_dtype"):
        MixedPrecisionPolicy(param_dtype="int32")
    fully_shard(model, offload_policy=CPUOffloadPolicy())     # on the host: accepted, a no-op
    with pytest.raises(ValueError, match="already passed to fully_shard"):
        fully_shard(model)
    with pytest.raises(ValueError, match="dtypes"):
        fully_shard(nn.Sequential(nn.Linear(2, 2, dtype=np.float32), nn.Linear(2, 2, dtype=np.float64)))
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    fully_shard(tied[0])
    with pytest.raises(ValueError, match="shared with a module"):
        fully_shard(tied)
    # the world of one still trains, and unshard()/reshard() swap the parameters in and out
    model.unshard()
    assert not hasattr(model[0].weight, "placements") and model[0].weight.shape == (7, 4)
    model.reshard()
    assert model[0].weight.placements and model[0].weight.dtensor_shape == (7, 4)
