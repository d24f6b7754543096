"""torch's encoder-decoder transformer layers (``neural_arch.nn.transformer_layers``) against a float64
NumPy form of torch's documented forward (``TransformerEncoderLayer``/``TransformerDecoderLayer``: post-norm
``norm1(x + sa(x))`` or ``norm_first`` ``x + sa(norm1(x))``, masks True = not allowed / float added),
in eval mode (dropout off), with finite-difference gradients, torch's state-dict keys written out by hand,
deep-copied stacks and ``Transformer``'s argument checks."""

from __future__ import annotations

import doctest
import importlib
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.core.tensor import Tensor, manual_seed, no_grad
from neural_arch.nn.transformer_layers import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

E, H, F = 4, 2, 6          # d_model, heads, feed-forward width: tiny, so finite differences are cheap
TOL = 1e-10
#: F.gelu's erf form is Abramowitz & Stegun's polynomial (|error| < 1.5e-7; the core's explorer allows the same)
GELU_TOL = 1e-6
SEEDS = st.integers(0, 2**16)


# ----------------------------------------------------------------------------- float64 reference
def _erf(x):
    return np.vectorize(math.erf)(x)


ACT = {"relu": lambda x: np.maximum(x, 0.0), "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))}


def ref_ln(x, p, name, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _additive(mask):
    return np.where(mask, -np.inf, 0.0) if mask.dtype == bool else mask


def ref_mha(p, name, q, kv, attn_mask=None, kpm=None):
    """torch's ``multi_head_attention_forward`` on (T, N, E) inputs, need_weights=False."""
    wq, wk, wv = np.split(p[f"{name}.in_proj_weight"], 3)
    bq, bk, bv = np.split(p[f"{name}.in_proj_bias"], 3)
    t, n, _ = q.shape
    s = kv.shape[0]
    d = E // H

    def heads(x):   # (T, N, E) -> (N, H, T, D)
        return x.reshape(x.shape[0], n, H, d).transpose(1, 2, 0, 3)

    qh, kh, vh = heads(q @ wq.T + bq), heads(kv @ wk.T + bk), heads(kv @ wv.T + bv)
    scores = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d)
    if attn_mask is not None:
        a = _additive(attn_mask)
        scores = scores + (a.reshape(n, H, t, s) if a.ndim == 3 else a)
    if kpm is not None:
        scores = scores + _additive(kpm)[:, None, None, :]
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = (w @ vh).transpose(2, 0, 1, 3).reshape(t, n, E)
    return out @ p[f"{name}.out_proj.weight"].T + p[f"{name}.out_proj.bias"]


def ref_ff(p, x, act):
    return ACT[act](x @ p["linear1.weight"].T + p["linear1.bias"]) @ p["linear2.weight"].T + p["linear2.bias"]


def ref_encoder_layer(p, x, norm_first, act, mask=None, kpm=None):
    """x is (S, N, E)."""
    if norm_first:
        y = ref_ln(x, p, "norm1")
        x = x + ref_mha(p, "self_attn", y, y, mask, kpm)
        return x + ref_ff(p, ref_ln(x, p, "norm2"), act)
    x = ref_ln(x + ref_mha(p, "self_attn", x, x, mask, kpm), p, "norm1")
    return ref_ln(x + ref_ff(p, x, act), p, "norm2")


def ref_decoder_layer(p, x, mem, norm_first, act, tgt_mask=None, mem_mask=None, tgt_kpm=None, mem_kpm=None):
    if norm_first:
        y = ref_ln(x, p, "norm1")
        x = x + ref_mha(p, "self_attn", y, y, tgt_mask, tgt_kpm)
        x = x + ref_mha(p, "multihead_attn", ref_ln(x, p, "norm2"), mem, mem_mask, mem_kpm)
        return x + ref_ff(p, ref_ln(x, p, "norm3"), act)
    x = ref_ln(x + ref_mha(p, "self_attn", x, x, tgt_mask, tgt_kpm), p, "norm1")
    x = ref_ln(x + ref_mha(p, "multihead_attn", x, mem, mem_mask, mem_kpm), p, "norm2")
    return ref_ln(x + ref_ff(p, x, act), p, "norm3")


def _sub(p, prefix):
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


# ----------------------------------------------------------------------------- helpers
def _randomised(module, seed):
    """``module`` in float64 eval mode with every parameter random (torch zero-initialises the attention
    biases and the LayerNorms are ones/zeros: random values check that each is used, and where)."""
    rng = np.random.default_rng(seed)
    module.load_state_dict({k: rng.standard_normal(v.shape) * 0.5 for k, v in module.state_dict().items()})
    return module.eval()


def _params(module):
    return {k: np.array(v.data if isinstance(v, Tensor) else v, dtype=np.float64)
            for k, v in module.state_dict().items()}


def _mask(kind, rng, n, t, s):
    """An attention mask of the given kind, with no fully masked row (torch gives NaN there)."""
    if kind is None:
        return None
    if kind == "causal":
        return np.triu(np.ones((t, s), dtype=bool), k=1)
    if kind == "bool":
        m = rng.random((t, s)) < 0.4
        m[:, 0] = False
        return m
    if kind == "float3d":
        return rng.standard_normal((n * H, t, s))
    return rng.standard_normal((t, s))


def _kpm(on, rng, n, s):
    if not on:
        return None
    m = rng.random((n, s)) < 0.4
    m[:, 0] = False
    return m


def _layout(x, batch_first):
    return x.transpose(1, 0, 2) if batch_first else x


MASKS = st.sampled_from([None, "bool", "float", "float3d", "causal"])


# ----------------------------------------------------------------------------- values
@settings(max_examples=20)
@given(norm_first=st.booleans(), batch_first=st.booleans(), act=st.sampled_from(["relu", "gelu"]),
       mask=MASKS, kpm=st.booleans(), n=st.integers(1, 2), s=st.integers(1, 4), seed=SEEDS)
@example(norm_first=False, batch_first=False, act="relu", mask="bool", kpm=True, n=2, s=4, seed=0)
@example(norm_first=True, batch_first=True, act="gelu", mask="float3d", kpm=True, n=2, s=3, seed=1)
def test_encoder_layer_matches_reference(norm_first, batch_first, act, mask, kpm, n, s, seed):
    manual_seed(seed)
    layer = _randomised(TransformerEncoderLayer(E, H, F, dropout=0.1, activation=act, batch_first=batch_first,
                                                norm_first=norm_first, dtype=np.float64), seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((s, n, E))
    m, k = _mask(mask, rng, n, s, s), _kpm(kpm, rng, n, s)
    want = ref_encoder_layer(_params(layer), x, norm_first, act, m, k)
    got = layer(Tensor(_layout(x, batch_first)), src_mask=m, src_key_padding_mask=k).data
    tol = GELU_TOL if act == "gelu" else TOL
    np.testing.assert_allclose(_layout(got, batch_first), want, rtol=tol, atol=tol)


@settings(max_examples=15)
@given(norm_first=st.booleans(), batch_first=st.booleans(), tgt_mask=MASKS, mem_mask=st.sampled_from([None, "bool",
       "float"]), kpm=st.booleans(), t=st.integers(1, 3), s=st.integers(1, 4), seed=SEEDS)
@example(norm_first=False, batch_first=False, tgt_mask="causal", mem_mask="bool", kpm=True, t=3, s=4, seed=0)
def test_decoder_layer_matches_reference(norm_first, batch_first, tgt_mask, mem_mask, kpm, t, s, seed):
    n = 2
    manual_seed(seed)
    layer = _randomised(TransformerDecoderLayer(E, H, F, batch_first=batch_first, norm_first=norm_first,
                                                dtype=np.float64), seed)
    rng = np.random.default_rng(seed + 1)
    x, mem = rng.standard_normal((t, n, E)), rng.standard_normal((s, n, E))
    tm, mm = _mask(tgt_mask, rng, n, t, t), _mask(mem_mask, rng, n, t, s)
    tk, mk = _kpm(kpm, rng, n, t), _kpm(kpm, rng, n, s)
    want = ref_decoder_layer(_params(layer), x, mem, norm_first, "relu", tm, mm, tk, mk)
    got = layer(Tensor(_layout(x, batch_first)), Tensor(_layout(mem, batch_first)), tgt_mask=tm, memory_mask=mm,
                tgt_key_padding_mask=tk, memory_key_padding_mask=mk).data
    np.testing.assert_allclose(_layout(got, batch_first), want, rtol=TOL, atol=TOL)


def test_transformer_is_encoder_then_decoder_with_final_norms():
    manual_seed(0)
    model = _randomised(Transformer(E, H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=F,
                                    dtype=np.float64), 3)
    p = _params(model)
    rng = np.random.default_rng(4)
    src, tgt = rng.standard_normal((4, 2, E)), rng.standard_normal((3, 2, E))
    src_kpm = _kpm(True, rng, 2, 4)
    tgt_mask = Transformer.generate_square_subsequent_mask(3, dtype=np.float64)
    mem = src
    for i in range(2):
        mem = ref_encoder_layer(_sub(p, f"encoder.layers.{i}."), mem, False, "relu", None, src_kpm)
    mem = ref_ln(mem, p, "encoder.norm")
    out = tgt
    for i in range(2):
        out = ref_decoder_layer(_sub(p, f"decoder.layers.{i}."), out, mem, False, "relu", tgt_mask.data,
                                None, None, src_kpm)
    want = ref_ln(out, p, "decoder.norm")
    got = model(Tensor(src), Tensor(tgt), tgt_mask=tgt_mask, src_key_padding_mask=src_kpm,
                memory_key_padding_mask=src_kpm).data
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


def test_unbatched_input_and_is_causal_without_a_mask():
    manual_seed(0)
    layer = _randomised(TransformerEncoderLayer(E, H, F, dtype=np.float64), 5)
    x = np.random.default_rng(6).standard_normal((4, 1, E))
    want = ref_encoder_layer(_params(layer), x, False, "relu", np.triu(np.ones((4, 4), dtype=bool), k=1))
    # is_causal alone applies the causal mask (torch raises and asks for the mask: the same intent)
    np.testing.assert_allclose(layer(Tensor(x), is_causal=True).data, want, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(layer(Tensor(x[:, 0]), src_mask=Transformer.generate_square_subsequent_mask(4))
                               .data, want[:, 0], rtol=TOL, atol=TOL)


def test_dropout_is_active_in_training_only():
    manual_seed(0)
    layer = TransformerEncoderLayer(E, H, F, dropout=0.5, dtype=np.float64)
    x = Tensor(np.random.default_rng(0).standard_normal((3, 2, E)))
    a, b = layer(x).data, layer(x).data
    assert not np.allclose(a, b)
    layer.eval()
    np.testing.assert_array_equal(layer(x).data, layer(x).data)


# ----------------------------------------------------------------------------- gradients
def _numeric(f, a, eps=1e-6):
    g = np.zeros_like(a)
    flat, gflat = a.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_gradients_equal_finite_differences(norm_first):
    manual_seed(0)
    from neural_arch.nn import functional as nnF
    # a smooth callable activation: the tanh GELU's backward is its forward's exact derivative (the erf
    # form's backward is the true derivative, not its polynomial's); relu's kink could meet a finite difference
    layer = _randomised(TransformerDecoderLayer(E, H, F, activation=lambda x: nnF.gelu(x, approximate="tanh"),
                                                norm_first=norm_first, dtype=np.float64), 7)
    rng = np.random.default_rng(8)
    x, mem = rng.standard_normal((3, 2, E)), rng.standard_normal((2, 2, E))
    up = rng.standard_normal((3, 2, E))
    tm, mk = np.triu(np.ones((3, 3), dtype=bool), k=1), np.array([[False, True], [False, False]])
    xt, mt = Tensor(x.copy(), requires_grad=True), Tensor(mem.copy(), requires_grad=True)
    (layer(xt, mt, tgt_mask=tm, memory_key_padding_mask=mk) * Tensor(up)).sum().backward()

    def loss():
        with no_grad():
            return float((layer(Tensor(x), Tensor(mem), tgt_mask=tm, memory_key_padding_mask=mk).data * up).sum())

    np.testing.assert_allclose(xt.grad.data, _numeric(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mt.grad.data, _numeric(loss, mem), rtol=1e-5, atol=1e-7)
    for name in ("self_attn.in_proj_weight", "multihead_attn.out_proj.bias", "linear1.weight", "norm3.weight"):
        param = dict(layer.named_parameters())[name]
        np.testing.assert_allclose(param.grad.data, _numeric(loss, param.data), rtol=1e-5, atol=1e-7,
                                   err_msg=name)


# ----------------------------------------------------------------------------- torch's structure
ENC_KEYS = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
            "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
            "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"]
DEC_KEYS = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
            "self_attn.out_proj.bias", "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias",
            "multihead_attn.out_proj.weight", "multihead_attn.out_proj.bias", "linear1.weight", "linear1.bias",
            "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
            "norm3.weight", "norm3.bias"]


def test_state_dict_keys_and_shapes_are_torchs():
    enc = TransformerEncoderLayer(E, H, F)
    assert list(enc.state_dict()) == ENC_KEYS
    shapes = {k: tuple(v.shape) for k, v in enc.state_dict().items()}
    assert shapes["self_attn.in_proj_weight"] == (3 * E, E) and shapes["linear1.weight"] == (F, E)
    assert shapes["linear2.weight"] == (E, F) and shapes["norm1.weight"] == (E,)
    assert list(TransformerDecoderLayer(E, H, F).state_dict()) == DEC_KEYS
    model = Transformer(E, H, 2, 1, F)
    want = ([f"encoder.layers.{i}.{k}" for i in range(2) for k in ENC_KEYS] + ["encoder.norm.weight",
            "encoder.norm.bias"] + [f"decoder.layers.0.{k}" for k in DEC_KEYS] + ["decoder.norm.weight",
                                                                               "decoder.norm.bias"])
    assert list(model.state_dict()) == want
    nobias = TransformerEncoderLayer(E, H, F, bias=False)
    assert list(nobias.state_dict()) == ["self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
                                         "linear2.weight", "norm1.weight", "norm2.weight"]
    assert [n for n, _ in TransformerDecoderLayer(E, H, F).named_children()] == [
        "self_attn", "multihead_attn", "linear1", "dropout", "linear2", "norm1", "norm2", "norm3", "dropout1",
        "dropout2", "dropout3"]


def test_defaults_are_torchs():
    layer = TransformerEncoderLayer(8, 2)
    assert layer.linear1.out_features == 2048 and layer.dropout.p == 0.1 and layer.norm1.eps == 1e-5
    assert not layer.norm_first and not layer.self_attn.batch_first and layer.self_attn.dropout == 0.1
    model = Transformer(num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=4)
    assert (model.d_model, model.nhead, model.batch_first) == (512, 8, False)
    # torch's init: Xavier-uniform on every matrix, LayerNorms ones/zeros, attention biases zero
    w = model.encoder.layers[0].linear1.weight.data
    assert np.abs(w).max() <= math.sqrt(6.0 / (512 + 4)) + 1e-7
    assert np.all(model.decoder.norm.weight.data == 1) and np.all(model.encoder.layers[0].self_attn.in_proj_bias.data == 0)


def test_stacks_are_independent_deep_copies():
    layer = TransformerEncoderLayer(E, H, F)
    enc = TransformerEncoder(layer, 3)
    assert len(enc.layers) == 3 and enc.num_layers == 3 and enc.norm is None
    ws = [m.linear1.weight for m in enc.layers]
    assert all(w is not layer.linear1.weight for w in ws) and ws[0] is not ws[1]
    np.testing.assert_array_equal(ws[0].data, layer.linear1.weight.data)
    ws[0].data[...] = 0
    assert not np.all(ws[1].data == 0) and not np.all(layer.linear1.weight.data == 0)
    dec = TransformerDecoder(TransformerDecoderLayer(E, H, F), 2)
    assert dec.layers[0].multihead_attn is not dec.layers[1].multihead_attn


def test_generate_square_subsequent_mask():
    m = Transformer.generate_square_subsequent_mask(4)
    assert m.shape == (4, 4) and m.dtype == np.float32
    np.testing.assert_array_equal(m.data, np.where(np.triu(np.ones((4, 4)), k=1) > 0, -np.inf, 0.0))
    assert Transformer.generate_square_subsequent_mask(2, dtype=np.float64).dtype == np.float64


def test_errors_are_torchs():
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        TransformerEncoderLayer(E, H, F, activation="tanh")
    model = Transformer(E, H, 1, 1, F)
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        model(np.zeros((3, 2, E)), np.zeros((3, 1, E)))
    with pytest.raises(RuntimeError, match="the feature number of src and tgt must be equal to d_model"):
        model(np.zeros((3, 2, E)), np.zeros((3, 2, E + 2)))


def test_callable_activation():
    from neural_arch.nn.activation import GELU
    manual_seed(0)
    a = _randomised(TransformerEncoderLayer(E, H, F, activation=GELU(), dtype=np.float64), 9)
    x = np.random.default_rng(1).standard_normal((2, 1, E))
    np.testing.assert_allclose(a(Tensor(x)).data, ref_encoder_layer(_params(a), x, False, "gelu"), rtol=GELU_TOL,
                               atol=GELU_TOL)


def test_docstring_examples_run():
    result = doctest.testmod(importlib.import_module("neural_arch.nn.transformer_layers"), verbose=False,
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 10
