"""Exploring ``GPT.generate`` against plain references (hypothesis).

* greedy decoding with the KV cache equals decoding each prompt **alone** by re-running the full
  forward on its whole prefix every step (float64, every logit <= 1e-10), for prompts of every length
  1 .. block_size, left-padded batches of different lengths, ``max_new_tokens`` up to the block size,
  and with ``eos_token_id``;
* float32: cached and uncached decoding agree;
* the sampler (temperature, then top-k, then top-p) against a NumPy reference fed the same uniforms:
  top-k keeps the ``k`` largest logits and their ties, top-p the smallest most-likely set whose
  probability reaches ``p`` (Hugging Face's nucleus); seeded runs repeat and ``top_k=1`` is greedy;
* a cache filled with left padding refuses a later step without the mask (it used to attend the
  padding and count positions from it), and a cache of another model or one left half updated is
  refused (its layers used to see different pasts);
* bad input is a clear ``ValueError`` at the call: token ids outside ``[0, vocab_size)`` (a negative
  id used to wrap to the vocabulary's end), non-integral ids (used to be truncated),
  capacity-limited MoE blocks under cached or padded decoding (used to route differently from the
  full forward), an infinite temperature (used to make top-k / top-p keep every token), and a
  fractional or empty ``eos_token_id`` (``2.5`` used to stop at token 2);
* ``PipelineGenerator.generate`` makes the same checks (it used to take the same bad input silently).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import nn
from neural_arch.nn.kv_cache import KVCache
from neural_arch.nn.transformer import _next_token

V, BLOCK = 11, 8


def _gpt(dtype=np.float64, seed: int = 0, **kw):
    na.manual_seed(seed)
    model = nn.GPT(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=8, **kw)
    rng = np.random.default_rng(seed)
    for p in model.parameters():   # larger than GPT-2's 0.02: logits far apart, no argmax near-ties
        p.data = (rng.standard_normal(p.data.shape) * 0.5).astype(dtype)
    return model.eval()


MODEL64 = _gpt()
MODEL32 = _gpt(np.float32)


def _alone_greedy(model, prompt, n: int, eos=None):
    """The reference: one prompt, the full forward over its whole prefix each step; the logits too."""
    seq, logits = np.asarray(prompt)[None, :], []
    with na.no_grad():
        for _ in range(n):
            last = model(seq).data[0, -1]
            logits.append(last)
            nxt = int(last.argmax())
            seq = np.concatenate([seq, [[nxt]]], axis=1)
            if eos is not None and nxt == eos:
                break
    return seq[0], logits


def _left_pad(prompts):
    width = max(len(p) for p in prompts)
    idx = np.array([[0] * (width - len(p)) + list(p) for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    return idx, mask


@st.composite
def _batches(draw):
    lengths = draw(st.lists(st.integers(1, BLOCK), min_size=1, max_size=3))
    n = draw(st.integers(0, BLOCK - max(lengths)))
    seed = draw(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, k) for k in lengths], n


@settings(max_examples=20)
@given(_batches())
@example(([np.array([3])], BLOCK - 1))                                   # one token, up to the block
@example(([np.arange(BLOCK) % V], 0))                                    # the whole block, nothing new
@example(([np.array([1, 2, 3, 4, 5, 6, 7]), np.array([9])], 1))          # lengths 7 and 1, 8 = block_size
def test_cached_greedy_equals_each_prompt_alone_fully_recomputed(case):
    prompts, n = case
    idx, mask = _left_pad(prompts)
    alone = [_alone_greedy(MODEL64, p, n) for p in prompts]
    # every logit of every cached step, per row, against the row's own full forward
    cache, step_ids, step_mask = KVCache(), idx, mask
    with na.no_grad():
        for s in range(n):
            last = MODEL64(step_ids, attention_mask=step_mask, kv_cache=cache).data[:, -1]
            for i, (_, ref) in enumerate(alone):
                assert np.abs(last[i] - ref[s]).max() <= 1e-10, f"row {i} step {s}"
            step_ids = last.argmax(-1)[:, None]
            step_mask = np.concatenate([step_mask, np.ones((len(prompts), 1), dtype=step_mask.dtype)], axis=1)
    out = MODEL64.generate(idx, n, attention_mask=mask)
    assert out.shape == (len(prompts), idx.shape[1] + n)
    for i, (seq, _) in enumerate(alone):
        np.testing.assert_array_equal(out[i, idx.shape[1] - len(prompts[i]):], seq)
    np.testing.assert_array_equal(MODEL64.generate(idx, n, attention_mask=mask, use_cache=False), out)
    if len({len(p) for p in prompts}) == 1:    # equal lengths: no mask needed, same tokens
        np.testing.assert_array_equal(MODEL64.generate(idx, n), out)


@settings(max_examples=10)
@given(_batches(), st.integers(0, V - 1))
def test_eos_in_a_batch_equals_each_prompt_alone(case, eos):
    prompts, n = case
    idx, mask = _left_pad(prompts)
    out = MODEL64.generate(idx, n, eos_token_id=eos, attention_mask=mask)
    pad = idx.shape[1]
    for i, p in enumerate(prompts):
        seq, _ = _alone_greedy(MODEL64, p, n, eos=eos)
        new = seq[len(p):]
        np.testing.assert_array_equal(out[i, pad:pad + len(new)], new)
        assert (out[i, pad + len(new):] == eos).all()     # a finished row is filled with eos
    stops = [len(_alone_greedy(MODEL64, p, n, eos=eos)[0]) - len(p) for p in prompts]
    assert out.shape[1] == pad + max(stops, default=0)     # stops once every row has finished


def test_a_padded_cache_needs_the_mask_on_every_step():
    """found: after a left-padded prefill, a decode step without attention_mask attended the padding and
    counted positions from it (a padded row's logits off by ~0.3), silently; now a ValueError."""
    idx, mask = _left_pad([np.array([1, 2, 3]), np.array([4])])
    cache = KVCache()
    with na.no_grad():
        nxt = MODEL64(idx, attention_mask=mask, kv_cache=cache).data[:, -1].argmax(-1)[:, None]
        with pytest.raises(ValueError, match="kv_cache holds padded sequences"):
            MODEL64(nxt, kv_cache=cache)
        full = np.concatenate([mask, np.ones((2, 1), dtype=mask.dtype)], axis=1)
        got = MODEL64(nxt, attention_mask=full, kv_cache=cache).data[1, -1]
        np.testing.assert_allclose(got, MODEL64(np.array([[4, nxt[1, 0]]])).data[0, -1], rtol=0, atol=1e-10)
        unpadded = KVCache()                      # no padding: the mask may be left out on later steps
        MODEL64(idx, attention_mask=np.ones_like(idx), kv_cache=unpadded)
        assert MODEL64(nxt, kv_cache=unpadded).data.shape == (2, 1, V)


def test_a_cache_of_another_model_or_half_updated_is_a_clear_error():
    """found: a 1-layer model's cache passed to a 2-layer model was extended silently (layer 1 started
    empty, so its causal mask and layer 0's positions disagreed)."""
    idx = np.array([[1, 2, 3]])
    other = nn.GPT(vocab_size=V, block_size=BLOCK, n_layer=1, n_head=2, n_embd=8).double()
    cache = KVCache()
    with na.no_grad():
        other(idx, kv_cache=cache)
        with pytest.raises(ValueError, match=r"holds 1 layers of lengths \[3\], this model has 2 blocks"):
            MODEL64(idx[:, :1], kv_cache=cache)
        half = KVCache()
        MODEL64(idx, kv_cache=half)
        half.update(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)), layer_idx=0)   # as a step that failed in layer 1
        with pytest.raises(ValueError, match=r"lengths \[4, 3\]"):
            MODEL64(idx[:, :1], kv_cache=half)


