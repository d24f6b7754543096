"""ZB-V (torch's ``ScheduleZBVZeroBubble``) as data, tested without processes.

* the V placement: rank r holds stages r and 2p-1-r; no message between stages p-1 and p;
* the plan: deadlock-free in the simulator, F < B < W per micro-batch and stage, each kind in
  micro-batch order per stage, at most 2p stage micro-batches alive per rank (1F1B's peak
  activation memory: a stage is half a 1F1B stage), and a bubble below ZB-H1's and 1F1B's
  that equals ``(p-1)/(6m+p-1)`` for m >= p (unit F, B, W; total work equal across schedules);
* plans built for unequal F, B, W costs: still valid, within the bound, below ZB-H1's bubble.

Equality with single-process training on real ranks, bitwise equality with interleaved 1F1B and
the placement errors of the schedule class are in test_pipeline_equivalence.py (its rank pools).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import assert_split_backward_order

from neural_arch.distributed.pipelining import ScheduleZBVZeroBubble, stage_indices
from neural_arch.distributed.pipelining.schedules import (
    COMM,
    DeadlockError,
    format_schedule,
    generate_stage_to_rank_mapping,
    one_f_one_b_plan,
    simulate,
    stage_to_rank,
    theoretical_bubble,
    with_communication,
)
from neural_arch.distributed.pipelining.zero_bubble import zero_bubble_plan, zero_bubble_theory
from neural_arch.distributed.pipelining.zero_bubble_v import zero_bubble_v_plan, zero_bubble_v_theory


@settings(deadline=None, max_examples=40)
@given(p=st.integers(1, 5), m=st.integers(1, 16))
def test_zbv_plan_is_valid_and_beats_zbh1(p, m):
    plan = zero_bubble_v_plan(p, m)
    assert plan.placement == "v" and plan.num_stages == 2 * p
    sim = simulate(plan, 1.0, 1.0, w_time=1.0)   # raises DeadlockError on any ordering bug
    assert_split_backward_order(plan)
    for r in range(p):
        comp = plan.compute(r)
        assert {a.stage for a in comp} == set(stage_indices(r, p, 2, style="v")) == {r, 2 * p - 1 - r}
        for a in plan.for_rank(r):  # every message crosses ranks; stages p-1 and p hand over locally
            if a.kind in COMM:
                assert a.peer != r and plan.stage_rank(a.stage) == r
                assert {a.stage, a.stage + (1 if a.kind in ("SEND_F", "RECV_B") else -1)} != {p - 1, p}
    # memory: 2p half-size stage micro-batches = 1F1B's p full ones (and no more than it needs)
    zbh1 = simulate(zero_bubble_plan(p, m), 1.0, 1.0, w_time=1.0)
    fused = simulate(one_f_one_b_plan(p, m), 1.0, 1.0, w_time=1.0)
    assert max(sim.max_in_flight) <= 2 * p
    assert max(sim.max_in_flight) == 2 * max(fused.max_in_flight) == 2 * min(p, m)
    if p > 1:
        assert sim.bubble_fraction < zbh1.bubble_fraction < fused.bubble_fraction
        assert fused.bubble_fraction == pytest.approx(theoretical_bubble(p, m))
    if m >= p:
        assert sim.bubble_fraction == pytest.approx(zero_bubble_v_theory(p, m), abs=1e-12)
        assert zbh1.bubble_fraction == pytest.approx(zero_bubble_theory(p, m), abs=1e-12)
    else:  # the ramps cannot overlap: never better than the formula
        assert sim.bubble_fraction >= zero_bubble_v_theory(p, m) - 1e-12


@settings(deadline=None, max_examples=25)
@given(p=st.integers(2, 5), m=st.integers(1, 16),
       costs=st.sampled_from([(2, 1, 1), (3, 2, 2), (1, 2, 1), (1, 1, 2), (3, 1, 1)]))
def test_zbv_plan_for_unequal_costs_beats_zbh1(p, m, costs):
    plan = zero_bubble_v_plan(p, m, costs)
    sim = simulate(plan, *costs[:2], w_time=costs[2])  # deadlock-free at the costs it was built for
    assert max(sim.max_in_flight) <= 2 * p
    assert sim.bubble_fraction < simulate(zero_bubble_plan(p, m), *costs[:2], w_time=costs[2]).bubble_fraction
    if costs == (2, 1, 1) and m >= 8:  # why costs exist: the unit-cost order keeps a steady-state bubble
        unit = simulate(zero_bubble_v_plan(p, m), *costs[:2], w_time=costs[2])
        assert unit.bubble_fraction > sim.bubble_fraction * 1.5


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_zbv_idle_is_half_of_zbh1_at_equal_work(p, m):
    # idle time per rank (makespan minus busy time): ZB-V waits r + (p-1-r) half-stage steps,
    # ZB-H1 p-1 full-stage steps
    v, h = simulate(zero_bubble_v_plan(p, m), w_time=1.0), simulate(zero_bubble_plan(p, m), w_time=1.0)
    work = 3.0 * m  # F + B + W of m micro-batches through one full stage's layers
    assert v.makespan - work == pytest.approx((p - 1) / 2)
    assert h.makespan - work == pytest.approx(p - 1)


def test_v_placement():
    assert generate_stage_to_rank_mapping(3, 6, style="v") == {0: 0, 1: 1, 2: 2, 3: 2, 4: 1, 5: 0}
    assert generate_stage_to_rank_mapping(3, 6) == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1, 5: 2}
    assert [stage_indices(r, 3, 2, style="v") for r in range(3)] == [[0, 5], [1, 4], [2, 3]]
    plan = zero_bubble_v_plan(3, 3)
    assert [plan.stage_rank(s) for s in range(6)] == [0, 1, 2, 2, 1, 0]
    # the loss (last stage) lives on rank 0, next to the first stage
    assert {a.stage for a in plan.compute(0)} == {0, 5}


def test_zbv_time_line_prints():
    lines = format_schedule(zero_bubble_v_plan(4, 8)).splitlines()
    assert lines[0] == "ZB-V (ranks=4, microbatches=8, virtual_stages=2)"
    # rank 0 warms up on chunk 0 (a) until the first micro-batch comes back to its last stage (b)
    assert lines[1].startswith("rank 0 | F0a F1a F2a F3a F4a F5a F6a F0b B0b W0b")
    assert lines[4].startswith("rank 3 | ... ... ... F0a F0b")  # stages 3 and 4: local hand-off


def test_simulator_rejects_a_local_hand_off_out_of_order():
    # p=1, stages 0 and 1 on rank 0: F of stage 1 before F of stage 0 takes an output that does not exist
    plan = with_communication("bad", [[a for a in zero_bubble_v_plan(1, 1).compute(0)]], 1, 1, 2, "v")
    acts = list(plan.by_rank[0])
    acts[0], acts[1] = acts[1], acts[0]
    bad = type(plan)(plan.name, 1, 1, 2, (tuple(acts),), "v")
    with pytest.raises(DeadlockError, match=r"F0@s1 runs before F0@s0, whose output it takes over"):
        simulate(bad, w_time=1.0)


def test_schedule_class_builds_the_plan():
    assert ScheduleZBVZeroBubble(6).plan(3) == zero_bubble_v_plan(3, 6)
    assert ScheduleZBVZeroBubble(6, costs=(2, 1, 1)).plan(3) == zero_bubble_v_plan(3, 6, (2, 1, 1))
    assert "rank 2" in ScheduleZBVZeroBubble(6).format(3)


@pytest.mark.parametrize("call, match", [
    (lambda: zero_bubble_v_plan(0, 4), "num_stages"),
    (lambda: zero_bubble_v_plan(2, 0), "n_microbatches"),
    (lambda: ScheduleZBVZeroBubble(0), "n_microbatches"),
    (lambda: zero_bubble_v_plan(2, 4, (2, 1)), "costs"),
    (lambda: ScheduleZBVZeroBubble(4, costs=(1.5, 1, 1)), "3 positive ints"),
    (lambda: stage_indices(0, 2, 3, style="v"), "virtual_stages=2"),
    (lambda: stage_indices(0, 2, 2, style="zigzag"), "style"),
    (lambda: stage_to_rank(0, 2, 6, "v"), "num_stages=4"),
    (lambda: stage_to_rank(0, 2, 4, "zigzag"), "style"),
])
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises(ValueError, match=match):
        call()
