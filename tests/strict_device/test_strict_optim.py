"""Optimizers and gradient clipping through the strict fake device: each update equals the NumPy
one, state stays on the device, and a step never makes the host wait for the device."""

from __future__ import annotations

import math

import fake_device as fd
import numpy as np
import pytest

from neural_arch import backend, nn, optim
from neural_arch.core.tensor import Tensor

pytestmark = pytest.mark.usefixtures("fake")

SHAPES = [(4, 3), (3,), (2, 2, 2)]
OPTIMIZERS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1),
    "sgd-momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd-nesterov-wd": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    "sgd-dampening": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.5, dampening=0.3),
    "adam": lambda ps: optim.Adam(ps, lr=0.01),
    "adam-wd-amsgrad": lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def _params(device, seed=0):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(rng.standard_normal(s), device=device) for s in SHAPES]


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(s) for s in SHAPES]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_matches_numpy_without_host_waits(name):
    host, dev = _params("cpu"), _params("fake")
    opt_h, opt_d = OPTIMIZERS[name](host), OPTIMIZERS[name](dev)
    buffers = [p.data for p in dev]
    for step in range(3):
        for ph, pd, g in zip(host, dev, _grads(step)):
            ph.grad = Tensor(g.copy())
            pd.grad = Tensor(g.copy(), device="fake")
        opt_h.step()
        with fd.counting() as ev:
            opt_d.step()
            opt_d.zero_grad(set_to_none=False)
        assert ev.host_waits == [] and ev.from_host == [], ev
    for ph, pd, buf in zip(host, dev, buffers):
        assert pd.data is buf and type(pd.data) is fd.FakeArray  # updated in place, on the device
        np.testing.assert_allclose(backend.to_host(pd.data), ph.data, rtol=1e-12, atol=1e-14)
    for st in opt_d.state.values():
        for v in st.values():
            assert not isinstance(v, np.ndarray), "optimizer state moved to the host"


@pytest.mark.parametrize("name", ["sgd-momentum", "adam-wd-amsgrad"])
def test_state_dict_goes_to_host_and_back(name):
    dev = _params("fake")
    opt = OPTIMIZERS[name](dev)
    for p, g in zip(dev, _grads(0)):
        p.grad = Tensor(g, device="fake")
    opt.step()
    sd = opt.state_dict()
    arrays = [v for st in sd["state"].values() for v in st.values() if hasattr(v, "shape")]
    assert arrays and all(type(v) is np.ndarray for v in arrays)  # checkpoints live on the host
    fresh = OPTIMIZERS[name](_params("fake"))
    fresh.load_state_dict(sd)
    for st_new, st_old in zip(fresh.state.values(), opt.state.values()):
        for k, v in st_old.items():
            if hasattr(v, "shape"):
                assert type(st_new[k]) is fd.FakeArray  # back on the parameter's device
                np.testing.assert_array_equal(backend.to_host(st_new[k]), backend.to_host(v))


def _grad_params(device, dtypes=(np.float64,) * 3, scale=1.0):
    ps = []
    for i, (s, dt) in enumerate(zip(SHAPES, dtypes)):
        p = nn.Parameter(np.zeros(s, dtype=dt), device=device)
        g = np.random.default_rng(i).standard_normal(s).astype(dt) * scale
        p.grad = Tensor(g, device=device)
        ps.append(p)
    return ps


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0, 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_numpy_without_syncs(norm_type, max_norm):
    host, dev = _grad_params("cpu"), _grad_params("fake")
    total_h = optim.clip_grad_norm_(host, max_norm, norm_type=norm_type)
    before = [backend.to_host(p.grad.data) for p in dev]
    with fd.counting() as ev:
        total_d = optim.clip_grad_norm_(dev, max_norm, norm_type=norm_type)
    assert ev.host_waits == [] and ev.from_host == [], ev
    assert isinstance(total_h, float)
    assert isinstance(total_d, Tensor) and total_d.shape == () and type(total_d.data) is fd.FakeArray
    assert total_d.item() == pytest.approx(total_h, rel=1e-12)
    for ph, pd, b in zip(host, dev, before):
        np.testing.assert_allclose(backend.to_host(pd.grad.data), ph.grad.data, rtol=1e-12, atol=1e-15)
        if max_norm > 1e5:  # below the limit: multiplied by exactly 1
            np.testing.assert_array_equal(backend.to_host(pd.grad.data), b)


def test_clip_grad_norm_mixed_and_half_precision():
    dev = _grad_params("fake", dtypes=(np.float16, np.float32, np.float64), scale=40.0)
    host = _grad_params("cpu", dtypes=(np.float64,) * 3, scale=40.0)
    total_h = optim.clip_grad_norm_(host, 1.0)
    with fd.counting() as ev:
        total_d = optim.clip_grad_norm_(dev, 1.0)
    assert ev.host_waits == []
    assert np.isfinite(total_d.item())  # float16 squares (up to 1e4 each) are summed in float32
    assert total_d.item() == pytest.approx(total_h, rel=1e-3)
    assert [p.grad.dtype for p in dev] == [np.float16, np.float32, np.float64]


def test_clip_grad_norm_nonfinite_error_reads_the_device_once():
    dev = _grad_params("fake")
    dev[1].grad.data[0] = math.nan
    with fd.counting() as ev, pytest.raises(RuntimeError, match="norm"):
        optim.clip_grad_norm_(dev, 1.0, error_if_nonfinite=True)
    assert len(ev.syncs) == 1  # the caller asked for the check: one read, nothing else
    assert optim.clip_grad_norm_(_grad_params("fake"), 1.0, error_if_nonfinite=True).item() > 1.0


def test_clip_grad_value_on_device():
    dev, host = _grad_params("fake"), _grad_params("cpu")
    with fd.counting() as ev:
        optim.clip_grad_value_(dev, 0.3)
    optim.clip_grad_value_(host, 0.3)
    assert ev.host_waits == []
    for pd, ph in zip(dev, host):
        np.testing.assert_array_equal(backend.to_host(pd.grad.data), ph.grad.data)
