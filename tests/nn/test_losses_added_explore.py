"""Exploring properties of the losses a ported torch script calls: ``l1_loss``, ``smooth_l1_loss``,
``huber_loss``, ``binary_cross_entropy``, ``binary_cross_entropy_with_logits`` and ``kl_div`` (and their
modules, with ``NLLLoss``), against float64 NumPy references written from torch's documented formulas.

Values match the reference (float64 within 1e-10, float32 within 3e-5); the gradient of every operand
that requires grad (input, target, ``weight``, ``pos_weight``) matches central finite differences of the
reference in float64, for a random upstream gradient and every reduction. Pinned ``@example`` cases are
torch's edge cases: ``beta=0`` is the L1 loss, BCE's log clamped at -100 (probabilities of exactly 0
and 1), logits of +-1000, a KL target of 0, empty inputs. Bad arguments raise at the call, naming the
argument. The formulas (torch's docs)::

    smooth_l1 = 0.5 d^2 / beta  if |d| < beta  else |d| - 0.5 beta        (d = x - t)
    huber     = 0.5 d^2         if |d| < delta else delta (|d| - 0.5 delta)
    bce       = -w (t max(log x, -100) + (1 - t) max(log(1 - x), -100))
    bce_logit = -w (p t log sigmoid(x) + (1 - t) log(1 - sigmoid(x)))
    kl_div    = t (log t - x)   (0 where t = 0),   log_target: exp(t) (t - x)
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from neural_arch import Tensor
from neural_arch.core.ops_loss import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from neural_arch.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    NLLLoss,
    SmoothL1Loss,
)

TOL = {np.float64: 1e-10, np.float32: 3e-5}
GRAD_TOL = {np.float64: 1e-6, np.float32: 2e-4}  # float64: the finite differences' own error
DTYPES = st.sampled_from([np.float64, np.float32])
REDUCTIONS = st.sampled_from(["mean", "sum", "none"])
SHAPES = st.sampled_from([(), (3,), (2, 3), (2, 1, 2)])
SEEDS = st.integers(0, 2**16)


# ----------------------------------------------------------------------------- references (float64)
def ref_l1(x, t):
    return np.abs(x - t)


def ref_smooth_l1(x, t, beta):
    d = np.abs(x - t)
    return d if beta == 0 else np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


def ref_huber(x, t, delta):
    d = np.abs(x - t)
    return np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


def ref_bce(x, t, w=None):
    with np.errstate(divide="ignore"):
        e = -(t * np.maximum(np.log(x), -100) + (1 - t) * np.maximum(np.log(1 - x), -100))
    return e if w is None else e * w


def ref_bce_logits(x, t, w=None, p=None):
    log_sig, log_one_minus_sig = -np.logaddexp(0, -x), -np.logaddexp(0, x)
    e = -((1 if p is None else p) * t * log_sig + (1 - t) * log_one_minus_sig)
    return e if w is None else e * w


def ref_kl(x, t, log_target=False):
    if log_target:
        return np.exp(t) * (t - x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t == 0, 0.0, t * (np.log(np.where(t == 0, 1.0, t)) - x))


def reduce(e, reduction):
    e = np.asarray(e, dtype=np.float64)
    if reduction == "none":
        return e
    if reduction == "sum":
        return e.sum()
    if reduction == "batchmean":
        return e.sum() / e.shape[0] if e.ndim else e.sum()
    with np.errstate(invalid="ignore"):
        return e.sum() / e.size if e.size else np.float64(np.nan)


# ----------------------------------------------------------------------------- the shared check
def _finite_differences(scalar, arrays: dict, name: str, h: float = 1e-6) -> np.ndarray:
    """Central differences of ``scalar(arrays)`` with respect to ``arrays[name]``."""
    base = arrays[name]
    grad = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        for sign in (1, -1):
            moved = base.copy()
            moved[i] += sign * h
            grad[i] += sign * scalar({**arrays, name: moved})
    return grad / (2 * h)


def check_loss(ours, reference, arrays: dict, requires: tuple, dtype, reduction: str, seed: int):
    """``ours(**tensors)`` against ``reduce(reference(**arrays))``: its value, its dtype, and the gradient
    of each name in ``requires`` against finite differences of the reference (float64)."""
    arrays = {k: np.asarray(v, dtype=dtype).astype(np.float64) for k, v in arrays.items()}  # the rounded point
    tensors = {k: Tensor(v.astype(dtype), requires_grad=k in requires) for k, v in arrays.items()}
    out = ours(**tensors)
    want = reduce(reference(**arrays), reduction)
    assert out.dtype == dtype and out.shape == np.shape(want)
    scale = 1.0 + np.abs(reference(**arrays)).sum()
    np.testing.assert_allclose(np.asarray(out.data, np.float64), want, rtol=TOL[dtype], atol=TOL[dtype] * scale,
                               equal_nan=True, err_msg="loss")
    upstream = np.random.default_rng(seed + 1).standard_normal(np.shape(want))
    out.backward(Tensor(upstream.astype(dtype)))

    def scalar(a):
        return float((upstream * reduce(reference(**a), reduction)).sum())

    for name in requires:
        got = tensors[name].grad
        assert got is not None and got.dtype == dtype and got.shape == arrays[name].shape, name
        if np.isnan(want).any():
            continue  # an empty mean: nan, as torch, and so is its gradient
        fd = _finite_differences(scalar, arrays, name)
        tol = GRAD_TOL[dtype]
        np.testing.assert_allclose(np.asarray(got.data, np.float64), fd, rtol=tol,
                                   atol=tol * (1 + np.abs(fd).max(initial=0)), err_msg=f"d loss / d {name}")
    return out


def _pair(seed, shape, low=-2.0, high=2.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, shape), rng.uniform(low, high, shape)


def _away_from(d, kinks, gap=1e-4):
    """No |d| within ``gap`` of a kink (the finite differences would straddle it)."""
    return all(np.all(np.abs(np.abs(d) - k) > gap) for k in kinks)


# ----------------------------------------------------------------------------- regression losses
@settings(max_examples=30)
@given(shape=SHAPES, dtype=DTYPES, seed=SEEDS, reduction=REDUCTIONS, target_grad=st.booleans())
@example(shape=(0,), dtype=np.float64, seed=0, reduction="mean", target_grad=True)  # empty mean: nan (torch)
def test_l1_loss_matches_torch_formula(shape, dtype, seed, reduction, target_grad):
    x, t = _pair(seed, shape)
    assume(_away_from(x - t, [0.0]))
    check_loss(lambda x, t: l1_loss(x, t, reduction=reduction), ref_l1, {"x": x, "t": t},
               ("x", "t") if target_grad else ("x",), dtype, reduction, seed)


@settings(max_examples=30)
@given(shape=SHAPES, dtype=DTYPES, seed=SEEDS, reduction=REDUCTIONS, beta=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
       target_grad=st.booleans())
@example(shape=(2, 3), dtype=np.float64, seed=3, reduction="sum", beta=0.0, target_grad=True)  # beta=0: l1
def test_smooth_l1_loss_matches_torch_formula(shape, dtype, seed, reduction, beta, target_grad):
    x, t = _pair(seed, shape)
    assume(_away_from(x - t, [0.0, beta]))
    check_loss(lambda x, t: smooth_l1_loss(x, t, reduction=reduction, beta=beta),
               lambda x, t: ref_smooth_l1(x, t, beta), {"x": x, "t": t},
               ("x", "t") if target_grad else ("x",), dtype, reduction, seed)


def test_smooth_l1_with_beta_zero_is_l1_loss_values_and_gradients():
    x = Tensor(np.array([-1.5, 0.2, 3.0]), requires_grad=True)
    x1 = Tensor(x.data.copy(), requires_grad=True)
    t = np.array([0.0, 0.0, 1.0])
    smooth_l1_loss(x, t, beta=0.0).backward()
    l1_loss(x1, t).backward()
    np.testing.assert_array_equal(x.grad.data, x1.grad.data)
    assert smooth_l1_loss(x, t, beta=0.0).item() == l1_loss(x, t).item()


@settings(max_examples=30)
@given(shape=SHAPES, dtype=DTYPES, seed=SEEDS, reduction=REDUCTIONS, delta=st.sampled_from([0.3, 1.0, 2.5]),
       target_grad=st.booleans())
@example(shape=(3,), dtype=np.float64, seed=5, reduction="mean", delta=1.0, target_grad=False)
def test_huber_loss_matches_torch_formula(shape, dtype, seed, reduction, delta, target_grad):
    x, t = _pair(seed, shape)
    assume(_away_from(x - t, [delta]))
    check_loss(lambda x, t: huber_loss(x, t, reduction, delta), lambda x, t: ref_huber(x, t, delta),
               {"x": x, "t": t}, ("x", "t") if target_grad else ("x",), dtype, reduction, seed)


def test_huber_is_delta_times_smooth_l1_and_l1_grad_at_zero_is_zero():
    x, t = np.array([0.1, -2.0, 4.0]), np.zeros(3)
    for delta in (0.5, 2.0):
        assert huber_loss(Tensor(x), t, "sum", delta).item() == pytest.approx(
            delta * smooth_l1_loss(Tensor(x), t, reduction="sum", beta=delta).item(), rel=1e-12)
    z = Tensor(np.zeros(2), requires_grad=True)
    l1_loss(z, np.zeros(2)).backward()  # torch's sign(0) = 0
    assert z.grad.tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- binary cross-entropy
@settings(max_examples=30)
@given(shape=SHAPES, dtype=DTYPES, seed=SEEDS, reduction=REDUCTIONS, weighted=st.booleans(),
       target_grad=st.booleans(), weight_grad=st.booleans())
@example(shape=(2, 3), dtype=np.float64, seed=1, reduction="mean", weighted=True, target_grad=True,
         weight_grad=True)
def test_binary_cross_entropy_matches_torch_formula(shape, dtype, seed, reduction, weighted, target_grad,
                                                    weight_grad):
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.uniform(0.05, 0.95, shape), "t": rng.uniform(0, 1, shape)}
    requires = ["x"] + (["t"] if target_grad else [])
    if weighted:
        arrays["w"] = rng.uniform(0.2, 2.0, shape[-1:])  # one weight per last-dim entry, broadcast
        requires += ["w"] if weight_grad else []
    check_loss(lambda x, t, w=None: binary_cross_entropy(x, t, w, reduction=reduction), ref_bce, arrays,
               tuple(requires), dtype, reduction, seed)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_binary_cross_entropy_clamps_log_at_minus_100_like_torch(dtype):
    """Probabilities of exactly 0 and 1: each log is clamped at -100, so the loss is finite (100 where
    the target is the other class, 0 where it is the same); the gradient is torch's
    ``(x - t) / max(x (1 - x), 1e-12)``."""
    x = Tensor(np.array([0.0, 0.0, 1.0, 1.0], dtype=dtype), requires_grad=True)
    t = np.array([0.0, 1.0, 0.0, 1.0], dtype=dtype)
    out = binary_cross_entropy(x, t, reduction="none")
    assert out.tolist() == [0.0, 100.0, 100.0, 0.0]
    out.sum().backward()
    np.testing.assert_allclose(x.grad.data, [0.0, -1e12, 1e12, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out.data, ref_bce(x.data.astype(np.float64), t), rtol=0)


@settings(max_examples=30)
@given(shape=SHAPES, dtype=DTYPES, seed=SEEDS, reduction=REDUCTIONS, weighted=st.booleans(),
       pos_weighted=st.booleans(), extra_grads=st.booleans())
@example(shape=(2, 3), dtype=np.float64, seed=2, reduction="none", weighted=True, pos_weighted=True,
         extra_grads=True)
def test_binary_cross_entropy_with_logits_matches_torch_formula(shape, dtype, seed, reduction, weighted,
                                                                pos_weighted, extra_grads):
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.uniform(-5, 5, shape), "t": rng.uniform(0, 1, shape)}
    requires = ["x"] + (["t"] if extra_grads else [])
    if weighted:
        arrays["w"] = rng.uniform(0.2, 2.0, shape)
        requires += ["w"] if extra_grads else []
    if pos_weighted:
        arrays["p"] = rng.uniform(0.2, 4.0, shape[-1:])  # per class, over the last dim (torch)
        requires += ["p"] if extra_grads else []
    check_loss(lambda x, t, w=None, p=None: binary_cross_entropy_with_logits(x, t, w, reduction=reduction,
                                                                             pos_weight=p),
               ref_bce_logits, arrays, tuple(requires), dtype, reduction, seed)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_binary_cross_entropy_with_logits_is_stable_for_large_logits(dtype):
    """Logits of +-1000 would overflow exp(): the loss is |x| where sigmoid is on the wrong side, 0 where
    it is on the right one, and the gradient is sigmoid(x) - t, finite everywhere."""
    x = Tensor(np.array([1000.0, -1000.0, 1000.0, -1000.0], dtype=dtype), requires_grad=True)
    t = np.array([0.0, 1.0, 1.0, 0.0], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        out = binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=np.array(2.0, dtype))
        out.sum().backward()
    assert out.tolist() == [1000.0, 2000.0, 0.0, 0.0]
    assert x.grad.tolist() == [1.0, -2.0, 0.0, 0.0]


# ----------------------------------------------------------------------------- kl_div
@settings(max_examples=30)
@given(shape=SHAPES, dtype=DTYPES, seed=SEEDS, reduction=st.sampled_from(["batchmean", "sum", "none", "mean"]),
       log_target=st.booleans(), target_grad=st.booleans())
@example(shape=(2, 3), dtype=np.float64, seed=4, reduction="batchmean", log_target=False, target_grad=True)
@example(shape=(), dtype=np.float64, seed=4, reduction="batchmean", log_target=True, target_grad=True)
def test_kl_div_matches_torch_formula(shape, dtype, seed, reduction, log_target, target_grad):
    rng = np.random.default_rng(seed)
    x = np.log(rng.uniform(0.05, 1, shape))
    t = rng.uniform(0.05, 1, shape)
    t = np.log(t) if log_target else t
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_loss(lambda x, t: kl_div(x, t, reduction=reduction, log_target=log_target),
                   lambda x, t: ref_kl(x, t, log_target), {"x": x, "t": t},
                   ("x", "t") if target_grad else ("x",), dtype, reduction, seed)
    # torch warns that 'mean' divides by every element, not by the batch size
    assert any("batchmean" in str(w.message) for w in caught) == (reduction == "mean")


def test_kl_div_target_zero_adds_zero_and_batchmean_divides_by_batch():
    x = Tensor(np.log(np.array([[0.5, 0.5], [0.9, 0.1]])), requires_grad=True)
    t = np.array([[1.0, 0.0], [0.0, 1.0]])
    out = kl_div(x, t, reduction="none")
    assert not np.isnan(out.data).any()
    np.testing.assert_allclose(out.data, [[np.log(2), 0.0], [0.0, np.log(10)]], rtol=1e-12)
    batchmean = kl_div(x, t, reduction="batchmean")
    assert batchmean.item() == pytest.approx((np.log(2) + np.log(10)) / 2, rel=1e-12)
    batchmean.backward()
    np.testing.assert_allclose(x.grad.data, -t / 2, rtol=0)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradients_accumulate_on_a_leaf_over_two_backward_calls(reduction):
    """Pin: a gradient handed back as a broadcast view was read-only, and the second backward's in-place
    accumulation into the leaf's ``.grad`` raised (a target broadcast over the input, or any reduction)."""
    x = Tensor(np.array([[0.3, 0.6]]), requires_grad=True)
    t = np.array([1.0, 0.0])
    losses = [l1_loss, smooth_l1_loss, huber_loss, kl_div]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broadcast target's warning
        for loss in losses:
            for _ in range(2):
                out = loss(x, t, reduction=reduction)
                out.backward(Tensor(np.ones(out.shape)))
        def total(a):
            refs = (ref_l1(a["x"], t), ref_smooth_l1(a["x"], t, 1.0), ref_huber(a["x"], t, 1.0), ref_kl(a["x"], t))
            return float(sum(reduce(e, reduction).sum() for e in refs))

        want = 2 * _finite_differences(total, {"x": x.data.copy()}, "x")
    np.testing.assert_allclose(x.grad.data, want, rtol=1e-6)