def test_past_the_block_is_a_clear_error_and_reaching_it_works():
    for t in range(1, BLOCK + 1):
        assert MODEL64.generate(np.zeros((2, t), dtype=np.int64), BLOCK - t).shape == (2, BLOCK)
        with pytest.raises(ValueError, match="exceeds block_size"):
            MODEL64.generate(np.zeros((2, t), dtype=np.int64), BLOCK - t + 1)


@settings(max_examples=8)
@given(_batches())
def test_float32_cached_equals_uncached(case):
    prompts, n = case
    idx, mask = _left_pad(prompts)
    cached = MODEL32.generate(idx, n, attention_mask=mask)
    assert cached.dtype == np.int64
    np.testing.assert_array_equal(cached, MODEL32.generate(idx, n, attention_mask=mask, use_cache=False))
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(cached[i, idx.shape[1] - len(p):], _alone_greedy(MODEL32, p, n)[0])


# -- the sampler ---------------------------------------------------------------------------------------
def _reference_sample(logits, temperature, top_k, top_p, uniforms):
    """Temperature, top-k (ties with the k-th kept), nucleus (most likely first, the smallest prefix whose
    mass reaches top_p), then the inverse CDF in vocabulary order with the given uniforms."""
    choices = []
    for row, u in zip(np.asarray(logits, dtype=np.float64), uniforms):
        scores = row / temperature
        keep = np.ones(scores.shape, dtype=bool)
        if top_k is not None and top_k < scores.size:
            keep &= scores >= np.sort(scores)[::-1][top_k - 1]
        if top_p is not None and top_p < 1.0:
            probs = np.where(keep, np.exp(scores - scores[keep].max()), 0.0)
            probs /= probs.sum()
            order = np.argsort(-probs, kind="stable")
            mass = np.cumsum(probs[order])
            n_keep = int(np.searchsorted(mass, top_p, side="left")) + 1     # first prefix with mass >= top_p
            nucleus = np.zeros_like(keep)
            nucleus[order[:n_keep]] = True
            keep &= nucleus
        probs = np.where(keep, np.exp(scores - scores[keep].max()), 0.0)
        cdf = np.cumsum(probs / probs.sum())
        choices.append(min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), row.size - 1))
    return np.array(choices)


