"""Pipeline schedules as data, tested without processes: every schedule is deadlock-free under a
FIFO-channel simulation, each micro-batch's forward precedes its backward on every stage, 1F1B
holds at most ``p - r`` activations on rank r, and the simulated bubble equals the formulas."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neural_arch.distributed.pipelining import (
    Action,
    DeadlockError,
    PipelinePlan,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    format_actions,
    format_schedule,
    gpipe_plan,
    interleaved_1f1b_plan,
    one_f_one_b_plan,
    simulate,
    theoretical_bubble,
)
from neural_arch.distributed.pipelining.schedules import B, F, with_communication

ps = st.integers(1, 6)
ms = st.integers(1, 12)
times = st.sampled_from([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)])


def _all_plans(p, m):
    yield gpipe_plan(p, m)
    yield one_f_one_b_plan(p, m)
    for v in (1, 2, 3):
        if m % p == 0:
            yield interleaved_1f1b_plan(p, m, v)


def _check_complete(plan: PipelinePlan):
    """Every (stage, micro-batch) has exactly one F and one B, on the stage's rank, F before B."""
    seen = {}
    for r in range(plan.num_ranks):
        for i, a in enumerate(plan.compute(r)):
            assert plan.stage_rank(a.stage) == r
            seen.setdefault((a.kind, a.microbatch, a.stage), []).append(i)
    for s in range(plan.num_stages):
        for mb in range(plan.n_microbatches):
            assert len(seen[(F, mb, s)]) == 1 and len(seen[(B, mb, s)]) == 1
            assert seen[(F, mb, s)][0] < seen[(B, mb, s)][0]
    assert len(seen) == 2 * plan.num_stages * plan.n_microbatches


@given(p=ps, m=ms, fb=times)
def test_every_schedule_is_deadlock_free_and_complete(p, m, fb):
    for plan in _all_plans(p, m):
        _check_complete(plan)
        sim = simulate(plan, *fb)  # raises DeadlockError on a deadlock or an out-of-order channel
        assert len(sim.events) == 2 * plan.num_stages * m


@given(p=ps, m=ms, fb=times)
def test_bubble_fraction_matches_formula(p, m, fb):
    for plan in (gpipe_plan(p, m), one_f_one_b_plan(p, m)):
        assert simulate(plan, *fb).bubble_fraction == pytest.approx(theoretical_bubble(p, m), abs=1e-12)
    if m % p == 0:
        for v in (2, 3):
            sim = simulate(interleaved_1f1b_plan(p, m, v), *fb)
            assert sim.bubble_fraction == pytest.approx(theoretical_bubble(p, m, v), abs=1e-12)


@given(p=ps, m=ms)
def test_1f1b_bounds_activations_in_flight(p, m):
    most = simulate(one_f_one_b_plan(p, m)).max_in_flight
    for r in range(p):
        assert most[r] <= p - r
        assert most[r] == min(p - r, m)  # and uses the whole budget: it is not GPipe in disguise
    assert simulate(gpipe_plan(p, m)).max_in_flight == (m,) * p


def test_simulator_catches_a_deadlock():
    # rank 0 wants B0 before sending F1; rank 1 wants F1 before sending B0's gradient
    plan = with_communication("bad", [[Action(F, 0, 0), Action(B, 0, 0), Action(F, 1, 0), Action(B, 1, 0)],
                                      [Action(F, 0, 1), Action(F, 1, 1), Action(B, 0, 1), Action(B, 1, 1)]], 2, 2)
    with pytest.raises(DeadlockError, match="schedule deadlocks: rank 0 waits at RECV_B0@s0<-r1; "
                                            "rank 1 waits at RECV_F1@s1<-r0"):
        simulate(plan)


def test_simulator_catches_backward_before_forward():
    plan = with_communication("bad", [[Action(B, 0, 0), Action(F, 0, 0)]], 1, 1)
    with pytest.raises(DeadlockError, match="before F0@s0"):
        simulate(plan)


def test_simulator_catches_channel_misorder():
    # stage 1 consumes micro-batch 1 before 0, but stage 0 sends 0 first
    plan = with_communication("swap", [[Action(F, 0, 0), Action(F, 1, 0), Action(B, 0, 0), Action(B, 1, 0)],
                                       [Action(F, 1, 1), Action(F, 0, 1), Action(B, 0, 1), Action(B, 1, 1)]], 2, 2)
    with pytest.raises(DeadlockError, match="disagree about the order"):
        simulate(plan)


def test_1f1b_order_and_timeline():
    plan = one_f_one_b_plan(2, 3)
    assert [str(a) for a in plan.compute(0)] == ["F0@s0", "F1@s0", "B0@s0", "F2@s0", "B1@s0", "B2@s0"]
    assert format_schedule(plan).splitlines()[1:] == [
        "rank 0 | F0 F1 .. B0 F2 B1 .. B2",
        "rank 1 | .. F0 B0 F1 B1 F2 B2 ..",
    ]
    text = format_actions(plan)
    assert "RECV_F0@s1<-r0" in text and "SEND_B0@s1->r0" in text


def test_interleaved_places_stages_round_robin():
    plan = interleaved_1f1b_plan(2, 4, 2)
    assert {a.stage for a in plan.compute(0)} == {0, 2}
    assert {a.stage for a in plan.compute(1)} == {1, 3}
    # the last stage (3) lives on rank 1 and sends its input gradient back to rank 0 (stage 2)
    assert Action("SEND_B", 0, 3, 0) in plan.for_rank(1)


def test_consecutive_stages_on_one_rank_hand_over_locally():
    # one rank, two chunks: stage 0 -> stage 1 never leaves the rank (no SEND/RECV to itself)
    plan = interleaved_1f1b_plan(1, 2, 2)
    assert plan.for_rank(0) == tuple(plan.compute(0))
    assert len(simulate(plan).events) == 8


def test_schedule_classes_build_plans():
    assert ScheduleGPipe(4).plan(2) == gpipe_plan(2, 4)
    assert Schedule1F1B(4).plan(3) == one_f_one_b_plan(3, 4)
    assert ScheduleInterleaved1F1B(4, 2).plan(2) == interleaved_1f1b_plan(2, 4, 2)
    assert "rank 1" in ScheduleInterleaved1F1B(4, 2).format(2)
    with pytest.raises(RuntimeError, match="bind it to"):
        Schedule1F1B(4).step()


@pytest.mark.parametrize("call, match", [
    (lambda: gpipe_plan(0, 4), "num_stages"),
    (lambda: one_f_one_b_plan(2, 0), "n_microbatches"),
    (lambda: interleaved_1f1b_plan(2, 3, 2), "multiple of the number of pipeline ranks"),
    (lambda: ScheduleGPipe(-1), "n_microbatches"),
    (lambda: ScheduleInterleaved1F1B(4, 0), "virtual_stages"),
])
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises(ValueError, match=match):
        call()
