"""Layers against hand-written NumPy, attention causality, GPT shapes and a tiny overfit run."""

import numpy as np
import pytest

from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import make_token_sequences


def _numpy_mlp(x, y, w1, b1, w2, b2):
    """Forward and backward of linear-relu-linear-softmax-CE (mean), by hand."""
    h_pre = x @ w1.T + b1
    h = np.maximum(h_pre, 0)
    logits = h @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = -logp[np.arange(n), y].mean()
    dlogits = np.exp(logp)
    dlogits[np.arange(n), y] -= 1
    dlogits /= n
    dw2 = dlogits.T @ h
    db2 = dlogits.sum(0)
    dh = dlogits @ w2 * (h_pre > 0)
    dw1 = dh.T @ x
    db1 = dh.sum(0)
    return logits, loss, (dw1, db1, dw2, db2)


def test_mlp_forward_backward_matches_numpy():
    manual_seed(0)
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(5, 7, dtype=np.float64), nn.ReLU(), nn.Linear(7, 3, dtype=np.float64))
    x = rng.normal(size=(6, 5))
    y = rng.integers(0, 3, size=6)
    logits = model(x)
    loss = nn.CrossEntropyLoss()(logits, y)
    loss.backward()
    params = [p.data for p in model.parameters()]
    ref_logits, ref_loss, ref_grads = _numpy_mlp(x, y, *params)
    np.testing.assert_allclose(logits.data, ref_logits, atol=1e-6, rtol=1e-6)
    assert abs(float(loss.item()) - ref_loss) < 1e-6
    for p, g in zip(model.parameters(), ref_grads):
        np.testing.assert_allclose(p.grad.data, g, atol=1e-6, rtol=1e-6)


def test_layer_norm_embedding_and_losses():
    ln = nn.LayerNorm(4, dtype=np.float64)
    x = np.random.default_rng(1).normal(size=(3, 4))
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln(x).data, ref, atol=1e-6)
    emb = nn.Embedding(10, 3)
    idx = np.array([[1, 2], [3, 1]])
    np.testing.assert_array_equal(emb(idx).data, emb.weight.data[idx])
    mse = nn.MSELoss()(Tensor(np.array([1.0, 3.0])), np.array([0.0, 1.0]))
    assert abs(float(mse.item()) - 2.5) < 1e-9
    logits = np.zeros((2, 2, 4), dtype=np.float32)
    ce = nn.CrossEntropyLoss(ignore_index=-1)(logits, np.array([[0, -1], [2, 3]]))
    assert abs(float(ce.item()) - np.log(4)) < 1e-5
    with pytest.raises(ValueError, match="reduction"):
        nn.CrossEntropyLoss(reduction="avg")


def test_activations():
    x = np.array([-2.0, 0.5, 3.0])
    np.testing.assert_allclose(nn.ReLU()(x).data, [0, 0.5, 3])
    np.testing.assert_allclose(nn.Tanh()(x).data, np.tanh(x), atol=1e-7)
    np.testing.assert_allclose(nn.Sigmoid()(x).data, 1 / (1 + np.exp(-x)), atol=1e-7)
    assert np.allclose(nn.GELU()(x).data, [-0.0455, 0.3457, 2.9960], atol=2e-3)
    np.testing.assert_allclose(nn.Softmax()(x).data.sum(), 1.0, atol=1e-7)


def test_dropout_train_eval():
    manual_seed(0)
    drop = nn.Dropout(0.5)
    y = drop(np.ones((1000,), dtype=np.float32)).data
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.4 < (y == 0).mean() < 0.6
    drop.eval()
    assert np.all(drop(np.ones(10, dtype=np.float32)).data == 1)
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_attention_is_causal():
    manual_seed(0)
    attn = nn.CausalSelfAttention(8, 2)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
    out = attn(x).data
    x2 = x.copy()
    x2[:, 3:] += 10.0  # changing the future must not change the past
    out2 = attn(x2).data
    np.testing.assert_allclose(out[:, :3], out2[:, :3], atol=1e-5)
    assert not np.allclose(out[:, 3:], out2[:, 3:])
    full = nn.CausalSelfAttention(8, 2, causal=False)
    assert full(x).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="divisible"):
        nn.CausalSelfAttention(8, 3)


def test_gpt_shapes_names_and_block_size():
    manual_seed(0)
    model = nn.GPT(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8)
    idx = np.zeros((3, 6), dtype=np.int64)
    assert model(idx).shape == (3, 6, 11)
    assert model(idx[:, :4]).shape == (3, 4, 11)
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"]
    assert "blocks.1.attn.q_proj.weight" in names and "blocks.0.mlp.fc2.bias" in names
    assert names[-1] == "head.weight"
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2
    with pytest.raises(ValueError, match="block_size"):
        model(np.zeros((1, 7), dtype=np.int64))
    # pipeline-style composition gives the same logits
    h = model.embed(idx)
    for block in model.blocks:
        h = block(h)
    np.testing.assert_allclose(model.logits_from_hidden(h).data, model(idx).data, atol=1e-6)


def test_gpt_overfits_tiny_task():
    manual_seed(0)
    x, y = make_token_sequences(16, seq_len=8, vocab_size=8, seed=0)
    model = nn.GPT(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(40):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    assert losses[-1] < 0.5 * losses[0], losses