@settings(max_examples=25)
@given(st.integers(1, 4), st.integers(2, 9), st.floats(0.25, 3.0), st.one_of(st.none(), st.integers(1, 10)),
       st.one_of(st.none(), st.floats(0.05, 1.0)), st.integers(0, 2 ** 16), st.sampled_from([np.float32, np.float64]))
@example(3, 4, 1.0, None, 0.5, 0, np.float64)
@example(2, 5, 0.7, 1, None, 1, np.float32)
def test_sampler_matches_a_numpy_reference(b, v, temperature, top_k, top_p, seed, dtype):
    logits = (np.random.default_rng(seed).standard_normal((b, v)) * 2).astype(dtype)
    got = _next_token(logits, True, temperature, top_k, top_p, np.random.default_rng(seed + 1), np)
    uniforms = np.random.default_rng(seed + 1).random(b)
    np.testing.assert_array_equal(got, _reference_sample(logits, temperature, top_k, top_p, uniforms))
    if top_k == 1:
        np.testing.assert_array_equal(got, logits.argmax(-1))


@settings(max_examples=6)
@given(_batches(), st.floats(0.3, 2.0), st.integers(0, 2 ** 16))
def test_seeded_sampling_repeats_and_top_k_1_is_greedy(case, temperature, seed):
    prompts, n = case
    idx, mask = _left_pad(prompts)
    kw = {"attention_mask": mask, "do_sample": True, "temperature": temperature}
    a = MODEL64.generate(idx, n, generator=np.random.default_rng(seed), top_p=0.9, **kw)
    np.testing.assert_array_equal(a, MODEL64.generate(idx, n, generator=np.random.default_rng(seed), top_p=0.9, **kw))
    g = na.Generator().manual_seed(seed)
    b = MODEL64.generate(idx, n, generator=g, **kw)
    np.testing.assert_array_equal(b, MODEL64.generate(idx, n, generator=na.Generator().manual_seed(seed), **kw))
    np.testing.assert_array_equal(MODEL64.generate(idx, n, top_k=1, generator=np.random.default_rng(seed), **kw),
                                  MODEL64.generate(idx, n, attention_mask=mask))


# -- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ids, match", [
    ([[-1, 2]], r"token id -1 is outside the vocabulary \[0, 11\)"),     # used to wrap to row V - 1
    ([[3, V]], r"token id 11 is outside the vocabulary"),
    ([[1.5, 2.0]], "must be integers.*non-integral"),                      # used to be truncated to 1
    ([[True, False]], "must be integers, got dtype bool"),
])
def test_bad_token_ids_are_a_clear_error(ids, match):
    with pytest.raises(ValueError, match=match):
        MODEL64.generate(np.array(ids), 2)
    with pytest.raises(ValueError, match=match):
        MODEL64.generate(na.Tensor(np.array(ids)), 2, use_cache=False)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan")])
