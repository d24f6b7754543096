"""``ft.ManagedProcessGroup``, the adapter ZeRO-2 and ``fully_shard`` reduce their gradient shards
through across replicas (the end-to-end proofs with real processes are tests/ft/test_ft_sharded_heal.py);
no processes here."""

import numpy as np
import pytest

from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor
from neural_arch.distributed import ft
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.optim import ZeroRedundancyOptimizer


class TwoReplicaManager:
    """What the adapter needs of a Manager: a quorum of two whose other member holds ``peer``."""

    def __init__(self, peer, fail=False):
        self.peer, self.fail, self.error, self.calls = peer, fail, None, 0

    def allreduce(self, array):
        self.calls += 1
        if self.fail:
            self.error = RuntimeError("a peer died")
        if self.error is None:
            array += self.peer
            array /= 2
        return array

    def errored(self):
        return self.error

    def num_participants(self):
        return 2

    def participating_rank(self):
        return 1


def test_the_lane_averages_or_sums_in_place_through_the_manager_and_a_failure_is_the_managers():
    lane = ft.ManagedProcessGroup(TwoReplicaManager(peer=np.array([3.0, 5.0])))
    assert lane.backend is lane and lane.size() == 2 and lane.rank() == 1
    x = np.array([1.0, 1.0])
    lane.backend.allreduce(x, ReduceOp.AVG)
    assert np.array_equal(x, [2.0, 3.0])
    lane.allreduce(x, ReduceOp.SUM)
    assert np.array_equal(x, [5.0, 8.0])
    with pytest.raises(ValueError, match="AVG and ReduceOp.SUM"):
        lane.allreduce(x, ReduceOp.MAX)
    broken = ft.ManagedProcessGroup(TwoReplicaManager(peer=np.zeros(2), fail=True))
    y = np.array([1.0, 2.0])
    broken.allreduce(y, ReduceOp.SUM)            # recorded by the manager, not raised, and left alone
    assert np.array_equal(y, [1.0, 2.0]) and broken.manager.errored() is not None


def test_zero_takes_replicate_group_in_stage_2_only():
    model = nn.Linear(2, 2, dtype=np.float64)
    lane = ft.ManagedProcessGroup(TwoReplicaManager(peer=np.zeros(1)))
    with pytest.raises(ValueError, match="needs stage=2"):
        ZeroRedundancyOptimizer(model.parameters(), optim.SGD, replicate_group=lane, lr=0.1)


def test_fully_shard_averages_each_gradient_shard_over_a_replicate_group_outside_its_mesh(world_of_one):
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import fully_shard

    def grads(lane):
        rng = np.random.default_rng(0)
        model = nn.Sequential(nn.Linear(3, 2, dtype=np.float64), nn.Tanh(), nn.Linear(2, 1, dtype=np.float64))
        for p in model.parameters():
            p.data[...] = rng.normal(size=p.data.shape)
        if lane is not None:
            fully_shard(model, replicate_group=lane)
        (model(Tensor(rng.normal(size=(4, 3)))) ** 2).sum().backward()
        return np.concatenate([np.asarray(p.grad.data).reshape(-1) for p in model.parameters()])

    local = grads(None)
    peer = np.arange(local.size, dtype=np.float64)      # the other replica's shard (a world of one: the whole)
    lane = ft.ManagedProcessGroup(TwoReplicaManager(peer=peer))
    assert np.allclose(grads(lane), (local + peer) / 2, rtol=0, atol=1e-12) and lane.manager.calls == 1
    broken = ft.ManagedProcessGroup(TwoReplicaManager(peer=peer, fail=True))
    assert np.allclose(grads(broken), local, rtol=0, atol=1e-12)      # left alone; the manager voids the step
    model = nn.Linear(2, 2, dtype=np.float64)
    with pytest.raises(ValueError, match="replicate_group is given and mesh"):
        fully_shard(model, mesh=init_device_mesh("cpu", (1, 1)), replicate_group=lane)
    with pytest.raises(TypeError, match="replicate_group must be a process group"):
        fully_shard(model, replicate_group="lane")
