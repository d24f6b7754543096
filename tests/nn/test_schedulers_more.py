"""LinearLR, MultiStepLR, ExponentialLR, OneCycleLR, ReduceLROnPlateau, SequentialLR and
ChainedScheduler: step-for-step sequences written out from torch.optim.lr_scheduler's documented
definitions, and state_dict resume."""

import math

import numpy as np
import pytest

from neural_arch import nn, optim


def _opt(lr=1.0, cls=optim.SGD, **kw):
    return cls([nn.Parameter(np.zeros(2))], lr=lr, **kw)


def _seq(sched, n, key="lr"):
    """The value of ``group[key]`` at construction and after each of ``n`` steps."""
    out = [sched.optimizer.param_groups[0][key]]
    for _ in range(n):
        sched.step()
        out.append(sched.optimizer.param_groups[0][key])
    return out


def _cos(start, end, pct):
    return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)


SEQUENCES = [
    (lambda o: optim.LinearLR(o, start_factor=0.25, total_iters=3), [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
    (lambda o: optim.LinearLR(o, start_factor=1.0, end_factor=0.5, total_iters=2), [1.0, 0.75, 0.5, 0.5]),
    (lambda o: optim.LinearLR(o), [1 / 3, 1 / 3 + 2 / 15, 1 / 3 + 4 / 15, 1 / 3 + 6 / 15, 1 / 3 + 8 / 15, 1.0, 1.0]),
    (lambda o: optim.MultiStepLR(o, milestones=[2, 4], gamma=0.1), [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]),
    (lambda o: optim.MultiStepLR(o, milestones=[1, 1, 3], gamma=0.5), [1.0, 0.25, 0.25, 0.125]),
    (lambda o: optim.ExponentialLR(o, gamma=0.5), [1.0, 0.5, 0.25, 0.125]),
    # Two-phase cosine 1cycle, 10 steps: up over steps 0..2 (end_step = 0.3*10 - 1), down over 2..9.
    (lambda o: optim.OneCycleLR(o, max_lr=1.0, total_steps=10),
     [0.04, 0.52, 1.0] + [_cos(1.0, 0.04 / 1e4, (s - 2) / 7) for s in range(3, 11)]),
    (lambda o: optim.OneCycleLR(o, max_lr=2.0, epochs=2, steps_per_epoch=3, pct_start=0.5,
                                anneal_strategy="linear", div_factor=4, final_div_factor=10),
     [0.5, 1.25, 2.0, 2.0 + (0.05 - 2.0) / 3, 2.0 + 2 * (0.05 - 2.0) / 3, 0.05, 0.05 + (0.05 - 2.0) / 3]),
    # Three-phase linear: end steps 2, 4, 9 (float(0.3*10) - 1, float(2*0.3*10) - 2, 10 - 1).
    (lambda o: optim.OneCycleLR(o, max_lr=1.0, total_steps=10, anneal_strategy="linear", three_phase=True),
     [0.04, 0.52, 1.0, 0.52, 0.04] + [0.04 + (4e-6 - 0.04) * k / 5 for k in range(1, 7)]),
    # SequentialLR: the second schedule restarts at its own step 0 at the milestone (torch's step(0)).
    (lambda o: optim.SequentialLR(o, [optim.LinearLR(o, start_factor=0.5, total_iters=2),
                                      optim.ExponentialLR(o, gamma=0.5)], milestones=[2]),
     [0.5, 0.75, 1.0, 0.5, 0.25, 0.125]),
    (lambda o: optim.SequentialLR(o, [optim.ExponentialLR(o, gamma=0.9), optim.MultiStepLR(o, [1], 0.1),
                                      optim.LinearLR(o, start_factor=0.5, total_iters=1)], milestones=[2, 4]),
     [1.0, 0.9, 1.0, 0.1, 0.5, 1.0, 1.0]),
    # ChainedScheduler: the factors multiply, linear(t) * 0.9**t.
    (lambda o: optim.ChainedScheduler([optim.LinearLR(o, start_factor=0.5, total_iters=2),
                                       optim.ExponentialLR(o, gamma=0.9)]),
     [0.5, 0.75 * 0.9, 0.81, 0.729, 0.6561]),
    (lambda o: optim.ChainedScheduler([optim.MultiStepLR(o, [2], gamma=0.1), optim.ExponentialLR(o, gamma=0.5)]),
     [1.0, 0.5, 0.025, 0.0125]),
]


@pytest.mark.parametrize("i", range(len(SEQUENCES)))
def test_sequences_match_torch_definitions(i):
    make, want = SEQUENCES[i]
    sched = make(_opt())
    got = _seq(sched, len(want) - 1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert sched.get_last_lr() == [got[-1]]


def test_onecycle_cycles_momentum_and_beta1_and_stops_at_total_steps():
    opt = _opt(momentum=0.9)
    sched = optim.OneCycleLR(opt, max_lr=1.0, total_steps=10, anneal_strategy="linear", three_phase=True)
    np.testing.assert_allclose(_seq(sched, 10, "momentum"), [0.95, 0.9, 0.85, 0.9] + [0.95] * 7, rtol=1e-12)
    with pytest.raises(ValueError, match="total_steps is 10"):
        sched.step()
    adam = _opt(cls=optim.Adam, lr=0.1)
    optim.OneCycleLR(adam, max_lr=0.1, total_steps=4, base_momentum=0.8, max_momentum=0.9)
    assert adam.param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="momentum"):
        optim.OneCycleLR(_opt(cls=optim.Adagrad), max_lr=1.0, total_steps=3)


def test_reduce_on_plateau_patience_cooldown_min_lr():
    sched = optim.ReduceLROnPlateau(_opt(), factor=0.5, patience=1, cooldown=1)
    lrs = []
    for loss in [5, 4, 4, 4, 4, 4, 4]:
        sched.step(loss)
        lrs.append(sched.get_last_lr()[0])
    assert lrs == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    sched = optim.ReduceLROnPlateau(_opt(), mode="max", factor=0.5, patience=0, threshold=0.1,
                                    threshold_mode="abs", min_lr=0.3)
    lrs = []
    for acc in [1.0, 1.05, 1.2, 1.2, 1.2]:
        sched.step(acc)
        lrs.append(sched.get_last_lr()[0])
    assert lrs == [1.0, 0.5, 0.5, 0.3, 0.3]
    with pytest.raises(ValueError, match="factor must be < 1.0"):
        optim.ReduceLROnPlateau(_opt(), factor=1.0)


RESUMABLE = [
    lambda o: optim.LinearLR(o, start_factor=0.2, total_iters=4),
    lambda o: optim.MultiStepLR(o, milestones=[1, 3], gamma=0.5),
    lambda o: optim.ExponentialLR(o, gamma=0.8),
    lambda o: optim.OneCycleLR(o, max_lr=1.0, total_steps=8),
    lambda o: optim.SequentialLR(o, [optim.LinearLR(o, start_factor=0.5, total_iters=2),
                                     optim.ExponentialLR(o, gamma=0.5)], milestones=[2]),
    lambda o: optim.SequentialLR(o, [optim.ExponentialLR(o, gamma=0.5),
                                     optim.LinearLR(o, start_factor=0.1, total_iters=2)], milestones=[5]),
    lambda o: optim.ChainedScheduler([optim.LinearLR(o, start_factor=0.5, total_iters=3),
                                      optim.ExponentialLR(o, gamma=0.9)]),
]


@pytest.mark.parametrize("i", range(len(RESUMABLE)))
def test_state_dict_resume(i):
    make = RESUMABLE[i]
    opt = _opt(momentum=0.9)
    full = _seq(make(opt), 6)
    opt = _opt(momentum=0.9)
    sched = make(opt)
    _seq(sched, 3)
    sd_sched, sd_opt = sched.state_dict(), opt.state_dict()
    assert "optimizer" not in sd_sched
    opt2 = _opt(momentum=0.9)
    sched2 = make(opt2)
    opt2.load_state_dict(sd_opt)
    sched2.load_state_dict(sd_sched)
    rest = _seq(sched2, 3)
    np.testing.assert_allclose(rest, full[3:], rtol=1e-12)


def test_reduce_on_plateau_state_dict_resume():
    opt = _opt()
    sched = optim.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    for loss in [3, 3]:
        sched.step(loss)
    sd_sched, sd_opt = sched.state_dict(), opt.state_dict()
    opt2 = _opt()
    sched2 = optim.ReduceLROnPlateau(opt2)
    opt2.load_state_dict(sd_opt)
    sched2.load_state_dict(sd_sched)
    sched2.step(3)  # third bad step in a row with patience 1: halve
    assert sched2.get_last_lr() == [0.5] and sched2.best == 3


def test_composites_reject_mismatched_inputs():
    o1, o2 = _opt(), _opt()
    a, b = optim.ExponentialLR(o1, 0.9), optim.ExponentialLR(o2, 0.9)
    with pytest.raises(ValueError, match="another optimizer"):
        optim.ChainedScheduler([a, b])
    with pytest.raises(ValueError, match="expected 1 milestones"):
        optim.SequentialLR(o1, [a, optim.ExponentialLR(o1, 0.5)], milestones=[1, 2])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        optim.SequentialLR(o1, [a, optim.ReduceLROnPlateau(o1)], milestones=[1])
