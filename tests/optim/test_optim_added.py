"""torch's remaining common optimizers -- Adamax, Adadelta, Rprop, ASGD, LBFGS: what is particular to each
(Rprop's step sizes against both bounds, ASGD's average and its one-step-late ``eta``, the flags we cannot
honour -- ``capturable``, ``differentiable`` -- as clear errors, torch's defaults and errors). The four
elementwise ones also run in ``test_optim_more_explore.py``'s tables with every other optimizer: param
groups with different options against float64 NumPy restatements of torch's algorithms
(``optim_added_references.py``), resumes, parameters without a gradient, a Tensor ``lr`` and a state
shaped like torch's. L-BFGS follows a transcription of torch's ``lbfgs.py`` (two-loop recursion,
strong-Wolfe line search) to 1e-10 on a quadratic and on Rosenbrock, with the gradients from our autograd.
"""

from __future__ import annotations

import copy
import doctest
import importlib

import numpy as np
import pytest
from optim_added_references import LBFGSRef, ref_asgd, ref_rprop

import neural_arch as na
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor
from neural_arch.optim.adadelta import Adadelta
from neural_arch.optim.adamax import Adamax
from neural_arch.optim.asgd import ASGD
from neural_arch.optim.lbfgs import LBFGS
from neural_arch.optim.rprop import Rprop


def test_rprop_grows_shrinks_and_clamps_step_sizes():
    """Signs that repeat, flip, and hit zero; step sizes pushed against both bounds."""
    p0 = np.array([1.0, 1.0, 1.0, 1.0])
    gs = [np.array(g, dtype=float) for g in ([1, 1, -1, 0], [2, -1, -1, 3], [1, -1, 1, 3], [1, 1, 1, -3], [1, 0, 1, -3])]
    p = nn.Parameter(p0.copy())
    opt = Rprop([p], lr=0.3, etas=(0.25, 2.0), step_sizes=(0.05, 1.0))
    for g in gs:
        p.grad = Tensor(g)
        opt.step()
    np.testing.assert_allclose(p.data, ref_rprop(p0, gs, lr=0.3, etas=(0.25, 2.0), step_sizes=(0.05, 1.0)), rtol=1e-14)
    # the flipped element's stored gradient is zero, so the next step neither grows nor shrinks it
    assert opt.state[p]["prev"].tolist() == [1.0, 0.0, 1.0, -3.0]


def test_asgd_average_and_a_learning_rate_schedule():
    """``ax`` is the running average of the iterates once ``t0`` is passed; ``eta`` follows ``lr`` one
    step late (it is computed at the end of a step from that step's ``lr``)."""
    rng = np.random.default_rng(0)
    p0, gs = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(6)]
    p = nn.Parameter(p0.copy())
    opt = ASGD([p], lr=0.2, lambd=0.1, t0=2, weight_decay=0.01)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for g in gs:
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = Tensor(g)
        opt.step()
        sched.step()
    want_p, want_ax = ref_asgd(p0, gs, lr=0.2, lambd=0.1, t0=2, weight_decay=0.01, lrs=lrs)
    np.testing.assert_allclose(p.data, want_p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(opt.state[p]["ax"], want_ax, rtol=1e-12, atol=1e-14)
    assert opt.state[p]["step"] == 6 and opt.state[p]["mu"] == 1 / 4


@pytest.mark.parametrize("cls", [Adamax, Adadelta, Rprop, ASGD])
@pytest.mark.parametrize("flag", ["capturable", "differentiable"])
def test_flags_we_cannot_honour_are_clear_errors(cls, flag):
    p = nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match=f"{flag}=True .* not supported"):
        cls([p], **{flag: True})
    opt = cls([p])
    opt.add_param_group({"params": [nn.Parameter(np.ones(1))], flag: True})
    with pytest.raises(ValueError, match=f"{flag}=True"):
        opt.step()


def test_invalid_hyper_parameters_are_torchs_value_errors():
    p = [nn.Parameter(np.ones(2))]
    for make in (lambda: Adamax(p, lr=-1), lambda: Adamax(p, betas=(1.0, 0.9)), lambda: Adamax(p, eps=-1),
                 lambda: Adadelta(p, rho=1.5), lambda: Adadelta(p, weight_decay=-1), lambda: Rprop(p, etas=(1.2, 0.5)),
                 lambda: Rprop(p, lr=-0.1), lambda: ASGD(p, lr=-1), lambda: ASGD(p, weight_decay=-1)):
        with pytest.raises(ValueError, match="invalid"):
            make()


