"""Exploring properties of the torch-parity additions to ``neural_arch.nn`` / ``nn.functional``: the
activations (``elu`` ... ``softmin``), ``one_hot``, ``normalize``, ``cosine_similarity``,
``pairwise_distance``, ``dropout1d``, ``alpha_dropout``, ``gumbel_softmax``, ``instance_norm``,
``local_response_norm``, ``bilinear``, the margin / embedding / likelihood losses, their modules and
``ParameterList`` / ``ParameterDict``.

Every function is checked against a float64 NumPy reference written from torch's documented formula
(tests/nn/nn_added_references.py): values within 1e-10 in float64 (3e-5 in float32), gradients of every
operand within 1e-6 of central finite differences of the reference, away from the kinks; at the kinks,
torch's subgradients are pinned (read from torch 2.13). Bad arguments raise torch's error type at the
call. Pinned ``@example`` cases are the bugs and edge cases this exploration found.
"""

from __future__ import annotations

import doctest
import importlib
import math
import warnings

import nn_added_references as R
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor, nn
from neural_arch.nn import functional as F

TOL = {np.float64: 1e-10, np.float32: 3e-5}
DTYPES = st.sampled_from([np.float64, np.float32])
SHAPES = st.sampled_from([(), (1,), (5,), (2, 3), (2, 1, 4)])
SEEDS = st.integers(0, 2**16)
REDUCTIONS = ["mean", "sum", "none"]


def _close(got, want, dtype, tol=None):
    got = got.data if isinstance(got, Tensor) else np.asarray(got)
    tol = TOL[dtype] if tol is None else tol
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def _check_grads(fn, ref, arrays, seed: int, grad_mask=None):
    """Backward of ``sum(fn(*tensors) * upstream)`` against central differences of ``ref`` (float64)."""
    rng = np.random.default_rng(seed)
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    upstream = rng.standard_normal(out.shape)
    (out * Tensor(upstream)).sum().backward()
    want = R.central_differences(ref, arrays, upstream)
    for i, (t, w) in enumerate(zip(tensors, want)):
        if grad_mask is not None and not grad_mask[i]:
            continue
        got = np.zeros_like(w) if t.grad is None else np.asarray(t.grad.data if isinstance(t.grad, Tensor) else t.grad)
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6, err_msg=f"operand {i}")


def _away_from(x, kinks, gap=1e-3):
    """``x`` with every value within ``gap`` of a kink moved off it (finite differences straddle no kink)."""
    x = x.copy()
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + 0.5
    return x


