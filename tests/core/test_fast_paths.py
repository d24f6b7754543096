"""The GPT step's fast paths (issue 37) compute what the general formulas compute.

* ``layer_norm`` on NumPy float32/float64 runs as ``(rows, n)`` matrices with dot-product reductions:
  equal to the general path (float64, <= 1e-12), and float32 stays float32;
* ``linear`` runs one 2-d GEMM over all leading dims: equal to the row-by-row product;
* attention that fits one tile skips the online-softmax bookkeeping: equal to the tiled loop;
* a float32 GPT's forward, loss and gradients stay float32 (no silent float64).
"""

import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import Tensor, nn
from neural_arch.core import ops_nn
from neural_arch.core.ops_attention import AttentionMask, attention_backward, attention_forward
from neural_arch.core.rng import manual_seed


def _rand(seed, *shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _layer_norm_and_grads(x, w, b, norm, g):
    xt = Tensor(x.copy(), requires_grad=True)
    wt = None if w is None else Tensor(w.copy(), requires_grad=True)
    bt = None if b is None else Tensor(b.copy(), requires_grad=True)
    y = F.layer_norm(xt, norm, wt, bt)
    y.backward(Tensor(g))
    return [y.data, xt.grad.data] + [t.grad.data for t in (wt, bt) if t is not None]


@pytest.mark.parametrize("norm, affine", [((6,), "wb"), ((6,), "w"), ((6,), "b"), ((6,), ""), ((3, 6), "wb")])
def test_layer_norm_rows_equal_the_general_path(monkeypatch, norm, affine):
    shape = (2, 5) + norm
    x, g = _rand(0, *shape) * 3 + 1, _rand(1, *shape)
    w = _rand(2, *norm) if "w" in affine else None
    b = _rand(3, *norm) if "b" in affine else None
    fast = _layer_norm_and_grads(x, w, b, norm, g)
    monkeypatch.setattr(ops_nn, "_fused_rows_ok", lambda *a: False)
    general = _layer_norm_and_grads(x, w, b, norm, g)
    for a, r in zip(fast, general):
        assert np.abs(a - r).max() <= 1e-12 * max(1.0, np.abs(r).max())


def test_layer_norm_float32_stays_float32():
    x, g = _rand(0, 4, 8, dtype=np.float32), _rand(1, 4, 8, dtype=np.float32)
    out = _layer_norm_and_grads(x, np.ones(8, np.float32), np.zeros(8, np.float32), (8,), g)
    assert [a.dtype for a in out] == [np.float32] * 4


def test_linear_over_leading_dims_equals_rows():
    x, w, b, g = _rand(0, 2, 3, 4), _rand(1, 5, 4), _rand(2, 5), _rand(3, 2, 3, 5)
    xt, wt, bt = (Tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.linear(xt, wt, bt)
    y.backward(Tensor(g))
    np.testing.assert_allclose(y.data, np.einsum("btk,nk->btn", x, w) + b, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(xt.grad.data, np.einsum("btn,nk->btk", g, w), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(wt.grad.data, np.einsum("btn,btk->nk", g, x), rtol=1e-13, atol=1e-13)
    v = Tensor(x[0, 0], requires_grad=True)  # a 1-d input keeps its shape
    F.linear(v, wt).sum().backward()
    assert F.linear(v, wt).shape == (5,) and v.grad.shape == (4,)


@pytest.mark.parametrize("kind", ["causal", "none"])
def test_one_tile_attention_equals_the_tiled_loop(kind):
    q, k, v, dout = (_rand(i, 2, 3, 6, 4) for i in range(4))
    mask = AttentionMask.causal(np.arange(6), np.arange(6)) if kind == "causal" else AttentionMask()
    one, lse1 = attention_forward(q, k, v, 0.5, mask, block=128)
    tiled, lse2 = attention_forward(q, k, v, 0.5, mask, block=4)
    assert np.abs(one - tiled).max() <= 1e-13 and np.abs(lse1 - lse2).max() <= 1e-13
    for a, r in zip(attention_backward(q, k, v, one, dout, lse1, 0.5, mask, block=128),
                    attention_backward(q, k, v, tiled, dout, lse2, 0.5, mask, block=4)):
        assert np.abs(a - r).max() <= 1e-12


def test_float32_gpt_step_stays_float32():
    manual_seed(0)
    model = nn.GPT(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8)
    idx = np.random.default_rng(0).integers(0, 11, size=(2, 6))
    logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, 11), idx.reshape(-1))
    loss.backward()
    assert logits.dtype == np.float32 and loss.dtype == np.float32
    assert {p.grad.dtype for p in model.parameters()} == {np.dtype(np.float32)}
