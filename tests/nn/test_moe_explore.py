"""Exploring properties of nn.MoE against a hand NumPy reference written from the documented rules:
top-k by probability (ties to the lowest expert), renormalised or raw gates, capacity
``ceil(factor * tokens * k / E)`` served level by level then token by token (a dropped assignment
passes the token through), the Switch load-balancing loss ``coef * E * sum_e f_e P_e`` and the
z-loss ``coef * mean(logsumexp(logits)^2)``, over inputs ``(..., C)`` with several leading dims
(and none: an empty batch), float32 and float64.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch import Tensor, nn


def _expert(moe, e, row):
    """Expert ``e`` on one token through the library's own modules (the unsharded op)."""
    return moe.experts[e](Tensor(row[None])).data[0].astype(np.float64)


def _reference(moe, x):
    E, k = moe.num_experts, moe.top_k
    flat = x.reshape(-1, moe.embed_dim).astype(np.float64)
    n = len(flat)
    logits = flat @ moe.router.weight.data.astype(np.float64).T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    choice = np.array([sorted(range(E), key=lambda e, p=p: (-p[e], e))[:k] for p in probs], dtype=int).reshape(n, k)
    top = np.take_along_axis(probs, choice, axis=1)
    gates = top / top.sum(-1, keepdims=True) if moe.normalize_gates else top
    # the rule in exact arithmetic (the factor as written: 0.1 is one tenth)
    cap = math.inf if moe.capacity_factor is None else math.ceil(Fraction(str(moe.capacity_factor)) * n * k / E)
    served = np.zeros(E, int)
    keep = np.zeros((n, k), bool)
    for j in range(k):                     # all first choices, then all second choices ...
        for t in range(n):                 # ... each level in token order
            e = choice[t, j]
            if served[e] < cap:
                served[e] += 1
                keep[t, j] = True
    out = np.zeros_like(flat)
    for t in range(n):
        for j in range(k):
            y = _expert(moe, choice[t, j], x.reshape(-1, moe.embed_dim)[t]) if keep[t, j] else flat[t]
            out[t] += gates[t, j] * y
    f = np.bincount(choice.reshape(-1), minlength=E) / max(n * k, 1)
    P = probs.mean(axis=0) if n else np.zeros(E)
    aux = moe.aux_loss_coef * E * (f * P).sum()
    if moe.z_loss_coef and n:
        m = logits.max(-1)
        lse = m + np.log(np.exp(logits - m[:, None]).sum(-1))
        aux += moe.z_loss_coef * (lse ** 2).mean()
    return out.reshape(x.shape), aux, int((~keep).sum()), np.bincount(choice.reshape(-1), minlength=E)


@given(st.integers(1, 4), st.integers(1, 4), st.sampled_from([None, 0.1, 0.5, 1.0, 1.25, 3.0]),
       st.sampled_from([(5,), (2, 3), (1, 2, 2), (1,)]), st.booleans(), st.sampled_from([0.0, 0.1]),
       st.sampled_from([np.float64, np.float32]), st.booleans(), st.integers(0, 999))
@settings(max_examples=30)
# top-2 of 2 experts with capacity 1 over 3 leading dims: nearly everything dropped
@example(2, 2, 0.1, (1, 2, 2), True, 0.1, np.float64, False, 0)
def test_moe_equals_reference(E, k, factor, lead, normalize, z, dtype, ties, seed):
    k = min(k, E)
    C = 3
    rng = np.random.default_rng(seed)
    moe = nn.MoE(C, E, top_k=k, hidden_dim=2, capacity_factor=factor, aux_loss_coef=0.3, z_loss_coef=z,
                 normalize_gates=normalize)
    for p in moe.parameters():
        p.data = rng.standard_normal(p.data.shape).astype(dtype)
    if ties:
        moe.router.weight.data[:] = 0          # every probability equal: ties go to the lowest index
    x = rng.standard_normal(lead + (C,)).astype(dtype)
    want, aux, dropped, per_expert = _reference(moe, x)
    got = moe(Tensor(x))
    tol = 1e-10 if dtype == np.float64 else 2e-4
    assert got.shape == x.shape and got.dtype == dtype
    np.testing.assert_allclose(got.data, want, atol=tol, rtol=tol)
    np.testing.assert_allclose(float(moe.aux_loss.data), aux, atol=tol, rtol=tol)
    assert moe.dropped == dropped
    assert moe.tokens_per_expert.tolist() == per_expert.tolist()


@pytest.mark.parametrize("factor, E, tokens, want", [
    (1.1, 2, 100, 55),      # float: 1.1 * 100 / 2 = 55.00000000000001, ceil 56
    (1.1, 1, 50, 55),       # float: 1.1 * 50 = 55.00000000000001, ceil 56
    (0.7, 7, 10, 1),
    (1.25, 4, 8, 3),        # a true fraction still rounds up
])
def test_capacity_is_the_exact_ceiling(factor, E, tokens, want):
    moe = nn.MoE(2, E, top_k=1, hidden_dim=1, capacity_factor=factor)
    assert moe.capacity(tokens) == want
    moe.router.weight.data[:] = 0                 # every token's first choice is expert 0
    moe(Tensor(np.ones((tokens, 2), np.float32)))
    assert moe.dropped == max(tokens - want, 0)


def test_empty_batch_gives_empty_output_and_zero_aux_loss():
    moe = nn.MoE(3, 2, top_k=1, capacity_factor=1.0, z_loss_coef=0.1)
    y = moe(Tensor(np.zeros((0, 4, 3), np.float32)))
    assert y.shape == (0, 4, 3) and float(moe.aux_loss.data) == 0.0 and moe.dropped == 0


@pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_capacity_factor_is_a_clear_error(factor):
    with pytest.raises(ValueError, match="capacity_factor"):
        nn.MoE(3, 2, capacity_factor=factor)


@pytest.mark.parametrize("bad", [np.zeros((4,)), np.zeros((2, 4))])
def test_wrong_width_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"expected inputs of shape \(\.\.\., 3\)"):
        nn.MoE(3, 2)(Tensor(bad))