# ----------------------------------------------------------------------------- activations
ACTIVATIONS = {
    # name: (ours, reference, kinks)
    "elu": (F.elu, R.ref_elu, [0.0]),
    "elu_alpha": (lambda x: F.elu(x, 0.5), lambda x: R.ref_elu(x, 0.5), [0.0]),
    "selu": (F.selu, R.ref_selu, [0.0]),
    "celu": (lambda x: F.celu(x, 2.0), lambda x: R.ref_celu(x, 2.0), [0.0]),
    "mish": (F.mish, R.ref_mish, []),
    "hardswish": (F.hardswish, R.ref_hardswish, [-3.0, 3.0]),
    "hardsigmoid": (F.hardsigmoid, R.ref_hardsigmoid, [-3.0, 3.0]),
    "hardtanh": (lambda x: F.hardtanh(x, -2.0, 0.5), lambda x: R.ref_hardtanh(x, -2.0, 0.5), [-2.0, 0.5]),
    "relu6": (F.relu6, R.ref_relu6, [0.0, 6.0]),
    "logsigmoid": (F.logsigmoid, R.ref_logsigmoid, []),
    "softsign": (F.softsign, R.ref_softsign, [0.0]),
    "tanhshrink": (F.tanhshrink, R.ref_tanhshrink, []),
    "threshold": (lambda x: F.threshold(x, 0.5, -2.0), lambda x: R.ref_threshold(x, 0.5, -2.0), [0.5]),
}
SPECIAL = [0.0, 3.0, -3.0, 6.0, 0.5, -2.0, 40.0, -40.0, 800.0, -800.0]
VALUES = st.one_of(st.floats(-8, 8, allow_nan=False), st.sampled_from(SPECIAL))


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@settings(max_examples=8)
@given(shape=SHAPES, dtype=DTYPES, data=st.data(), seed=SEEDS)
def test_activation_matches_reference_and_finite_differences(name, shape, dtype, data, seed):
    ours, ref, kinks = ACTIVATIONS[name]
    x = np.array(data.draw(st.lists(VALUES, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                 dtype=np.float64).reshape(shape)
    with np.errstate(over="ignore"):
        y = ours(Tensor(x.astype(dtype)))
    assert y.dtype == np.dtype(dtype)
    assert np.isfinite(y.data).all()  # +-800 must neither overflow nor give NaN
    _close(y, ref(x.astype(dtype).astype(np.float64)), dtype)
    smooth = np.clip(_away_from(x, kinks), -30, 30)
    _check_grads(ours, ref, [smooth], seed)


# torch's subgradients at the kinks (torch 2.13, float64): (ours, point, gradient)
KINKS = [
    ("hardswish", F.hardswish, [-3.0, 3.0], [0.0, 1.0]),          # pinned: we gave -0.5 and 1.5 (torch < 2.x)
    ("hardsigmoid", F.hardsigmoid, [-3.0, 3.0], [0.0, 0.0]),
    ("hardtanh", lambda x: F.hardtanh(x, -2.0, 0.5), [-2.0, 0.5], [0.0, 0.0]),
    ("relu6", F.relu6, [0.0, 6.0], [0.0, 0.0]),
    ("elu", lambda x: F.elu(x, 2.0), [0.0], [2.0]),
    ("celu", lambda x: F.celu(x, 2.0), [0.0], [1.0]),
    ("selu", F.selu, [0.0], [1.7580993408473766]),
    ("softsign", F.softsign, [0.0], [1.0]),
    ("threshold", lambda x: F.threshold(x, 1.0, 5.0), [1.0], [0.0]),
    ("prelu", lambda x: F.prelu(x, Tensor(np.array([0.3]))), [0.0], [0.3]),
    ("margin_ranking", lambda x: F.margin_ranking_loss(x, Tensor(np.zeros(1)), Tensor(np.ones(1))), [0.0], [-1.0]),
    ("hinge", lambda x: F.hinge_embedding_loss(x, Tensor(-np.ones(1))), [1.0], [-1.0]),
    ("normalize_zero", lambda x: F.normalize(x.reshape(1, 2)), [0.0, 0.0], [1e12, 1e12]),
    ("pairwise_equal", lambda x: F.pairwise_distance(x.reshape(1, 2), Tensor(np.zeros((1, 2))), eps=0.0),
     [0.0, 0.0], [0.0, 0.0]),
]


@pytest.mark.parametrize("name,fn,points,grads", KINKS, ids=[k[0] for k in KINKS])
def test_subgradients_at_the_kinks_are_torchs(name, fn, points, grads):
    x = Tensor(np.array(points), requires_grad=True)
    fn(x).sum().backward()
    np.testing.assert_allclose(x.grad.data if isinstance(x.grad, Tensor) else x.grad, grads, rtol=1e-12)


# torch 2.13's values at (nan, inf, -inf) and gradients at (inf, -inf); None: NaN in torch too, not pinned
NAN = math.nan
NONFINITE = [
    ("elu", F.elu, [NAN, math.inf, -1.0], [1.0, 0.0]),
    ("selu", F.selu, [NAN, math.inf, -1.7580993408473766], [1.0507009873554805, 0.0]),
    ("celu", F.celu, [NAN, math.inf, -1.0], [1.0, 0.0]),
    ("mish", F.mish, [NAN, math.inf, NAN], None),
    ("hardswish", F.hardswish, [NAN, math.inf, NAN], [1.0, 0.0]),            # pinned: nan gave 0, grads NaN
    ("hardsigmoid", F.hardsigmoid, [NAN, 1.0, 0.0], [0.0, 0.0]),             # pinned: nan gave 0
    ("hardtanh", F.hardtanh, [NAN, 1.0, -1.0], [0.0, 0.0]),                  # pinned: nan gave 1
    ("relu6", F.relu6, [NAN, 6.0, 0.0], [0.0, 0.0]),                         # pinned: nan gave 6
    ("logsigmoid", F.logsigmoid, [NAN, 0.0, -math.inf], [0.0, 1.0]),
    ("softsign", F.softsign, [NAN, NAN, NAN], None),
    ("tanhshrink", F.tanhshrink, [NAN, math.inf, -math.inf], [1.0, 1.0]),
    ("threshold", lambda x: F.threshold(x, 0.5, -2.0), [NAN, math.inf, -2.0], None),  # pinned: nan gave -2
    ("prelu", lambda x: F.prelu(x, Tensor(np.array([0.3]))), [NAN, math.inf, -math.inf], None),
]


@pytest.mark.parametrize("name,fn,values,grads", NONFINITE, ids=[n[0] for n in NONFINITE])
def test_nan_stays_nan_and_infinities_are_torchs(name, fn, values, grads):
    with np.errstate(all="ignore"):
        y = fn(Tensor(np.array([NAN, math.inf, -math.inf])))
        np.testing.assert_array_equal(y.data, values)
        if grads is not None:
            x = Tensor(np.array([math.inf, -math.inf]), requires_grad=True)
            fn(x).sum().backward()
            np.testing.assert_array_equal(x.grad.data if isinstance(x.grad, Tensor) else x.grad, grads)


INPLACE = [
    ("elu", lambda x: F.elu(x, inplace=True)), ("selu", lambda x: F.selu(x, inplace=True)),
    ("celu", lambda x: F.celu(x, inplace=True)), ("mish", lambda x: F.mish(x, inplace=True)),
    ("hardswish", lambda x: F.hardswish(x, inplace=True)), ("hardsigmoid", lambda x: F.hardsigmoid(x, inplace=True)),
    ("hardtanh", lambda x: F.hardtanh(x, inplace=True)), ("relu6", lambda x: F.relu6(x, inplace=True)),
    ("threshold", lambda x: F.threshold(x, 0.5, -2.0, inplace=True)),
    ("ReLU6", nn.ReLU6(inplace=True)), ("ELU", nn.ELU(inplace=True)), ("Hardswish", nn.Hardswish(inplace=True)),
]


@pytest.mark.parametrize("name,call", INPLACE, ids=[n[0] for n in INPLACE])
def test_inplace_true_writes_into_an_untracked_input(name, call):
    # pinned: inplace=True was ignored, so a torch script that drops the return value kept the old x
    data = np.array([-4.0, -0.5, 0.25, 7.0])
    want = call(Tensor(data.copy())).data
    x = Tensor(data.copy())
    alias = x
    assert call(x) is x and np.array_equal(alias.data, want)
    tracked = Tensor(data.copy(), requires_grad=True)     # a graph tensor: a new result, gradients intact
    out = call(tracked)
    assert out is not tracked and np.array_equal(tracked.data, data) and np.array_equal(out.data, want)


@settings(max_examples=10)
@given(shape=st.sampled_from([(2, 4), (3, 2, 5), (2, 6, 1)]), dim=st.sampled_from([0, 1, -1]), dtype=DTYPES,
       seed=SEEDS)
def test_glu_softmin_prelu(shape, dim, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3
    _close(F.softmin(Tensor(x.astype(dtype)), dim=dim), R.ref_softmin(x.astype(dtype).astype(np.float64), dim), dtype)
    _check_grads(lambda t: F.softmin(t, dim=dim), lambda a: R.ref_softmin(a, dim), [x], seed)
    if shape[dim] % 2 == 0:
        _close(F.glu(Tensor(x.astype(dtype)), dim), R.ref_glu(x.astype(dtype).astype(np.float64), dim), dtype)
        _check_grads(lambda t: F.glu(t, dim), lambda a: R.ref_glu(a, dim), [x], seed)
    else:
        with pytest.raises(RuntimeError, match="even"):
            F.glu(Tensor(x), dim)
    for w in (rng.random(1), rng.random(shape[1])):
        smooth = _away_from(x, [0.0])
        _close(F.prelu(Tensor(smooth.astype(dtype)), Tensor(w.astype(dtype))),
               R.ref_prelu(smooth.astype(dtype).astype(np.float64), w.astype(dtype).astype(np.float64)), dtype)
        _check_grads(F.prelu, R.ref_prelu, [smooth, w], seed)


def test_empty_and_scalar_shapes_are_torchs():
    # pinned: glu of a size-0 dimension raised (split into no chunks); torch gives two empty halves
    assert F.glu(Tensor(np.zeros((2, 0)))).shape == (2, 0)
    # pinned: two scalars with keepdim=True gave shape (1,); torch gives a 0-d distance
    assert F.pairwise_distance(Tensor(np.array(1.0)), Tensor(np.array(4.0)), keepdim=True).shape == ()
    assert F.triplet_margin_loss(Tensor(np.array(1.0)), Tensor(np.array(2.0)), Tensor(np.array(3.0))).item() == 0.0
    assert F.one_hot(np.zeros((2, 0), dtype=np.int64), 3).shape == (2, 0, 3)
    assert F.multilabel_soft_margin_loss(Tensor(np.zeros((2, 3))), Tensor(np.ones(3)), reduction="none").shape == (2,)


def test_implicit_softmin_dim_warns_and_picks_torchs_dim():
    x = np.arange(6.0).reshape(2, 3)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        y = F.softmin(Tensor(x))
    _close(y, R.ref_softmin(x, 1), np.float64)


# ----------------------------------------------------------------------------- distances, one_hot
@settings(max_examples=15)
@given(shape=st.sampled_from([(1, 3), (4, 3), (2, 3, 2), (3,)]), p=st.sampled_from([1.0, 2.0, 3.0, math.inf]),
       dtype=DTYPES, seed=SEEDS, scale=st.sampled_from([1.0, 1e-9, 1e6]))
@example(shape=(1, 2), p=2.0, dtype=np.float64, seed=0, scale=1e-9)  # norms below eps: each clamped alone
def test_normalize_cosine_similarity_pairwise_distance(shape, p, dtype, seed, scale):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(shape) * scale, rng.standard_normal(shape) * scale
    dim = 1 if len(shape) > 1 else 0
    cast = lambda v: v.astype(dtype).astype(np.float64)
    _close(F.normalize(Tensor(a.astype(dtype)), p=p, dim=dim), R.ref_normalize(cast(a), p, dim), dtype)
    _close(F.cosine_similarity(Tensor(a.astype(dtype)), Tensor(b.astype(dtype)), dim=dim),
           R.ref_cosine_similarity(cast(a), cast(b), dim), dtype)
    _close(F.pairwise_distance(Tensor(a.astype(dtype)), Tensor(b.astype(dtype)), p=p),
           R.ref_pairwise_distance(cast(a), cast(b), p), dtype)
    if scale == 1.0 and p != math.inf:
        _check_grads(lambda t: F.normalize(t, p=p, dim=dim), lambda v: R.ref_normalize(v, p, dim), [a], seed)
        _check_grads(lambda s, t: F.cosine_similarity(s, t, dim=dim),
                     lambda s, t: R.ref_cosine_similarity(s, t, dim), [a, b], seed)
        _check_grads(lambda s, t: F.pairwise_distance(s, t, p=p, keepdim=True),
                     lambda s, t: R.ref_pairwise_distance(s, t, p, keepdim=True), [a, b], seed)


def test_cosine_similarity_uses_torch2s_eps_rule_and_broadcasts():
    # torch 2.x: x . y / (max(|x|, eps) max(|y|, eps)); the older max(|x| |y|, eps) gives 0.01 here
    v = Tensor(np.array([[1e-5, 0.0]]))
    assert F.cosine_similarity(v, v).item() == pytest.approx(1.0, abs=1e-12)
    short = Tensor(np.array([[1e-9, 0.0]]))
    assert F.cosine_similarity(short, short).item() == pytest.approx(0.01, rel=1e-9)
    a, b = np.random.default_rng(1).standard_normal((2, 3)), np.random.default_rng(2).standard_normal((4, 1, 3))
    _close(F.cosine_similarity(Tensor(a), Tensor(b), dim=-1), R.ref_cosine_similarity(a, b, -1), np.float64)
    assert nn.CosineSimilarity(dim=-1)(Tensor(a), Tensor(b)).shape == (4, 2)


@settings(max_examples=15)
@given(shape=st.sampled_from([(), (0,), (3,), (2, 4)]), num_classes=st.integers(-1, 6), seed=SEEDS)
@example(shape=(), num_classes=3, seed=0)
def test_one_hot_is_int64_and_refuses_bad_labels(shape, num_classes, seed):
    labels = np.random.default_rng(seed).integers(0, 5, shape).astype(np.int64)
    if labels.size == 0 and num_classes <= 0:  # torch: nothing to infer the classes from
        with pytest.raises(RuntimeError, match="infer"):
            F.one_hot(labels)
        return
    classes = int(labels.max()) + 1 if num_classes == -1 else num_classes
    if labels.size and labels.max() >= classes:
        with pytest.raises(RuntimeError, match="smaller than num_classes"):
            F.one_hot(Tensor(labels), num_classes)
        return
    y = F.one_hot(Tensor(labels), num_classes)
    assert y.dtype == np.int64 and not y.requires_grad
    np.testing.assert_array_equal(y.data, R.ref_one_hot(labels, classes))


def test_one_hot_refuses_negative_and_non_int64_labels():
    with pytest.raises(RuntimeError, match="non-negative"):
        F.one_hot(np.array([-1, 2]))
    for bad in (np.array([1, 2], dtype=np.int32), np.array([1.0, 2.0])):
        with pytest.raises(RuntimeError, match="LongTensor"):
            F.one_hot(bad, 3)


# ----------------------------------------------------------------------------- norms, bilinear
@settings(max_examples=10)
@given(shape=st.sampled_from([(2, 3, 4), (1, 2, 3, 2), (3, 1, 5)]), affine=st.booleans(), dtype=DTYPES,
       seed=SEEDS)
def test_instance_norm_and_local_response_norm(shape, affine, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2 + 1
    w, b = (rng.standard_normal(shape[1]), rng.standard_normal(shape[1])) if affine else (None, None)
    wt = None if w is None else Tensor(w.astype(dtype))
    bt = None if b is None else Tensor(b.astype(dtype))
    cast = lambda v: None if v is None else v.astype(dtype).astype(np.float64)
    _close(F.instance_norm(Tensor(x.astype(dtype)), weight=wt, bias=bt), R.ref_instance_norm(cast(x), cast(w), cast(b)),
           dtype, None if dtype is np.float64 else 1e-4)
    if affine:
        _check_grads(lambda t, u, v: F.instance_norm(t, weight=u, bias=v), R.ref_instance_norm, [x, w, b], seed)
    for size in (1, 2, 3, 5):
        _close(F.local_response_norm(Tensor(x.astype(dtype)), size, 0.5, 0.75, 1.5),
               R.ref_local_response_norm(cast(x), size, 0.5, 0.75, 1.5), dtype)
    _check_grads(lambda t: F.local_response_norm(t, 3, 0.5, 0.75, 1.5),
                 lambda v: R.ref_local_response_norm(v, 3, 0.5, 0.75, 1.5), [x], seed)


def test_instance_norm_running_stats_and_eval():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2, 5))
    layer = nn.InstanceNorm1d(2, momentum=0.5, track_running_stats=True, dtype=np.float64)
    layer(Tensor(x))
    np.testing.assert_allclose(layer.running_mean.data, 0.5 * x.mean(axis=2).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(layer.running_var.data, 0.5 + 0.5 * x.var(axis=2, ddof=1).mean(axis=0), rtol=1e-12)
    assert layer.num_batches_tracked.item() == 0  # torch's instance norm never counts
    layer.eval()
    rm, rv = layer.running_mean.data.copy(), layer.running_var.data.copy()
    _close(layer(Tensor(x[0])), (x[0] - rm[:, None]) / np.sqrt(rv[:, None] + 1e-5), np.float64)  # unbatched (C, L)
    with pytest.raises(ValueError, match="num_features"):
        layer(Tensor(np.zeros((1, 3, 5))))
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        F.instance_norm(Tensor(np.zeros((2, 3, 1))))


@settings(max_examples=8)
@given(lead=st.sampled_from([(), (1,), (3,), (2, 2)]), bias=st.booleans(), seed=SEEDS)
def test_bilinear_matches_reference(lead, bias, seed):
    rng = np.random.default_rng(seed)
    x1, x2 = rng.standard_normal(lead + (3,)), rng.standard_normal(lead + (2,))
    w, b = rng.standard_normal((4, 3, 2)), rng.standard_normal(4)
    args = [x1, x2, w] + ([b] if bias else [])
    _close(F.bilinear(*[Tensor(a) for a in args]), R.ref_bilinear(*args), np.float64)
    _check_grads(F.bilinear, R.ref_bilinear, args, seed)
    layer = nn.Bilinear(3, 2, 4, bias=bias)
    assert [n for n, _ in layer.named_parameters()] == (["weight", "bias"] if bias else ["weight"])
    assert np.abs(layer.weight.data).max() <= 1 / math.sqrt(3)


# ----------------------------------------------------------------------------- losses
def _labels(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


LOSSES = {
    "margin_ranking": (lambda r, a, b, y: F.margin_ranking_loss(a, b, y, margin=0.3, reduction=r),
                       lambda a, b, y: R.ref_margin_ranking(a, b, y, 0.3), "x x y", (0, 1)),
    "hinge_embedding": (lambda r, a, y: F.hinge_embedding_loss(a, y, margin=1.5, reduction=r),
                        lambda a, y: R.ref_hinge_embedding(a, y, 1.5), "x y", (0,)),
    "soft_margin": (lambda r, a, y: F.soft_margin_loss(a, y, reduction=r), R.ref_soft_margin, "x y", (0,)),
    "poisson_log": (lambda r, a, t: F.poisson_nll_loss(a, t, reduction=r),
                    lambda a, t: R.ref_poisson_nll(a, t), "x c", (0, 1)),
    "poisson_full": (lambda r, a, t: F.poisson_nll_loss(a, t, log_input=False, full=True, reduction=r),
                     lambda a, t: R.ref_poisson_nll(a, t, False, True), "p c", (0, 1)),
    "gaussian": (lambda r, a, t, v: F.gaussian_nll_loss(a, t, v, full=True, reduction=r),
                 lambda a, t, v: R.ref_gaussian_nll(a, t, v, True), "x x p", (0, 1, 2)),
    "multilabel": (lambda r, a, y: F.multilabel_soft_margin_loss(a, y, reduction=r),
                   R.ref_multilabel_soft_margin, "x b", (0,)),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
@settings(max_examples=6)
@given(shape=st.sampled_from([(1,), (4,), (2, 3)]), reduction=st.sampled_from(REDUCTIONS), dtype=DTYPES,
       seed=SEEDS)
def test_elementwise_losses_match_reference(name, shape, reduction, dtype, seed):
    ours, ref, kinds, grad_of = LOSSES[name]
    rng = np.random.default_rng(seed)
    draw = {"x": lambda: rng.standard_normal(shape) * 2, "y": lambda: _labels(rng, shape),
            # counts off 1.0: Stirling's term switches on at t > 1 (a jump the differences must not straddle)
            "c": lambda: rng.poisson(2.0, shape).astype(np.float64) + 0.25,
            "p": lambda: rng.random(shape) + 0.1, "b": lambda: (rng.random(shape) < 0.5).astype(np.float64)}
    arrays = [draw[k]() for k in kinds.split()]
    got = ours(reduction, *[Tensor(a.astype(dtype)) for a in arrays])
    want = R.reduce(ref(*[a.astype(dtype).astype(np.float64) for a in arrays]), reduction)
    _close(got, want, dtype)
    mask = [i in grad_of for i in range(len(arrays))]
    _check_grads(lambda *t: ours(reduction, *t), lambda *a: R.reduce(ref(*a), reduction), arrays, seed, mask)


@settings(max_examples=10)
@given(n=st.sampled_from([None, 1, 3]), margin=st.sampled_from([0.0, 0.4]), p=st.sampled_from([1.0, 2.0]),
       swap=st.booleans(), reduction=st.sampled_from(REDUCTIONS), seed=SEEDS)
def test_cosine_embedding_and_triplet_losses(n, margin, p, swap, reduction, seed):
    rng = np.random.default_rng(seed)
    lead = () if n is None else (n,)
    a, b, c = (rng.standard_normal(lead + (4,)) for _ in range(3))
    y = _labels(rng, lead)
    got = F.cosine_embedding_loss(Tensor(a), Tensor(b), Tensor(y), margin=margin, reduction=reduction)
    _close(got, R.reduce(R.ref_cosine_embedding(a, b, y, margin), reduction), np.float64)
    _check_grads(lambda s, t: F.cosine_embedding_loss(s, t, Tensor(y), margin=margin, reduction=reduction),
                 lambda s, t: R.reduce(R.ref_cosine_embedding(s, t, y, margin), reduction), [a, b], seed)
    tm = margin + 1.0
    got = F.triplet_margin_loss(Tensor(a), Tensor(b), Tensor(c), margin=tm, p=p, swap=swap, reduction=reduction)
    _close(got, R.reduce(R.ref_triplet(a, b, c, tm, p, 1e-6, swap), reduction), np.float64)
    _check_grads(lambda s, t, u: F.triplet_margin_loss(s, t, u, margin=tm, p=p, swap=swap, reduction=reduction),
                 lambda s, t, u: R.reduce(R.ref_triplet(s, t, u, tm, p, 1e-6, swap), reduction), [a, b, c], seed)


def test_poisson_nll_full_adds_stirling_only_above_one():
    x, t = np.full(4, 0.5), np.array([0.0, 1.0, 2.0, 5.0])
    got = F.poisson_nll_loss(Tensor(x), Tensor(t), full=True, reduction="none")
    _close(got, R.ref_poisson_nll(x, t, True, True), np.float64)
    assert got.data[1] == pytest.approx(np.exp(0.5) - 0.5, rel=1e-12)   # t = 1: no Stirling term


def test_gaussian_nll_var_shapes_clamp_and_its_gradient():
    rng = np.random.default_rng(5)
    x, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    for var in (rng.random(3) + 0.1, rng.random((3, 1)) + 0.1, rng.random((1, 4)) + 0.1):
        _close(F.gaussian_nll_loss(Tensor(x), Tensor(t), Tensor(var)), R.ref_gaussian_nll(x, t, var).mean(),
               np.float64)
    _close(F.gaussian_nll_loss(Tensor(x), Tensor(t), 0.5), R.ref_gaussian_nll(x, t, np.full((3, 4), 0.5)).mean(),
           np.float64)
    # torch clamps var at eps under no_grad: the clamped value, the unclamped (identity) gradient
    v = Tensor(np.array([1e-9, 1.0]), requires_grad=True)
    F.gaussian_nll_loss(Tensor(np.zeros(2)), Tensor(np.array([1.0, 1.0])), v, reduction="sum").backward()
    np.testing.assert_allclose(v.grad.data if isinstance(v.grad, Tensor) else v.grad,
                               [0.5 / 1e-6 - 0.5 / 1e-12, 0.0], rtol=1e-9)
    with pytest.raises(ValueError, match="incorrect size"):
        F.gaussian_nll_loss(Tensor(x), Tensor(t), Tensor(np.ones((2, 2))))
    with pytest.raises(ValueError, match="negative"):
        F.gaussian_nll_loss(Tensor(x), Tensor(t), Tensor(-np.ones((3, 4))))


def test_multilabel_soft_margin_weight_and_large_logits():
    x = np.array([[800.0, -800.0, 0.0]])
    y = np.array([[0.0, 1.0, 1.0]])
    w = np.array([1.0, 2.0, 3.0])
    got = F.multilabel_soft_margin_loss(Tensor(x), Tensor(y), Tensor(w), reduction="none")
    _close(got, R.ref_multilabel_soft_margin(x, y, w), np.float64)
    assert np.isfinite(got.data).all()


@pytest.mark.parametrize("legacy,reduction", [({"reduce": False}, "none"), ({"size_average": False}, "sum"),
                                              ({"size_average": True, "reduce": True}, "mean")])
def test_legacy_size_average_and_reduce_decide_the_reduction(legacy, reduction):
    # pinned: they were accepted and ignored, so reduce=False silently gave the mean
    x, y = Tensor(np.array([0.5, -1.0, 2.0])), Tensor(np.array([1.0, -1.0, 1.0]))
    calls = [lambda **kw: F.soft_margin_loss(x, y, **kw), lambda **kw: F.hinge_embedding_loss(x, y, **kw),
             lambda **kw: F.margin_ranking_loss(x, x * 0.5, y, **kw), lambda **kw: F.poisson_nll_loss(x, y * y, **kw),
             lambda **kw: F.multilabel_soft_margin_loss(x.reshape(1, 3), y.reshape(1, 3), **kw),
             lambda **kw: F.triplet_margin_loss(x, x, y, **kw),
             lambda **kw: F.cosine_embedding_loss(x.reshape(1, 3), y.reshape(1, 3), Tensor(np.ones(1)), **kw)]
    for call in calls:
        with pytest.warns(UserWarning, match=f"reduction='{reduction}'"):
            got = call(**legacy)
        np.testing.assert_array_equal(got.data, call(reduction=reduction).data)


def test_a_target_shape_that_differs_warns_and_one_that_does_not_fit_raises():
    x = Tensor(np.zeros((3, 1)))
    with pytest.warns(UserWarning, match="incorrect results due to broadcasting"):
        assert F.hinge_embedding_loss(x, Tensor(np.ones(3)), reduction="none").shape == (3, 3)
    for call in (lambda: F.soft_margin_loss(Tensor(np.zeros(3)), Tensor(np.ones(2))),
                 lambda: F.hinge_embedding_loss(Tensor(np.zeros(3)), Tensor(np.ones(2))),
                 lambda: F.margin_ranking_loss(Tensor(np.zeros((2, 3))), Tensor(np.ones(3)), Tensor(np.ones((2, 3)))),
                 lambda: F.triplet_margin_loss(Tensor(np.zeros((2, 3))), Tensor(np.zeros(3)), Tensor(np.ones((2, 3))))):
        with pytest.raises(RuntimeError):
            call()


# ----------------------------------------------------------------------------- random ops
def test_dropout1d_drops_whole_channels_and_checks_rank():
    na.manual_seed(0)
    y = F.dropout1d(Tensor(np.ones((4, 16, 3))), p=0.5).data
    assert set(np.unique(y)) <= {0.0, 2.0} and (y.std(axis=-1) == 0).all() and 0 < (y == 0).mean() < 1
    assert F.dropout1d(Tensor(np.ones((16, 3))), p=0.5).shape == (16, 3)       # unbatched (C, L)
    with pytest.raises(RuntimeError, match="2D or 3D"):
        F.dropout1d(Tensor(np.ones((2, 3, 4, 5))))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout1d(Tensor(np.ones((2, 3))), p=1.5)
    layer = nn.Dropout1d(0.5).eval()
    x = Tensor(np.ones((2, 3, 4)))
    assert layer(x) is x


def test_alpha_dropout_keeps_selu_statistics_and_its_affine_form():
    p = 0.3
    assert F.alpha_dropout(Tensor(np.ones(3)), p).tolist() == [1.0, 1.0, 1.0]          # torch: training=False
    na.manual_seed(1)
    x = np.random.default_rng(0).standard_normal(200_000)
    y = F.alpha_dropout(Tensor(x), p, training=True).data
    assert abs(y.mean()) < 0.01 and abs(y.std() - 1) < 0.01
    alpha = 1.7580993408473766
    a = ((1 - p) * (1 + p * alpha ** 2)) ** -0.5
    b = a * alpha * p
    kept = np.isclose(y, a * x + b, rtol=0, atol=1e-12)
    dropped = np.isclose(y, -a * alpha + b, rtol=0, atol=1e-12)
    assert (kept | dropped).all() and abs(dropped.mean() - p) < 0.01
    assert F.alpha_dropout(Tensor(np.ones(3)), 1.0, training=True).tolist() == [0.0, 0.0, 0.0]
    xt = Tensor(np.ones(4), requires_grad=True)
    na.manual_seed(2)
    F.alpha_dropout(xt, 0.5, training=True).sum().backward()
    a_half = (0.5 * (1 + 0.5 * alpha ** 2)) ** -0.5  # the gradient: a where kept, 0 where dropped
    g = xt.grad.data if isinstance(xt.grad, Tensor) else xt.grad
    assert (np.isclose(g, 0.0, rtol=0, atol=0) | np.isclose(g, a_half, rtol=1e-12)).all()


@pytest.mark.parametrize("dim", [-1, 0])
def test_gumbel_softmax_hard_is_one_hot_with_the_soft_gradient(dim):
    logits = np.random.default_rng(4).standard_normal((3, 4))
    upstream = np.random.default_rng(5).standard_normal((3, 4))
    grads, values = [], []
    for hard in (False, True):
        na.manual_seed(7)
        x = Tensor(logits.copy(), requires_grad=True)
        y = F.gumbel_softmax(x, tau=0.5, hard=hard, dim=dim)
        (y * Tensor(upstream)).sum().backward()
        grads.append(x.grad.data if isinstance(x.grad, Tensor) else x.grad)
        values.append(y.data)
    soft, hard = values
    np.testing.assert_allclose(soft.sum(axis=dim), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(hard, (soft == soft.max(axis=dim, keepdims=True)).astype(float))
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="tau"):
        F.gumbel_softmax(Tensor(logits), tau=0.0)   # torch returns NaN here


# ----------------------------------------------------------------------------- errors
ERRORS = [
    (lambda: F.elu(np.array([1, 2])), TypeError),
    (lambda: F.celu(Tensor(np.ones(2)), alpha=0.0), RuntimeError),
    (lambda: F.hardtanh(Tensor(np.ones(2)), 1.0, -1.0), ValueError),
    (lambda: nn.Hardtanh(1.0, 1.0), ValueError),
    (lambda: F.glu(Tensor(np.array(1.0))), RuntimeError),
    (lambda: F.glu(Tensor(np.ones(4)), dim=1), IndexError),
    (lambda: F.prelu(Tensor(np.ones((2, 3))), Tensor(np.ones(2))), RuntimeError),
    (lambda: F.prelu(Tensor(np.ones((2, 3, 4))), Tensor(np.ones((1, 3)))), RuntimeError),  # pinned: was accepted
    (lambda: F.prelu(Tensor(np.ones(3)), Tensor(np.ones(3))), RuntimeError),
    (lambda: F.normalize(Tensor(np.ones(3)), dim=1), IndexError),
    (lambda: F.cosine_similarity(Tensor(np.ones(3)), Tensor(np.ones(3))), IndexError),
    (lambda: F.cosine_similarity(Tensor(np.ones((2, 3))), Tensor(np.ones((2, 4)))), ValueError),
    (lambda: F.alpha_dropout(Tensor(np.ones(2)), p=-0.1), ValueError),
    (lambda: F.local_response_norm(Tensor(np.ones((2, 3))), 2), ValueError),
    (lambda: F.local_response_norm(Tensor(np.ones((2, 3, 4))), 0), RuntimeError),
    (lambda: F.instance_norm(Tensor(np.ones((2, 3, 4))), weight=Tensor(np.ones(2))), RuntimeError),
    (lambda: F.instance_norm(Tensor(np.ones((2, 3, 4))), Tensor(np.zeros(1)), Tensor(np.ones(1))), RuntimeError),
    (lambda: F.bilinear(Tensor(np.ones((2, 3))), Tensor(np.ones((1, 4))), Tensor(np.ones((5, 3, 4)))), RuntimeError),
    (lambda: F.triplet_margin_loss(Tensor(np.ones(3)), Tensor(np.ones(3)), Tensor(np.ones(3)), margin=0.0),
     ValueError),
    (lambda: nn.TripletMarginLoss(margin=-1.0), ValueError),
    (lambda: F.soft_margin_loss(Tensor(np.ones(2)), Tensor(np.ones(2)), reduction="avg"), ValueError),
    (lambda: nn.MarginRankingLoss(reduction="batchmean"), ValueError),
    (lambda: F.one_hot(np.array([1]), 1.5), TypeError),
    (lambda: F.one_hot(np.zeros((2, 0), dtype=np.int64), 0), RuntimeError),
    # pinned: an out-of-range dim on an empty input was accepted (softmax of nothing along no axis)
    (lambda: F.softmin(Tensor(np.zeros((2, 0))), dim=2), IndexError),
    # pinned: broadcasting that grows the input (torch refuses it for these two)
    (lambda: F.soft_margin_loss(Tensor(np.zeros(3)), Tensor(np.ones((3, 1)))), RuntimeError),
    (lambda: F.multilabel_soft_margin_loss(Tensor(np.zeros((3, 1))), Tensor(np.ones(3))), RuntimeError),
    (lambda: F.multilabel_soft_margin_loss(Tensor(np.array(1.0)), Tensor(np.array(1.0))), IndexError),
    (lambda: F.cosine_embedding_loss(Tensor(np.ones((2, 3))), Tensor(np.ones((2, 3))), Tensor(np.array(1.0))),
     RuntimeError),
]


@pytest.mark.parametrize("call,error", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_bad_arguments_raise_torchs_error_at_the_call(call, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error):
            call()


# ----------------------------------------------------------------------------- modules
MODULES = [
    (nn.ELU(), F.elu, "ELU(alpha=1.0)"),
    (nn.SELU(), F.selu, "SELU()"),
    (nn.CELU(), F.celu, "CELU(alpha=1.0)"),
    (nn.Mish(), F.mish, "Mish()"),
    (nn.Hardswish(), F.hardswish, "Hardswish()"),
    (nn.Hardsigmoid(), F.hardsigmoid, "Hardsigmoid()"),
    (nn.Hardtanh(), F.hardtanh, "Hardtanh(min_val=-1.0, max_val=1.0)"),
    (nn.ReLU6(), F.relu6, "ReLU6()"),
    (nn.LogSigmoid(), F.logsigmoid, "LogSigmoid()"),
    (nn.Softsign(), F.softsign, "Softsign()"),
    (nn.Tanhshrink(), F.tanhshrink, "Tanhshrink()"),
    (nn.Threshold(0.1, 20.0), lambda x: F.threshold(x, 0.1, 20.0), "Threshold(threshold=0.1, value=20.0)"),
    (nn.GLU(), F.glu, "GLU(dim=-1)"),
    (nn.Softmin(dim=1), lambda x: F.softmin(x, 1), "Softmin(dim=1)"),
    (nn.LocalResponseNorm(2), lambda x: F.local_response_norm(x, 2), "LocalResponseNorm(2, alpha=0.0001, beta=0.75, k=1.0)"),
]


@pytest.mark.parametrize("module,fn,text", MODULES, ids=[m[2].split("(")[0] for m in MODULES])
def test_activation_modules_are_their_functions(module, fn, text):
    x = Tensor(np.random.default_rng(0).standard_normal((2, 4, 2)))
    np.testing.assert_array_equal(module(x).data, fn(x).data)
    assert repr(module) == text and not list(module.parameters())


def test_prelu_module_defaults_and_state_dict():
    act = nn.PReLU()
    assert list(act.state_dict()) == ["weight"] and act.weight.shape == (1,) and act.weight.data[0] == np.float32(0.25)
    per_channel = nn.PReLU(num_parameters=3, init=0.1)
    x = Tensor(np.array([[-1.0, -2.0, 3.0]]))
    np.testing.assert_allclose(per_channel(x).data, [[-0.1, -0.2, 3.0]], rtol=1e-6)
    with pytest.raises(RuntimeError):
        per_channel(Tensor(np.ones((2, 4))))


def test_loss_modules_defaults_and_buffers():
    rng = np.random.default_rng(0)
    a, b, c = (Tensor(rng.standard_normal((3, 4))) for _ in range(3))
    y = Tensor(_labels(rng, (3,)))
    assert nn.MarginRankingLoss().margin == 0.0 and nn.HingeEmbeddingLoss().margin == 1.0
    assert nn.CosineEmbeddingLoss().margin == 0.0 and nn.TripletMarginLoss().margin == 1.0
    trip = nn.TripletMarginLoss()
    assert (trip.p, trip.eps, trip.swap) == (2.0, 1e-6, False)
    pois = nn.PoissonNLLLoss()
    assert (pois.log_input, pois.full, pois.eps, pois.reduction) == (True, False, 1e-8, "mean")
    gauss = nn.GaussianNLLLoss()
    assert (gauss.full, gauss.eps) == (False, 1e-6)
    assert nn.CosineEmbeddingLoss()(a, b, y).item() == F.cosine_embedding_loss(a, b, y).item()
    assert trip(a, b, c).item() == F.triplet_margin_loss(a, b, c).item()
    w = Tensor(np.array([1.0, 2.0, 3.0, 4.0]))
    mlsm = nn.MultiLabelSoftMarginLoss(weight=w)
    assert list(mlsm.state_dict()) == ["weight"]
    target = Tensor((rng.random((3, 4)) < 0.5).astype(np.float64))
    assert mlsm(a, target).item() == F.multilabel_soft_margin_loss(a, target, w).item()
    assert nn.SoftMarginLoss(reduction="sum")(a, target).item() == F.soft_margin_loss(a, target, reduction="sum").item()


def test_instance_norm_module_state_dict_names_and_distance_modules():
    assert list(nn.InstanceNorm2d(3).state_dict()) == []
    names = list(nn.InstanceNorm2d(3, affine=True, track_running_stats=True).state_dict())
    assert names == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert list(nn.InstanceNorm1d(3, affine=True, bias=False).state_dict()) == ["weight"]
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 2, 2)))
    np.testing.assert_allclose(nn.InstanceNorm2d(3)(x).data, R.ref_instance_norm(x.data), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="4D"):
        nn.InstanceNorm2d(3)(Tensor(np.ones((2, 3))))
    dist = nn.PairwiseDistance(p=1.0, eps=0.0, keepdim=True)
    assert (dist.norm, dist.eps, dist.keepdim) == (1.0, 0.0, True)
    assert dist(Tensor(np.ones((2, 3))), Tensor(np.zeros((2, 3)))).tolist() == [[3.0], [3.0]]
    cos = nn.CosineSimilarity()
    assert (cos.dim, cos.eps) == (1, 1e-8)
    assert isinstance(nn.AlphaDropout(0.2), nn.Dropout) and nn.AlphaDropout().p == 0.5


def test_parameter_list_and_dict():
    params = nn.ParameterList([nn.Parameter(np.zeros(2)), Tensor(np.ones(3))])   # a Tensor is wrapped
    params.append(nn.Parameter(np.ones(1)))
    assert len(params) == 3 and all(isinstance(p, nn.Parameter) for p in params)
    assert [n for n, _ in params.named_parameters()] == ["0", "1", "2"] and params[-1].shape == (1,)
    params[0] = nn.Parameter(np.full(2, 5.0))
    assert params[0].data.tolist() == [5.0, 5.0] and len(params[1:]) == 2
    with pytest.raises(IndexError):
        params[3]
    with pytest.raises(TypeError):
        params.append(np.zeros(2))
    holder = nn.Module()
    holder.scales = params
    holder.named = nn.ParameterDict({"a": nn.Parameter(np.ones(2))})
    holder.named["b"] = nn.Parameter(np.zeros(1))
    assert list(holder.state_dict()) == ["scales.0", "scales.1", "scales.2", "named.a", "named.b"]
    assert "a" in holder.named and list(holder.named.keys()) == ["a", "b"] and len(holder.named) == 2
    del holder.named["a"]
    assert list(holder.named) == ["b"]


NEW_MODULES = ["neural_arch.nn.functional.activations", "neural_arch.nn.functional.distances",
               "neural_arch.nn.functional.encodings", "neural_arch.nn.functional.stochastic",
               "neural_arch.nn.functional.norms", "neural_arch.nn.functional.losses",
               "neural_arch.nn.functional.bilinear_form", "neural_arch.nn.activation", "neural_arch.nn.loss",
               "neural_arch.nn.normalization", "neural_arch.nn.distance", "neural_arch.nn.instancenorm",
               "neural_arch.nn.bilinear", "neural_arch.nn.parameter_containers", "nn_added_references"]


@pytest.mark.parametrize("name", NEW_MODULES)
def test_docstring_examples(name):
    na.manual_seed(0)
    assert doctest.testmod(importlib.import_module(name), verbose=False).failed == 0
