"""PyTorch idioms, ported by changing imports only, run on 2 and 3 real ranks (one pool per world size).

Each test is one idiom a torch user writes; the rank functions live in port_rank_fns.py and are
checked against oracles computed here or on the global batch.
"""

import numpy as np
import port_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool, run_ranks

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=[pytest.param(2, id="gloo-2"), pytest.param(3, id="gloo-3")])
def pool(request):
    with RankPool(request.param, backend="gloo", timeout=60.0) as p:
        yield p


def test_sampler_set_epoch_partitions_and_reshuffles(pool):
    n, epochs = 12, 3
    per_rank = pool.run(fns.sampler_set_epoch, n, epochs)
    for epoch in range(epochs):
        shares = [per_rank[r][epoch] for r in range(pool.world_size)]
        assert sorted(i for s in shares for i in s) == list(range(n))  # disjoint, complete
    orders = [tuple(i for r in range(pool.world_size) for i in per_rank[r][e]) for e in range(epochs)]
    assert len(set(orders)) == epochs  # set_epoch changes the permutation


def test_rank0_checkpoint_barrier_load(pool, tmp_path):
    diffs = pool.run(fns.checkpoint_rank0_barrier_load, str(tmp_path / "ckpt.npz"))
    assert max(diffs) == 0.0


def test_accuracy_with_out_max_dim(pool):
    for counted, expected in pool.run(fns.accuracy_with_max, 5):
        assert counted == expected


@pytest.mark.parametrize("mode", ["blocking", "async", "batch"])
def test_send_recv_ring(pool, mode):
    world = pool.world_size
    got = pool.run(fns.ring, mode)
    for rank, value in enumerate(got):
        assert value == [10.0 * ((rank - 1) % world), 1.0]


@pytest.mark.parametrize("mode", ["no_sync", "flag"])
def test_gradient_accumulation_matches_single_process(pool, mode):
    assert max(pool.run(fns.accumulation, mode)) <= 1e-10


def test_object_collectives(pool):
    world = pool.world_size
    results = pool.run(fns.object_collectives)
    for rank, out in enumerate(results):
        assert out["broadcast"] == [{"lr": 0.1, "epochs": 3}, "cfg"]
        assert out["all_gather"] == [("rank", r) for r in range(world)]
        assert out["gather"] == ([{"r": r} for r in range(world)] if rank == 0 else None)
        assert out["scatter"] == f"item{rank}"
    assert results[-1]["p2p"] == [{"step": 7}, [1, 2, 3]] and results[-1]["sender"] == 0


def test_new_collectives_and_non_member_semantics(pool):
    for rank, res in enumerate(pool.run(fns.new_tensor_collectives, 11)):
        assert res["a2a"] == 0.0
        assert res["mismatch"] is True  # every rank raises, naming the disagreement
        assert res["into"] is True
        member = rank in (0, 1)
        # members reduce; a non-member's call returns None, warns, and leaves the tensor alone
        assert res["group"] == ((True, 2.0, False, 0) if member else (False, 1.0, True, 1))
        assert res["group_ranks"] == ([0, 1] if member else None)
        assert res["world_is_default"] is True


def test_sync_batchnorm_equals_global_batchnorm(pool):
    for res in pool.run(fns.sync_bn_oracle, 1, [3, 5, 1], (2, 2)):
        assert res["tracked"] == 3
        for key in ("y", "grad_x", "grad_w", "grad_b", "running", "eval"):
            assert res[key] <= 1e-10, (key, res)


def test_sync_batchnorm_under_ddp_training(pool):
    assert max(pool.run(fns.sync_bn_ddp_training, 4, [2, 5, 3])) <= 1e-10


@pytest.mark.mpi
@pytest.mark.parametrize("world", [2, 3])
def test_sync_batchnorm_under_mpi(world):
    with RankPool(world, backend="mpi", timeout=60.0) as p:
        for res in p.run(fns.sync_bn_oracle, 2, [4, 1, 6], (3,)):
            assert max(res[k] for k in ("y", "grad_x", "grad_w", "grad_b", "running", "eval")) <= 1e-10
        assert max(p.run(fns.sync_bn_ddp_training, 5, [3, 2, 4])) <= 1e-10


def test_torchrun_style_env_init():
    results = run_ranks(fns.torchrun_env_init, 2, init=False, timeout=60)
    for r in results:
        assert r.ok, r.traceback
    for rank, r in enumerate(r.value for r in results):
        assert r["rank"] == r["env_rank"] == r["local_rank"] == rank
        assert r["world"] == r["env_world"] == 2 and r["sum"] == 1.0 and r["is_init"]


def test_monitored_barrier_names_the_missing_rank():
    results = run_ranks(fns.monitored_barrier_missing, 3, args=(1.5,), timeout=60)
    assert results[2].value == "absent"
    assert "global rank 2 did not reach the barrier" in results[0].value, results[0]
    assert "did not release" in results[1].value


def test_sync_batchnorm_single_process_and_convert():
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import SyncBatchNorm

    class BatchNorm2d(nn.Module):  # torch's layout, standing in for nn.BatchNorm2d
        def __init__(self, c):
            super().__init__()
            self.num_features, self.eps, self.momentum = c, 1e-5, 0.1
            self.affine, self.track_running_stats = True, True
            self.weight = nn.Parameter(np.full(c, 2.0))
            self.bias = nn.Parameter(np.zeros(c))
            self.register_buffer("running_mean", np.zeros(c))
            self.register_buffer("running_var", np.ones(c))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64))

    model = nn.Sequential(nn.Linear(2, 2), BatchNorm2d(4))
    weight = model[1].weight
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted is model and isinstance(model[1], SyncBatchNorm) and model[1].weight is weight
    x = np.random.default_rng(0).normal(size=(6, 4, 3, 3))
    y, gx, _, _ = fns._reference_bn(x, np.ones_like(x), np.full(4, 2.0), np.zeros(4), 1e-5)
    xt = Tensor(x, requires_grad=True)
    out = model[1](xt)
    out.sum().backward()
    assert np.abs(out.data - y).max() <= 1e-10 and np.abs(xt.grad.data - gx).max() <= 1e-10
    with pytest.raises(ValueError, match=r"\(N, 4, \*\)"):
        model[1](Tensor(np.zeros((2, 3))))


def test_convert_real_nn_batchnorm2d():
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import SyncBatchNorm

    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU())
    model.double()
    plain = nn.BatchNorm2d(2).double()
    plain.weight.data[...] = model[1].weight.data
    model = SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model[1], SyncBatchNorm) and model[1].weight.dtype == np.float64
    x = Tensor(np.random.default_rng(1).normal(size=(4, 2, 5, 5)))
    assert np.abs(model[1](x).data - plain(x).data).max() <= 1e-10
    assert np.abs(model[1].running_var.data - plain.running_var.data).max() <= 1e-12
