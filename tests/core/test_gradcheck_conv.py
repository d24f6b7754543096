"""Convolution, pooling, padding, channel dropout and batch norm: values against naive NumPy
loops (stride, padding, dilation, groups, ceil_mode...) and float64 finite-difference gradients."""

from __future__ import annotations

import numpy as np
import pytest
from core_testutils import check_grad, randn
from hypothesis import given, settings
from hypothesis import strategies as st

import neural_arch.nn.functional as F
from neural_arch.core import ops_norm
from neural_arch.core.tensor import Tensor, manual_seed

SETTINGS = settings(deadline=None, max_examples=12)
seeds = st.integers(0, 2**16)


# ----------------------------------------------------------------------------- references
def conv2d_ref(x, w, b, stride, padding, dilation, groups):
    """The definition, one output element at a time."""
    n, _, h, wd = x.shape
    co, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, co, ho, wo))
    cog = co // groups
    for i in range(n):
        for o in range(co):
            g = o // cog
            for r in range(ho):
                for s in range(wo):
                    patch = xp[i, g * cg:(g + 1) * cg, r * sh:r * sh + dh * (kh - 1) + 1:dh,
                               s * sw:s * sw + dw * (kw - 1) + 1:dw]
                    out[i, o, r, s] = (patch * w[o]).sum() + (b[o] if b is not None else 0.0)
    return out


