"""Continuous batching in one process (no sockets): requests that join and leave a running batch at
different steps, their caches left-padded into one decode batch, get ``GPT.generate``'s tokens alone;
the step plan survives its int64 encoding; the docstring examples of the serving modules run."""

import doctest
import importlib

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import manual_seed
from neural_arch.serve.batcher import STEP, ContinuousBatcher, StepPlan, plan_capacity
from neural_arch.serve.decode_step import DecodeEngine
from neural_arch.serve.protocol import GenerationRequest


def _model():
    manual_seed(3)
    return nn.GPT(vocab_size=31, block_size=24, n_layer=2, n_head=2, n_embd=16).double()


def test_requests_joining_and_leaving_get_the_tokens_they_get_alone():
    model, batcher = _model(), ContinuousBatcher(max_batch=3)
    engine = DecodeEngine(model)
    rng = np.random.default_rng(0)
    # (arrival step, prompt length, max_new_tokens): five requests, at most three in the batch
    specs = [(0, 5, 9), (0, 2, 3), (2, 7, 6), (3, 1, 8), (4, 4, 2)]
    prompts = [rng.integers(0, 31, size=n).tolist() for _, n, _ in specs]
    actives, sizes = {}, []
    for step in range(40):
        for i, (at, _, new) in enumerate(specs):
            if at == step:
                actives[i] = batcher.submit(GenerationRequest(prompt=prompts[i], max_new_tokens=new))
        plan = batcher.next_plan(wait_s=0)
        sizes.append(len(plan.decode))
        batcher.deliver(plan, engine.step(plan, batcher.sample_token))
    assert max(sizes) == 3 and batcher.counts() == {"running": 0, "waiting": 0, "steps": batcher.step_index}
    assert engine.caches == {}  # every finished request's cache was dropped
    for i, (_, _, new) in enumerate(specs):
        want = model.generate(np.array([prompts[i]]), new)[0, len(prompts[i]):].tolist()
        assert actives[i].tokens == want, f"request {i}"
    # request 2 arrived while 0 was decoding and was decoded in the same batch as 0
    assert actives[0].first_step < actives[2].first_step <= actives[0].last_step


def test_sampling_request_with_a_seed_draws_as_generate_does():
    model = _model()
    engine, batcher = DecodeEngine(model), ContinuousBatcher()
    prompt = [4, 5, 6]
    a = batcher.submit(GenerationRequest(prompt=prompt, max_new_tokens=6, temperature=0.8, top_k=9, top_p=0.9, seed=11))
    g = batcher.submit(GenerationRequest(prompt=[1, 2], max_new_tokens=6))
    while batcher.counts()["running"] or batcher.counts()["waiting"]:
        plan = batcher.next_plan(wait_s=0)
        batcher.deliver(plan, engine.step(plan, batcher.sample_token))
    want = model.generate(np.array([prompt]), 6, do_sample=True, temperature=0.8, top_k=9, top_p=0.9,
                          generator=np.random.default_rng(11))[0, 3:].tolist()
    assert a.tokens == want
    assert g.tokens == model.generate(np.array([[1, 2]]), 6)[0, 2:].tolist()


def test_a_cancelled_request_leaves_at_the_next_step_and_frees_its_place():
    """Running: the next plan drops it (leaves, no decode) and a waiting request takes its place in that
    same step; waiting: it never joins. The others still get ``GPT.generate``'s tokens."""
    model, batcher = _model(), ContinuousBatcher(max_batch=2)
    engine = DecodeEngine(model)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3]]
    a, b, c, d = (batcher.submit(GenerationRequest(prompt=q, max_new_tokens=6)) for q in prompts)
    for _ in range(2):   # a and b prefill, then decode once
        plan = batcher.next_plan(wait_s=0)
        batcher.deliver(plan, engine.step(plan, batcher.sample_token))
    batcher.cancel(a)
    batcher.cancel(d)     # still waiting
    plan = batcher.next_plan(wait_s=0)
    assert plan.leaves == [a.slot] and plan.decode == [(b.slot, False)] and [j[0] for j in plan.joins] == [c.slot]
    batcher.deliver(plan, engine.step(plan, batcher.sample_token))
    assert a.slot not in engine.caches and len(a.tokens) == 2 and batcher.cancelled == 2
    while batcher.counts()["running"] or batcher.counts()["waiting"]:
        plan = batcher.next_plan(wait_s=0)
        assert d.slot not in [j[0] for j in plan.joins]
        batcher.deliver(plan, engine.step(plan, batcher.sample_token))
    engine.step(batcher.next_plan(wait_s=0))      # the last finished request leaves
    assert d.tokens == [] and engine.caches == {}
    for r, q in ((b, prompts[1]), (c, prompts[2])):
        assert r.tokens == model.generate(np.array([q]), 6)[0, len(q):].tolist()


def test_the_prefill_budget_holds_joins_to_the_next_step_and_the_plan_fits_one_broadcast():
    batcher = ContinuousBatcher(max_batch=8, max_prefill_tokens=10)
    for n in (6, 4, 1, 9):
        batcher.submit(GenerationRequest(prompt=[1] * n, max_new_tokens=2))
    first, second = batcher.next_plan(wait_s=0), batcher.next_plan(wait_s=0)
    assert [len(j[2]) for j in first.joins] == [6, 4] and [len(j[2]) for j in second.joins] == [1, 9]
    # the largest plan: max_batch leaves and running requests, the budget's prompt tokens
    worst = StepPlan(STEP, 0, leaves=list(range(8)), joins=[(8, True, [1] * 10)], decode=[(i, True) for i in range(7)],
                     inputs=[3] * 7)
    assert worst.encode().size + 1 <= plan_capacity(8, 10)


def test_step_plan_round_trips_through_int64():
    plan = StepPlan(STEP, 12, leaves=[3, 4], joins=[(7, True, [1, 2, 3]), (8, False, [9])], decode=[(5, False)])
    assert StepPlan.decode_array(plan.encode()) == plan
    with_inputs = StepPlan(STEP, 13, joins=[(9, False, [4])], decode=[(5, False), (7, True)], inputs=[11, 2])
    assert StepPlan.decode_array(with_inputs.encode()) == with_inputs
    assert plan.encode().dtype == np.int64


@pytest.mark.parametrize("name", ["neural_arch.serve.protocol", "neural_arch.serve.batcher", "neural_arch.serve.decode_step",
                                  "neural_arch.serve.checkpoint", "neural_arch.serve.worker",
                                  "neural_arch.serve.pipeline_stage"])
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
