"""Exploring properties: optimizers and LR schedulers against torch's documented formulas in NumPy.

Each optimizer runs a few steps over parameters of assorted shapes (0-d, size 1, odd sizes) and
dtypes, with a fresh gradient per step, and is compared with a plain per-tensor NumPy reference
written from torch's documentation. Schedulers are compared with their closed forms, alone and
composed (``ChainedScheduler`` multiplies chainable factors, as torch's does). State dicts must
resume bitwise.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from optim_references import rmsprop_ref

from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor

SHAPES = [(), (1,), (3,), (2, 3), (5, 1)]
TOL = {np.float64: 1e-10, np.float32: 2e-5}


def _problem(seed, dtype, n_params, steps):
    rng = np.random.default_rng(seed)
    shapes = [SHAPES[(seed + i) % len(SHAPES)] for i in range(n_params)]
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    return init, grads


def _run(make_opt, init, grads, dtype):
    params = [nn.Parameter(np.array(a, dtype=dtype, copy=True)) for a in init]
    opt = make_opt(params)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = Tensor(np.array(g, copy=True))
        opt.step()
    return [p.data for p in params], opt, params


# ---- NumPy references (torch's documented algorithms, one tensor at a time, float64) ----

def _ref_sgd(p, gs, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False):
    p, buf = p.astype(np.float64), None
    for g in gs:
        g = g.astype(np.float64)
        g = -g if maximize else g
        g = g + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def _ref_adam(p, gs, lr, betas, eps, weight_decay, amsgrad, decoupled, maximize=False):
    p = p.astype(np.float64)
    m, v, vmax = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(gs, 1):
        g = g.astype(np.float64)
        g = -g if maximize else g
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v)
        denom = np.sqrt(vmax if amsgrad else v) / math.sqrt(1 - b2**t) + eps
        p = p - lr / (1 - b1**t) * m / denom
    return p


def _ref_adagrad(p, gs, lr, lr_decay, weight_decay, init_acc, eps):
    p = p.astype(np.float64)
    s = np.full_like(p, init_acc)
    for t, g in enumerate(gs, 1):
        g = g.astype(np.float64) + weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g
        p = p - clr * g / (np.sqrt(s) + eps)
    return p


def _check(got, init, grads, ref, dtype):
    for i, (a, p0) in enumerate(zip(got, init)):
        assert a.dtype == dtype and a.shape == p0.shape
        want = ref(p0, [gs[i] for gs in grads])
        np.testing.assert_allclose(a, want, rtol=TOL[dtype], atol=TOL[dtype])


DTYPES = st.sampled_from([np.float64, np.float32])
SEEDS = st.integers(0, 10_000)


@settings(max_examples=20)
@given(seed=SEEDS, dtype=DTYPES, n=st.integers(1, 4), momentum=st.sampled_from([0.0, 0.9]),
       dampening=st.sampled_from([0.0, 0.5]), wd=st.sampled_from([0.0, 0.1]), nesterov=st.booleans(),
       maximize=st.booleans())
@example(seed=0, dtype=np.float64, n=2, momentum=0.9, dampening=0.0, wd=0.1, nesterov=False, maximize=True)
def test_sgd_matches_torch_formula(seed, dtype, n, momentum, dampening, wd, nesterov, maximize):
    if nesterov and (momentum == 0 or dampening != 0):
        with pytest.raises(ValueError, match="nesterov"):
            optim.SGD([nn.Parameter(np.ones(2))], lr=0.1, momentum=momentum, dampening=dampening, nesterov=True)
        return
    init, grads = _problem(seed, dtype, n, 3)
    kw = {"lr": 0.1, "momentum": momentum, "dampening": dampening, "weight_decay": wd, "nesterov": nesterov, "maximize": maximize}
    got, _, _ = _run(lambda ps: optim.SGD(ps, **kw), init, grads, dtype)
    _check(got, init, grads, lambda p, gs: _ref_sgd(p, gs, **kw), dtype)


@settings(max_examples=20)
@given(seed=SEEDS, dtype=DTYPES, n=st.integers(1, 4), wd=st.sampled_from([0.0, 0.05]), amsgrad=st.booleans(),
       decoupled=st.booleans(), maximize=st.booleans(), foreach=st.sampled_from([None, False, True]))
@example(seed=1, dtype=np.float64, n=3, wd=0.05, amsgrad=True, decoupled=True, maximize=True, foreach=None)
def test_adam_adamw_match_torch_formula(seed, dtype, n, wd, amsgrad, decoupled, maximize, foreach):
    init, grads = _problem(seed, dtype, n, 4)
    cls = optim.AdamW if decoupled else optim.Adam
    kw = {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": wd, "amsgrad": amsgrad}
    got, _, _ = _run(lambda ps: cls(ps, foreach=foreach, maximize=maximize, **kw), init, grads, dtype)
    _check(got, init, grads, lambda p, gs: _ref_adam(p, gs, decoupled=decoupled, maximize=maximize, **kw), dtype)


@settings(max_examples=15)
@given(seed=SEEDS, dtype=DTYPES, n=st.integers(1, 4), wd=st.sampled_from([0.0, 0.1]),
       momentum=st.sampled_from([0.0, 0.5]), centered=st.booleans(), foreach=st.sampled_from([None, False]))
def test_rmsprop_matches_torch_formula(seed, dtype, n, wd, momentum, centered, foreach):
    init, grads = _problem(seed, dtype, n, 3)
    kw = {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "weight_decay": wd, "momentum": momentum, "centered": centered}
    got, _, _ = _run(lambda ps: optim.RMSprop(ps, foreach=foreach, **kw), init, grads, dtype)
    _check(got, init, grads, lambda p, gs: rmsprop_ref(p.astype(np.float64), [g.astype(np.float64) for g in gs], kw["lr"], kw["alpha"],
                                                       kw["eps"], wd, momentum, centered), dtype)


@settings(max_examples=15)
@given(seed=SEEDS, dtype=DTYPES, n=st.integers(1, 4), lr_decay=st.sampled_from([0.0, 0.1]),
       wd=st.sampled_from([0.0, 0.1]), init_acc=st.sampled_from([0.0, 0.5]))
def test_adagrad_matches_torch_formula(seed, dtype, n, lr_decay, wd, init_acc):
    init, grads = _problem(seed, dtype, n, 3)
    kw = {"lr": 0.1, "lr_decay": lr_decay, "weight_decay": wd, "initial_accumulator_value": init_acc, "eps": 1e-10}
    got, _, _ = _run(lambda ps: optim.Adagrad(ps, **kw), init, grads, dtype)
    _check(got, init, grads, lambda p, gs: _ref_adagrad(p, gs, lr=0.1, lr_decay=lr_decay, weight_decay=wd,
                                                         init_acc=init_acc, eps=1e-10), dtype)


MAKERS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda ps: optim.Adam(ps, lr=0.01, amsgrad=True),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01),
    "rmsprop": lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda ps: optim.Adagrad(ps, lr=0.1, lr_decay=0.01),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_optimizer_state_dict_resumes_bitwise(name):
    init, grads = _problem(7, np.float64, 4, 5)
    straight, _, _ = _run(MAKERS[name], init, grads, np.float64)
    first, opt, _ = _run(MAKERS[name], init, grads[:2], np.float64)
    saved = copy.deepcopy(opt.state_dict())
    params2 = [nn.Parameter(a.copy()) for a in first]
    opt2 = MAKERS[name](params2)
    opt2.load_state_dict(saved)
    for step_grads in grads[2:]:
        for p, g in zip(params2, step_grads):
            p.grad = Tensor(g.copy())
        opt2.step()
    for a, b in zip(straight, params2):
        np.testing.assert_array_equal(a, b.data)


# ---- schedulers ----------------------------------------------------------------------------------

def _rates(sched, opt, steps):
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return np.array(out)


def _opt(lrs=(1.0, 0.5)):
    return optim.SGD([{"params": [nn.Parameter(np.ones(1))], "lr": lr} for lr in lrs], lr=1.0, momentum=0.9)


CLOSED = {
    "step": (lambda o: optim.StepLR(o, step_size=3, gamma=0.5), lambda t: 0.5 ** (t // 3)),
    "multistep": (lambda o: optim.MultiStepLR(o, [2, 5, 5], gamma=0.1), lambda t: 0.1 ** sum(m <= t for m in [2, 5, 5])),
    "exponential": (lambda o: optim.ExponentialLR(o, gamma=0.9), lambda t: 0.9**t),
    "linear": (lambda o: optim.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4),
               lambda t: 0.25 + 0.75 * min(t, 4) / 4),
    "cosine": (lambda o: optim.lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.0),
               lambda t: 0.5 * (1 + math.cos(math.pi * t / 5))),
}


@pytest.mark.parametrize("name", sorted(CLOSED))
def test_scheduler_matches_closed_form(name):
    make, factor = CLOSED[name]
    opt = _opt()
    got = _rates(make(opt), opt, 9)
    want = np.array([[b * factor(t) for b in (1.0, 0.5)] for t in range(9)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@settings(max_examples=15)
@given(a=st.sampled_from(sorted(CLOSED)), b=st.sampled_from(sorted(CLOSED)))
@example(a="step", b="exponential")  # StepLR used to reset to base * gamma**k, erasing the other factor
def test_chained_scheduler_multiplies_factors(a, b):
    """torch: chainable schedulers compose multiplicatively (cosine's recursion composes only with itself
    approximately, so it is paired with none)."""
    if "cosine" in (a, b):
        return
    opt = _opt()
    sched = optim.ChainedScheduler([CLOSED[a][0](opt), CLOSED[b][0](opt)])
    got = _rates(sched, opt, 9)
    fa, fb = CLOSED[a][1], CLOSED[b][1]
    want = np.array([[base * fa(t) * fb(t) for base in (1.0, 0.5)] for t in range(9)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_sequential_lr_restarts_each_schedule():
    opt = _opt()
    warm = optim.LinearLR(opt, start_factor=0.5, total_iters=2)
    decay = optim.StepLR(opt, step_size=2, gamma=0.1)
    got = _rates(optim.SequentialLR(opt, [warm, decay], milestones=[3]), opt, 8)
    f = [0.5, 0.75, 1.0] + [0.1 ** ((t - 3) // 2) for t in range(3, 8)]
    np.testing.assert_allclose(got, np.array([[1.0 * x, 0.5 * x] for x in f]), rtol=1e-12)


@settings(max_examples=10)
@given(total=st.integers(2, 30), pct=st.sampled_from([0.1, 0.3, 0.5]), strategy=st.sampled_from(["cos", "linear"]))
def test_one_cycle_matches_formula(total, pct, strategy):
    opt = optim.SGD([nn.Parameter(np.ones(1))], lr=1.0, momentum=0.9)
    sched = optim.OneCycleLR(opt, max_lr=1.0, total_steps=total, pct_start=pct, anneal_strategy=strategy)
    got = _rates(sched, opt, total)[:, 0]
    lo, hi, end = 1.0 / 25, 1.0, 1.0 / 25 / 1e4
    up = float(pct * total) - 1

    def anneal(a, b, x):
        return b + (a - b) / 2 * (math.cos(math.pi * x) + 1) if strategy == "cos" else (b - a) * x + a

    want = [anneal(lo, hi, t / up) if t <= up else anneal(hi, end, (t - up) / (total - 1 - up)) for t in range(total)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="total_steps"):
        sched.step()


@pytest.mark.parametrize("total, pct", [(1, 1.0), (2, 0.5), (4, 1.0)])
def test_one_cycle_with_an_empty_phase_is_a_clear_error(total, pct):
    """torch raises ZeroDivisionError from inside its formula; say which argument to change."""
    opt = optim.SGD([nn.Parameter(np.ones(1))], lr=1.0, momentum=0.9)
    with pytest.raises(ValueError, match="pct_start"):
        sched = optim.OneCycleLR(opt, max_lr=1.0, total_steps=total, pct_start=pct)
        for _ in range(total):
            sched.step()


def test_reduce_on_plateau_patience_cooldown_min_lr():
    opt = _opt((1.0, 0.5))
    sched = optim.ReduceLROnPlateau(opt, factor=0.5, patience=1, cooldown=1, min_lr=[0.2, 0.2])
    seen = []
    for metric in [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5]:
        sched.step(metric)
        seen.append([g["lr"] for g in opt.param_groups])
    # bad epochs: 1, 2 (> patience: cut, cooldown 1), cooldown swallows one, 1, 2 (cut), ...
    assert seen[:3] == [[1.0, 0.5], [1.0, 0.5], [0.5, 0.25]]
    assert seen[5] == [0.25, 0.2] and min(min(r) for r in seen) == 0.2


@pytest.mark.parametrize("name", ["step", "multistep", "exponential", "linear", "cosine"])
def test_scheduler_state_dict_resumes_exactly(name):
    make, _ = CLOSED[name]
    opt = _opt()
    straight = _rates(make(opt), opt, 8)
    opt = _opt()
    sched = make(opt)
    head = _rates(sched, opt, 3)
    sd, osd = copy.deepcopy(sched.state_dict()), copy.deepcopy(opt.state_dict())
    opt2 = _opt()
    opt2.load_state_dict(osd)
    sched2 = make(opt2)
    sched2.load_state_dict(sd)
    tail = _rates(sched2, opt2, 5)
    np.testing.assert_array_equal(np.concatenate([head, tail]), straight)


# ---- gradient clipping ---------------------------------------------------------------------------

@settings(max_examples=20)
@given(seed=SEEDS, dtype=st.sampled_from([np.float64, np.float32, np.float16]),
       norm_type=st.sampled_from([2.0, 1.0, 3.0, math.inf]), max_norm=st.sampled_from([0.5, 1e4]),
       magnitude=st.sampled_from([1e-3, 1.0, 300.0]))
@example(seed=0, dtype=np.float16, norm_type=2.0, max_norm=1.0, magnitude=300.0)  # squares overflow float16
def test_clip_grad_norm_matches_float64_reference(seed, dtype, norm_type, max_norm, magnitude):
    """torch's rule: ``total = ||(||g_i||)||``, every gradient times ``min(1, max_norm / (total + 1e-6))``.
    float16 gradients of a few hundred used to give a norm of inf (squares summed in float16), and
    the clip then zeroed every gradient without a word."""
    rng = np.random.default_rng(seed)
    grads = [(magnitude * rng.standard_normal(s)).astype(dtype) for s in [(4,), (2, 3), ()]]
    params = [nn.Parameter(np.zeros(g.shape, dtype)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = Tensor(g.copy())
    total = optim.clip_grad_norm_(params, max_norm, norm_type)
    wide = [g.astype(np.float64).ravel() for g in grads]
    want_total = max(np.abs(w).max() for w in wide) if math.isinf(norm_type) else \
        sum((np.abs(w) ** norm_type).sum() for w in wide) ** (1 / norm_type)
    rtol = {np.float64: 1e-12, np.float32: 1e-6, np.float16: 1e-6}[dtype]  # the norm is taken in >= float32
    assert math.isfinite(float(total))
    np.testing.assert_allclose(float(total), want_total, rtol=rtol)
    coef = min(1.0, max_norm / (want_total + 1e-6))
    for p, g in zip(params, grads):
        want = (g.astype(np.float64) * coef)
        np.testing.assert_allclose(p.grad.data.astype(np.float64), want, rtol=2e-3 if dtype == np.float16 else 1e-6,
                                   atol=1e-3 * coef * magnitude if dtype == np.float16 else 0)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_gradient_of_another_dtype_and_0d_parameters(name):
    """float32 parameters (one 0-d) with float64 gradients take the per-tensor path; Adam's kernel
    used to fail there on the 0-d one with NumPy's 'return arrays must be of ArrayType'."""
    init, grads = _problem(3, np.float32, 3, 3)
    assert any(a.ndim == 0 for a in init)
    wide = [[g.astype(np.float64) for g in gs] for gs in grads]
    got, _, _ = _run(MAKERS[name], init, wide, np.float32)
    want, _, _ = _run(MAKERS[name], [a.astype(np.float64) for a in init], wide, np.float64)
    for a, b in zip(got, want):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


COMPOSITE = {
    "chained": lambda o: optim.ChainedScheduler([optim.StepLR(o, 2, 0.5), optim.ExponentialLR(o, 0.9)]),
    "sequential": lambda o: optim.SequentialLR(
        o, [optim.LinearLR(o, 0.5, total_iters=2), optim.lr_scheduler.CosineAnnealingLR(o, 5)], [3]),
    "onecycle": lambda o: optim.OneCycleLR(o, 1.0, total_steps=10),
}


@pytest.mark.parametrize("name", sorted(COMPOSITE))
@pytest.mark.parametrize("cut", [1, 3, 6])
def test_composite_scheduler_state_dict_resumes_exactly(name, cut):
    make = COMPOSITE[name]
    opt = _opt()
    straight = _rates(make(opt), opt, 9)
    opt = _opt()
    sched = make(opt)
    head = _rates(sched, opt, cut)
    sd, osd = copy.deepcopy(sched.state_dict()), copy.deepcopy(opt.state_dict())
    opt2 = _opt()
    opt2.load_state_dict(osd)
    sched2 = make(opt2)
    sched2.load_state_dict(sd)
    np.testing.assert_array_equal(np.concatenate([head, _rates(sched2, opt2, 9 - cut)]), straight)
