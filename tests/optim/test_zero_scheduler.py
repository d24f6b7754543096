"""An LR scheduler's value reaches ZeroRedundancyOptimizer's real step (the inner optimizer copies the
group dicts it is given: ZeRO must sync into the inner optimizer's own groups). In a world of one."""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor
from neural_arch.optim.lr_scheduler import StepLR


@pytest.mark.parametrize("stage", [1, 2])
def test_a_scheduled_learning_rate_reaches_the_step(world_of_one, stage):
    model = nn.Linear(3, 2, dtype=np.float64)
    opt = world_of_one.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD, lr=1.0, stage=stage)
    StepLR(opt, step_size=1, gamma=0.5).step()          # lr 1.0 -> 0.5
    before = model.weight.data.copy()
    (model(Tensor(np.ones((1, 3)))) * Tensor(np.ones((1, 2)))).sum().backward()
    grad = np.ones((2, 3))                                # d(sum(W x + b)) / dW with x = ones
    opt.step()
    np.testing.assert_allclose(before - model.weight.data, 0.5 * grad, rtol=0, atol=1e-12)
