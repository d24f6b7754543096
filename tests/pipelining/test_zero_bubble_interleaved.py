"""Interleaved zero bubble (torch's ``ScheduleInterleavedZeroBubble``) as data, tested without processes.

* the plan, for every p in 1..4, v in 2..3, m in 1..16 (all 128 cases, a few ms each): deadlock-free
  in the simulator, loop placement, F < B < W per micro-batch and stage, each kind in micro-batch
  order per stage, at most ``v p + p - 1`` stage micro-batches alive per rank (interleaved 1F1B's
  peak, and never above what interleaved 1F1B holds for the same m), a bubble below ZB-H1's and
  below interleaved 1F1B's (where it exists: m a multiple of p) at equal work;
* plans built for unequal costs: valid at those costs, within the bound;
* the shared list scheduler (``zero_bubble.list_schedule``) refuses a policy that breaks a
  dependency, and the builders' bad arguments name themselves.

Equality with single-process training on real gloo ranks (p = 2 and 4, v = 2, m = 3 included)
and bitwise equality with interleaved 1F1B are in test_pipeline_equivalence.py (its rank pools).
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import assert_split_backward_order

from neural_arch.distributed.pipelining import ScheduleInterleavedZeroBubble, stage_indices
from neural_arch.distributed.pipelining.schedules import (
    COMM,
    B,
    interleaved_1f1b_plan,
    simulate,
    theoretical_bubble,
)
from neural_arch.distributed.pipelining.zero_bubble import list_schedule, zero_bubble_plan
from neural_arch.distributed.pipelining.zero_bubble_interleaved import (
    interleaved_zero_bubble_memory_bound,
    interleaved_zero_bubble_plan,
    interleaved_zero_bubble_theory,
)


@pytest.mark.parametrize("p, v", list(itertools.product(range(1, 5), (2, 3))))
def test_izb_plan_is_valid_and_beats_interleaved_and_zbh1(p, v):
    for m in range(1, 17):
        plan = interleaved_zero_bubble_plan(p, m, v)
        assert plan.placement == "loop" and plan.num_stages == p * v
        sim = simulate(plan, 1.0, 1.0, w_time=1.0)   # raises DeadlockError on any ordering bug
        assert_split_backward_order(plan)
        for r in range(p):
            comp = plan.compute(r)
            assert {a.stage for a in comp} == set(stage_indices(r, p, v)) == {c * p + r for c in range(v)}
            for a in plan.for_rank(r):  # messages only between ranks; p = 1 hands everything over locally
                assert a.kind not in COMM or (a.peer != r and plan.stage_rank(a.stage) == r)
        bound = interleaved_zero_bubble_memory_bound(p, v)
        assert max(sim.max_in_flight) <= min(bound, v * m)
        zbh1 = simulate(zero_bubble_plan(p, m), 1.0, 1.0, w_time=1.0)
        if p > 1:
            assert sim.bubble_fraction < zbh1.bubble_fraction, (m, sim.bubble_fraction, zbh1.bubble_fraction)
        if m % p == 0:  # interleaved 1F1B exists: same stages, B and W fused (cost 2), same total work
            inter = simulate(interleaved_1f1b_plan(p, m, v), 1.0, 1.0, w_time=1.0)
            assert inter.bubble_fraction == pytest.approx(theoretical_bubble(p, m, v))
            assert max(sim.max_in_flight) <= max(inter.max_in_flight) == min(bound, v * m)
            if p > 1:
                assert sim.bubble_fraction < inter.bubble_fraction
            # where interleaved 1F1B runs, the only idle time left is the two ramps
            assert sim.bubble_fraction == pytest.approx(interleaved_zero_bubble_theory(p, m, v), abs=1e-12)
        # the ramps are idle time no order can fill: never better than the formula
        assert sim.bubble_fraction >= interleaved_zero_bubble_theory(p, m, v) - 1e-12


@settings(deadline=None, max_examples=25)
@given(p=st.integers(2, 4), v=st.integers(2, 3), m=st.integers(1, 12),
       costs=st.sampled_from([(2, 1, 1), (3, 2, 2), (1, 2, 1), (1, 1, 2), (1, 10, 1)]))
def test_izb_plan_for_unequal_costs(p, v, m, costs):
    plan = interleaved_zero_bubble_plan(p, m, v, costs)
    sim = simulate(plan, *costs[:2], w_time=costs[2])  # deadlock-free at the costs it was built for
    assert max(sim.max_in_flight) <= interleaved_zero_bubble_memory_bound(p, v)
    simulate(plan, w_time=1.0)                          # and at any other: the plan is an order
    assert plan.name == f"InterleavedZB(costs={costs})"


def test_schedule_class_builds_the_plan():
    assert ScheduleInterleavedZeroBubble(6, 2).plan(3) == interleaved_zero_bubble_plan(3, 6, 2)
    assert ScheduleInterleavedZeroBubble(5, 3, costs=(2, 1, 1)).plan(2) == interleaved_zero_bubble_plan(2, 5, 3,
                                                                                                    (2, 1, 1))
    text = ScheduleInterleavedZeroBubble(4, 2).format(2)
    assert text.splitlines()[0] == "InterleavedZB (ranks=2, microbatches=4, virtual_stages=2)"
    assert text.splitlines()[1].startswith("rank 0 | F0a F1a F0b")  # chunk b (stage 2) as soon as it can


def test_list_schedule_refuses_a_policy_that_breaks_a_dependency():
    with pytest.raises(RuntimeError, match="chose B on chunk 0 of rank 0, which cannot run now"):
        list_schedule("bad", [(0,)], 1, (1, 1, 1), lambda view: (B, 0), 1, "loop")
    with pytest.raises(RuntimeError, match="stopped making progress"):
        list_schedule("idle", [(0,)], 1, (1, 1, 1), lambda view: None, 1, "loop")


@pytest.mark.parametrize("call, match", [
    (lambda: interleaved_zero_bubble_plan(0, 4, 2), "num_stages"),
    (lambda: interleaved_zero_bubble_plan(2, 0, 2), "n_microbatches"),
    (lambda: interleaved_zero_bubble_plan(2, 4, 0), "virtual_stages"),
    (lambda: interleaved_zero_bubble_plan(2, 4, 2, (1, 1)), "costs"),
    (lambda: ScheduleInterleavedZeroBubble(0, 2), "n_microbatches"),
    (lambda: ScheduleInterleavedZeroBubble(4, 0), "virtual_stages"),
    (lambda: ScheduleInterleavedZeroBubble(4, 2, costs=(1.5, 1, 1)), "3 positive ints"),
])
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises(ValueError, match=match):
        call()