def test_defaults_are_torchs():
    p = [nn.Parameter(np.ones(2))]
    def pick(opt, *keys):
        return tuple(opt.defaults[k] for k in keys)
    assert pick(Adamax(p), "lr", "betas", "eps", "weight_decay", "foreach", "maximize") == (2e-3, (0.9, 0.999), 1e-8, 0, None, False)
    assert pick(Adadelta(p), "lr", "rho", "eps", "weight_decay") == (1.0, 0.9, 1e-6, 0)
    assert pick(Rprop(p), "lr", "etas", "step_sizes") == (1e-2, (0.5, 1.2), (1e-6, 50))
    assert pick(ASGD(p), "lr", "lambd", "alpha", "t0", "weight_decay") == (1e-2, 1e-4, 0.75, 1e6, 0)
    assert pick(LBFGS(p), "lr", "max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size",
                "line_search_fn") == (1, 20, 25, 1e-7, 1e-9, 100, None)


@pytest.mark.parametrize("cls", [Adamax, Adadelta, Rprop, ASGD])
def test_a_step_between_forward_and_backward_is_torchs_error(cls):
    """The step writes the arrays in place and counts the writes: a graph recorded before it raises."""
    w = Tensor(np.ones(3), requires_grad=True)
    x = Tensor(np.full(3, 2.0), requires_grad=True)
    opt = cls([w], lr=0.5)
    w.grad = Tensor(np.ones(3))
    loss = (w * x).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# ---------------------------------------------------------------------------------------------- L-BFGS

def _rosenbrock(x):
    f = np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return float(f), g


_M = np.random.default_rng(1).standard_normal((7, 7))
_A = _M @ _M.T + 0.5 * np.eye(7)
_B = np.random.default_rng(3).standard_normal(7)
X0 = np.array([-1.2, 1.0, -0.5, 0.8, 1.5, -1.0, 0.3])

