"""Exploring continuous batching (hypothesis), in one process: ``ContinuousBatcher`` + ``DecodeEngine`` as
rank 0 runs them, for random mixes of requests -- prompt lengths 1 .. block_size - 1, ``max_new_tokens``
up to the block, arrivals at different steps, greedy and seeded sampling (temperature, top-k, top-p),
clients that go away, ``max_batch`` 1 .. 3 and a prefill budget. Every request must get exactly the
tokens it gets **alone** (the reference: the full forward over its whole prefix each step, float64,
and its own generator), whatever it was batched with; requests finish at different steps and their
caches are dropped. A request longer than the model is a clear error (400 at the door, ``ValueError``
in the engine), and so is an infinite temperature (it made top-k / top-p keep every token); a
capacity-limited MoE model, whose batch would mix requests, is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import nn
from neural_arch.nn.transformer import _next_token
from neural_arch.serve.batcher import STEP, ContinuousBatcher, StepPlan
from neural_arch.serve.decode_step import DecodeEngine
from neural_arch.serve.protocol import GenerationRequest, RequestError, parse_request

V, BLOCK = 13, 10


def _model(**kw):
    na.manual_seed(1)
    model = nn.GPT(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=8, **kw).double()
    rng = np.random.default_rng(1)
    for p in model.parameters():   # logits far apart: no argmax near-ties
        p.data = rng.standard_normal(p.data.shape) * 0.5
    return model


MODEL = _model()


def _alone(request: GenerationRequest) -> list:
    """The request served alone: full forward over its prefix each step, its own generator."""
    seq, gen, out = np.array([request.prompt]), np.random.default_rng(request.seed), []
    with na.no_grad():
        for _ in range(request.max_new_tokens):
            last = MODEL(seq).data[:, -1]
            if request.sampling:
                token = int(_next_token(last, True, request.temperature, request.top_k, request.top_p, gen, np)[0])
            else:
                token = int(last.argmax())
            out.append(token)
            seq = np.concatenate([seq, [[token]]], axis=1)
    return out


@st.composite
def _requests(draw):
    n = draw(st.integers(1, 5))
    specs = []
    for _ in range(n):
        length = draw(st.integers(1, BLOCK - 1))
        new = draw(st.integers(1, BLOCK - length))
        at = draw(st.integers(0, 4))
        sampling = draw(st.booleans())
        req = GenerationRequest(prompt=draw(st.lists(st.integers(0, V - 1), min_size=length, max_size=length)),
                                max_new_tokens=new)
        if sampling:
            req.temperature = draw(st.floats(0.3, 2.0))
            req.top_k = draw(st.one_of(st.none(), st.integers(1, V)))
            req.top_p = draw(st.one_of(st.none(), st.floats(0.1, 1.0)))
            req.seed = draw(st.integers(0, 2 ** 16))
        cancel_after = draw(st.one_of(st.none(), st.integers(0, 3)))   # the client goes away after k tokens
        specs.append((at, req, cancel_after))
    return specs


def _serve(specs, max_batch, max_prefill_tokens):
    batcher, engine = ContinuousBatcher(max_batch, max_prefill_tokens), DecodeEngine(MODEL)
    actives, batch_sizes = {}, []
    for step in range(200):
        for i, (at, req, _) in enumerate(specs):
            if at == step:
                actives[i] = batcher.submit(req)
        for i, (_, _, cancel_after) in enumerate(specs):
            a = actives.get(i)
            if a is not None and cancel_after is not None and len(a.tokens) >= cancel_after and not a.done:
                batcher.cancel(a)
        plan = batcher.next_plan(wait_s=0)
        batch_sizes.append(len(plan.decode))
        batcher.deliver(plan, engine.step(plan, batcher.sample_token))
        if step > 4 and not any(batcher.counts()[k] for k in ("running", "waiting")):
            break
    plan = batcher.next_plan(wait_s=0)              # the last leaves reach the engine too
    engine.step(plan, batcher.sample_token)
    assert engine.caches == {} and engine.last == {}, "a finished or cancelled request kept its cache"
    return actives, batch_sizes


@settings(max_examples=15)
@given(_requests(), st.integers(1, 3), st.sampled_from([None, BLOCK, 2 * BLOCK]))
@example([(0, GenerationRequest(prompt=[1, 2, 3, 4, 5, 6, 7, 8, 9], max_new_tokens=1), None),     # a full block
          (0, GenerationRequest(prompt=[4], max_new_tokens=9), None),
          (1, GenerationRequest(prompt=[5, 6], max_new_tokens=8, temperature=0.7, top_k=3, seed=5), None),
          (2, GenerationRequest(prompt=[7, 8, 9], max_new_tokens=4, temperature=1.3, top_p=0.6, seed=9), 1)],
         3, BLOCK)
def test_each_request_gets_its_tokens_alone_whatever_it_is_batched_with(specs, max_batch, budget):
    actives, batch_sizes = _serve(specs, max_batch, budget)
    assert max(batch_sizes) <= max_batch
    for i, (_, req, cancel_after) in enumerate(specs):
        a, want = actives[i], _alone(req)
        if cancel_after is None or cancel_after >= req.max_new_tokens:
            assert a.tokens == want, f"request {i}"
            assert a.finished_at is not None and a.events.qsize() == len(want) + 1    # the tokens, then done
        else:   # cancelled: what it got before is its own prefix, and it got no more than a step's worth
            assert a.tokens == want[:len(a.tokens)] and a.finished_at is None, f"request {i}"


def test_requests_of_different_lengths_share_steps_and_finish_apart():
    specs = [(0, GenerationRequest(prompt=[1, 2, 3], max_new_tokens=7), None),
             (0, GenerationRequest(prompt=[9], max_new_tokens=3), None),
             (1, GenerationRequest(prompt=[4, 4, 4, 4, 4, 4], max_new_tokens=4, temperature=0.9, seed=3), None)]
    actives, batch_sizes = _serve(specs, 3, None)
    assert max(batch_sizes) == 3
    a, b, c = (actives[i] for i in range(3))
    assert b.last_step < c.last_step < a.last_step and a.first_step < c.first_step <= b.last_step
    for i, (_, req, _) in enumerate(specs):
        assert actives[i].tokens == _alone(req)


def test_a_request_longer_than_the_model_is_a_clear_error():
    with pytest.raises(RequestError, match="exceed the model's block_size 10"):
        parse_request(b'{"prompt": [1, 2, 3], "max_new_tokens": 8}', vocab_size=V, block_size=BLOCK)
    parse_request(b'{"prompt": [1, 2, 3], "max_new_tokens": 7}', vocab_size=V, block_size=BLOCK)
    for body in (b'{"prompt": [-1]}', b'{"prompt": [13]}', b'{"prompt": [1.0]}', b'{"prompt": []}',
                 b'{"prompt": [1], "max_new_tokens": 0}'):
        with pytest.raises(RequestError):
            parse_request(body, vocab_size=V, block_size=BLOCK)
    for body in (b'{"prompt": [1], "max_new_tokens": 2, "temperature": Infinity, "top_k": 1}',
                 b'{"prompt": [1], "max_new_tokens": 2, "temperature": 1e999}'):
        with pytest.raises(RequestError, match="finite number >= 0"):   # found: inf made top_k keep every token
            parse_request(body, vocab_size=V, block_size=BLOCK)
    engine = DecodeEngine(MODEL)
    with pytest.raises(ValueError, match="block_size"):      # past the cache: the engine refuses, no garbage
        engine.step(StepPlan(STEP, 0, joins=[(0, False, list(range(BLOCK + 1)))]))
    engine.step(StepPlan(STEP, 0, joins=[(1, False, [1] * BLOCK)]))   # a full block: its one token
    with pytest.raises(ValueError, match="block_size"):
        engine.step(StepPlan(STEP, 1, decode=[(1, False)]))


def test_a_capacity_limited_moe_model_is_refused():
    with pytest.raises(ValueError, match="capacity_factor"):
        DecodeEngine(_model(moe_num_experts=2, moe_kwargs={"top_k": 1, "capacity_factor": 1.0}))
    DecodeEngine(_model(moe_num_experts=2, moe_kwargs={"top_k": 1}))   # no capacity: nothing dropped, served
