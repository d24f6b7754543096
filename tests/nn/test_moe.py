"""nn.MoE: routing rules (top-k, ties, capacity order, pass-through) against a per-token loop,
the auxiliary losses against their formulas, and finite-difference gradients (float64)."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import Tensor, nn
from neural_arch.core.tensor import manual_seed, no_grad
from neural_arch.nn import moe as moe_module


def _make(top_k, capacity_factor=None, E=3, C=4, H=3, z=0.0, seed=0, normalize=True):
    rng = np.random.default_rng(seed)
    moe = nn.MoE(C, E, top_k=top_k, hidden_dim=H, capacity_factor=capacity_factor, aux_loss_coef=0.3,
                 z_loss_coef=z, normalize_gates=normalize)
    for p in moe.parameters():
        p.data = rng.standard_normal(p.data.shape)       # float64, large enough to spread the router
    return moe


def _gelu(v):
    return F.gelu(Tensor(v)).data       # the library's GELU (its erf is an approximation)


def _reference(moe, x):
    """One token at a time, straight from the documented rules."""
    E, k = moe.num_experts, moe.top_k
    flat = x.reshape(-1, moe.embed_dim)
    n = len(flat)
    logits = flat @ moe.router.weight.data.T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    choice = [sorted(range(E), key=lambda e, p=p: (-p[e], e))[:k] for p in probs]
    cap = math.inf if moe.capacity_factor is None else math.ceil(moe.capacity_factor * n * k / E)
    served = [0] * E
    keep = np.zeros((n, k), dtype=bool)
    for j in range(k):                       # first choices of every token, then second choices
        for t in range(n):                   # in token order
            e = choice[t][j]
            keep[t, j] = served[e] < cap
            served[e] += 1
    out = np.zeros_like(flat)
    for t in range(n):
        g = probs[t, choice[t]]
        if moe.normalize_gates:
            g = g / g.sum()
        for j, e in enumerate(choice[t]):
            ex = moe.experts[e]
            y = _gelu(flat[t] @ ex.fc1.weight.data.T + ex.fc1.bias.data) @ ex.fc2.weight.data.T + ex.fc2.bias.data
            out[t] += g[j] * (y if keep[t, j] else flat[t])
    counts = np.bincount(np.array(choice).reshape(-1), minlength=E)
    lse = np.log(np.exp(logits).sum(-1))
    aux = moe.aux_loss_coef * E * np.sum(counts / (n * k) * probs.mean(0)) + moe.z_loss_coef * np.mean(lse ** 2)
    return out.reshape(x.shape), aux, int((~keep).sum())


@pytest.mark.parametrize("top_k, capacity_factor, normalize", [
    (1, None, True), (2, None, True), (1, 0.5, True), (2, 0.6, True), (2, 0.6, False), (3, 0.8, True)])
def test_moe_matches_per_token_reference(top_k, capacity_factor, normalize):
    moe = _make(top_k, capacity_factor, z=0.05, normalize=normalize)
    x = np.random.default_rng(1).standard_normal((2, 7, 4))
    y = moe(Tensor(x))
    ref, aux, dropped = _reference(moe, x)
    assert y.shape == x.shape
    np.testing.assert_allclose(y.data, ref, rtol=0, atol=1e-12)
    assert abs(float(moe.aux_loss.data) - aux) <= 1e-12
    assert moe.dropped == dropped
    assert (dropped > 0) == (capacity_factor is not None)   # the capacity cases really drop
    assert moe.tokens_per_expert.sum() == 14 * top_k


def test_dropped_tokens_pass_through_unchanged():
    moe = _make(1, capacity_factor=0.1)                     # capacity ceil(0.1 * 6 / 3) = 1 per expert
    x = np.random.default_rng(2).standard_normal((6, 4))
    y = moe(Tensor(x)).data
    passed = np.isclose(y, x).all(axis=1)
    assert moe.dropped == 6 - int((moe.tokens_per_expert > 0).sum()) and passed.sum() == moe.dropped


def test_ties_go_to_the_lowest_expert_index():
    moe = _make(2, E=4)
    moe.router.weight.data[...] = 0.0                       # every probability equal: 1/4
    moe(Tensor(np.ones((5, 4))))
    assert moe.tokens_per_expert.tolist() == [5, 5, 0, 0]


@pytest.mark.parametrize("top_k, capacity_factor", [(1, None), (2, None), (2, 0.7)])
def test_moe_gradients_match_finite_differences(top_k, capacity_factor):
    moe = _make(top_k, capacity_factor, z=0.1, seed=3)
    for ex in moe.experts:
        ex.act = nn.Tanh()      # GELU's forward uses an approximate erf (1e-7): check MoE's own gradient
    x0 = np.random.default_rng(4).standard_normal((5, 4))
    up = np.random.default_rng(5).standard_normal((5, 4))

    def objective(xa):
        y = moe(Tensor(xa) if not isinstance(xa, Tensor) else xa)
        return (y * up).sum() + moe.aux_loss

    x = Tensor(x0.copy(), requires_grad=True)
    moe.zero_grad()
    objective(x).backward()
    assert moe.dropped > 0 or capacity_factor is None
    eps = 1e-6
    targets = [("x", x0, x.grad.data)] + [(n, p.data, p.grad.data) for n, p in moe.named_parameters()]
    with no_grad():
        for name, arr, grad in targets:
            num = np.zeros_like(arr)
            flat, gflat = arr.reshape(-1), num.reshape(-1)
            for i in range(flat.size):
                old = flat[i]
                flat[i] = old + eps
                fp = float(objective(x0).data)
                flat[i] = old - eps
                fm = float(objective(x0).data)
                flat[i] = old
                gflat[i] = (fp - fm) / (2 * eps)
            np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-7, err_msg=name)


def test_every_expert_gets_a_gradient_even_without_tokens():
    moe = _make(1, E=4)
    moe.router.weight.data[...] = 0.0
    moe.router.weight.data[0] = 1.0                          # expert 0 wins every positive token
    out = moe(Tensor(np.abs(np.random.default_rng(6).standard_normal((3, 4))) + 0.1))
    (out.sum() + moe.aux_loss).backward()
    assert moe.tokens_per_expert.tolist() == [3, 0, 0, 0]
    for e in range(1, 4):
        assert moe.experts[e].fc1.weight.grad is not None
        assert not np.any(moe.experts[e].fc1.weight.grad.data)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="top_k=3 must be between 1 and num_experts=2"):
        nn.MoE(4, 2, top_k=3)
    with pytest.raises(ValueError, match="capacity_factor"):
        nn.MoE(4, 2, capacity_factor=0)
    with pytest.raises(ValueError, match=r"expected inputs of shape \(\.\.\., 4\)"):
        nn.MoE(4, 2)(Tensor(np.ones((2, 3))))


@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples():
    assert doctest.testmod(moe_module, verbose=False).failed == 0


def test_gpt_moe_option_every_other_block():
    manual_seed(0)
    gpt = nn.GPT(vocab_size=11, block_size=6, n_layer=4, n_head=2, n_embd=8, moe_num_experts=4, moe_every=2,
                 moe_kwargs={"top_k": 2, "capacity_factor": 1.5, "z_loss_coef": 0.01})
    kinds = [type(b.mlp).__name__ for b in gpt.blocks]
    assert kinds == ["Sequential", "MoE", "Sequential", "MoE"]
    assert gpt.blocks[1].mlp.experts[0].fc1.out_features == 32 and gpt.blocks[1].mlp.capacity_factor == 1.5
    logits = gpt(np.arange(12).reshape(2, 6) % 11)
    loss = F.cross_entropy(logits.reshape(-1, 11), np.arange(12) % 11) + gpt.aux_loss
    loss.backward()
    assert abs(float(gpt.aux_loss.data) - sum(float(gpt.blocks[i].mlp.aux_loss.data) for i in (1, 3))) < 1e-6  # float32
    assert gpt.blocks[3].mlp.router.weight.grad is not None
    assert nn.GPT(11, 6, 2, 2, 8).aux_loss is None                     # dense by default
