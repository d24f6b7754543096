"""``neural_arch.cuda`` on a real GPU: memory statistics against CuPy's pool, and a CUDA graph of a
training step whose replays equal the same steps run eagerly (the strict fake device cannot check
either: it has no memory pool and no graphs)."""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch import cuda, nn, optim
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F

pytestmark = pytest.mark.gpu


def _mlp(cp, seed: int = 0):
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.3, size=p.shape).astype(np.float32)
    return model.to("cuda")


def _batches(n: int = 4):
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(16, 12)).astype(np.float32), rng.integers(0, 5, size=16)) for _ in range(n)]


def test_memory_statistics_follow_cupys_pool(cupy_gpu):
    cp = cupy_gpu
    pool = cp.get_default_memory_pool()
    cuda.reset_peak_memory_stats()
    before = cuda.memory_allocated()
    assert before == pool.used_bytes()
    x = Tensor(cp.zeros((1024, 1024), np.float32))  # 4 MiB
    assert cuda.memory_allocated() - before >= 4 * 2**20
    assert cuda.memory_allocated() == pool.used_bytes()
    assert cuda.memory_reserved() >= cuda.memory_allocated()
    peak = cuda.max_memory_allocated()
    assert peak >= before + 4 * 2**20
    del x
    assert cuda.memory_allocated() == pool.used_bytes() < before + 4 * 2**20
    assert cuda.max_memory_allocated() == peak, "the peak must survive the array's release"
    cuda.reset_peak_memory_stats()
    assert cuda.max_memory_allocated() == cuda.memory_allocated()


def test_graphed_sgd_step_replays_equal_eager_steps(cupy_gpu):
    """make_graphed_step runs the step 3 times (warm-up) then captures it without running it; each
    replay is then one step on whatever the static buffers hold."""
    from neural_arch.cuda.graphs import make_graphed_step

    cp = cupy_gpu
    batches = _batches()
    warm_x, warm_y = batches[0]

    def eager_reference():
        model = _mlp(cp)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for x, y in [(warm_x, warm_y)] * 3 + batches:
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(Tensor(cp.asarray(x))), cp.asarray(y))
            loss.backward()
            opt.step()
            losses.append(float(cp.asnumpy(loss.data)))
        return [cp.asnumpy(p.data) for p in model.parameters()], losses[3:]

    model = _mlp(cp)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    static_x = Tensor(cp.asarray(warm_x))
    static_y = cp.asarray(warm_y)

    def step():
        opt.zero_grad(set_to_none=False)  # keep the .grad arrays: the graph writes into them
        loss = F.cross_entropy(model(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    graphed = make_graphed_step(step)
    losses = []
    for x, y in batches:
        static_x.data[...] = cp.asarray(x)  # refill the captured inputs in place
        static_y[...] = cp.asarray(y)
        losses.append(float(cp.asnumpy(graphed().data)))
    want_params, want_losses = eager_reference()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip((cp.asnumpy(p.data) for p in model.parameters()), want_params):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert losses[0] != losses[1], "the replays must see the refilled inputs"
