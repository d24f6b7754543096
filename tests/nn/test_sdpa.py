"""F.scaled_dot_product_attention: blockwise (online softmax) result equals the naive softmax form,
forward and gradients, in float64 (<= 1e-10); gradients also match central differences; masks,
causal, scale, dropout, the returned log-sum-exp, errors; nn.CausalSelfAttention goes through it.
"""

import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import Tensor, nn
from neural_arch.core.rng import manual_seed

TOL = 1e-10


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _naive(q, k, v, mask=None, causal=False, scale=None):
    """The textbook form with the project's differentiable ops (builds the whole (L, S) matrix)."""
    s = F.matmul(q, k.transpose(-1, -2)) * (scale if scale is not None else 1.0 / np.sqrt(q.shape[-1]))
    if causal:
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool))
    if mask is not None:
        s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask)
    return F.matmul(F.softmax(s, axis=-1), v)


def _grads(fn, arrays, upstream):
    leaves = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*leaves)
    out.backward(Tensor(upstream))
    return out.data, [t.grad.data for t in leaves]


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bool-mask": {"attn_mask": "bool"},
    "float-mask": {"attn_mask": "float"},
    "scale": {"scale": 0.37},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("block", [1, 3, 128])
def test_blockwise_equals_naive_forward_and_grads(case, block):
    kw = dict(CASES[case])
    L, S = (7, 7) if case == "causal" else (5, 7)  # causal: square; others: L != S
    q, k, v = _rand(1, 2, 3, L, 4), _rand(2, 2, 3, S, 4), _rand(3, 2, 3, S, 5)
    mask = None
    if kw.get("attn_mask") == "bool":
        mask = np.random.default_rng(4).random((3, L, S)) < 0.7   # broadcasts over the batch
        mask[:, 0, :] = True
        kw["attn_mask"] = mask
    elif kw.get("attn_mask") == "float":
        mask = _rand(5, L, S)
        kw["attn_mask"] = mask
    up = _rand(6, 2, 3, L, 5)
    got, g_got = _grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, block_size=block, **kw),
                        [q, k, v], up)
    ref, g_ref = _grads(lambda a, b, c: _naive(a, b, c, mask=mask, causal=kw.get("is_causal", False),
                                                scale=kw.get("scale")), [q, k, v], up)
    assert np.abs(got - ref).max() <= TOL
    for name, a, b in zip("qkv", g_got, g_ref):
        assert np.abs(a - b).max() <= TOL, f"d{name} differs by {np.abs(a - b).max():g}"


def test_grads_match_central_differences():
    q, k, v = _rand(1, 1, 2, 4, 3), _rand(2, 1, 2, 5, 3), _rand(3, 1, 2, 5, 3)
    up = _rand(4, 1, 2, 4, 3)
    fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, block_size=2)
    _, grads = _grads(fn, [q, k, v], up)
    eps = 1e-6
    for i, x in enumerate((q, k, v)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q.copy(), k.copy(), v.copy()]
            args[i][idx] += eps
            plus = (fn(*args).data * up).sum()
            args[i][idx] -= 2 * eps
            minus = (fn(*args).data * up).sum()
            num[idx] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grads[i], num, rtol=1e-6, atol=1e-8, err_msg="qkv"[i])


def test_lse_is_the_log_sum_exp_and_merges_two_halves():
    from neural_arch.core.ops_attention import merge_partial

    q, k, v = _rand(1, 2, 6, 4), _rand(2, 2, 9, 4), _rand(3, 2, 9, 4)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, block_size=4)
    s = q @ k.swapaxes(-1, -2) / 2.0
    assert np.abs(lse.data - np.log(np.exp(s).sum(-1))).max() <= TOL
    o1, l1 = F.scaled_dot_product_attention(q, k[:, :4], v[:, :4], return_lse=True)
    o2, l2 = F.scaled_dot_product_attention(q, k[:, 4:], v[:, 4:], return_lse=True)
    merged, lse_m = merge_partial(o1.data, l1.data, o2.data, l2.data)
    assert np.abs(merged - out.data).max() <= TOL and np.abs(lse_m - lse.data).max() <= TOL


def test_fully_masked_row_gives_zero_and_no_nan():
    q, k, v = _rand(1, 3, 2), _rand(2, 4, 2), _rand(3, 4, 2)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    qt = Tensor(q, requires_grad=True)
    out, lse = F.scaled_dot_product_attention(qt, k, v, attn_mask=mask, return_lse=True, block_size=2)
    out.sum().backward()
    assert np.all(out.data[1] == 0) and np.isneginf(lse.data[1]) and np.isfinite(out.data).all()
    assert np.isfinite(qt.grad.data).all() and np.all(qt.grad.data[1] == 0)


def test_dropout_is_reproducible_and_grads_match_differences():
    q, k, v = _rand(1, 1, 3, 2), _rand(2, 1, 5, 2), _rand(3, 1, 5, 2)

    def fn(a, b, c):
        manual_seed(7)  # the same masks on every call
        return F.scaled_dot_product_attention(a, b, c, dropout_p=0.4, block_size=2)

    up = _rand(4, 1, 3, 2)
    out, grads = _grads(fn, [q, k, v], up)
    no_drop = F.scaled_dot_product_attention(q, k, v).data
    assert not np.allclose(out, no_drop)
    eps = 1e-6
    for i, x in enumerate((q, k, v)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q.copy(), k.copy(), v.copy()]
            args[i][idx] += eps
            plus = (fn(*args).data * up).sum()
            args[i][idx] -= 2 * eps
            num[idx] = (plus - (fn(*args).data * up).sum()) / (2 * eps)
        np.testing.assert_allclose(grads[i], num, rtol=1e-6, atol=1e-8)
    assert np.all(F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).data == 0)


def test_clear_errors():
    q = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3), bool), is_causal=True)
    with pytest.raises(ValueError, match="do not fit together"):
        F.scaled_dot_product_attention(q, np.zeros((1, 2, 3, 5)), q)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="dropout_p"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=1.5)


def test_causal_self_attention_uses_sdpa_and_equals_the_naive_form():
    manual_seed(0)
    attn = nn.CausalSelfAttention(8, 2, dtype=np.float64)
    x = Tensor(_rand(1, 2, 5, 8), requires_grad=True)
    calls = []
    attn.attention_fn = lambda *a, **kw: calls.append(kw) or F.scaled_dot_product_attention(*a, **kw)
    y = attn(x)
    assert calls == [{"dropout_p": 0.0, "is_causal": True}]
    y.sum().backward()
    # the old formula: full (T, T) scores, additive causal mask, softmax
    b, t, _ = x.shape
    xs = Tensor(x.data, requires_grad=True)
    heads = [p(xs).reshape(b, t, 2, 4).permute(0, 2, 1, 3) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    ref = attn.out_proj(_naive(*heads, causal=True).permute(0, 2, 1, 3).reshape(b, t, 8))
    ref.sum().backward()
    assert np.abs(y.data - ref.data).max() <= TOL
    assert np.abs(x.grad.data - xs.grad.data).max() <= TOL


@pytest.mark.parametrize("name", ["neural_arch.core.ops_attention"])  # distributed modules: their own doctest run
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0 and result.attempted > 0, f"{result.failed} docstring example(s) failed in {name}"
