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


def _regression_step_parts(cp, linear: bool):
    """A model and its SGD step on static buffers: ``linear`` uses an ``nn.Linear`` (cuBLAS), else an
    elementwise regression (products and sums only, no matrix product)."""
    rng = np.random.default_rng(0)
    if linear:
        model = _mlp(cp)
        params = list(model.parameters())
    else:
        w = Tensor(cp.asarray(rng.normal(0, 0.3, size=12)), requires_grad=True)
        params = [w]

        def model(x):
            return (x * w).sum(axis=1)
    opt = optim.SGD(params, lr=0.1, momentum=0.9)

    def loss_of(x, y):
        if linear:
            return F.cross_entropy(model(x), y)
        return ((model(x) - Tensor(y)) ** 2).mean()
    return params, opt, loss_of


def _data(linear: bool):
    rng = np.random.default_rng(1)
    dtype = np.float32 if linear else np.float64
    return [(rng.normal(size=(16, 12)).astype(dtype),
             rng.integers(0, 5, size=16) if linear else rng.normal(size=16)) for _ in range(4)]


@pytest.mark.parametrize("linear", [False, True], ids=["elementwise", "linear"])
def test_graphed_sgd_step_replays_equal_eager_steps(cupy_gpu, linear):
    """make_graphed_step runs the step 3 times (warm-up) then captures it without running it; each
    replay is then one step on whatever the static buffers hold. A step with a matrix product cannot
    be captured on CuPy (cuBLAS refused during capture): then the error must say so."""
    from neural_arch.cuda.graphs import make_graphed_step

    cp = cupy_gpu
    batches = _data(linear)
    warm_x, warm_y = batches[0]

    params, opt, loss_of = _regression_step_parts(cp, linear)
    losses = []
    for x, y in [(warm_x, warm_y)] * 3 + batches:
        opt.zero_grad(set_to_none=False)
        loss = loss_of(Tensor(cp.asarray(x)), cp.asarray(y))
        loss.backward()
        opt.step()
        losses.append(float(cp.asnumpy(loss.data)))
    want_params, want_losses = [cp.asnumpy(p.data) for p in params], losses[3:]

    params, opt, loss_of = _regression_step_parts(cp, linear)
    static_x = Tensor(cp.asarray(warm_x))
    static_y = cp.asarray(warm_y)

    def step():
        opt.zero_grad(set_to_none=False)  # keep the .grad arrays: the graph writes into them
        loss = loss_of(static_x, static_y)
        loss.backward()
        opt.step()
        return loss

    try:
        graphed = make_graphed_step(step)
    except RuntimeError as exc:
        assert linear, f"an elementwise step must capture: {exc}"
        assert "cuBLAS" in str(exc) and "matrix product" in str(exc), str(exc)
        return
    got = []
    for x, y in batches:
        static_x.data[...] = cp.asarray(x)  # refill the captured inputs in place
        static_y[...] = cp.asarray(y)
        got.append(float(cp.asnumpy(graphed().data)))
    np.testing.assert_allclose(got, want_losses, rtol=1e-5, atol=1e-6)
    for p, want in zip(params, want_params):
        np.testing.assert_allclose(cp.asnumpy(p.data), want, rtol=1e-5, atol=1e-6)
    assert got[0] != got[1], "the replays must see the refilled inputs"
