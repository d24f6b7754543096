"""Exploring properties of the LR schedulers against closed forms written from torch 2.13's
documentation: random options and two param groups with different rates, ``get_last_lr()`` equal to
the rates in force, ``state_dict`` resumes (through pickle) bitwise, and the documented errors.

``MultiplicativeLR``, ``ConstantLR``, ``PolynomialLR``, ``CosineAnnealingWarmRestarts`` and ``CyclicLR``
(torch has them; ported scripts call them) were added alongside.

Bugs these properties found (pinned below): ``LambdaLR`` refused torch's list of one function per
param group ("'list' object is not callable"), and ``SequentialLR`` with a milestone at 0 started the
first schedule instead of the one that runs at step 0.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch import nn, optim
from neural_arch.optim import lr_scheduler as lrs

BASES = (1.0, 0.5)


def _opt(cls=optim.SGD, **kw):
    kw = {"momentum": 0.9, **kw} if cls is optim.SGD else kw
    return cls([{"params": [nn.Parameter(np.ones(1))], "lr": b} for b in BASES], lr=1.0, **kw)


def _rates(sched, opt, steps, metrics=None):
    """The rates in force before each of ``steps`` training steps (checks ``get_last_lr()`` on the way)."""
    out = []
    for k in range(steps):
        now = [g["lr"] for g in opt.param_groups]
        assert sched.get_last_lr() == now
        out.append(now)
        opt.step()
        sched.step() if metrics is None else sched.step(metrics[k])
    return np.array(out)


def _factors(factor, steps):
    return np.array([[b * factor(t) for b in BASES] for t in range(steps)])


# ---- closed forms ------------------------------------------------------------------------------------

@settings(max_examples=25)
@given(kind=st.sampled_from(["multistep", "exponential", "linear", "step", "lambda_list"]),
       milestones=st.lists(st.integers(0, 12), min_size=0, max_size=4), gamma=st.sampled_from([0.1, 0.5, 0.9]),
       start=st.sampled_from([0.1, 1 / 3, 1.0]), end=st.sampled_from([0.0, 0.5, 1.0]), total=st.integers(1, 8),
       step_size=st.integers(1, 4))
@example(kind="lambda_list", milestones=[], gamma=0.5, start=1.0, end=1.0, total=1, step_size=1)  # used to raise
@example(kind="multistep", milestones=[5, 2, 2, 0], gamma=0.5, start=1.0, end=1.0, total=1, step_size=1)
def test_closed_forms(kind, milestones, gamma, start, end, total, step_size):
    steps = 14
    opt = _opt()
    if kind == "multistep":
        sched = optim.MultiStepLR(opt, milestones, gamma=gamma)
        factors = [_factors(lambda t: gamma ** sum(m <= t for m in milestones), steps)]
    elif kind == "exponential":
        sched = optim.ExponentialLR(opt, gamma=gamma)
        factors = [_factors(lambda t: gamma**t, steps)]
    elif kind == "linear":
        sched = optim.LinearLR(opt, start_factor=start, end_factor=end, total_iters=total)
        factors = [_factors(lambda t: start + (end - start) * min(t, total) / total, steps)]
    elif kind == "step":
        sched = optim.StepLR(opt, step_size=step_size, gamma=gamma)
        factors = [_factors(lambda t: gamma ** (t // step_size), steps)]
    else:  # torch's LambdaLR form: one function per param group
        sched = optim.LambdaLR(opt, [lambda t: gamma**t, lambda t: 1 / (1 + t * step_size)])
        factors = [np.array([[BASES[0] * gamma**t, BASES[1] / (1 + t * step_size)] for t in range(steps)])]
    # a milestone at 0 already applies to the first rate (the construction step is step 0), as in torch
    np.testing.assert_allclose(_rates(sched, opt, steps), factors[0], rtol=1e-12, atol=1e-15)


# ---- the schedules torch has that were missing (MultiplicativeLR, ConstantLR, PolynomialLR,
# CosineAnnealingWarmRestarts, CyclicLR): closed forms from torch's documentation ----------------------

@settings(max_examples=20)
@given(kind=st.sampled_from(["constant", "polynomial", "multiplicative", "chained"]),
       factor=st.sampled_from([0.0, 0.1, 0.5, 1.0]), total=st.integers(0, 6), power=st.sampled_from([0.5, 1.0, 2.0]))
@example(kind="constant", factor=0.0, total=3, power=1.0)  # torch divides by zero at total_iters
@example(kind="constant", factor=0.5, total=0, power=1.0)  # torch keeps base * factor for ever
def test_constant_polynomial_multiplicative_closed_forms(kind, factor, total, power):
    steps = 10
    opt = _opt()
    poly_total = max(total, 1)

    def poly(t):
        return (1 - min(t, poly_total) / poly_total) ** power

    def const(t):
        return factor if t < total else 1.0

    if kind == "constant":
        sched, f = optim.ConstantLR(opt, factor=factor, total_iters=total), const
    elif kind == "polynomial":
        sched, f = optim.PolynomialLR(opt, total_iters=poly_total, power=power), poly
    elif kind == "multiplicative":
        sched = optim.MultiplicativeLR(opt, [lambda t: 0.9, lambda t: 1 / (1 + t)])
        want = np.array([[BASES[0] * 0.9**t, BASES[1] / math.factorial(t + 1)] for t in range(steps)])
        np.testing.assert_allclose(_rates(sched, opt, steps), want, rtol=1e-12)
        return
    else:  # chainable: the factors multiply
        if factor == 0.0:
            return
        sched = optim.ChainedScheduler([optim.ConstantLR(opt, factor=factor, total_iters=total),
                                        optim.PolynomialLR(opt, total_iters=poly_total, power=power)])

        def f(t):
            return const(t) * poly(t)
    np.testing.assert_allclose(_rates(sched, opt, steps), _factors(f, steps), rtol=1e-12, atol=1e-15)


def _sgdr(epoch, t0, t_mult, eta_min, base):
    """torch's documented SGDR rate at a (fractional) epoch: find the period, then the cosine."""
    start, period = 0, t0
    while epoch >= start + period:
        start, period = start + period, period * t_mult
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * (epoch - start) / period)) / 2


