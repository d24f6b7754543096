"""Finite-difference gradient checks (float64) for activations, softmax family, where/clip,
dropout, embedding, layer_norm and the losses."""

from __future__ import annotations

import numpy as np
import pytest
from core_testutils import check_grad, randn
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neural_arch.nn.functional as F
from neural_arch.core.tensor import Tensor, manual_seed

SETTINGS = settings(deadline=None, max_examples=20)
seeds = st.integers(0, 2**16)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
nonscalar = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)


@pytest.mark.parametrize(
    "name,fn,positive",
    [
        ("exp", F.exp, False),
        ("log", F.log, True),
        ("sqrt", F.sqrt, True),
        ("abs", F.abs, False),
        ("tanh", F.tanh, False),
        ("sigmoid", F.sigmoid, False),
        ("relu", F.relu, False),
        ("gelu", F.gelu, False),
        ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), False),
        ("silu", F.silu, False),
        ("leaky_relu", lambda t: F.leaky_relu(t, 0.1), False),
        ("clip", lambda t: F.clip(t, -0.42, 0.71), False),
        ("clip_lo", lambda t: F.clip(t, min=-0.42), False),
        ("clip_hi", lambda t: t.clip(max=0.21), False),
        ("methods", lambda t: t.exp() + t.tanh() + t.sigmoid() + t.relu() + t.abs(), False),
    ],
)
@SETTINGS
@given(shape=shapes, seed=seeds)
def test_unary(name, fn, positive, shape, seed):
    # `spread` keeps values away from kinks (0 for relu/abs, the clip bounds).
    x = randn(seed, shape, positive=True) if positive else randn(seed, shape, spread=True)
    check_grad(fn, x)


def test_gelu_matches_erf_reference():
    import math

    xs = np.linspace(-4, 4, 41)
    got = F.gelu(Tensor(xs)).data
    ref = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xs])
    np.testing.assert_allclose(got, ref, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@SETTINGS
@given(shape=nonscalar, seed=seeds, data=st.data())
def test_softmax_family(name, shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    fn = getattr(F, name)
    check_grad(lambda t: fn(t, axis=axis), randn(seed, shape))
    assert np.isfinite(fn(Tensor(np.array([1000.0, -1000.0]))).data).all()


@SETTINGS
@given(shp=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3), seed=seeds)
def test_where(shp, seed):
    sc, sa, sb = shp.input_shapes
    cond = np.random.default_rng(seed).random(sc) > 0.5
    check_grad(lambda a, b: F.where(cond, a, b), randn(seed, sa), randn(seed + 1, sb))
    check_grad(lambda a: F.where(Tensor(cond), a, 0.0), randn(seed, sa))


def test_dropout_gradient_is_mask():
    manual_seed(0)
    x = Tensor(np.ones((50, 40)), requires_grad=True)
    y = F.dropout(x, p=0.3, training=True)
    y.sum().backward()
    mask = y.data
    np.testing.assert_array_equal(x.grad.data, mask)  # d(x*mask)/dx = mask, x = 1
    assert set(np.unique(mask)).issubset({0.0, 1.0 / 0.7})
    assert 0.2 < (mask == 0).mean() < 0.4
    # deterministic after manual_seed, identity in eval mode, all-zero at p=1
    manual_seed(0)
    np.testing.assert_array_equal(F.dropout(Tensor(np.ones((50, 40))), 0.3).data, mask)
    assert F.dropout(x, 0.3, training=False) is x
    assert (F.dropout(x, 1.0).data == 0).all()
    with pytest.raises(ValueError, match="p must be in"):
        F.dropout(x, 1.5)


def test_dropout_keeps_dtype():
    y = F.dropout(Tensor(np.ones((4, 4), np.float32)), 0.5)
    assert y.dtype == np.float32


@SETTINGS
@given(idx_shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4), seed=seeds)
def test_embedding(idx_shape, seed):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 4, size=idx_shape)  # repeated indices accumulate
    check_grad(lambda w: F.embedding(idx, w), randn(seed, (4, 3)))
    check_grad(lambda w: F.embedding(Tensor(idx), w), randn(seed, (4, 2)))


@SETTINGS
@given(lead=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3), d=st.integers(2, 4),
       affine=st.booleans(), two=st.booleans(), seed=seeds)
def test_layer_norm(lead, d, affine, two, seed):
    norm = (2, d) if two else (d,)
    x = randn(seed, lead + norm)
    if affine:
        w, b = randn(seed + 1, norm), randn(seed + 2, norm)
        check_grad(lambda x, w, b: F.layer_norm(x, norm, w, b), x, w, b)
    else:
        check_grad(lambda x: F.layer_norm(x, norm if two else d), x)


def test_layer_norm_values():
    x = np.random.default_rng(0).standard_normal((3, 5))
    y = F.layer_norm(Tensor(x), 5).data
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, atol=1e-10)
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(Tensor(x), 4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@SETTINGS
@given(n=st.integers(1, 4), c=st.integers(1, 4), seed=seeds, ignore=st.booleans())
def test_cross_entropy(reduction, n, c, seed, ignore):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, c, size=n)
    if ignore and n > 1:
        target[0] = -100
    check_grad(lambda t: F.cross_entropy(t, target, reduction=reduction), randn(seed, (n, c)))


def test_cross_entropy_values_and_shapes():
    logits = randn(0, (4, 3))
    target = np.array([0, 2, 1, 2])
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ref = -logp[np.arange(4), target]
    np.testing.assert_allclose(F.cross_entropy(Tensor(logits), target).item(), ref.mean())
    np.testing.assert_allclose(F.cross_entropy(Tensor(logits), target, reduction="none").data, ref)
    # ignore_index: mean over the remaining targets only
    t2 = target.copy()
    t2[1] = 7
    np.testing.assert_allclose(
        F.cross_entropy(Tensor(logits), t2, ignore_index=7).item(), ref[[0, 2, 3]].mean()
    )
    # (N, C, d) logits with (N, d) targets, and a 1-D (C,) logit vector with a scalar target
    l3 = randn(1, (2, 3, 2))
    t3 = np.array([[0, 2], [1, 1]])
    check_grad(lambda t: F.cross_entropy(t, t3), l3)
    check_grad(lambda t: F.cross_entropy(t, np.array(1)), randn(2, (3,)))
    check_grad(lambda t: F.cross_entropy(t, target, label_smoothing=0.1), logits)
    with pytest.raises(IndexError, match="out of range"):
        F.cross_entropy(Tensor(logits), np.array([0, 3, 1, 2]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(Tensor(logits), target, reduction="avg")


def test_nll_loss_matches_cross_entropy():
    logits = randn(3, (5, 4))
    target = np.array([0, 3, 1, 1, -100])
    a = F.cross_entropy(Tensor(logits), target).item()
    b = F.nll_loss(F.log_softmax(Tensor(logits)), target).item()
    np.testing.assert_allclose(a, b)
    check_grad(lambda t: F.nll_loss(F.log_softmax(t), target), logits)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@SETTINGS
@given(shp=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3), seed=seeds)
def test_mse_loss(reduction, shp, seed):
    sa, sb = shp.input_shapes
    check_grad(lambda a, b: F.mse_loss(a, b, reduction=reduction), randn(seed, sa), randn(seed + 1, sb))
    check_grad(lambda a: F.mse_loss(a, randn(seed + 1, sb), reduction=reduction), randn(seed, sa))
