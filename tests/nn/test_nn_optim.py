"""Optimizers against their textbook formulas, state_dict round-trips, schedulers, clipping."""

import math

import numpy as np
import pytest

from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor, manual_seed

STEPS = 5


def _grads(shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for _ in range(STEPS)]


def _run(opt_factory, grads, p0):
    p = nn.Parameter(p0.copy())
    opt = opt_factory([p])
    for g in grads:
        p.grad = Tensor(g.copy())
        opt.step()
    return p.data


def _sgd_ref(p, grads, lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False):
    p = p.copy()
    buf = None
    for g in grads:
        g = g + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def _adam_ref(p, grads, lr, b1, b2, eps, wd=0.0, decoupled=False, amsgrad=False):
    p = p.copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    vmax = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat = m / (1 - b1**t)
        vmax = np.maximum(vmax, v)
        v_hat = (vmax if amsgrad else v) / (1 - b2**t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


@pytest.mark.parametrize("kw", [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, dampening=0.3),
    dict(momentum=0.9, nesterov=True),
    dict(momentum=0.5, weight_decay=0.1),
    dict(momentum=0.9, nesterov=True, weight_decay=0.01),
])
def test_sgd_matches_formula(kw):
    p0 = np.random.default_rng(1).normal(size=(3, 4))
    grads = _grads((3, 4))
    got = _run(lambda ps: optim.SGD(ps, lr=0.1, **kw), grads, p0)
    ref = _sgd_ref(p0, grads, 0.1, kw.get("momentum", 0.0), kw.get("dampening", 0.0),
                   kw.get("weight_decay", 0.0), kw.get("nesterov", False))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls,kw", [
    (optim.Adam, dict()),
    (optim.Adam, dict(weight_decay=0.1)),
    (optim.Adam, dict(amsgrad=True)),
    (optim.AdamW, dict()),
    (optim.AdamW, dict(weight_decay=0.3, betas=(0.8, 0.99))),
    (optim.AdamW, dict(weight_decay=0.1, amsgrad=True)),
])
def test_adam_matches_formula(cls, kw):
    p0 = np.random.default_rng(2).normal(size=(5,))
    grads = _grads((5,), seed=3)
    got = _run(lambda ps: cls(ps, lr=0.01, **kw), grads, p0)
    b1, b2 = kw.get("betas", (0.9, 0.999))
    wd = kw.get("weight_decay", 0.01 if cls is optim.AdamW else 0.0)
    ref = _adam_ref(p0, grads, 0.01, b1, b2, 1e-8, wd, cls is optim.AdamW, kw.get("amsgrad", False))
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_update_is_in_place_and_skips_missing_grads():
    a = nn.Parameter(np.ones(3))
    b = nn.Parameter(np.ones(3))
    buf = a.data
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = Tensor(np.ones(3))
    opt.step()
    assert a.data is buf and not np.all(buf == 1)
    assert np.all(b.data == 1) and b not in opt.state