@settings(max_examples=12)
@given(t0=st.integers(1, 3), t_mult=st.integers(1, 3), eta_min=st.sampled_from([0.0, 0.1]))
@example(t0=2, t_mult=2, eta_min=0.0)
def test_cosine_warm_restarts_by_step_and_by_fractional_epoch(t0, t_mult, eta_min):
    opt = _opt()
    sched = optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=t0, T_mult=t_mult, eta_min=eta_min)
    want = np.array([[_sgdr(t, t0, t_mult, eta_min, b) for b in BASES] for t in range(20)])
    np.testing.assert_allclose(_rates(sched, opt, 20), want, rtol=1e-12, atol=1e-15)
    # epochs that start a period exactly (6.0 with T_0=2, T_mult=2) are where a float log of the
    # epoch can land below the integer and pick the period before
    for epoch in [0.5, 2.0, 2.25, 6.0, 14.0, 4.999, 30.0, 0.25]:
        sched.step(epoch)
        assert sched.last_epoch == math.floor(epoch)
        np.testing.assert_allclose(sched.get_last_lr(), [_sgdr(epoch, t0, t_mult, eta_min, b) for b in BASES],
                                   rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="T_mult"):
        optim.lr_scheduler.CosineAnnealingWarmRestarts(_opt(), T_0=2, T_mult=0)


def _cyclic_reference(t, base, top, up, down, mode, gamma, mom_lo, mom_hi):
    """Smith's cyclical rate as torch documents it, and the momentum that mirrors it."""
    total = up + down
    cycle = math.floor(1 + t / total)
    x = 1 + t / total - cycle
    height = x / (up / total) if x <= up / total else (x - 1) / (up / total - 1)
    scale = {"triangular": 1.0, "triangular2": 1 / 2 ** (cycle - 1), "exp_range": gamma**t}[mode]
    return base + (top - base) * height * scale, mom_hi - (mom_hi - mom_lo) * height * scale


@settings(max_examples=20)
@given(mode=st.sampled_from(["triangular", "triangular2", "exp_range"]), up=st.integers(1, 4),
       down=st.sampled_from([None, 0, 1, 3]), gamma=st.sampled_from([1.0, 0.9]), adam=st.booleans())
