"""``ft.ManagedProcessGroup``, the adapter ZeRO-2 reduces its gradient shards through across replicas
(the end-to-end proof with real processes is tests/ft/test_ft_zero_heal.py); no processes here."""

import numpy as np
import pytest

from neural_arch import nn, optim
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
