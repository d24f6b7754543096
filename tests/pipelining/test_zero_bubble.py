"""Zero-bubble (ZB-H1): the plan as data, the split backward, and equality with 1F1B and with
single-process training.

* plan: deadlock-free in the simulator, F < B < W per micro-batch and stage, bubble below 1F1B's
  at every (p, m) and equal to ``(p-1)/(3m+p-1)`` for m >= p (unit F, B, W), and the job's peak
  of micro-batches alive (F to W) equal to 1F1B's (p, on rank 0);
* split backward (no processes): deferring Linear weight gradients to ``W`` gives bitwise the
  gradients of the fused backward, MLP and GPT, over several micro-batches;
* real ranks (gloo, 2 and 4 stages): ZB-H1 equals single-process training (float64 <= 1e-10) and
  equals 1F1B bitwise, with the weight gradients really deferred.
"""

import numpy as np
import pp_rank_fns as fns
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import assert_split_backward_order

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.pipelining.schedules import (
    B,
    DeadlockError,
    W,
    format_schedule,
    one_f_one_b_plan,
    simulate,
    theoretical_bubble,
)
from neural_arch.distributed.pipelining.weight_grad import WeightGradStash, defer_linear_weight_grads
from neural_arch.distributed.pipelining.zero_bubble import zero_bubble_plan, zero_bubble_theory
from neural_arch.distributed.testing import RankPool
from neural_arch.nn.linear import Linear


@settings(deadline=None, max_examples=40)
@given(p=st.integers(1, 5), m=st.integers(1, 16))
def test_zbh1_plan_is_valid_and_beats_1f1b(p, m):
    plan = zero_bubble_plan(p, m)
    sim = simulate(plan, 1.0, 1.0, w_time=1.0)   # raises DeadlockError on any ordering bug
    base = simulate(one_f_one_b_plan(p, m), 1.0, 1.0, w_time=1.0)
    assert_split_backward_order(plan)   # one stage per rank: W accumulates like 1F1B's B
    assert max(sim.max_in_flight) == max(base.max_in_flight) == min(p, m)
    if p > 1:
        assert sim.bubble_fraction < base.bubble_fraction
        assert base.bubble_fraction == pytest.approx(theoretical_bubble(p, m))
    if m >= p:
        assert sim.bubble_fraction == pytest.approx(zero_bubble_theory(p, m))


def test_zbh1_time_line_prints():
    text = format_schedule(zero_bubble_plan(4, 8))
    lines = text.splitlines()
    assert lines[0] == "ZB-H1 (ranks=4, microbatches=8)"
    assert lines[1].startswith("rank 0 | F0 F1 F2 F3 .. .. .. B0 W0 F4 B1 W1")
    assert lines[4].startswith("rank 3 | .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 W0")


def test_simulator_rejects_w_before_b():
    plan = zero_bubble_plan(2, 2)
    acts = list(plan.by_rank[1])
    i_b, i_w = next(i for i, a in enumerate(acts) if a.kind == B), next(i for i, a in enumerate(acts) if a.kind == W)
    acts[i_b], acts[i_w] = acts[i_w], acts[i_b]
    bad = type(plan)(plan.name, plan.num_ranks, plan.n_microbatches, 1, (plan.by_rank[0], tuple(acts)))
    with pytest.raises(DeadlockError, match="before B0"):
        simulate(bad, w_time=1.0)


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_split_backward_is_bitwise_the_fused_backward(kind):
    fused, split = fns.build_model(kind, layers=3), fns.build_model(kind, layers=3)
    lf = fns.loss_fn(kind)
    X, y = fns.make_batch(kind, 8, 0)
    stashes = []
    for i in range(4):
        xs, ys = X[2 * i:2 * i + 2], y[2 * i:2 * i + 2]
        lf(fused(Tensor(xs)), ys).backward(np.asarray(0.25))
        stash = WeightGradStash()
        with defer_linear_weight_grads(split, stash):
            loss = lf(split(Tensor(xs)), ys)
        assert len(stash) > 0
        loss.backward(np.asarray(0.25))
        stashes.append(stash)
    linears = [m for m in split.modules() if isinstance(m, Linear)]
    assert linears and all(m.weight.grad is None for m in linears), "B must leave Linear weights alone"
    for stash in stashes:
        stash.apply()
    for (name, p), (_, q) in zip(fused.named_parameters(), split.named_parameters()):
        assert np.array_equal(p.grad.data, q.grad.data), name
    assert all("forward" not in vars(m) for m in linears), "the deferral must be undone after the forward"


def test_w_before_b_is_a_clear_error():
    model = fns.build_model("mlp", layers=2)
    stash = WeightGradStash()
    with defer_linear_weight_grads(model, stash):
        model(Tensor(np.ones((2, 6))))
    with pytest.raises(RuntimeError, match="W before its B"):
        stash.apply()


@pytest.fixture(scope="module", params=[2, 4], ids=["gloo-2", "gloo-4"])
def pool(request):
    with RankPool(request.param, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_zbh1_matches_single_process(pool, kind):
    world = pool.world_size
    cfg = {"kind": kind, "pp": world, "m": 2 * world, "schedule": "zbh1",
           "opt": "adam" if kind == "gpt" else "sgd", "steps": 3}
    for rank, r in enumerate(pool.run(fns.train_run, cfg)):
        assert r["moved"] > 1e-3
        for what in ("grad", "param", "loss"):
            assert r[what] <= 1e-10, f"rank {rank} {cfg}: {what} differs by {r[what]:g}"


@pytest.mark.timeout(240)
def test_zbh1_is_bitwise_1f1b(pool):
    results = pool.run(fns.zb_vs_1f1b_run, "gpt", 2 * pool.world_size)
    for rank, r in enumerate(results):
        assert r["bitwise"], f"rank {rank}: ZB-H1 and 1F1B gradients/parameters differ"
        assert r["deferred"], f"rank {rank}: the first W found Linear weight gradients already computed"