@example(mode="triangular2", up=2, down=0, gamma=1.0, adam=False)  # a saw-tooth: no way down
def test_cyclic_lr_matches_documented_formula(mode, up, down, gamma, adam):
    opt = _opt(optim.Adam) if adam else _opt()
    sched = optim.lr_scheduler.CyclicLR(opt, base_lr=[0.1, 0.05], max_lr=1.0, step_size_up=up, step_size_down=down,
                                        mode=mode, gamma=gamma, base_momentum=[0.8, 0.7], max_momentum=0.95)
    for t in range(16):
        for g, base, mom_lo in zip(opt.param_groups, (0.1, 0.05), (0.8, 0.7)):
            lr, mom = _cyclic_reference(t, base, 1.0, up, up if down is None else down, mode, gamma, mom_lo, 0.95)
            np.testing.assert_allclose(g["lr"], lr, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(g["betas"][0] if adam else g["momentum"], mom, rtol=1e-12, atol=1e-15)
        assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
    with pytest.raises(ValueError, match="cycle_momentum"):
        optim.lr_scheduler.CyclicLR(optim.Adagrad([nn.Parameter(np.ones(1))]), 0.1, 1.0)


def test_multiplicative_lr_restarted_by_sequential_lr_applies_its_step_0_factor():
    """torch: a restart at a milestone is not the construction step, so ``lr_lambda(0)`` applies."""
    opt = _opt()
    sched = optim.SequentialLR(opt, [optim.PolynomialLR(opt, total_iters=5, power=2.0),
                                     optim.MultiplicativeLR(opt, lambda t: 0.5)], [3])
    f = [1.0, 0.64, 0.36] + [0.36 * 0.5 ** (t - 2) for t in range(3, 8)]
    np.testing.assert_allclose(_rates(sched, opt, 8), _factors(lambda t: f[t], 8), rtol=1e-12)


def test_lambda_lr_list_must_have_one_function_per_group():
    with pytest.raises(ValueError, match="expected 2 lr_lambdas"):
        optim.LambdaLR(_opt(), [lambda t: 1.0])


def _one_cycle_reference(total, max_lr, pct, strategy, div, final_div, three_phase, mom_lo, mom_hi):
    """torch.optim.lr_scheduler.OneCycleLR's documented phases, rate and momentum at each step."""
    lo = max_lr / div
    end = lo / final_div

    def anneal(a, b, x):
        return b + (a - b) / 2 * (math.cos(math.pi * x) + 1) if strategy == "cos" else (b - a) * x + a

    if three_phase:
        phases = [(float(pct * total) - 1, lo, max_lr, mom_hi, mom_lo),
                  (float(2 * pct * total) - 2, max_lr, lo, mom_lo, mom_hi),
                  (total - 1, lo, end, mom_hi, mom_hi)]
    else:
        phases = [(float(pct * total) - 1, lo, max_lr, mom_hi, mom_lo), (total - 1, max_lr, end, mom_lo, mom_hi)]
    out = []
    for t in range(total):
        start = 0.0
        for i, (stop, a, b, ma, mb) in enumerate(phases):
            if t <= stop or i == len(phases) - 1:
                x = (t - start) / (stop - start)
                out.append((anneal(a, b, x), anneal(ma, mb, x)))
                break
            start = stop
    return np.array(out)


@settings(max_examples=20)
@given(total=st.integers(6, 25), pct=st.sampled_from([0.25, 0.3, 0.4]), strategy=st.sampled_from(["cos", "linear"]),
       div=st.sampled_from([25.0, 4.0]), final_div=st.sampled_from([1e4, 10.0]), three_phase=st.booleans(),
       adam=st.booleans(), by_epochs=st.booleans())
@example(total=10, pct=0.3, strategy="linear", div=4.0, final_div=10.0, three_phase=True, adam=True, by_epochs=True)
def test_one_cycle_matches_documented_phases(total, pct, strategy, div, final_div, three_phase, adam, by_epochs):
    opt = _opt(optim.Adam) if adam else _opt()
    size = {"epochs": 2, "steps_per_epoch": total // 2} if by_epochs else {"total_steps": total}
    total = total // 2 * 2 if by_epochs else total
    sched = optim.OneCycleLR(opt, max_lr=[2.0, 1.0], pct_start=pct, anneal_strategy=strategy, div_factor=div,
                             final_div_factor=final_div, three_phase=three_phase, base_momentum=[0.8, 0.7],
                             max_momentum=0.95, **size)
    rates, moms = [], []
    for _ in range(total):
        rates.append([g["lr"] for g in opt.param_groups])
        moms.append([g["betas"][0] if adam else g["momentum"] for g in opt.param_groups])
        assert sched.get_last_lr() == rates[-1]
        opt.step()
        sched.step() if len(rates) < total else None
    for k, (top, mom_lo) in enumerate([(2.0, 0.8), (1.0, 0.7)]):
        want = _one_cycle_reference(total, top, pct, strategy, div, final_div, three_phase, mom_lo, 0.95)
        np.testing.assert_allclose(np.array(rates)[:, k], want[:, 0], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(np.array(moms)[:, k], want[:, 1], rtol=1e-12, atol=1e-15)
    sched.step()  # the step after the last one: torch allows it (last_epoch == total_steps) ...
    with pytest.raises(ValueError, match="total_steps"):
        sched.step()  # ... and raises on the one after


# ---- ReduceLROnPlateau ---------------------------------------------------------------------------------

def _plateau_reference(metrics, mode, factor, patience, threshold, threshold_mode, cooldown, min_lrs, eps):
    """torch's documented rule, the rates after each ``step(metric)``."""
    lrs = list(BASES)
    best = math.inf if mode == "min" else -math.inf
    bad = cool = 0
    out = []
    for a in metrics:
        if mode == "min":
            better = a < (best * (1 - threshold) if threshold_mode == "rel" else best - threshold)
        else:
            better = a > (best * (1 + threshold) if threshold_mode == "rel" else best + threshold)
        best, bad = (a, 0) if better else (best, bad + 1)
        if cool > 0:
            cool, bad = cool - 1, 0
        if bad > patience:
            for i, lr in enumerate(lrs):
                new = max(lr * factor, min_lrs[i])
                lrs[i] = new if lr - new > eps else lr
            cool, bad = cooldown, 0
        out.append(list(lrs))
    return np.array(out)


@settings(max_examples=25)
@given(metrics=st.lists(st.sampled_from([1.0, 0.999, 0.95, 1.2, 0.5, -0.3, -1.0]), min_size=1, max_size=25),
       mode=st.sampled_from(["min", "max"]), factor=st.sampled_from([0.1, 0.5]), patience=st.integers(0, 3),
       threshold=st.sampled_from([1e-4, 0.1]), threshold_mode=st.sampled_from(["rel", "abs"]),
       cooldown=st.integers(0, 2), min_lr=st.sampled_from([0.0, 0.2, (0.3, 0.01)]), eps=st.sampled_from([1e-8, 0.2]))
def test_reduce_on_plateau_matches_documented_rule(metrics, mode, factor, patience, threshold, threshold_mode,
                                                   cooldown, min_lr, eps):
    opt = _opt()
    sched = optim.ReduceLROnPlateau(opt, mode=mode, factor=factor, patience=patience, threshold=threshold,
                                    threshold_mode=threshold_mode, cooldown=cooldown,
                                    min_lr=list(min_lr) if isinstance(min_lr, tuple) else min_lr, eps=eps)
    got = []
    for m in metrics:
        opt.step()
        sched.step(m)
        got.append([g["lr"] for g in opt.param_groups])
        assert sched.get_last_lr() == got[-1]
    min_lrs = list(min_lr) if isinstance(min_lr, tuple) else [min_lr] * 2
    want = _plateau_reference(metrics, mode, factor, patience, threshold, threshold_mode, cooldown, min_lrs, eps)
    np.testing.assert_array_equal(np.array(got), want)


# ---- SequentialLR ------------------------------------------------------------------------------------

SEQUENTIAL = {
    # milestone 0: the second schedule runs from step 0 (torch 2.13 starts the one that bisect picks)
    "milestone_0": (lambda o: optim.SequentialLR(o, [optim.ExponentialLR(o, 0.5), optim.StepLR(o, 2, 0.5)], [0]),
                    lambda t: 0.5 ** (t // 2)),
    "milestones_0_3": (lambda o: optim.SequentialLR(o, [optim.ExponentialLR(o, 0.5), optim.LinearLR(o, 0.5, total_iters=2),
                                                        optim.ExponentialLR(o, 0.9)], [0, 3]),
                       lambda t: 0.9 ** (t - 3) if t >= 3 else 0.5 + 0.5 * min(t, 2) / 2),
}


@pytest.mark.parametrize("name", sorted(SEQUENTIAL))
def test_sequential_lr_with_a_milestone_at_0(name):
    make, factor = SEQUENTIAL[name]
    opt = _opt()
    np.testing.assert_allclose(_rates(make(opt), opt, 10), _factors(factor, 10), rtol=1e-12, atol=1e-15)


# ---- state dicts, and the order of the step calls ------------------------------------------------------

RESUMABLE = {
    "lambda_list": lambda o: optim.LambdaLR(o, [lambda t: 0.9**t, lambda t: 1 / (t + 1)]),
    "multistep": lambda o: optim.MultiStepLR(o, [3, 1, 3], 0.5),
    "linear": lambda o: optim.LinearLR(o, 0.2, 0.9, 4),
    "onecycle_three_phase": lambda o: optim.OneCycleLR(o, [1.0, 2.0], total_steps=12, three_phase=True,
                                                       anneal_strategy="linear"),
    "sequential_milestone_0": SEQUENTIAL["milestones_0_3"][0],
    "plateau": lambda o: optim.ReduceLROnPlateau(o, patience=1, cooldown=1, factor=0.5, min_lr=[0.1, 0.2]),
    "multiplicative": lambda o: optim.MultiplicativeLR(o, [lambda t: 0.9, lambda t: 0.5]),
    "constant_polynomial": lambda o: optim.ChainedScheduler([optim.ConstantLR(o, 0.5, 3), optim.PolynomialLR(o, 8, 2.0)]),
    "warm_restarts": lambda o: optim.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2, eta_min=0.01),
    "cyclic": lambda o: optim.CyclicLR(o, [0.1, 0.05], 1.0, step_size_up=3, mode="triangular2"),
}
METRICS = [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4]


@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_scheduler_resume_through_pickle_is_bitwise(name):
    make = RESUMABLE[name]
    metrics = METRICS if name == "plateau" else None
    opt = _opt()
    straight = _rates(make(opt), opt, 11, metrics)
    for cut in (2, 5):
        opt = _opt()
        sched = make(opt)
        head = _rates(sched, opt, cut, metrics)
        saved = pickle.loads(pickle.dumps((opt.state_dict(), sched.state_dict())))
        opt2 = _opt()
        sched2 = make(opt2)  # torch's order: build, then load both
        opt2.load_state_dict(copy.deepcopy(saved[0]))
        sched2.load_state_dict(saved[1])
        tail = _rates(sched2, opt2, 11 - cut, None if metrics is None else metrics[cut:])
        np.testing.assert_array_equal(np.concatenate([head, tail]), straight)


@pytest.mark.parametrize("name", ["lambda_list", "linear", "onecycle_three_phase", "sequential_milestone_0"])
def test_scheduler_step_before_optimizer_step_gives_the_same_rates(name):
    """torch warns about this order (the first rate of the schedule is then never used for an update),
    but the rates themselves do not depend on it."""
    make = RESUMABLE[name]
    a, b = _opt(), _opt()
    sa, sb = make(a), make(b)
    for _ in range(8):
        sa.step()
        a.step()
        b.step()
        sb.step()
        assert [g["lr"] for g in a.param_groups] == [g["lr"] for g in b.param_groups]


@pytest.mark.parametrize("name", ["exponential", "multiplicative", "linear", "polynomial"])
def test_resume_with_last_epoch_keeps_the_loaded_rate(name):
    """torch 2.13: a recursive schedule built with ``last_epoch=k`` over a loaded optimizer leaves the
    loaded rate in force (its construction step does not scale it again); ours skipped a step."""
    make = {"exponential": lambda o, e: optim.ExponentialLR(o, 0.8, last_epoch=e),
            "multiplicative": lambda o, e: optim.MultiplicativeLR(o, lambda t: 0.8, last_epoch=e),
            "linear": lambda o, e: optim.LinearLR(o, 0.2, 0.9, 4, last_epoch=e),
            "polynomial": lambda o, e: optim.PolynomialLR(o, 6, 2.0, last_epoch=e)}[name]
    opt = _opt()
    straight = _rates(make(opt, -1), opt, 7)
    opt = _opt()
    _rates(make(opt, -1), opt, 3)
    opt2 = _opt()
    opt2.load_state_dict(opt.state_dict())
    resumed = _rates(make(opt2, 3), opt2, 4)
    np.testing.assert_array_equal(resumed[0], straight[3])
    if name in ("exponential", "multiplicative"):  # a constant ratio: the whole sequence goes on unchanged
        np.testing.assert_allclose(resumed, straight[3:], rtol=1e-12)


def test_resume_with_last_epoch_needs_initial_lr():
    with pytest.raises(KeyError, match="initial_lr"):
        optim.ExponentialLR(_opt(), 0.9, last_epoch=3)
    with pytest.raises(KeyError, match="initial_lr"):
        lrs.LambdaLR(_opt(), lambda t: 1.0, last_epoch=0)
