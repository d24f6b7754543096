"""GPT.generate with a KV cache: every cached step's logits equal a full forward over the prefix
(float64, <= 1e-10), left-padded batches equal each prompt alone, greedy/top-k/top-p/eos semantics,
eval + no_grad with the mode restored, and a clear error past block_size."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import neural_arch as na
from neural_arch import Tensor, nn
from neural_arch.nn import kv_cache as kv_cache_module
from neural_arch.nn import transformer as transformer_module
from neural_arch.nn.kv_cache import KVCache

V, BLOCK = 13, 16


def _gpt(moe: bool = False, seed: int = 0):
    na.manual_seed(seed)
    kw = {"moe_num_experts": 3, "moe_every": 2, "moe_kwargs": {"top_k": 2}} if moe else {}
    model = nn.GPT(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=8, **kw).double()
    rng = np.random.default_rng(seed)
    for p in model.parameters():   # larger weights than GPT-2's 0.02: logits that differ visibly
        p.data = rng.standard_normal(p.data.shape) * 0.5
    return model


def _full_last(model, seq, mask=None):
    with na.no_grad():
        return model(seq, attention_mask=mask).data[:, -1]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_cached_steps_equal_full_recomputation(moe):
    model = _gpt(moe).eval()
    seq = np.random.default_rng(1).integers(0, V, (3, 5))
    cache = KVCache()
    with na.no_grad():
        logits = model(seq, kv_cache=cache).data
        np.testing.assert_allclose(logits, model(seq).data, rtol=0, atol=1e-10)   # prefill, every position
        for _ in range(BLOCK - seq.shape[1]):
            full = model(seq).data[:, -1]
            assert np.abs(logits[:, -1] - full).max() <= 1e-10
            nxt = full.argmax(-1)[:, None]
            seq = np.concatenate([seq, nxt], axis=1)
            logits = model(nxt, kv_cache=cache).data
            assert logits.shape == (3, 1, V)
        assert cache.get_seq_length() == BLOCK and len(cache) == 2
        np.testing.assert_allclose(logits[:, -1], model(seq).data[:, -1], rtol=0, atol=1e-10)
        with pytest.raises(ValueError, match="block_size"):   # one position more has no embedding
            model(nxt, kv_cache=cache)


def test_generate_greedy_equals_full_recomputation_loop():
    model = _gpt()
    prompt = np.random.default_rng(2).integers(0, V, (2, 4))
    seq = prompt
    for _ in range(7):
        seq = np.concatenate([seq, _full_last(model, seq).argmax(-1)[:, None]], axis=1)
    out = model.generate(prompt, max_new_tokens=7)
    np.testing.assert_array_equal(out, seq)
    np.testing.assert_array_equal(model.generate(prompt, 7, use_cache=False), seq)
    as_tensor = model.generate(Tensor(prompt), 7)
    assert isinstance(as_tensor, Tensor)
    np.testing.assert_array_equal(as_tensor.data, seq)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_left_padded_batch_equals_each_prompt_alone(moe):
    model = _gpt(moe).eval()
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, n) for n in (5, 2, 4)]
    width, pad = 5, 0
    idx = np.array([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cache = KVCache()
    seqs = [p[None, :] for p in prompts]
    with na.no_grad():
        logits = model(idx, attention_mask=mask, kv_cache=cache).data[:, -1]
        for _ in range(6):
            for i, s in enumerate(seqs):     # each padded row's step equals its prompt's own full forward
                assert np.abs(logits[i] - model(s).data[0, -1]).max() <= 1e-10
            nxt = logits.argmax(-1)[:, None]
            seqs = [np.concatenate([s, nxt[i:i + 1]], axis=1) for i, s in enumerate(seqs)]
            mask = np.concatenate([mask, np.ones((3, 1), dtype=mask.dtype)], axis=1)
            logits = model(nxt, attention_mask=mask, kv_cache=cache).data[:, -1]
    out = model.generate(idx, 6, attention_mask=mask[:, :width])
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(out[i, width - len(p):], model.generate(p[None, :], 6)[0])
    with pytest.raises(ValueError, match="LEFT padding"):
        model.generate(idx[:, ::-1], 2, attention_mask=mask[:, :width][:, ::-1])


def test_past_block_size_is_a_clear_error():
    model = _gpt()
    with pytest.raises(ValueError, match=r"prompt length 10 plus max_new_tokens 7 = 17 exceeds block_size 16"):
        model.generate(np.zeros((1, 10), dtype=np.int64), max_new_tokens=7)
    assert model.generate(np.zeros((1, 10), dtype=np.int64), max_new_tokens=6).shape == (1, 16)


def test_eos_pads_finished_sequences_and_stops_when_all_are_done():
    model = _gpt()
    prompt = np.random.default_rng(4).integers(0, V, (2, 3))
    free = model.generate(prompt, 8)
    eos = int(free[0, 4])                       # row 0 emits it (at its 2nd new token, or earlier)
    out = model.generate(prompt, 8, eos_token_id=eos)
    first = {i: next((j for j in range(3, free.shape[1]) if free[i, j] == eos), None) for i in range(2)}
    for i in range(2):
        stop = first[i]
        if stop is None:
            np.testing.assert_array_equal(out[i], free[i, :out.shape[1]])
        else:
            np.testing.assert_array_equal(out[i, :stop + 1], free[i, :stop + 1])
            assert (out[i, stop:] == eos).all()
    if all(v is not None for v in first.values()):
        assert out.shape[1] == max(first.values()) + 1
    alone = model.generate(prompt[:1], 8, eos_token_id=[V + 5, eos])   # a list; stops at once for one row
    np.testing.assert_array_equal(alone[0], free[0, :first[0] + 1])


def test_sampling_is_seeded_and_top_k_1_or_tiny_top_p_is_greedy():
    model = _gpt()
    prompt = np.random.default_rng(5).integers(0, V, (4, 3))
    a = model.generate(prompt, 6, do_sample=True, temperature=1.5, generator=np.random.default_rng(7))
    b = model.generate(prompt, 6, do_sample=True, temperature=1.5, generator=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    na.manual_seed(11)
    c = model.generate(prompt, 6, do_sample=True)
    na.manual_seed(11)
    np.testing.assert_array_equal(c, model.generate(prompt, 6, do_sample=True))
    greedy = model.generate(prompt, 6)
    np.testing.assert_array_equal(model.generate(prompt, 6, do_sample=True, top_k=1), greedy)
    np.testing.assert_array_equal(model.generate(prompt, 6, do_sample=True, top_p=1e-6), greedy)


def test_top_k_and_top_p_filter_like_hugging_face():
    logits = np.log(np.array([[0.5, 0.25, 0.15, 0.1]] * 400))
    gen = np.random.default_rng(0)

    def draws(**kw):
        kw = {"top_k": None, "top_p": None, **kw}
        return set(transformer_module._next_token(logits, True, 1.0, kw["top_k"], kw["top_p"], gen, np).tolist())

    assert draws() == {0, 1, 2, 3}
    assert draws(top_k=2) == {0, 1}
    assert draws(top_p=0.5) == {0}            # 0.5 already reaches top_p
    assert draws(top_p=0.6) == {0, 1}         # HF keeps the smallest set whose mass reaches top_p
    assert draws(top_p=0.85) == {0, 1, 2}
    assert draws(top_k=3, top_p=0.95) == {0, 1, 2}
    tied = np.log(np.array([[0.3, 0.3, 0.3, 0.1]] * 400))   # top-k keeps ties with the k-th value
    assert set(transformer_module._next_token(tied, True, 1.0, 1, None, gen, np).tolist()) == {0, 1, 2}


def test_eval_no_grad_and_mode_restored():
    model = _gpt()
    model.train()
    out = model.generate(np.array([[1, 2]]), 3)
    assert model.training and all(m.training for m in model.modules())
    assert isinstance(out, np.ndarray) and out.shape == (1, 5)
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    model.generate(np.array([[1, 2]]), 3)
    assert not model.training


def test_arguments_are_checked():
    model = _gpt()
    with pytest.raises(ValueError, match="temperature"):
        model.generate(np.array([[1]]), 2, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(np.array([[1]]), 2, do_sample=True, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(np.array([[1]]), 2, do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(np.array([[1, 2]]), attention_mask=np.ones((1, 3)))


@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples():
    for module in (kv_cache_module, transformer_module):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0