def _pool_size(size, k, s, p, d, ceil_mode):
    eff = size + 2 * p - d * (k - 1) - 1
    out = (-(-eff // s) if ceil_mode else eff // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool_ref(x, k, s, p, d, ceil_mode):
    n, c, h, w = x.shape
    ho, wo = _pool_size(h, k, s, p, d, ceil_mode), _pool_size(w, k, s, p, d, ceil_mode)
    out = np.full((n, c, ho, wo), -np.inf)
    idx = np.zeros((n, c, ho, wo), dtype=np.int64)
    for r in range(ho):
        for q in range(wo):
            for a in range(k):
                for b in range(k):
                    hi, wi = r * s - p + a * d, q * s - p + b * d
                    if 0 <= hi < h and 0 <= wi < w:
                        v = x[:, :, hi, wi]
                        better = v > out[:, :, r, q]
                        out[:, :, r, q] = np.where(better, v, out[:, :, r, q])
                        idx[:, :, r, q] = np.where(better, hi * w + wi, idx[:, :, r, q])
    return out, idx


def avg_pool_ref(x, k, s, p, ceil_mode, count_include_pad, divisor_override):
    """torch's CPU kernel, transcribed."""
    n, c, h, w = x.shape
    ho, wo = _pool_size(h, k, s, p, 1, ceil_mode), _pool_size(w, k, s, p, 1, ceil_mode)
    out = np.zeros((n, c, ho, wo))
    for r in range(ho):
        for q in range(wo):
            hs, ws = r * s - p, q * s - p
            he, we = min(hs + k, h + p), min(ws + k, w + p)
            pool = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            if hs >= he or ws >= we:
                continue
            div = divisor_override or (pool if count_include_pad else (he - hs) * (we - ws))
            out[:, :, r, q] = x[:, :, hs:he, ws:we].sum(axis=(2, 3)) / div
    return out


def adaptive_ref(x, oh, ow):
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, h1 = (i * h) // oh, -(-((i + 1) * h) // oh)
            w0, w1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            out[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return out


# ----------------------------------------------------------------------------- conv2d
conv_cases = st.fixed_dictionaries({
    "n": st.integers(1, 2), "groups": st.sampled_from([1, 2]), "cg": st.integers(1, 2),
    "cog": st.integers(1, 2), "k": st.tuples(st.integers(1, 3), st.integers(1, 3)),
    "stride": st.tuples(st.integers(1, 2), st.integers(1, 2)),
    "padding": st.tuples(st.integers(0, 2), st.integers(0, 2)),
    "dilation": st.tuples(st.integers(1, 2), st.integers(1, 2)),
    "hw": st.tuples(st.integers(4, 6), st.integers(4, 6)), "bias": st.booleans(),
})


@SETTINGS
@given(case=conv_cases, seed=seeds)
def test_conv2d_matches_naive_loops_and_gradcheck(case, seed):
    g, cg, cog = case["groups"], case["cg"], case["cog"]
    x = randn(seed, (case["n"], g * cg) + case["hw"])
    w = randn(seed + 1, (g * cog, cg) + case["k"])
    b = randn(seed + 2, (g * cog,)) if case["bias"] else None
    args = (case["stride"], case["padding"], case["dilation"], g)
    got = F.conv2d(Tensor(x), Tensor(w), None if b is None else Tensor(b), *args).data
    np.testing.assert_allclose(got, conv2d_ref(x, w, b, *args), atol=1e-12)
    if b is None:
        check_grad(lambda x, w: F.conv2d(x, w, None, *args), x, w)
    else:
        check_grad(lambda x, w, b: F.conv2d(x, w, b, *args), x, w, b)


def test_conv2d_padding_strings_unbatched_and_errors():
    x, w = randn(0, (1, 2, 5, 6)), randn(1, (3, 2, 2, 3))
    same = F.conv2d(Tensor(x), Tensor(w), padding="same")
    assert same.shape == (1, 3, 5, 6)
    # torch's 'same' puts the extra row/column at the end: top/left 0, bottom 1, left/right 1
    ref = conv2d_ref(np.pad(x, ((0, 0), (0, 0), (0, 1), (1, 1))), w, None, (1, 1), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(same.data, ref, atol=1e-12)
    assert F.conv2d(Tensor(x), Tensor(w), padding="valid").shape == (1, 3, 4, 4)
    un = F.conv2d(Tensor(x[0]), Tensor(w), padding=1)
    assert un.shape == (3, 6, 6)
    np.testing.assert_allclose(un.data, F.conv2d(Tensor(x), Tensor(w), padding=1).data[0])
    check_grad(lambda t: F.conv2d(t, Tensor(w), padding="same"), x)
    with pytest.raises(ValueError, match="to have 4 channels, but got 2"):
        F.conv2d(Tensor(x), Tensor(randn(2, (3, 4, 2, 2))))
    with pytest.raises(ValueError, match="divisible by 2"):
        F.conv2d(Tensor(randn(0, (1, 4, 5, 5))), Tensor(randn(2, (3, 2, 2, 2))), groups=2)
    with pytest.raises(ValueError, match="strided"):
        F.conv2d(Tensor(x), Tensor(w), stride=2, padding="same")
    with pytest.raises(ValueError, match="kernel can't be larger"):
        F.conv2d(Tensor(x), Tensor(randn(2, (3, 2, 7, 7))))
    with pytest.raises(ValueError, match="4D"):
        F.conv2d(Tensor(randn(0, (2, 5))), Tensor(w))


def test_conv2d_keeps_float32():
    x = Tensor(randn(0, (2, 3, 6, 6)).astype(np.float32), requires_grad=True)
    w = Tensor(randn(1, (4, 3, 3, 3)).astype(np.float32), requires_grad=True)
    y = F.conv2d(x, w, Tensor(np.zeros(4, np.float32), requires_grad=True), padding=1)
    y.sum().backward()
    assert y.dtype == x.grad.dtype == w.grad.dtype == np.float32


# ----------------------------------------------------------------------------- pooling
pool_cases = st.fixed_dictionaries({
    "k": st.integers(1, 3), "s": st.integers(1, 3), "d": st.integers(1, 2),
    "ceil": st.booleans(), "hw": st.tuples(st.integers(3, 6), st.integers(3, 6)),
}).flatmap(lambda c: st.fixed_dictionaries({**{k: st.just(v) for k, v in c.items()},
                                            "p": st.integers(0, c["k"] // 2)}))


@SETTINGS
@given(case=pool_cases, seed=seeds)
def test_max_pool2d_matches_loops_and_gradcheck(case, seed):
    k, s, p, d, ceil = case["k"], case["s"], case["p"], case["d"], case["ceil"]
    x = randn(seed, (2, 2) + case["hw"], spread=True)  # distinct values: a unique max per window
    if _pool_size(case["hw"][0], k, s, p, d, ceil) < 1 or _pool_size(case["hw"][1], k, s, p, d, ceil) < 1:
        return
    out, idx = F.max_pool2d(Tensor(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
    ref, ref_idx = max_pool_ref(x, k, s, p, d, ceil)
    np.testing.assert_array_equal(out.data, ref)
    np.testing.assert_array_equal(idx.data, ref_idx)
    check_grad(lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=ceil), x)


def test_max_pool2d_overlapping_windows_accumulate_and_ties_pick_first():
    x = Tensor(np.array([[[[1.0, 5.0, 2.0], [0.0, 3.0, 4.0]]]]), requires_grad=True)
    F.max_pool2d(x, 2, stride=1).sum().backward()  # 5 is the maximum of both windows
    assert x.grad.data[0, 0].tolist() == [[0, 2, 0], [0, 0, 0]]
    t = Tensor(np.ones((1, 1, 2, 2)), requires_grad=True)
    _, idx = F.max_pool2d(t, 2, return_indices=True)
    F.max_pool2d(t, 2).sum().backward()
    assert idx.item() == 0 and t.grad.data[0, 0].tolist() == [[1, 0], [0, 0]]
    with pytest.raises(ValueError, match="half of kernel size"):
        F.max_pool2d(t, 2, padding=2)
    assert F.max_pool2d(Tensor(np.ones((3, 4, 4))), 2).shape == (3, 2, 2)  # unbatched


@SETTINGS
@given(case=pool_cases, include=st.booleans(), override=st.sampled_from([None, 3]), seed=seeds)
def test_avg_pool2d_matches_torch_kernel_and_gradcheck(case, include, override, seed):
    k, s, p, ceil = case["k"], case["s"], case["p"], case["ceil"]
    x = randn(seed, (2, 2) + case["hw"])
    if _pool_size(case["hw"][0], k, s, p, 1, ceil) < 1 or _pool_size(case["hw"][1], k, s, p, 1, ceil) < 1:
        return
    got = F.avg_pool2d(Tensor(x), k, s, p, ceil, include, override).data
    np.testing.assert_allclose(got, avg_pool_ref(x, k, s, p, ceil, include, override), atol=1e-12)
    check_grad(lambda t: F.avg_pool2d(t, k, s, p, ceil, include, override), x)


@SETTINGS
@given(hw=st.tuples(st.integers(1, 7), st.integers(1, 7)), out=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       seed=seeds)
def test_adaptive_avg_pool2d_matches_torch_bins_and_gradcheck(hw, out, seed):
    x = randn(seed, (2, 3) + hw)
    got = F.adaptive_avg_pool2d(Tensor(x), out).data
    np.testing.assert_allclose(got, adaptive_ref(x, *out), atol=1e-12)
    check_grad(lambda t: F.adaptive_avg_pool2d(t, out), x)
    assert F.adaptive_avg_pool2d(Tensor(x), (None, 1)).shape == (2, 3, hw[0], 1)
    assert F.adaptive_avg_pool2d(Tensor(x[0]), 1).shape == (3, 1, 1)


# ----------------------------------------------------------------------------- pad, dropout2d
@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")])
def test_pad_modes_match_numpy(mode, np_mode):
    x = randn(0, (2, 3, 4, 5))
    got = F.pad(Tensor(x), (1, 2, 3, 0), mode=mode).data
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (0, 0), (3, 0), (1, 2)), mode=np_mode))
    check_grad(lambda t: F.pad(t, (1, 2, 3, 0), mode=mode), randn(1, (1, 2, 4, 4)))


def test_pad_constant_including_negative_crops():
    x = randn(0, (2, 3, 4))
    np.testing.assert_array_equal(F.pad(Tensor(x), (1, 2), value=7.0).data,
                                  np.pad(x, ((0, 0), (0, 0), (1, 2)), constant_values=7.0))
    np.testing.assert_array_equal(F.pad(Tensor(x), (-1, 1, 0, -2)).data,
                                  np.pad(x[:, :1, 1:], ((0, 0), (0, 0), (0, 1))))
    check_grad(lambda t: F.pad(t, (-1, 1, 2, -1)), x)
    with pytest.raises(ValueError, match="less than the corresponding input dimension"):
        F.pad(Tensor(x), (4, 0), mode="reflect")


def test_dropout2d_drops_whole_channels():
    manual_seed(0)
    x = Tensor(np.ones((40, 30, 3, 3)), requires_grad=True)
    y = F.dropout2d(x, p=0.4)
    y.sum().backward()
    per_channel = y.data.reshape(40, 30, 9)
    assert (per_channel.min(axis=2) == per_channel.max(axis=2)).all()  # one value per (n, c)
    assert set(np.unique(per_channel)) <= {0.0, 1 / 0.6}
    assert 0.3 < (per_channel[:, :, 0] == 0).mean() < 0.5
    np.testing.assert_array_equal(x.grad.data, y.data)  # gradient = the mask (x = 1)
    assert F.dropout2d(x, 0.4, training=False) is x
    assert F.dropout2d(Tensor(np.ones((2, 3, 5))), 0.5).shape == (2, 3, 5)  # (N, C, L): per (n, c)


# ----------------------------------------------------------------------------- batch norm
def _bn_ref(x, w, b, eps=1e-5):
    axes = (0,) + tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    return (x - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + eps) * w.reshape(shp) + b.reshape(shp)


@SETTINGS
@given(shape=st.sampled_from([(4, 3), (3, 2, 4), (2, 3, 2, 3)]), affine=st.booleans(), seed=seeds)
def test_batch_norm_training_values_running_stats_and_gradcheck(shape, affine, seed):
    x = randn(seed, shape) * 2 + 1
    c = shape[1]
    w, b = (randn(seed + 1, (c,)), randn(seed + 2, (c,))) if affine else (np.ones(c), np.zeros(c))
    rm, rv = np.zeros(c), np.ones(c)
    y = F.batch_norm(Tensor(x), Tensor(rm), Tensor(rv), Tensor(w), Tensor(b), training=True, momentum=0.3)
    np.testing.assert_allclose(y.data, _bn_ref(x, w, b), atol=1e-10)
    axes = (0,) + tuple(range(2, x.ndim))
    np.testing.assert_allclose(rm, 0.3 * x.mean(axis=axes), atol=1e-12)
    np.testing.assert_allclose(rv, 0.7 + 0.3 * x.var(axis=axes, ddof=1), atol=1e-12)  # unbiased
    if affine:
        check_grad(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, atol=1e-5)
    else:
        check_grad(lambda x: F.batch_norm(x, None, None, training=True), x, atol=1e-5)


def test_batch_norm_eval_uses_running_stats():
    x = randn(0, (4, 3, 2))
    rm, rv, w, b = randn(1, (3,)), np.abs(randn(2, (3,))) + 0.5, randn(3, (3,)), randn(4, (3,))
    y = F.batch_norm(Tensor(x), rm, rv, Tensor(w), Tensor(b), training=False, eps=1e-3)
    ref = (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-3) * w[:, None] + b[:, None]
    np.testing.assert_allclose(y.data, ref, atol=1e-12)
    check_grad(lambda x, w, b: F.batch_norm(x, Tensor(rm), Tensor(rv), w, b, eps=1e-3), x, w, b)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(Tensor(randn(0, (1, 3))), None, None, training=True)
    with pytest.raises(ValueError, match="running_mean and running_var"):
        F.batch_norm(Tensor(x), None, None, training=False)


def test_batch_norm_seam_reproduces_the_global_batch_from_parts():
    """What SyncBatchNorm will do across ranks, simulated with three parts of one batch."""
    x = randn(0, (7, 3, 2)) * 3 + 2
    w, b = randn(1, (3,)), randn(2, (3,))
    g = randn(3, x.shape)
    parts = [x[:2], x[2:3], x[3:]]  # unequal sizes, one of a single sample
    stats = [ops_norm.batch_norm_stats(p) for p in parts]
    counts = np.array([s[0] for s in stats])
    count, mean, var = ops_norm.batch_norm_gather_stats(counts, np.stack([s[1] for s in stats]),
                                                         np.stack([s[2] for s in stats]))
    full = ops_norm.batch_norm_stats(x)
    assert count == full[0] == 14
    np.testing.assert_allclose(mean, full[1], atol=1e-13)
    np.testing.assert_allclose(var, full[2], atol=1e-13)

    # whole batch, one process
    xt, wt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, w, b))
    F.batch_norm(xt, None, None, wt, bt, training=True).backward(Tensor(g))

    # per part, with the global statistics; reduce_grad returns the global sums (the all-reduce)
    xhat = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5)
    global_sums = (g.sum(axis=(0, 2)), (g * xhat).sum(axis=(0, 2)))
    local_sums = []

    def reduce_grad(sum_dy, sum_dy_xhat):
        local_sums.append((sum_dy, sum_dy_xhat))
        return global_sums

    grads, gw, gb = [], np.zeros(3), np.zeros(3)
    start = 0
    for p in parts:
        pt, pw, pb = Tensor(p.copy(), requires_grad=True), Tensor(w, requires_grad=True), Tensor(b, requires_grad=True)
        y = ops_norm.batch_norm_elemt(pt, mean, var, pw, pb, 1e-5, count=count, reduce_grad=reduce_grad)
        np.testing.assert_allclose(y.data, _bn_ref(x, w, b)[start:start + len(p)], atol=1e-12)
        y.backward(Tensor(g[start:start + len(p)]))
        grads.append(pt.grad.data)
        gw += pw.grad.data
        gb += pb.grad.data
        start += len(p)
    np.testing.assert_allclose(np.concatenate(grads), xt.grad.data, atol=1e-12)
    np.testing.assert_allclose(gw, wt.grad.data, atol=1e-12)  # local sums add up (DDP's job)
    np.testing.assert_allclose(gb, bt.grad.data, atol=1e-12)
    np.testing.assert_allclose(sum(s[0] for s in local_sums), global_sums[0], atol=1e-12)
    np.testing.assert_allclose(sum(s[1] for s in local_sums), global_sums[1], atol=1e-12)


def test_update_running_stats_uses_unbiased_variance():
    rm, rv = Tensor(np.zeros(2)), Tensor(np.ones(2))
    ops_norm.update_running_stats(rm, rv, np.array([1.0, 2.0]), np.array([3.0, 3.0]), 4, 0.5)
    np.testing.assert_allclose(rm.data, [0.5, 1.0])
    np.testing.assert_allclose(rv.data, [0.5 + 0.5 * 4.0, 0.5 + 0.5 * 4.0])