def test_param_groups_and_errors():
    m = nn.Linear(2, 2)
    opt = optim.SGD([{"params": [m.weight]}, {"params": [m.bias], "lr": 0.5, "momentum": 0.9}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[0]["momentum"] == 0.0 and opt.param_groups[1]["momentum"] == 0.9
    with pytest.raises(ValueError, match="more than one"):
        opt.add_param_group({"params": [m.weight]})
    with pytest.raises(ValueError, match="required"):
        optim.SGD(m.parameters())
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(m.parameters(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(m.parameters(), betas=(0.9, 1.5))


def test_zero_grad():
    p = nn.Parameter(np.ones(2))
    opt = optim.SGD([p], lr=0.1)
    p.grad = Tensor(np.ones(2))
    opt.zero_grad(set_to_none=False)
    assert np.all(p.grad.data == 0)
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("factory", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: optim.Adam(ps, lr=0.01, amsgrad=True),
    lambda ps: optim.AdamW([{"params": ps[:1]}, {"params": ps[1:], "weight_decay": 0.0}], lr=0.01),
])
def test_optimizer_state_dict_roundtrip(factory):
    manual_seed(0)
    grads = _grads((4, 3), seed=5)

    def make():
        manual_seed(0)
        return nn.Linear(3, 4, dtype=np.float64)

    def step(model, opt, g):
        model.weight.grad = Tensor(g)
        model.bias.grad = Tensor(g[:, 0].copy())
        opt.step()

    full = make()
    opt_full = factory(list(full.parameters()))
    for g in grads:
        step(full, opt_full, g)

    part = make()
    opt_part = factory(list(part.parameters()))
    for g in grads[:2]:
        step(part, opt_part, g)
    saved_model, saved_opt = part.state_dict(), opt_part.state_dict()
    resumed = make()
    resumed.load_state_dict(saved_model)
    opt_resumed = factory(list(resumed.parameters()))
    opt_resumed.load_state_dict(saved_opt)
    again = opt_resumed.state_dict()
    assert again["param_groups"] == saved_opt["param_groups"]
    for i, st in saved_opt["state"].items():
        for k, v in st.items():
            np.testing.assert_array_equal(again["state"][i][k], v)
    for g in grads[2:]:
        step(resumed, opt_resumed, g)
    for a, b in zip(full.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_step_lr():
    opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    rates = []
    for _ in range(6):
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert rates == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    assert opt.param_groups[0]["lr"] == 0.125


def test_cosine_warmup_and_resume():
    def make():
        opt = optim.SGD([{"params": [nn.Parameter(np.ones(1))]},
                         {"params": [nn.Parameter(np.ones(1))], "lr": 0.5}], lr=1.0)
        return opt, optim.CosineAnnealingWarmup(opt, warmup_steps=3, total_steps=10, min_lr=0.1)

    opt, sched = make()
    rates = []
    for _ in range(12):
        rates.append(sched.get_last_lr())
        sched.step()
    first = [r[0] for r in rates]
    assert first[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert first[3] == pytest.approx(1.0)
    assert first[3:10] == sorted(first[3:10], reverse=True)
    assert first[10] == pytest.approx(0.1) and first[11] == pytest.approx(0.1)
    assert rates[5][1] == pytest.approx(0.1 + 0.4 * 0.5 * (1 + math.cos(math.pi * 2 / 7)))
    # resume from a state_dict mid-way
    opt2, sched2 = make()
    for _ in range(4):
        sched2.step()
    state = sched2.state_dict()
    opt3, sched3 = make()
    sched3.load_state_dict(state)
    assert sched3.get_last_lr() == sched2.get_last_lr()
    assert opt3.param_groups[1]["lr"] == opt2.param_groups[1]["lr"]
    sched2.step()
    sched3.step()
    assert sched3.get_last_lr() == sched2.get_last_lr()
    with pytest.raises(ValueError):
        optim.CosineAnnealingWarmup(opt, warmup_steps=5, total_steps=3)


def test_clip_grad_norm():
    a = nn.Parameter(np.zeros(2))
    b = nn.Parameter(np.zeros((2, 2)))
    c = nn.Parameter(np.zeros(1))  # no grad: ignored
    a.grad = Tensor(np.array([3.0, 0.0]))
    b.grad = Tensor(np.array([[0.0, 4.0], [0.0, 0.0]]))
    total = optim.clip_grad_norm_([a, b, c], max_norm=1.0)
    assert total == pytest.approx(5.0)
    new_norm = np.sqrt((a.grad.data ** 2).sum() + (b.grad.data ** 2).sum())
    assert new_norm == pytest.approx(1.0, rel=1e-5)
    # below the limit: untouched
    assert optim.clip_grad_norm_([a, b], max_norm=10.0) == pytest.approx(1.0, rel=1e-5)
    assert new_norm == pytest.approx(np.sqrt((a.grad.data ** 2).sum() + (b.grad.data ** 2).sum()))
    a.grad = Tensor(np.array([-7.0, 2.0]))
    assert optim.clip_grad_norm_([a], 100.0, norm_type=float("inf")) == 7.0
    assert optim.clip_grad_norm_([a], 100.0, norm_type=1) == pytest.approx(9.0)
    a.grad = Tensor(np.array([np.nan, 1.0]))
    with pytest.raises(RuntimeError, match="norm"):
        optim.clip_grad_norm_([a], 1.0, error_if_nonfinite=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_large_contiguous_params_use_fast_update(dtype):
    # Large contiguous arrays take the BLAS axpy path (when SciPy is present); same result.
    rng = np.random.default_rng(4)
    p0 = rng.normal(size=(80, 70)).astype(dtype)
    grads = [rng.normal(size=(80, 70)).astype(dtype) for _ in range(3)]
    p = nn.Parameter(p0.copy())
    buf = p.data
    opt = optim.SGD([p], lr=0.05, momentum=0.9)
    for g in grads:
        p.grad = Tensor(g.copy())
        opt.step()
    assert p.data is buf
    ref = _sgd_ref(p0.astype(np.float64), [g.astype(np.float64) for g in grads], 0.05, 0.9)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(p.data, ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(p.grad.data, grads[-1])  # the gradient itself is untouched