# ----------------------------------------------------------------------------- modules
def test_loss_modules_equal_their_functions_and_keep_weights_as_buffers():
    rng = np.random.default_rng(0)
    p = Tensor(rng.uniform(0.1, 0.9, (3, 4)))
    logits, target = Tensor(rng.standard_normal((3, 4))), Tensor(rng.uniform(0, 1, (3, 4)))
    w, pw = Tensor(rng.uniform(0.5, 2, (4,))), Tensor(rng.uniform(0.5, 2, (4,)))
    cases = [
        (L1Loss(reduction="sum")(logits, target), l1_loss(logits, target, reduction="sum")),
        (SmoothL1Loss(beta=0.5)(logits, target), smooth_l1_loss(logits, target, beta=0.5)),
        (HuberLoss("none", 0.7)(logits, target), huber_loss(logits, target, "none", 0.7)),
        (BCELoss(w)(p, target), binary_cross_entropy(p, target, w)),
        (BCEWithLogitsLoss(w, pos_weight=pw)(logits, target),
         binary_cross_entropy_with_logits(logits, target, w, pos_weight=pw)),
        (KLDivLoss(reduction="batchmean", log_target=True)(logits, target),
         kl_div(logits, target, reduction="batchmean", log_target=True)),
        (NLLLoss(w, ignore_index=1)(logits, np.array([0, 1, 3])),
         nll_loss(logits, np.array([0, 1, 3]), w, ignore_index=1)),
    ]
    for got, want in cases:
        np.testing.assert_array_equal(got.data, want.data)
    assert sorted(BCEWithLogitsLoss(w, pos_weight=pw).state_dict()) == ["pos_weight", "weight"]
    assert sorted(BCELoss(w).state_dict()) == ["weight"] and sorted(NLLLoss(w).state_dict()) == ["weight"]
    assert repr(KLDivLoss(reduction="batchmean")) == "KLDivLoss(reduction='batchmean', log_target=False)"
    x = Tensor(rng.standard_normal(4), requires_grad=True)
    HuberLoss()(x, np.zeros(4)).backward()
    np.testing.assert_allclose(x.grad.data, np.clip(x.data, -1, 1) / 4, rtol=1e-12)


