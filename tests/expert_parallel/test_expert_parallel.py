"""Expert parallelism: MoE with experts split over ranks (ep = 1, 2, 4; ep < world with
expert-data-parallel groups) under DDP equals single-process training on the union batch
(outputs, aux loss, gradients, parameters after 3 Adam steps; float64 <= 1e-10), top-1 and
top-2, with and without capacity, a rank whose tokens all go elsewhere; the differentiable
uneven all_to_all_single. Ranks are real processes (one RankPool per module parameter).
"""

import ep_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

TOL = 1e-10


@pytest.fixture(scope="module", params=[
    pytest.param(("gloo", 2), id="gloo-2"),
    pytest.param(("gloo", 4), id="gloo-4"),
    pytest.param(("mpi", 2), id="mpi-2", marks=pytest.mark.mpi),
])
def pool(request):
    backend, world = request.param
    with RankPool(world, backend=backend, timeout=120.0) as p:
        yield p


def _check(results, keys=("out", "aux", "grads", "params")):
    for rank, out in enumerate(results):
        for key in keys:
            assert out[key] <= TOL, f"rank {rank}: {key} differs by {out[key]:g}"


def test_uneven_all_to_all_single_forward_and_backward(pool):
    for rank, (dy, dg) in enumerate(pool.run(fns.a2a_uneven_run)):
        assert dy == 0.0 and dg == 0.0, f"rank {rank}: forward {dy:g}, grad {dg:g}"


@pytest.mark.parametrize("top_k, capacity_factor", [(1, None), (2, None), (1, 0.5), (2, 0.6)],
                         ids=["top1", "top2", "top1-capacity", "top2-capacity"])
def test_ep_equals_world_matches_single_process(pool, top_k, capacity_factor):
    n = pool.world_size
    results = pool.run(fns.ep_train_run, n, top_k, capacity_factor)
    _check(results)
    assert [out["ids"] for out in results] == [list(range(r * 4 // n, (r + 1) * 4 // n)) for r in range(n)]
    assert (results[0]["dropped"] > 0) == (capacity_factor is not None)


@pytest.mark.cases(lambda p: p["pool"] == ("gloo", 4))
@pytest.mark.parametrize("ep_size, how, top_k, capacity_factor", [
    (2, "mesh", 2, None), (2, "world", 1, 0.5), (1, "mesh", 2, 0.6)],
    ids=["ep2-mesh-top2", "ep2-groups-top1-capacity", "ep1-top2-capacity"])
def test_ep_inside_dp_with_expert_data_parallel_groups(pool, ep_size, how, top_k, capacity_factor):
    results = pool.run(fns.ep_train_run, ep_size, top_k, capacity_factor, how)
    _check(results)
    per = 4 // ep_size
    assert [out["ids"] for out in results] == [list(range((r % ep_size) * per, (r % ep_size + 1) * per))
                                               for r in range(4)]


@pytest.mark.cases(lambda p: p["pool"][0] == "gloo")
def test_rank_whose_tokens_all_go_elsewhere(pool):
    n = pool.world_size
    results = pool.run(fns.ep_train_run, n, 2, None, "world", True)
    _check(results)
    assert results[-1]["choices"] == [0, 1]        # the last rank keeps nothing for itself


@pytest.mark.cases(lambda p: p["pool"] == ("gloo", 2))
def test_local_aux_loss_uses_per_rank_statistics(pool):
    _check(pool.run(fns.ep_train_run, 2, 2, None, "world", False, True, 1), keys=("out", "aux"))


@pytest.mark.cases(lambda p: p["pool"][0] == "gloo")
def test_moe_gpt_under_expert_parallelism_matches_single_process(pool):
    ep = 2                                             # ep = world on 2 ranks, ep inside dp on 4
    for rank, out in enumerate(pool.run(fns.gpt_ep_run, ep)):
        for key in ("logits", "aux", "params"):
            assert out[key] <= TOL, f"rank {rank}: {key} differs by {out[key]:g}"


def test_sharding_wrappers_keep_expert_parameters_whole(world_of_one):
    """ZeRO and FSDP leave expert parameters out of their partitions and flat units (each rank holds
    other experts): they stay whole, are stepped by every rank holding them, and their gradients are
    reduced over the expert-data-parallel group (test_sharded_moe.py proves the training equal)."""
    import numpy as np

    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    def model():
        m = nn.Sequential(nn.Linear(2, 2, dtype=np.float64), nn.Linear(2, 2, dtype=np.float64))
        m[1].weight.allreduce = False          # what parallelize_moe sets on expert parameters
        return m

    m = model()
    zero1 = world_of_one.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=optim.SGD, lr=0.1)
    assert all(p is not m[1].weight for part in zero1.partition for p in part)
    assert any(p is m[1].weight for g in zero1.optim.param_groups for p in g["params"])
    m = model()
    zero2 = world_of_one.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=optim.SGD, stage=2, lr=0.1)
    assert all(p is not m[1].weight for b in zero2._buckets for p in b)
    m[1](m[0](Tensor(np.ones((1, 2))))).sum().backward()
    expected = m[1].weight.data - 0.1 * m[1].weight.grad.data     # reduced over a group of one: as is
    zero2.step()
    assert np.array_equal(m[1].weight.data, expected)
    m = model()
    fsdp = world_of_one.FullyShardedDataParallel(m)
    assert sum(u.layout.numel for u in fsdp._units) == 12 - 4      # all but the expert weight
    assert [p for p in fsdp.parameters()][-1] is m[1].weight
    assert "1.weight" in fsdp.state_dict()


def test_tensor_parallel_plan_of_a_gpt_whose_every_mlp_is_moe(world_of_one):
    """parallelize_gpt shards attention and the vocabulary of a GPT with no dense MLP (every block an nn.MoE,
    whose experts expert parallelism splits): the plan's MLP entries are left out instead of matching
    nothing, and the dense blocks of a mixed model are still sharded."""
    from neural_arch import nn
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor.parallel import parallelize_gpt

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    for moe_every, dense_fc1 in ((1, []), (2, [0])):
        model = nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8,
                       moe_num_experts=2, moe_every=moe_every)
        parallelize_gpt(model, mesh)
        assert hasattr(model.blocks[0].attn.q_proj.weight, "placements")
        sharded = [i for i, b in enumerate(model.blocks) if hasattr(getattr(b.mlp, "fc1", None), "weight")
                   and hasattr(b.mlp.fc1.weight, "placements")]
        assert sharded == dense_fc1, (moe_every, sharded)