# name -> (x0, NumPy loss and gradient, the same loss in Tensor ops for the closure)
PROBLEMS = {
    "quadratic": (np.random.default_rng(2).standard_normal(7), lambda x: (float(0.5 * x @ _A @ x - _B @ x), _A @ x - _B),
                  lambda x: 0.5 * (x * (Tensor(_A) @ x)).sum() - (Tensor(_B) * x).sum()),
    "rosenbrock": (X0, _rosenbrock, lambda x: (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()),
    # non-convex: a large lr sends the zoom's trials against the bracket's ends (moved a tenth inside)
    "cauchy": (np.random.default_rng(5).uniform(-2, 2, 7), lambda x: (float(np.log1p((x - 1) ** 2).sum()), 2 * (x - 1) / (1 + (x - 1) ** 2)),
               lambda x: (1.0 + (x - 1.0) ** 2).log().sum()),
    # unbounded below: the bracketing phase runs out of its 25 trials
    "linear": (X0, lambda x: (float(-x.sum()), -np.ones_like(x)), lambda x: -x.sum()),
}


def _split(x):
    """The flat vector as two parameters of different shapes (L-BFGS flattens them back)."""
    return [nn.Parameter(x[:4].reshape(2, 2).copy()), nn.Parameter(x[4:].copy())]


def _closure(opt, params, problem):
    """A closure with the gradients from autograd (Tensor ops), as a user writes it."""
    loss_of = PROBLEMS[problem][2]

    def closure():
        opt.zero_grad()
        loss = loss_of(na.cat([p.reshape(-1) for p in params]))
        loss.backward()
        return loss
    return closure


def _flat(params):
    return np.concatenate([p.data.reshape(-1) for p in params])


@pytest.mark.parametrize("problem, line_search_fn, lr, extra", [
    ("quadratic", None, 0.05, {}), ("quadratic", "strong_wolfe", 1, {}), ("rosenbrock", None, 2e-4, {}),
    ("rosenbrock", "strong_wolfe", 1, {}), ("cauchy", "strong_wolfe", 100, {}), ("linear", "strong_wolfe", 1, {}),
    # converges: stops on a loss that no longer changes, then on a direction that no longer descends
    ("quadratic", "strong_wolfe", 1, {"max_iter": 15, "history_size": 10, "tolerance_grad": 1e-12})])
def test_lbfgs_follows_a_transcription_of_torchs_algorithm(problem, line_search_fn, lr, extra):
    """Same iterates as the float64 reference after every ``step`` (several calls: the history carries
    over), with a short history so that old pairs are dropped. Fixed steps (no line search) need a small
    ``lr`` to stay bounded."""
    x0, fg, _ = PROBLEMS[problem]
    options = {"lr": lr, "max_iter": 6, "history_size": 3, "line_search_fn": line_search_fn, **extra}
    params = _split(x0)
    opt = LBFGS(params, **options)
    ref = LBFGSRef(x0, fg, **options)
    closure = _closure(opt, params, problem)
    for _ in range(3):
        loss = opt.step(closure)
        want_loss = ref.step()
        np.testing.assert_allclose(_flat(params), ref.x, rtol=1e-10, atol=1e-10)
        assert abs(float(loss) - want_loss) <= 1e-10 * max(1.0, abs(want_loss))
    state = opt.state[params[0]]
    assert state["n_iter"] == ref.total_iters and state["func_evals"] == ref.func_evals
    assert len(state["old_dirs"]) == len(ref.Y) <= options["history_size"]
    assert fg(_flat(params))[0] < fg(x0)[0]


def test_lbfgs_with_the_line_search_solves_rosenbrock():
    params = _split(X0)
    opt = LBFGS(params, max_iter=200, max_eval=400, line_search_fn="strong_wolfe", tolerance_grad=1e-9)
    opt.step(_closure(opt, params, "rosenbrock"))
    np.testing.assert_allclose(_flat(params), np.ones(7), atol=1e-6)


def test_lbfgs_state_dict_round_trip_continues_exactly():
    x0 = X0
    options = {"max_iter": 4, "history_size": 5, "line_search_fn": "strong_wolfe"}
    straight = _split(x0)
    opt = LBFGS(straight, **options)
    for _ in range(4):
        opt.step(_closure(opt, straight, "rosenbrock"))
    params = _split(x0)
    opt = LBFGS(params, **options)
    for k in range(4):
        if k == 2:
            saved = copy.deepcopy(opt.state_dict())
            assert set(saved["state"]) == {0} and {"d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad",
                                                    "prev_loss", "al", "func_evals", "n_iter"} == set(saved["state"][0])
            params = [nn.Parameter(p.data.copy()) for p in params]
            opt = LBFGS(params, **options)
            opt.load_state_dict(saved)
        opt.step(_closure(opt, params, "rosenbrock"))
    for a, b in zip(straight, params):
        np.testing.assert_array_equal(a.data, b.data)


def test_lbfgs_errors_are_torchs():
    p, q = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))
    with pytest.raises(ValueError, match="parameter groups"):
        LBFGS([{"params": [p]}, {"params": [q], "lr": 0.1}])
    opt = LBFGS([p])
    with pytest.raises(TypeError, match="needs a closure"):
        opt.step()
    bad = LBFGS([q], line_search_fn="backtracking")

    def closure():
        bad.zero_grad()
        loss = (q * q).sum()
        loss.backward()
        return loss
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        bad.step(closure)
    # a history saved for another model: refused before anything changes
    good = LBFGS([q], line_search_fn="strong_wolfe")
    good.step(closure)
    with pytest.raises(ValueError, match="4 elements in all"):
        LBFGS([nn.Parameter(np.ones(3)), nn.Parameter(np.ones(1))]).load_state_dict(good.state_dict())
    # an optimum already reached: one evaluation, nothing moves
    zero = nn.Parameter(np.zeros(2))
    still = LBFGS([zero])

    def at_optimum():
        still.zero_grad()
        loss = (zero * zero).sum()
        loss.backward()
        return loss
    assert float(still.step(at_optimum)) == 0.0 and still.state[zero]["func_evals"] == 1
    np.testing.assert_array_equal(zero.data, 0.0)


def test_lbfgs_closure_runs_with_gradients_even_under_no_grad():
    x = nn.Parameter(np.array([3.0]))
    opt = LBFGS([x], max_iter=3)

    def closure():
        opt.zero_grad()
        loss = ((x - 1.0) ** 2).sum()
        loss.backward()
        return loss
    with na.no_grad():
        opt.step(closure)
    assert abs(float(x.data[0]) - 1.0) < 1e-6


@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples():
    for name in ("adamax", "adadelta", "rprop", "asgd", "lbfgs"):
        module = importlib.import_module(f"neural_arch.optim.{name}")
        assert doctest.testmod(module, verbose=False).failed == 0, name
