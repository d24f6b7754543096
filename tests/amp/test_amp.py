"""autocast (op lists, dtypes, nesting, gradients) and GradScaler (dynamic loss scaling)."""

import numpy as np
import pytest

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch import nn, optim
from neural_arch.amp import GradScaler, autocast
from neural_arch.core.tensor import Tensor


def _mlp(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    m = nn.Sequential(nn.Linear(5, 8, dtype=dtype), nn.ReLU(), nn.Linear(8, 3, dtype=dtype))
    for p in m.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.shape).astype(dtype)
    return m


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_autocast_runs_linear_low_and_loss_in_float32(low):
    m = _mlp()
    x = Tensor(np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32))
    y = np.array([0, 1, 2, 0])
    with autocast("cpu", dtype=low):
        h = m(x)
        loss = F.cross_entropy(h, y)
        probs = F.softmax(h, axis=-1)
    assert h.dtype.name == low and loss.dtype == np.float32 and probs.dtype == np.float32
    loss.backward()
    assert all(p.grad.dtype == np.float32 for p in m.parameters())
    ref = _mlp()
    F.cross_entropy(ref(x), y).backward()
    tol = 0.05 if low == "bfloat16" else 5e-3  # bf16 has 8 mantissa bits, fp16 has 11
    for p, q in zip(m.parameters(), ref.parameters()):
        assert np.abs(p.grad.data - q.grad.data).max() <= tol * max(1.0, np.abs(q.grad.data).max())
    assert not hasattr(F.linear, "__autocast_original__"), "autocast left its wrappers installed"


def test_autocast_leaves_float64_alone_and_nests():
    m = _mlp(np.float64)
    x = Tensor(np.ones((2, 5)))
    with autocast("cpu"):
        assert m(x).dtype == np.float64
        m32 = _mlp()
        with autocast("cpu", enabled=False):
            assert m32(Tensor(np.ones((2, 5), dtype=np.float32))).dtype == np.float32
        assert m32(Tensor(np.ones((2, 5), dtype=np.float32))).dtype.name == "bfloat16"


def test_autocast_bad_arguments():
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        autocast("cpu", dtype=np.float32)
    with pytest.raises(ValueError, match="device_type"):
        autocast("tpu")


def _scaled_step(scaler, m, opt, x, y, poison=False):
    loss = F.cross_entropy(m(x), y)
    scaler.scale(loss).backward()
    if poison:
        m[0].weight.grad.data[0, 0] = np.inf
    out = scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return out


def test_grad_scaler_skips_exactly_the_overflowing_step_and_halves_the_scale():
    m, ref = _mlp(np.float64), _mlp(np.float64)
    opt, ref_opt = optim.SGD(m.parameters(), lr=0.1), optim.SGD(ref.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=2.0**10, growth_interval=3)
    rng = np.random.default_rng(2)
    batches = [(Tensor(rng.normal(size=(4, 5))), rng.integers(0, 3, 4)) for _ in range(5)]
    scales = []
    for i, (x, y) in enumerate(batches):
        _scaled_step(scaler, m, opt, x, y, poison=(i == 2))
        scales.append(scaler.get_scale())
        if i != 2:  # the reference skips the poisoned step too
            F.cross_entropy(ref(x), y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
    assert scales == [2.0**10, 2.0**10, 2.0**9, 2.0**9, 2.0**9]
    for p, q in zip(m.parameters(), ref.parameters()):
        assert np.abs(p.data - q.data).max() <= 1e-12  # power-of-two scales are exact in float64


def test_grad_scaler_grows_after_growth_interval_and_unscale_before_clip():
    m = _mlp(np.float64)
    opt = optim.SGD(m.parameters(), lr=0.0)
    scaler = GradScaler(init_scale=4.0, growth_factor=2.0, growth_interval=2)
    x, y = Tensor(np.ones((2, 5))), np.array([0, 1])
    for _ in range(2):
        scaler.scale(F.cross_entropy(m(x), y)).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.unscale_(opt)
        unscaled = [p.grad.data.copy() for p in m.parameters()]
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        assert max(np.abs(a - p.grad.data).max() for a, p in zip(unscaled, m.parameters())) <= 1e-12
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 8.0
    assert GradScaler(enabled=False).scale(Tensor(np.ones(1))).item() == 1.0
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=2.0)


def test_bfloat16_dtype_is_ml_dtypes():
    import ml_dtypes

    assert np.dtype(na.bfloat16) == np.dtype(ml_dtypes.bfloat16)