def test_a_temperature_that_is_not_finite_and_positive_is_a_clear_error(temperature):
    # found: temperature=inf flattened every logit to 0, so top_k=1 sampled any token
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        MODEL64.generate(np.array([[1, 2]]), 2, do_sample=True, temperature=temperature, top_k=1)


@pytest.mark.parametrize("eos", [2.5, [], [[1, 2]]])
def test_a_bad_eos_token_id_is_a_clear_error(eos):
    # found: 2.5 was truncated to token 2 (a stop nobody asked for), [] failed at the first step
    with pytest.raises(ValueError, match="eos_token_id must be an integer token id"):
        MODEL64.generate(np.array([[1, 2]]), 2, eos_token_id=eos)


def test_ragged_prompts_say_how_to_pad():
    with pytest.raises(ValueError, match="left-pad them and pass attention_mask"):
        MODEL64.generate([[1, 2], [3]], 2)


def test_integral_float_ids_and_lists_still_work():
    ref = MODEL64.generate(np.array([[1, 2]]), 3)
    np.testing.assert_array_equal(MODEL64.generate(np.array([[1.0, 2.0]]), 3), ref)
    np.testing.assert_array_equal(MODEL64.generate([[1, 2]], 3), ref)


def test_capacity_limited_moe_refuses_cached_or_padded_generation():
    model = _gpt(moe_num_experts=3, moe_kwargs={"top_k": 1, "capacity_factor": 1.0})
    prompt = np.random.default_rng(0).integers(0, V, (1, 5))
    # found: cached decoding (one token per step) routed differently from the full forward
    with pytest.raises(ValueError, match="capacity_factor"):
        model.generate(prompt, 3)
    with pytest.raises(ValueError, match="capacity_factor"):
        model.generate(np.array([[0, 1, 2], [3, 4, 5]]), 2, attention_mask=np.array([[0, 1, 1], [1, 1, 1]]),
                       use_cache=False)
    seq = prompt
    with na.no_grad():
        for _ in range(3):
            seq = np.concatenate([seq, model(seq).data[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(model.generate(prompt, 3, use_cache=False), seq)
    for block in model.blocks:          # what the error says to do: no token dropped, caching is exact
        block.mlp.capacity_factor = None
    alone = [_alone_greedy(model, p, 3)[0] for p in prompt]
    np.testing.assert_array_equal(model.generate(prompt, 3)[0], alone[0])


def test_pipeline_generator_checks_its_input_like_generate(world_of_one):
    """``PipelineGenerator.generate`` (one stage here) used to take negative or fractional ids, a
    right-padded mask and out-of-range sampling arguments silently; it raises GPT.generate's errors on
    every rank before any message now, and equals GPT.generate on good input."""
    from neural_arch.distributed.pipelining.generation import PipelineGenerator

    gen = PipelineGenerator(MODEL64)
    idx, mask = _left_pad([np.array([1, 2, 3]), np.array([4])])
    (out,) = gen.generate([idx], 3, attention_masks=[mask])
    np.testing.assert_array_equal(out, MODEL64.generate(idx, 3, attention_mask=mask))
    bad = [
        (([np.array([[-1, 2]])], 2), {}, "token id -1 is outside the vocabulary"),
        (([np.array([[1.5, 2.0]])], 2), {}, "must be integers"),
        (([idx], 2), {"attention_masks": [mask[:, ::-1]]}, "LEFT padding"),
        (([idx], 2), {"attention_masks": [mask[:, :1]]}, "shape of idx"),
        (([idx], 2), {"attention_masks": []}, "one per prompt"),
        (([idx], 2), {"do_sample": True, "top_k": 0}, "top_k"),
        (([idx], 2), {"do_sample": True, "temperature": 0.0}, "temperature"),
        (([idx], 2), {"eos_token_id": 1.5}, "eos_token_id"),
        (([idx, idx], 2), {"do_sample": True, "generators": [np.random.default_rng(0)]}, "one per prompt"),
    ]
    for args, kw, match in bad:
        with pytest.raises(ValueError, match=match):
            gen.generate(*args, **kw)
    moe = PipelineGenerator(_gpt(moe_num_experts=2, moe_kwargs={"top_k": 1, "capacity_factor": 1.0}))
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.generate([idx[:1]], 2)
