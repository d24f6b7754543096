"""DTensor (torch.distributed.tensor): placements, distribute_tensor / from_local / to_local /
full_tensor / redistribute for every transition on each mesh dimension (2x2 mesh, a 1-d mesh of 4,
1-d sub-meshes), a _StridedShard inside a Shard (FSDP x TP's layout) to and from other layouts,
DeviceMesh.from_group, uneven torch.chunk shards (down to zero rows), and gradients against the
single-process computation in float64 (<= 1e-10). Ranks are real gloo processes (one RankPool).
Sharding propagation (dtensor_ops_rank_fns): elementwise, sum/mean, softmax, layer norm,
embedding, cross entropy and shape ops on random shapes and placements equal the full-tensor op,
gradients too; a layout without a rule raises naming the op and the placements.
"""

import dtensor_ops_rank_fns as ops_fns
import dtensor_rank_fns as fns
import hsdp_tp_rank_fns
import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=[4, 3], ids=["gloo-4", "gloo-3"])
def pool(request):
    with RankPool(request.param, backend="gloo", timeout=120.0) as p:
        yield p


def test_every_transition_matmul_and_gradients(pool):
    for rank, bad in enumerate(pool.run(fns.transitions_run, 0)):
        assert bad == [], f"rank {rank}: {len(bad)} failures, e.g. {bad[:5]}"
    if pool.world_size != 4:
        return  # an odd world: 1-d mesh of 3 (chunks 2,2,1 and 1,1,0) only
    for rank, bad in enumerate(pool.run(fns.matmul_run, 4)):
        assert bad == [], f"rank {rank}: {len(bad)} failures, e.g. {bad[:5]}"
    for rank, bad in enumerate(pool.run(fns.strided_run, 6)):
        assert bad == [], f"rank {rank}: {len(bad)} failures, e.g. {bad[:5]}"
    for rank, bad in enumerate(pool.run(fns.partial_grad_run, 1)):
        assert bad == [], f"rank {rank}: {bad}"
    for rank, out in enumerate(pool.run(fns.distribute_and_check_run, 2)):
        assert out["src3"] == 0.0                          # every rank got rank 3's values
        assert out["inferred"] == (5, 3)                   # run_check sums the uneven shards
        assert out["torch_rule"] == (8, 3)                 # without it: local * mesh size (torch)
        assert out["error"] and "global ranks [3]" in out["error"], out["error"]


def test_sharding_propagation_equals_the_full_tensor_op(pool):
    for fn in (ops_fns.pointwise_and_reductions_run, ops_fns.views_run, ops_fns.layer_norm_embedding_loss_run,
               ops_fns.errors_run):
        for rank, bad in enumerate(pool.run(fn, 7)):
            assert bad == [], f"{fn.__name__}, rank {rank}: {len(bad)} failures, e.g. {bad[:3]}"


def test_hsdp_x_tp_on_a_3d_mesh_equals_one_process(pool):
    if pool.world_size != 4:
        return  # 4 ranks: (1, 2, 2) shards and (2, 1, 2) replicates around tp 2
    for shape in ((1, 2, 2), (2, 1, 2)):
        out = pool.run(hsdp_tp_rank_fns.hsdp_tp_run, shape)
        for rank, r in enumerate(out):
            assert r["worst"] <= 1e-10, f"mesh {shape}, rank {rank}: differs from one process by {r['worst']}"
        assert out[0]["placements"]["0.weight"] == "(Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0))"
        assert out[0]["placements"]["2.weight"] == "(Replicate(), Shard(dim=0), Shard(dim=1))"


def test_sharding_propagation_world_of_one(world_of_one):
    import neural_arch.distributed.tensor._ops as ops
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import Shard, distribute_tensor

    for fn in (ops_fns.pointwise_and_reductions_run, ops_fns.views_run, ops_fns.layer_norm_embedding_loss_run,
               ops_fns.errors_run):
        assert fn(11) == [], fn.__name__
    dt = distribute_tensor(Tensor(np.ones((2, 3))), init_device_mesh("cpu", (1,)), [Shard(1)])
    with pytest.raises(NotImplementedError, match=r"softmax\(dim=-1\).*\[Shard\(dim=1\)\] of shape \(2, 3\)"):
        dt.softmax(-1)
    assert not hasattr(dt, "var") and not hasattr(dt, "data")        # no rule: hasattr is False, no gather
    with pytest.raises(NotImplementedError, match=r"DTensor.var: no sharding rule for placements \[Shard"):
        dt.var()
    with pytest.raises(TypeError, match="no implicit conversion"):
        np.asarray(dt)
    with pytest.raises(AttributeError, match="DTensor has no .data"):
        ops.UNARY_OPS["exp"][0](dt)                                   # a Tensor function given a DTensor
    assert dt.sum(dim=1).placements[0].is_partial() and dt.T.placements == (Shard(0),)


def test_world_of_one(world_of_one):
    assert fns.transitions_run(3) == []         # every transition is the identity layout on one rank
    assert fns.matmul_run(5) == []


def test_placements_and_errors_name_the_argument(world_of_one):
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    assert Shard(0).is_shard() and Shard(0).is_shard(0) and not Shard(1).is_shard(0)
    assert Replicate().is_replicate() and Partial().is_partial("sum") and Partial("avg").reduce_op == "avg"
    assert Shard(1) == Shard(1) and Shard(0) != Shard(1) and len({Replicate(), Replicate()}) == 1
    with pytest.raises(ValueError, match="reduce_op"):
        Partial("max")
    mesh = init_device_mesh("cpu", (1,))
    x = Tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match="one placement per mesh dimension"):
        distribute_tensor(x, mesh, [Shard(0), Shard(1)])
    with pytest.raises(ValueError, match=r"Shard\(dim=2\) is out of range"):
        distribute_tensor(x, mesh, [Shard(2)])
    with pytest.raises(NotImplementedError, match="at most one mesh dimension"):
        distribute_tensor(x, init_device_mesh("cpu", (1, 1)), [Shard(0), Shard(-2)])
    from neural_arch.distributed.device_mesh import DeviceMesh
    from neural_arch.distributed.tensor.placement_types import _StridedShard

    with pytest.raises(NotImplementedError, match="split_factor=1"):   # the tp dim of a 1x1 mesh cuts 1 piece
        distribute_tensor(x, init_device_mesh("cpu", (1, 1)), [_StridedShard(0, split_factor=2), Shard(0)])
    with pytest.raises(TypeError, match="split_factor"):
        _StridedShard(0, split_factor=0)
    assert repr(_StridedShard(1, split_factor=2)) == "_StridedShard(dim=1, sf=2)" and _StridedShard(0, split_factor=2).is_shard(0)
    with pytest.raises(TypeError, match="ProcessGroup"):
        DeviceMesh.from_group("tp", "cpu")
    with pytest.raises(ValueError, match="torch.chunk sizes"):
        DTensor.from_local(x, mesh, [Shard(0)], shape=(3, 3))
    with pytest.raises(ValueError, match="contiguous stride"):
        DTensor.from_local(x, mesh, [Replicate()], stride=(1, 2))
    dt = DTensor.from_local(x, mesh, [Replicate()], stride=(3, 1))
    assert dt.shape == (2, 3) and dt.dtype == np.float64 and dt.stride() == (3, 1) and dt.ndim == 2
    assert dt.redistribute(mesh, [Replicate()]) is dt and dt.grad is None
    assert "placements=(Replicate(),)" in repr(dt)
