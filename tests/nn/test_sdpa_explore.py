"""Exploring properties of F.scaled_dot_product_attention and nn.MultiheadAttention against a plain
NumPy float64 reference (``softmax(q k^T * scale + mask) v`` and its hand-written gradients).

Shapes, dtypes and options a PyTorch user would use: broadcast masks ``(L, S)``, ``(1, 1, L, S)``,
``(B, 1, L, S)``, boolean and float masks, ``is_causal`` with ``L != S`` (top-left aligned, torch's
``ones(L, S).tril()``), custom scales, block sizes that do not divide the lengths, rows whose keys are
all masked (documented: output 0, zero gradient), float32 and float64. Pinned ``@example`` cases are
bugs this exploration found.
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch.nn.functional as F
from neural_arch import Tensor, nn

TOL = {np.float64: 1e-10, np.float32: 2e-4}


def _reference(q, k, v, keep, add, scale, g):
    """Float64 forward and gradients of attention; a row with no visible key gives 0 (and no gradient)."""
    q, k, v, g = (a.astype(np.float64) for a in (q, k, v, g))
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if add is not None:
        s = s + add
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    e = np.exp(s - np.where(seen, m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = np.where(seen, e / np.where(seen, total, 1.0), 0.0)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    return out, ds @ k, np.swapaxes(ds, -1, -2) @ q, dv


def _unbroadcast(d, shape):
    while d.ndim > len(shape):
        d = d.sum(axis=0)
    for i, n in enumerate(shape):
        if n == 1 and d.shape[i] != 1:
            d = d.sum(axis=i, keepdims=True)
    return d


MASK_SHAPES = ["LS", "11LS", "B1LS", "S", "BHLS"]


@st.composite
def attention_case(draw):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    L, S = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    E, Ev = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["none", "causal", "bool", "float"]))
    shape = draw(st.sampled_from(MASK_SHAPES))
    scale = draw(st.sampled_from([None, 0.3, 2.0]))
    block = draw(st.sampled_from([None, 1, 2, 3]))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    kv_broadcast = draw(st.sampled_from([False, True, "q"]))  # True: k/v (1, H, S, E); "q": q (1, H, L, E)
    seed = draw(st.integers(0, 2**16))
    return B, H, L, S, E, Ev, kind, shape, scale, block, dtype, kv_broadcast, seed


def _mask_shape(code, B, H, L, S):
    return {"LS": (L, S), "11LS": (1, 1, L, S), "B1LS": (B, 1, L, S), "S": (S,), "BHLS": (B, H, L, S)}[code]


@given(attention_case())
@settings(max_examples=60)
# a fully masked row (bool) inside a tile of several keys, causal with L > S and L < S
@example((1, 1, 3, 2, 2, 2, "bool", "LS", None, 2, np.float64, False, 0))
@example((2, 1, 5, 2, 1, 1, "causal", "LS", 0.3, 1, np.float64, True, 1))
@example((1, 2, 2, 5, 2, 3, "causal", "LS", None, 3, np.float32, False, 2))
def test_sdpa_equals_reference(case):
    B, H, L, S, E, Ev, kind, shape, scale, block, dtype, kv_broadcast, seed = case
    rng = np.random.default_rng(seed)
    kb = 1 if kv_broadcast is True else B
    qb = 1 if kv_broadcast == "q" else B
    q = rng.standard_normal((qb, H, L, E)).astype(dtype)
    k = rng.standard_normal((kb, H, S, E)).astype(dtype)
    v = rng.standard_normal((kb, H, S, Ev)).astype(dtype)
    g = rng.standard_normal((B, H, L, Ev)).astype(dtype)
    keep = add = mask = None
    if kind == "causal":
        keep = np.tril(np.ones((L, S), bool))          # torch: ones(L, S).tril(diagonal=0)
    elif kind == "bool":
        mask = keep = rng.random(_mask_shape(shape, B, H, L, S)) < 0.6
    elif kind == "float":
        mask = add = rng.standard_normal(_mask_shape(shape, B, H, L, S)).astype(dtype)
        # -inf entries too: whole rows hidden where a row happens to be all -inf
        add[rng.random(add.shape) < 0.3] = -np.inf
    sc = 1.0 / np.sqrt(E) if scale is None else scale
    ref = _reference(q, k, v, keep, add, sc, g)
    leaves = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=kind == "causal", scale=scale,
                                         block_size=block)
    out.backward(Tensor(g))
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == (B, H, L, Ev)
    assert np.all(np.isfinite(out.data))
    np.testing.assert_allclose(out.data, ref[0], atol=tol, rtol=tol)
    for leaf, want in zip(leaves, ref[1:]):
        assert leaf.grad.shape == leaf.shape
        np.testing.assert_allclose(leaf.grad.data, _unbroadcast(want, leaf.shape), atol=tol * 10, rtol=tol * 10)


def test_fully_masked_rows_give_zero_output_and_zero_gradient():
    q = Tensor(np.ones((1, 2, 3)), requires_grad=True)
    mask = np.array([[True, False], [False, False]])  # query 1 sees nothing
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    out.sum().backward()
    assert out.data[0, 1].tolist() == [0.0, 0.0, 0.0] and out.data[0, 0].tolist() == [1.0, 1.0, 1.0]
    assert np.all(np.isfinite(q.grad.data))


def test_is_causal_with_attn_mask_raises():
    q = np.ones((1, 2, 3))
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((2, 2), bool), is_causal=True)


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.int32])
def test_integer_mask_is_a_clear_error(dtype):
    # torch accepts only a boolean or a floating mask: an integer 0/1 "keep" mask added to the scores
    # would silently attend everywhere
    q = np.ones((1, 2, 3))
    with pytest.raises(TypeError, match="attn_mask must be boolean"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((2, 2), dtype))


def test_mask_that_does_not_broadcast_is_a_clear_error():
    q = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="does not broadcast"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3, 3), bool))


@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("bias_shape", [(3, 5), (2, 1, 3, 5), (1, 2, 3, 5)])
def test_float_mask_that_requires_grad_gets_its_gradient(block, bias_shape):
    # torch differentiates the additive mask (e.g. a learned relative-position bias); it used to get
    # no gradient at all, silently
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal(s) for s in [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 2), (2, 2, 3, 2)])
    bias = rng.standard_normal(bias_shape)
    bias[..., 0, 1] = -np.inf                  # a hidden pair: its gradient is 0
    leaf = Tensor(bias.copy(), requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=leaf, block_size=block)
    out.backward(Tensor(g))
    s = (q @ k.swapaxes(-1, -2)) / 2.0 + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ v.swapaxes(-1, -2)
    want = _unbroadcast(p * (dp - (dp * p).sum(-1, keepdims=True)), bias_shape)
    assert leaf.grad is not None and leaf.grad.shape == bias_shape
    np.testing.assert_allclose(leaf.grad.data, want, atol=1e-10)
    np.testing.assert_allclose(out.data, p @ v, atol=1e-10)


# ---------------------------------------------------------------------------------- MultiheadAttention
def _mha_reference(mha, query, key, value, kpm, am, batch_first):
    """torch's MultiheadAttention forward in NumPy float64 (weights per head)."""
    if batch_first:
        query, key, value = (np.swapaxes(x, 0, 1) for x in (query, key, value))
    e, h = mha.embed_dim, mha.num_heads
    d = e // h
    if mha._qkv_same_embed_dim:
        ws = np.split(mha.in_proj_weight.data, 3)
    else:
        ws = [mha.q_proj_weight.data, mha.k_proj_weight.data, mha.v_proj_weight.data]
    bs = np.split(mha.in_proj_bias.data, 3)
    L, N, _ = query.shape
    S = key.shape[0]
    q, k, v = (x @ w.T + b for x, w, b in zip((query, key, value), ws, bs))
    q, k, v = (x.reshape(x.shape[0], N, h, d).transpose(1, 2, 0, 3) for x in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    if am is not None:
        am = np.where(am, -np.inf, 0.0) if am.dtype == bool else am
        s = s + (am.reshape(N, -1, L, S) if am.ndim == 3 else am)
    if kpm is not None:
        s = s + np.where(kpm, -np.inf, 0.0)[:, None, None, :]
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = (p @ v).transpose(2, 0, 1, 3).reshape(L, N, e) @ mha.out_proj.weight.data.T + mha.out_proj.bias.data
    if batch_first:
        y = np.swapaxes(y, 0, 1)
    return y, p


@given(st.integers(1, 2), st.integers(1, 4), st.integers(1, 4), st.sampled_from([1, 2]), st.booleans(),
       st.sampled_from([None, 3]), st.booleans(), st.sampled_from([None, "2d", "3d", "bool"]), st.booleans(),
       st.integers(0, 999))
@settings(max_examples=30)
def test_multihead_attention_equals_reference(N, L, S, h, batch_first, kdim, use_kpm, use_am, need_weights, seed):
    rng = np.random.default_rng(seed)
    e = 2 * h
    mha = nn.MultiheadAttention(e, h, kdim=kdim, vdim=kdim, batch_first=batch_first, dtype=np.float64)
    mha.in_proj_bias.data[:] = rng.standard_normal(3 * e)
    kd = e if kdim is None else kdim
    shape = (lambda t, w: (N, t, w)) if batch_first else (lambda t, w: (t, N, w))
    query, key, value = (rng.standard_normal(shape(t, w)) for t, w in ((L, e), (S, kd), (S, kd)))
    kpm = rng.random((N, S)) < 0.3 if use_kpm else None
    if kpm is not None:
        kpm[:, 0] = False                      # every query keeps one key: no NaN rows in the reference
    am = None
    if use_am == "2d":
        am = rng.standard_normal((L, S))
    elif use_am == "3d":                       # torch's (N * num_heads, L, S), batch-major
        am = rng.standard_normal((N * h, L, S))
    elif use_am == "bool":                     # True = not allowed; key 0 stays allowed
        am = rng.random((L, S)) < 0.4
        am[:, 0] = False
    want_y, want_p = _mha_reference(mha, query, key, value, kpm, am, batch_first)
    for average in (True, False):
        y, w = mha(query, key, value, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights,
                   average_attn_weights=average)
        np.testing.assert_allclose(y.data, want_y, atol=1e-10)
        if not need_weights:
            assert w is None
        else:
            np.testing.assert_allclose(w.data, want_p.mean(axis=1) if average else want_p, atol=1e-10)


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_unbatched_equals_a_batch_of_one(average, need_weights):
    rng = np.random.default_rng(0)
    mha = nn.MultiheadAttention(4, 2, dtype=np.float64)
    q, kv = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    kpm = np.array([False, True, False, False, True])
    am = rng.standard_normal((2, 3, 5))                      # (num_heads, L, S) unbatched
    y1, w1 = mha(q, kv, kv, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights,
                 average_attn_weights=average)
    y2, w2 = mha(q[:, None], kv[:, None], kv[:, None], key_padding_mask=kpm[None], attn_mask=am,
                 need_weights=need_weights, average_attn_weights=average)
    assert y1.shape == (3, 4)
    np.testing.assert_allclose(y1.data, y2.data[:, 0], atol=1e-12)
    if need_weights:
        assert w1.shape == ((3, 5) if average else (2, 3, 5))
        np.testing.assert_allclose(w1.data, w2.data[0], atol=1e-12)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("shape", [(3, 5), (2 * 2, 3, 5)])
def test_multihead_attention_float_mask_that_requires_grad_gets_its_gradient(need_weights, shape):
    # a learned additive bias passed as attn_mask used to be detached (its .grad stayed None)
    rng = np.random.default_rng(1)
    mha = nn.MultiheadAttention(4, 2, batch_first=True, dtype=np.float64)
    q, kv = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    kpm = np.array([[False, True, False, False, False], [False] * 5])
    bias = Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)
    y, _ = mha(q, kv, kv, key_padding_mask=kpm, attn_mask=bias, need_weights=need_weights)
    y.sum().backward()
    assert bias.grad is not None and bias.grad.shape == shape

    def loss(b):
        return float(mha(q, kv, kv, key_padding_mask=kpm, attn_mask=b, need_weights=need_weights)[0].data.sum())

    base = bias.data.astype(np.float64)
    for idx in [(0,) * len(shape), tuple(n - 1 for n in shape)]:
        hi, lo = base.copy(), base.copy()
        hi[idx] += 1e-6
        lo[idx] -= 1e-6
        assert abs(bias.grad.data[idx] - (loss(hi) - loss(lo)) / 2e-6) < 1e-6

