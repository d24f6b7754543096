"""nn.MultiheadAttention with torch's contract: torch's parameter names, layouts and mask semantics,
checked against a naive NumPy form of torch's ``multi_head_attention_forward`` in float64, with
finite-difference gradients; the GPT block keeps its own CausalSelfAttention (old pickles load as it)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor, manual_seed

E, H, L, S, N = 8, 2, 3, 5, 2
TOL = 1e-12


def reference(params, q, k, v, kdim_split: bool, attn_mask=None, key_padding_mask=None, average=True):
    """torch's functional form, written out: (L, N, E) inputs, bool masks True = not allowed."""
    if kdim_split:
        wq, wk, wv = params["q_proj_weight"], params["k_proj_weight"], params["v_proj_weight"]
    else:
        wq, wk, wv = np.split(params["in_proj_weight"], 3)
    bq, bk, bv = np.split(params["in_proj_bias"], 3)
    d = E // H
    qp, kp, vp = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv
    def heads(x):   # (T, N, E) -> (N, H, T, D)
        return x.reshape(x.shape[0], N, H, d).transpose(1, 2, 0, 3)

    qh, kh, vh = heads(qp), heads(kp), heads(vp)
    scores = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    if attn_mask is not None:
        add = np.where(attn_mask, -np.inf, 0.0) if attn_mask.dtype == bool else attn_mask
        scores = scores + (add.reshape(N, H, L, S) if add.ndim == 3 else add)
    if key_padding_mask is not None:
        add = np.where(key_padding_mask, -np.inf, 0.0) if key_padding_mask.dtype == bool else key_padding_mask
        scores = scores + add[:, None, None, :]
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = (w @ vh).transpose(2, 0, 1, 3).reshape(L, N, E)
    out = out @ params["out_proj.weight"].T + params["out_proj.bias"]
    return out, (w.mean(1) if average else w)


def _module(kdim_split: bool, batch_first: bool = False):
    manual_seed(0)
    m = nn.MultiheadAttention(E, H, kdim=6 if kdim_split else None, vdim=4 if kdim_split else None,
                              batch_first=batch_first, dtype=np.float64)
    rng = np.random.default_rng(1)
    # non-zero biases so the bias slicing is checked too (torch initialises them to 0)
    m.load_state_dict({n: rng.standard_normal(p.shape) for n, p in m.state_dict().items()})
    return m


def _inputs(kdim_split: bool, seed: int = 2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, N, E)), rng.standard_normal((S, N, 6 if kdim_split else E)),
            rng.standard_normal((S, N, 4 if kdim_split else E)))


def _masks(kind: str, rng):
    am = kpm = None
    if kind in ("bool", "both"):
        am = rng.random((L, S)) < 0.4
        am[:, 0] = False
    if kind == "float":
        am = rng.standard_normal((L, S))
    if kind == "3d":
        am = rng.random((N * H, L, S)) < 0.4
        am[..., 1] = False
    if kind in ("padding", "both"):
        kpm = rng.random((N, S)) < 0.4
        kpm[:, 0] = False
        if kind == "both":
            am[:, 0] = False
    return am, kpm


def test_torch_parameter_names_and_init():
    m = nn.MultiheadAttention(E, H)
    assert sorted(m.state_dict()) == ["in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"]
    assert m.in_proj_weight.shape == (3 * E, E) and m.q_proj_weight is None and isinstance(m.out_proj, nn.Linear)
    assert not m.in_proj_bias.data.any() and not m.out_proj.bias.data.any()     # torch zeroes both
    split = nn.MultiheadAttention(E, H, kdim=6, vdim=4, bias=False)
    assert sorted(split.state_dict()) == ["k_proj_weight", "out_proj.weight", "q_proj_weight", "v_proj_weight"]
    assert split.k_proj_weight.shape == (E, 6) and split.v_proj_weight.shape == (E, 4)
    for flag in ("add_bias_kv", "add_zero_attn"):
        with pytest.raises(NotImplementedError, match=flag):
            nn.MultiheadAttention(E, H, **{flag: True})
    with pytest.raises(ValueError, match="divisible"):
        nn.MultiheadAttention(E, 3)