# ----------------------------------------------------------------------------- bad input
X, T = Tensor(np.full((2, 3), 0.5)), np.full((2, 3), 0.5)
BAD = [
    (lambda: l1_loss(X, T, reduction="batchmean"), ValueError, "reduction"),
    (lambda: l1_loss(X, np.zeros((4, 3))), ValueError, "target size"),
    (lambda: smooth_l1_loss(X, T, beta=-1.0), ValueError, "beta"),
    (lambda: huber_loss(X, T, delta=0.0), ValueError, "delta"),
    (lambda: huber_loss(X, T, "avg"), ValueError, "reduction"),
    (lambda: binary_cross_entropy(X, np.zeros((2, 1))), ValueError, "target size"),
    (lambda: binary_cross_entropy(Tensor(np.array([0.5, 1.5])), np.zeros(2)), ValueError, "between 0 and 1"),
    (lambda: binary_cross_entropy(Tensor(np.array([np.nan])), np.zeros(1)), ValueError, "between 0 and 1"),
    (lambda: binary_cross_entropy(X, T, np.ones(2)), ValueError, "weight"),
    (lambda: binary_cross_entropy(X, T, np.ones((2, 2, 3))), ValueError, "weight"),
    (lambda: binary_cross_entropy_with_logits(X, np.zeros(3)), ValueError, "target size"),
    (lambda: binary_cross_entropy_with_logits(X, T, pos_weight=np.ones(2)), ValueError, "pos_weight"),
    (lambda: binary_cross_entropy_with_logits(X, T, reduction="batchmean"), ValueError, "reduction"),
    (lambda: kl_div(X, T, reduction="avg"), ValueError, "reduction"),
    (lambda: kl_div(X, np.zeros((3, 3))), ValueError, "target size"),
    (lambda: l1_loss(Tensor(np.array([1, 2])), np.zeros(2)), TypeError, "floating-point input"),
    (lambda: l1_loss(X, np.array(["a"] * 3)), TypeError, "target"),
    (lambda: binary_cross_entropy(X, T, T, "mean"), TypeError, "positional"),  # torch's size_average slot
    (lambda: SmoothL1Loss(beta=-0.1), ValueError, "beta"),
    (lambda: HuberLoss(delta=-1), ValueError, "delta"),
    (lambda: KLDivLoss(reduction="avg"), ValueError, "reduction"),
    (lambda: BCEWithLogitsLoss(reduction="batchmean"), ValueError, "reduction"),
]


