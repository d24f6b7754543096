"""cross_entropy's target kinds (host side): probability ("soft label") targets as torch has them,
gradient-checked in float64; float class-index targets refused like torch (use ``.long()``)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neural_arch.nn.functional as F
from neural_arch.core.tensor import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "core"))
from core_testutils import check_grad, randn


def _probs(seed, shape, axis):
    rng = np.random.default_rng(seed)
    e = np.exp(rng.standard_normal(shape))
    return e / e.sum(axis=axis, keepdims=True)


def _reference(logits, target, axis, reduction, smoothing):
    """torch's formula for probability targets, written directly in NumPy."""
    C = logits.shape[axis]
    t = target * (1 - smoothing) + smoothing / C
    m = logits.max(axis=axis, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=axis, keepdims=True))
    per = -(t * logp).sum(axis=axis)
    if reduction == "mean":
        return per.sum() / per.size
    return per.sum() if reduction == "sum" else per


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("shape", [(4, 3), (3,), (2, 3, 2, 2)])
def test_probability_targets_match_torch_formula(reduction, smoothing, shape):
    axis = 0 if len(shape) == 1 else 1
    logits, target = randn(1, shape), _probs(2, shape, axis)
    got = F.cross_entropy(Tensor(logits), target, reduction=reduction, label_smoothing=smoothing).data
    np.testing.assert_allclose(got, _reference(logits, target, axis, reduction, smoothing), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@settings(deadline=None, max_examples=10)
@given(n=st.integers(1, 4), c=st.integers(1, 4), seed=st.integers(0, 2**16), smoothing=st.sampled_from([0.0, 0.2]))
def test_probability_targets_gradcheck(reduction, n, c, seed, smoothing):
    # Gradients w.r.t. the logits and the (not necessarily normalised) soft target, float64.
    target = np.abs(randn(seed + 1, (n, c))) + 0.1
    check_grad(lambda x, t: F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing),
               randn(seed, (n, c)), target)


def test_probability_targets_gradcheck_spatial_and_unbatched():
    check_grad(lambda x, t: F.cross_entropy(x, t), randn(3, (2, 3, 2)), _probs(4, (2, 3, 2), 1))
    check_grad(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), randn(5, (4,)), _probs(6, (4,), 0))


def test_probability_targets_equal_one_hot_class_targets():
    logits = randn(7, (5, 4))
    labels = np.array([0, 3, 1, 2, 3])
    onehot = np.eye(4)[labels]
    for smoothing in (0.0, 0.1):
        a = F.cross_entropy(Tensor(logits), labels, label_smoothing=smoothing).item()
        b = F.cross_entropy(Tensor(logits), onehot, label_smoothing=smoothing).item()
        assert a == pytest.approx(b, rel=1e-12)
    x1, x2 = Tensor(logits, requires_grad=True), Tensor(logits, requires_grad=True)
    F.cross_entropy(x1, labels).backward()
    F.cross_entropy(x2, onehot).backward()
    np.testing.assert_allclose(x1.grad.data, x2.grad.data, rtol=1e-12, atol=1e-15)


def test_soft_target_tensor_gets_a_gradient_and_dtype_follows_logits():
    x = Tensor(randn(8, (3, 4)).astype(np.float32), requires_grad=True)
    t = Tensor(_probs(9, (3, 4), 1), requires_grad=True)  # float64 target for float32 logits
    loss = F.cross_entropy(x, t)
    assert loss.dtype == np.float32
    loss.backward()
    assert x.grad.dtype == np.float32 and t.grad.dtype == np.float64 and t.grad.shape == (3, 4)


@pytest.mark.parametrize("dtype,name", [(np.float32, "Float"), (np.float64, "Double"), (bool, "Bool")])
def test_float_class_index_targets_are_refused_like_torch(dtype, name):
    logits = Tensor(randn(10, (3, 4)))
    target = np.array([0, 1, 3]).astype(dtype)
    with pytest.raises(RuntimeError, match=f"expected scalar type Long but found {name}") as info:
        F.cross_entropy(logits, target)
    assert ".long()" in str(info.value)
    assert isinstance(info.value, TypeError)  # this project's convention for bad argument types
    assert F.cross_entropy(logits, Tensor(target).long()).shape == ()  # the fix the message names
    # float targets of the logits' shape are probabilities, not indices
    F.cross_entropy(logits, np.full((3, 4), 0.25, dtype=np.float32))


def test_class_targets_still_validated():
    logits = Tensor(randn(11, (3, 4)))
    with pytest.raises(IndexError, match="target 4 is out of range for 4 classes"):
        F.cross_entropy(logits, np.array([0, 4, 1]))
    with pytest.raises(IndexError, match="target -3 is out of range"):
        F.cross_entropy(logits, np.array([0, -3, 1]))
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(logits, np.array([0, 1, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="does not match"):
        F.cross_entropy(logits, np.array([0, 1]))
    assert F.cross_entropy(logits, np.array([7, 1, 7]), ignore_index=7).item() == pytest.approx(
        F.cross_entropy(logits[1:2], np.array([1])).item(), rel=1e-12)
