"""Checks every split-backward (zero-bubble) plan must pass, shared by the ZB-H1, ZB-V and
interleaved zero-bubble tests."""

from __future__ import annotations

from neural_arch.distributed.pipelining.schedules import B, F, PipelinePlan, W


def assert_split_backward_order(plan: PipelinePlan) -> None:
    """On every rank, for every stage it runs: each micro-batch's F, B and W exactly once, F before
    B before W, and each kind in micro-batch order (FIFO lanes and gradient accumulation need it);
    every stage runs on the rank its placement names."""
    m = plan.n_microbatches
    for r in range(plan.num_ranks):
        comp = plan.compute(r)
        for s in sorted({a.stage for a in comp}):
            assert plan.stage_rank(s) == r, (s, r)
            mine = [a for a in comp if a.stage == s]
            assert sorted((a.kind, a.microbatch) for a in mine) == sorted((k, i) for k in (F, B, W) for i in range(m))
            order = {(a.kind, a.microbatch): i for i, a in enumerate(mine)}
            assert all(order[(F, i)] < order[(B, i)] < order[(W, i)] for i in range(m))
            for kind in (F, B, W):
                assert [a.microbatch for a in mine if a.kind == kind] == list(range(m))
