"""Pipeline-parallel generation: the decode schedule as data (simulated: no deadlock, the makespan the
module docstring states, stages overlapping once requests >= stages), and on real ranks (gloo with 3
stages, so a middle stage too; mpi with 2) every request's tokens equal ``GPT.generate``'s on one process
(float64, greedy and sampled with the request's own generator)."""

import doctest

import pp_generation_rank_fns as fns
import pytest

from neural_arch.distributed.pipelining import generation
from neural_arch.distributed.pipelining.generation import (
    FORWARD,
    SEND_LEAVE,
    decode_makespan,
    decode_plan,
    format_decode_timeline,
    simulate_decode,
)
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("p,m,n", [(1, 1, 3), (2, 1, 4), (2, 2, 3), (3, 2, 4), (3, 5, 3), (4, 4, 6), (4, 7, 2)])
def test_schedule_simulates_without_deadlock_in_the_stated_time(p, m, n):
    plan = decode_plan(p, m, n)
    events = simulate_decode(plan)
    assert len(events) == p * m * n
    assert max(e.end for e in events) == decode_makespan(p, m, n)
    for k in range(p):  # every stage goes round the requests in the same order: step, then request
        order = [(e.step, e.request) for e in events if e.stage == k]
        assert order == sorted(order)
        assert [(a.step, a.request) for a in plan[k] if a.kind == FORWARD] == order


@pytest.mark.parametrize("p,steps,n", [(1, [2, 4], 4), (2, [1, 3], 3), (3, [2, 5, 1, 5], 5), (4, [3, 1, 6, 2, 6], 6)])
def test_a_request_that_ends_leaves_the_schedule(p, steps, n):
    """Each request runs its own number of steps on every stage, nothing deadlocks, and the news of its
    end reaches every stage (the token's flag to the first, a leave to each middle one)."""
    plan = decode_plan(p, len(steps), n, request_steps=steps)
    events = simulate_decode(plan)
    for k in range(p):
        assert sorted((e.request, e.step) for e in events if e.stage == k) == sorted(
            (r, s) for r, length in enumerate(steps) for s in range(length))
        leaves = sorted((a.request, a.step) for a in plan[k] if a.kind == SEND_LEAVE)
        # stages 0 .. p-3 pass the news on; the last decided it and the one before it need not tell it
        want = [(r, length) for r, length in enumerate(steps) if length < n] if k < p - 2 else []
        assert leaves == want, k
    assert max(e.end for e in events) <= decode_makespan(p, len(steps), n)
    # requests that all end at step L cost what n_steps = L costs
    for length in range(1, n + 1):
        short = simulate_decode(decode_plan(p, len(steps), n, request_steps=[length] * len(steps)))
        assert max(e.end for e in short) == decode_makespan(p, len(steps), length)
    with pytest.raises(ValueError, match="request_steps"):
        decode_plan(p, len(steps), n, request_steps=[n + 1] * len(steps))


def test_enough_requests_fill_the_pipeline():
    p, n = 4, 8
    one = simulate_decode(decode_plan(p, 1, n))
    full = simulate_decode(decode_plan(p, p, n))
    # one request keeps one stage busy at a time; p requests keep all of them busy but for fill and drain
    assert max(e.end for e in one) == n * p
    assert max(e.end for e in full) == n * p + p - 1
    busy = {k: sorted(e.start for e in full if e.stage == k) for k in range(p)}
    for k in range(p):
        assert busy[k] == [float(k + i) for i in range(n * p)]  # no gap once stage k has started
    text = format_decode_timeline(full, p, title="decode, 4 stages, 4 requests")
    assert text.splitlines()[1].startswith("stage 0 | 0.0 1.0 2.0 3.0 0.1")


def test_docstring_examples():
    assert doctest.testmod(generation, verbose=False).failed == 0


# the rank pools' tests come last: the mpi pool then closes at the module's end, where the leak check
# removes the shared-memory segments MPICH leaves (tests/leak_check.py)
@pytest.fixture(scope="module", params=[
    pytest.param(("gloo", 3), id="gloo-3"),
    pytest.param(("mpi", 2), id="mpi-2", marks=pytest.mark.mpi),
])
def pool(request):
    backend, n = request.param
    with RankPool(n, backend=backend, timeout=120.0) as p:
        yield p


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_tokens_equal_single_process_generate(pool, do_sample):
    results = pool.run(fns.pipeline_generate_run, do_sample)
    bounds = [out["blocks"] for out in results]
    assert bounds[0][0] == 0 and bounds[-1][1] == fns.SHAPE["n_layer"]
    for rank, out in enumerate(results):
        assert out["got"] == out["want"], f"rank {rank}"
        # each stage caches its own blocks only, every position but the last token's (never fed back)
        assert out["cache_layers"] == [bounds[rank][1] - bounds[rank][0]] * len(out["got"])
        assert out["cached"] == [t + 5 - 1 for t in out["prompt_lengths"]]


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_requests_stop_at_eos_like_single_process_generate(pool, do_sample):
    """Requests leave the running pipeline at their end token; tokens equal ``GPT.generate`` with
    ``eos_token_id``, and every stage ran exactly the plan of those lengths."""
    results = pool.run(fns.pipeline_generate_eos_run, do_sample)
    lengths = results[0]["new_tokens"]
    assert min(lengths) < 6, lengths      # some request did end early
    for out in results:
        assert out["got"] == out["want"], f"stage {out['stage']}"
        assert out["new_tokens"] == lengths
        plan = decode_plan(out["stages"], len(lengths), 6, request_steps=lengths)[out["stage"]]
        assert out["actions"] == [str(a) for a in plan], f"stage {out['stage']}"
