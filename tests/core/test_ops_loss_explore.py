"""Exploring properties of the losses against float64 NumPy references written from torch's
documented formulas (``tests/core/ops_references.py``): ``cross_entropy`` with class indices and
with probability targets, ``weight=``, ``ignore_index=``, ``label_smoothing=``, every reduction,
``(C,)``, ``(N, C)`` and ``(N, C, d1, ...)`` inputs; ``nll_loss`` with the same options; ``mse_loss``
with a broadcasting target. Float32 and float64. Pinned ``@example`` cases are bugs this exploration
found; the references themselves were checked against torch 2.13 while writing them.

Example of the formula the references implement (torch's, for class indices)::

    loss_n = (1 - eps) * w[y_n] * -log p[n, y_n] + eps / C * sum_c w[c] * -log p[n, c]
    mean   = sum_n loss_n / sum_n w[y_n]          (over rows whose target is not ignore_index)
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch.nn.functional as F
from neural_arch import Tensor, nn
from tests.core import ops_references as ref

TOL = {np.float64: 1e-10, np.float32: 3e-5}
DTYPES = st.sampled_from([np.float64, np.float32])
REDUCTIONS = st.sampled_from(["mean", "sum", "none"])
LAYOUTS = st.sampled_from([(3,), (4, 3), (1, 1), (2, 3, 2), (2, 2, 1, 3)])  # (C,), (N, C), (N, C, d...)


def _close(got, want, dtype, what=""):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=what)


def _target_shape(shape):
    return () if len(shape) == 1 else (shape[0],) + tuple(shape[2:])


def _class_case(seed, shape, dtype, ignore):
    rng = np.random.default_rng(seed)
    C = shape[0] if len(shape) == 1 else shape[1]
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    t = np.asarray(rng.integers(0, C, _target_shape(shape)), dtype=np.int64)
    if ignore and t.size:
        t.reshape(-1)[rng.random(t.size) < 0.4] = -1  # ignore_index=-1 in these tests
    w = (rng.random(C) + 0.25).astype(dtype)
    return x, t, w, C


def _upstream(seed, reduction, tshape):
    rng = np.random.default_rng(seed + 7)
    return rng.standard_normal(tshape if reduction == "none" else ())


@settings(max_examples=60)
@given(shape=LAYOUTS, dtype=DTYPES, seed=st.integers(0, 2**16), reduction=REDUCTIONS,
       weighted=st.booleans(), ignore=st.booleans(), smoothing=st.sampled_from([0.0, 0.1, 1.0]))
@example(shape=(4, 3), dtype=np.float64, seed=0, reduction="mean", weighted=True, ignore=True, smoothing=0.1)
def test_cross_entropy_class_targets_match_torch_formula(shape, dtype, seed, reduction, weighted, ignore,
                                                         smoothing):
    """Pins: ``weight=`` did not exist (a torch user's third positional argument was taken as
    ``ignore_index``)."""
    x, t, w, C = _class_case(seed, shape, dtype, ignore)
    tx = Tensor(x, requires_grad=True)
    kwargs = {"weight": Tensor(w)} if weighted else {}
    out = F.cross_entropy(tx, t, ignore_index=-1, reduction=reduction, label_smoothing=smoothing, **kwargs)
    a, share = ref.class_coefficients(t.reshape(-1), C, w.astype(np.float64) if weighted else None, -1, smoothing)
    g = _upstream(seed, reduction, t.shape)
    want, grad_rows = ref.cross_entropy_rows(ref.classes_last(x.astype(np.float64)), a, share, reduction, g)
    out.backward(Tensor(np.asarray(g, dtype=dtype)))
    assert out.dtype == dtype
    _close(out.data, np.reshape(want, t.shape) if reduction == "none" else want, dtype, "loss")
    if not (reduction == "mean" and share.sum() == 0):  # every row ignored: nan loss (torch) and gradient
        _close(tx.grad.data, ref.classes_back(grad_rows, shape), dtype, "grad")


@settings(max_examples=40)
@given(shape=LAYOUTS, dtype=DTYPES, seed=st.integers(0, 2**16), reduction=REDUCTIONS,
       weighted=st.booleans(), smoothing=st.sampled_from([0.0, 0.2]))
def test_cross_entropy_probability_targets_match_torch_formula(shape, dtype, seed, reduction, weighted, smoothing):
    """Soft labels: ``loss_n = -sum_c w_c t'_c log p_c`` with ``t' = (1 - eps) t + eps / C``; mean
    divides by the number of rows (torch ignores the weights there)."""
    rng = np.random.default_rng(seed)
    C = shape[0] if len(shape) == 1 else shape[1]
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    p = rng.random(shape)
    p = (p / p.sum(axis=0 if len(shape) == 1 else 1, keepdims=True)).astype(dtype)
    w = (rng.random(C) + 0.25).astype(dtype)
    tx, tp = Tensor(x, requires_grad=True), Tensor(p, requires_grad=True)
    kwargs = {"weight": w} if weighted else {}
    out = F.cross_entropy(tx, tp, reduction=reduction, label_smoothing=smoothing, **kwargs)
    rows_p = ref.classes_last(p.astype(np.float64)) * (1 - smoothing) + smoothing / C
    a = rows_p * (w.astype(np.float64)[None, :] if weighted else 1.0)
    M = rows_p.shape[0]
    g = _upstream(seed, reduction, _target_shape(shape))
    red = "sum" if reduction == "mean" else reduction
    want, grad_rows = ref.cross_entropy_rows(ref.classes_last(x.astype(np.float64)), a, np.ones(M), red,
                                             g / M if reduction == "mean" else g)
    if reduction == "mean":
        want = want / M
    out.backward(Tensor(np.asarray(g, dtype=dtype)))
    _close(out.data, np.reshape(want, _target_shape(shape)) if reduction == "none" else want, dtype, "loss")
    _close(tx.grad.data, ref.classes_back(grad_rows, shape), dtype, "grad logits")
    logp = ref.log_softmax(ref.classes_last(x.astype(np.float64)), -1)
    scale = np.full(M, g / M) if reduction == "mean" else np.broadcast_to(np.asarray(g, float).reshape(-1), (M,))
    gp = -logp * (w.astype(np.float64)[None, :] if weighted else 1.0) * (1 - smoothing) * scale[:, None]
    _close(tp.grad.data, ref.classes_back(gp, shape), dtype, "grad target")


@settings(max_examples=50)
@given(shape=LAYOUTS, dtype=DTYPES, seed=st.integers(0, 2**16), reduction=REDUCTIONS,
       weighted=st.booleans(), ignore=st.booleans())
@example(shape=(2, 3, 2), dtype=np.float64, seed=0, reduction="mean", weighted=False, ignore=False)
@example(shape=(3,), dtype=np.float64, seed=0, reduction="none", weighted=True, ignore=False)
def test_nll_loss_matches_torch_formula(shape, dtype, seed, reduction, weighted, ignore):
    """Pins: (N, C, d) inputs and (C,) inputs were mis-indexed or refused, ``weight=`` did not exist."""
    x, t, w, _ = _class_case(seed, shape, dtype, ignore)
    logp_in = np.asarray(x - 3.0, dtype=dtype)  # any values: nll_loss does not normalise
    tx = Tensor(logp_in, requires_grad=True)
    kwargs = {"weight": Tensor(w)} if weighted else {}
    out = F.nll_loss(tx, t, ignore_index=-1, reduction=reduction, **kwargs)
    rows = ref.classes_last(logp_in.astype(np.float64))
    tf = t.reshape(-1)
    keep = tf != -1
    safe = np.where(keep, tf, 0)
    wy = (w.astype(np.float64)[safe] if weighted else np.ones(tf.size)) * keep
    per_row = -rows[np.arange(tf.size), safe] * wy
    g = _upstream(seed, reduction, t.shape)
    with np.errstate(all="ignore"):
        if reduction == "mean":
            want, scale = per_row.sum() / wy.sum(), np.full(tf.size, g / wy.sum())
        elif reduction == "sum":
            want, scale = per_row.sum(), np.full(tf.size, float(g))
        else:
            want, scale = per_row.reshape(t.shape), np.asarray(g, float).reshape(-1)
    grad_rows = np.zeros(rows.shape)
    grad_rows[np.arange(tf.size), safe] = -wy * scale
    out.backward(Tensor(np.asarray(g, dtype=dtype)))
    assert out.dtype == dtype
    _close(out.data, want, dtype, "loss")
    if np.all(np.isfinite(grad_rows)):
        _close(tx.grad.data, ref.classes_back(grad_rows, shape), dtype, "grad")


@settings(max_examples=30)
@given(shapes=st.sampled_from([((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1), (2, 3)), ((), ()), ((0,), (0,))]),
       dtype=DTYPES, seed=st.integers(0, 2**16), reduction=REDUCTIONS)
def test_mse_loss_matches_numpy_with_broadcasting(shapes, dtype, seed, reduction):
    rng = np.random.default_rng(seed)
    si, st_ = shapes
    a, b = np.asarray(rng.standard_normal(si)).astype(dtype), np.asarray(rng.standard_normal(st_)).astype(dtype)
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    out = F.mse_loss(ta, tb, reduction=reduction)
    d = a.astype(np.float64) - b.astype(np.float64)
    g = np.asarray(rng.standard_normal(d.shape if reduction == "none" else ()))
    with np.errstate(all="ignore"):
        want = {"mean": (d * d).mean(), "sum": (d * d).sum(), "none": d * d}[reduction]
        gd = 2 * d * (g / d.size if reduction == "mean" else g)
    out.backward(Tensor(g.astype(dtype)))
    _close(out.data, want, dtype, "loss")
    _close(ta.grad.data, ref.unbroadcast(gd, si), dtype, "grad input")
    _close(tb.grad.data, ref.unbroadcast(-gd, st_), dtype, "grad target")


def test_nll_loss_refuses_what_torch_refuses():
    """Pins: a negative target picked a class from the end (NumPy's wrap-around), an unknown reduction
    silently meant "mean", a float target was truncated, and every row ignored gave 0 instead of
    torch's nan."""
    logp = Tensor(np.log(np.full((2, 3), 1.0 / 3.0)))
    with pytest.raises(IndexError):
        F.nll_loss(logp, np.array([-1, 0]))
    with pytest.raises(IndexError):
        F.nll_loss(logp, np.array([3, 0]))
    with pytest.raises(ValueError, match="reduction"):
        F.nll_loss(logp, np.array([1, 0]), reduction="avg")
    with pytest.raises(TypeError):
        F.nll_loss(logp, np.array([1.7, 0.0]))
    with pytest.raises(ValueError):
        F.nll_loss(logp, np.array([1, 0, 2]))  # 3 targets for 2 rows
    assert np.isnan(F.nll_loss(logp, np.array([-100, -100])).item())


def test_cross_entropy_weight_is_torch_third_positional_argument():
    x = np.random.default_rng(0).standard_normal((3, 3))
    t = np.array([0, 1, 2])
    w = np.array([1.0, 2.0, 3.0])
    positional = F.cross_entropy(Tensor(x), t, w).item()
    assert positional == F.cross_entropy(Tensor(x), t, weight=w).item()
    logp = ref.log_softmax(x, -1)
    assert positional == pytest.approx(-(w * logp[[0, 1, 2], t]).sum() / w.sum(), rel=1e-12)
    with pytest.raises(TypeError):
        F.cross_entropy(Tensor(x), t, w, -100)  # torch's 4th is the legacy size_average: refuse, not guess
    with pytest.raises(ValueError, match="weight"):
        F.cross_entropy(Tensor(x), t, weight=np.ones(4))
    module = nn.CrossEntropyLoss(weight=Tensor(w), ignore_index=2)
    assert module(Tensor(x), t).item() == pytest.approx(F.cross_entropy(Tensor(x), t, w, ignore_index=2).item())


def test_softmax_family_on_empty_dims_returns_empty_like_torch():
    """Pin: softmax/log_softmax over (or beside) a size-0 dim raised a NumPy reduction error."""
    for shape, dim in (((2, 0), -1), ((0, 3), 0), ((0, 3), 1), ((0,), 0)):
        x = Tensor(np.zeros(shape), requires_grad=True)
        for op in (F.softmax, F.log_softmax):
            out = op(x, dim=dim)
            assert out.shape == shape
            out.sum().backward()
            assert x.grad.shape == shape


def test_integer_logits_and_dropout_inputs_are_refused_not_truncated():
    """Pins: ``cross_entropy`` of int64 logits returned the loss cast to int64 (1 for 1.9076), and
    ``dropout(p=0.3)`` of an int64 tensor scaled by ``int(1 / 0.7) == 1``; torch raises for both."""
    x = Tensor(np.array([[1, 2, 3], [3, 2, 1]]))
    with pytest.raises(TypeError, match="floating-point"):
        F.cross_entropy(x, np.array([0, 1]))
    with pytest.raises(TypeError, match="floating-point"):
        F.dropout(Tensor(np.array([1, 2, 3, 4])), 0.3)