@pytest.mark.parametrize("call, error, words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_arguments_are_clear_errors_at_the_call(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_target_of_another_shape_warns_and_broadcasts_like_torch():
    x = Tensor(np.zeros((3, 1)), requires_grad=True)
    for fn in (l1_loss, smooth_l1_loss, huber_loss, kl_div):
        with pytest.warns(UserWarning, match="different to the input size"):
            out = fn(x, np.arange(3.0), reduction="sum")
        assert out.shape == ()
    assert x.grad is None or x.grad.shape == (3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        l1_loss(x, np.zeros((3, 1)))  # same shape: no warning


def test_mse_loss_neighbour_still_matches_its_formula():
    """The neighbouring ``mse_loss`` (same file) against its formula and finite differences."""
    rng = np.random.default_rng(9)
    x, t = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    check_loss(lambda x, t: mse_loss(x, t, reduction="sum"), lambda x, t: (x - t) ** 2, {"x": x, "t": t},
               ("x", "t"), np.float64, "sum", 9)


# ----------------------------------------------------------------------------- CuPy (the lent GPU)
@pytest.mark.gpu
def test_losses_on_cupy_match_numpy():
    import cupy as cp  # noqa: F401  (the marker skips without it)

    rng = np.random.default_rng(0)
    xs, ts, ws = rng.uniform(0.1, 0.9, (3, 4)), rng.uniform(0, 1, (3, 4)), rng.uniform(0.5, 2, (4,))
    calls = [
        lambda x, t, w: l1_loss(x, t),
        lambda x, t, w: smooth_l1_loss(x, t, reduction="sum", beta=0.3),
        lambda x, t, w: huber_loss(x, t, "none", 0.2),
        lambda x, t, w: binary_cross_entropy(x, t, w),
        lambda x, t, w: binary_cross_entropy_with_logits(x, t, w, pos_weight=w),
        lambda x, t, w: kl_div(x.log(), t, reduction="batchmean"),
    ]
    for call in calls:
        results = {}
        for dev in ("cpu", "cuda:0"):
            x, t = Tensor(xs, requires_grad=True, device=dev), Tensor(ts, requires_grad=True, device=dev)
            out = call(x, t, Tensor(ws, device=dev))
            out.sum().backward()
            results[dev] = (out.numpy(), x.grad.numpy(), t.grad.numpy())
        for cpu, gpu in zip(results["cpu"], results["cuda:0"]):
            np.testing.assert_allclose(gpu, cpu, rtol=1e-10, atol=1e-12)


@settings(max_examples=15)
@given(shape=st.sampled_from([(2, 4, 3, 4), (2, 3, 3), (2, 3, 5), (1, 2, 2, 2), (3, 2, 4)]), seed=SEEDS)
@example(shape=(2, 4, 3, 4), seed=0)  # torch's layout, 4 classes on 4-wide images: was silently misread
def test_cross_entropy_module_reads_torch_class_layout_like_the_function(shape, seed):
    """Pin (a neighbour in ``nn/loss.py``): ``CrossEntropyLoss`` flattened every >2-d input with classes
    last, so torch's ``(N, C, H, W)`` logits with an ``(N, H, W)`` target were read as rows of W
    classes whenever ``C == W`` (same element count): a wrong loss, no error. Now a target that only
    fits torch's layout goes to ``cross_entropy`` as torch's does; ``(B, T, C)`` with ``(B, T)`` still
    reads classes last (a language model's layout, the module's documented reading where both fit)."""
    from neural_arch.core.ops_loss import cross_entropy
    from neural_arch.nn.loss import CrossEntropyLoss

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    torch_target = (shape[0],) + shape[2:]
    last_target = shape[:-1]
    module = CrossEntropyLoss()
    if torch_target != last_target:
        t = rng.integers(0, shape[1], torch_target)
        xt = Tensor(x, requires_grad=True)
        module(xt, t).backward()
        xf = Tensor(x, requires_grad=True)
        want = cross_entropy(xf, t)
        want.backward()
        assert module(Tensor(x), t).item() == want.item()
        np.testing.assert_array_equal(xt.grad.data, xf.grad.data)
    t = rng.integers(0, shape[-1], last_target)  # classes last
    flat = cross_entropy(Tensor(x.reshape(-1, shape[-1])), t.reshape(-1)).item()
    assert module(Tensor(x), Tensor(t)).item() == flat


def test_kl_div_target_of_zero_gets_gradient_zero_like_torch():
    """torch's xlogy: a target of 0 contributes 0 to the loss and gets gradient 0 (found: -inf)."""
    x = Tensor(np.log(np.array([[0.5, 0.5]])))
    t = Tensor(np.array([[1.0, 0.0]]), requires_grad=True)
    kl_div(x, t, reduction="sum").backward()
    assert np.array_equal(t.grad.data[:, 1], [0.0]) and np.isfinite(t.grad.data).all()
    assert np.isclose(t.grad.data[0, 0], np.log(1.0) + 1 - np.log(0.5))