@pytest.mark.parametrize("kdim_split", [False, True])
@pytest.mark.parametrize("kind", ["none", "bool", "float", "3d", "padding", "both"])
def test_equals_the_reference(kdim_split, kind):
    m = _module(kdim_split)
    q, k, v = _inputs(kdim_split)
    am, kpm = _masks(kind, np.random.default_rng(3))
    params = {n: np.asarray(p) for n, p in m.state_dict().items()}
    ref_out, ref_w = reference(params, q, k, v, kdim_split, am, kpm)
    out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am)
    assert np.abs(out.data - ref_out).max() <= TOL and np.abs(w.data - ref_w).max() <= TOL
    fused, none = m(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=False)   # the sdpa path
    assert none is None and np.abs(fused.data - ref_out).max() <= TOL
    _, per_head = m(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    assert np.abs(per_head.data - reference(params, q, k, v, kdim_split, am, kpm, average=False)[1]).max() <= TOL


def test_layouts_batch_first_unbatched_and_causal():
    m, mb = _module(False), _module(False, batch_first=True)
    q, k, v = _inputs(False)
    out, w = m(q, k, v)
    out_b, w_b = mb(*(x.transpose(1, 0, 2) for x in (q, k, v)))
    assert np.abs(out_b.data.transpose(1, 0, 2) - out.data).max() <= TOL and np.abs(w_b.data - w.data).max() <= TOL
    one, w_one = m(q[:, 0], k[:, 0], v[:, 0])                                      # unbatched (L, E)
    assert one.shape == (L, E) and w_one.shape == (L, S) and np.abs(one.data - out.data[:, 0]).max() <= TOL
    causal = np.triu(np.ones((L, L), bool), 1)
    want, _ = m(q, q, q, attn_mask=causal)
    for need_weights in (True, False):
        got, _ = m(q, q, q, is_causal=True, need_weights=need_weights)   # the hint alone applies the mask
        assert np.abs(got.data - want.data).max() <= TOL
    with pytest.raises(ValueError, match="key_padding_mask"):
        m(q, k, v, key_padding_mask=np.zeros((S, N), bool))
    with pytest.raises(ValueError, match="attn_mask"):
        m(q, k, v, attn_mask=np.zeros((S, L), bool))


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradients_equal_finite_differences(need_weights):
    m = _module(True)
    q, k, v = _inputs(True, seed=4)
    am, kpm = _masks("both", np.random.default_rng(5))
    g = np.random.default_rng(6).standard_normal((L, N, E))

    def loss(qa, ka, va):
        out, _ = m(qa, ka, va, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights)
        return (out * Tensor(g)).sum()

    xs = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
    m.zero_grad()
    loss(*xs).backward()
    eps = 1e-6
    for i, x in enumerate(xs):
        for idx in [(0, 0, 0), (1, 1, 2), (-1, 0, -1)]:
            arrays = [a.copy() for a in (q, k, v)]
            arrays[i][idx] += eps
            up = loss(*arrays).item()
            arrays[i][idx] -= 2 * eps
            fd = (up - loss(*arrays).item()) / (2 * eps)
            assert abs(fd - x.grad.data[idx]) <= 1e-7, (i, idx)
    for name, p in m.named_parameters():
        assert p.grad is not None and np.isfinite(p.grad.data).all(), name
    w = m.k_proj_weight
    base = w.data[1, 2]
    w.data[1, 2] = base + eps
    up = loss(q, k, v).item()
    w.data[1, 2] = base - eps
    down = loss(q, k, v).item()
    w.data[1, 2] = base
    assert abs((up - down) / (2 * eps) - w.grad.data[1, 2]) <= 1e-7


def test_the_gpt_block_uses_causal_self_attention_and_old_pickles_load():
    block = nn.TransformerBlock(E, H)
    assert type(block.attn) is nn.CausalSelfAttention
    # a pickle made when CausalSelfAttention was called MultiheadAttention names the old class (protocol 0
    # writes names as text without a length prefix, so the bytes can be edited)
    data = pickle.dumps(block.attn, protocol=0).replace(b"CausalSelfAttention", b"MultiheadAttention")
    old = pickle.loads(data)
    assert type(old) is nn.CausalSelfAttention
    x = np.random.default_rng(0).standard_normal((1, 4, E)).astype(np.float32)
    assert np.array_equal(old(x).data, block.attn(x).data)
