"""ZB-V, the V-shaped zero-bubble schedule of Qi et al. ("Zero Bubble Pipeline Parallelism",
2023, section 6), as data -- torch's ``ScheduleZBVZeroBubble``.

The model is cut into ``2p`` stages for ``p`` ranks and placed in a V: rank r holds stage ``r``
(chunk 0, on the way down) and stage ``2p-1-r`` (chunk 1, on the way back up). So rank 0 holds
both the first stage and the last one (the loss), and rank ``p-1`` holds stages ``p-1`` and
``p``, whose hand-off is local (no message). As in ZB-H1 (:mod:`.zero_bubble`) every backward is
split into ``B`` (input gradient, on the critical path) and ``W`` (weight gradient, deferred).

How the plan is built (a pure function of ``p``, ``m`` and the relative costs, default
F = B = W = 1 per stage): a list scheduler (:func:`.zero_bubble.list_schedule`) walks all
ranks in unit time steps and, whenever a rank is free, runs the first of

1. the oldest pending ``W`` if the rank is within one slot of the memory bound below;
2. a ready ``F``, chunk 1 before chunk 0 (the forward wave runs ahead, as in the paper's V);
3. a ready ``B``, the older micro-batch of the two stages first;
4. the oldest pending ``W`` (it fills what would be a bubble);

and idles otherwise. **Memory bound** (the paper's): at most ``2p`` stage micro-batches between
their ``F`` and their ``W`` on any rank. A stage is half a 1F1B stage, so that is 1F1B's peak
activation memory (p full micro-batches on rank 0). A chunk-0 ``F`` may take at most ``2p-1``
of those slots, so a chunk-1 ``F`` always finds room: that is what keeps the V deadlock-free
(the backward of a micro-batch can only start once its chunk-1 forward has run on rank 0).

With unit costs each rank is idle only while the first forward wave reaches it (``r`` steps on
rank r) and while the last backward wave leaves (``p-1-r`` steps): the bubble is
``(p-1)/(6m+p-1)`` for ``m >= p`` (:func:`zero_bubble_v_theory`; the simulator gives exactly
that for p <= 8, m <= 32), half of ZB-H1's idle time at equal work. Any ``m >= 1`` runs (torch
pads to ``2p-1`` micro-batches instead); with ``m < p`` the ramps do not overlap and the
bubble is larger, still below ZB-H1's.

**Unequal costs.** The paper's V (and torch's) is bubble-free only when F, B and W take equal
time. A plan built for unit costs but run with F = 2B = 2W keeps a bubble in its steady state
(about 0.18 at p = 2, whatever m; ZB-H1's shrinks like 1/m) -- the round trip of a micro-batch
through a rank's two stages is longer than the work it has to fill it with. Pass the measured
ratio as small integers (``costs=(2, 1, 1)``) and the same list scheduler builds the order for
those costs: the simulated bubble is then again about half of ZB-H1's (p = 2, 4; F:B:W = 2:1:1
and 3:2:2). Every rank must build the same plan: pass the same ``costs`` everywhere.

Example::

    >>> from neural_arch.distributed.pipelining.schedules import format_schedule
    >>> plan = zero_bubble_v_plan(2, 4)
    >>> [str(a) for a in plan.compute(1)][:6]       # rank 1 holds stages 1 and 2: local hand-off
    ['F0@s1', 'F0@s2', 'F1@s1', 'F1@s2', 'B0@s2', 'W0@s2']
    >>> print(format_schedule(plan))                # a: stage r, b: stage 2p-1-r
    ZB-V (ranks=2, microbatches=4, virtual_stages=2)
    rank 0 | F0a F1a F2a F0b B0b W0b F1b B1b W1b B0a W0a F2b B2b W2b F3a B1a W1a F3b B3b W3b B2a W2a ... B3a W3a
    rank 1 | ... F0a F0b F1a F1b B0b W0b B0a W0a F2a F2b B1b W1b B1a W1a F3a F3b B2b W2b B2a W2a B3b B3a W3b W3a
"""

from __future__ import annotations

from neural_arch.distributed.pipelining.schedules import B, F, PipelinePlan, W, _check
from neural_arch.distributed.pipelining.zero_bubble import RankView, check_costs, list_schedule


def zero_bubble_v_plan(num_stages: int, n_microbatches: int, costs: tuple[int, int, int] = (1, 1, 1)) -> PipelinePlan:
    """ZB-V for ``num_stages`` pipeline *ranks* (the model is cut into ``2 * num_stages`` stages,
    placed in a V) and ``n_microbatches`` micro-batches (any ``>= 1``); ``costs``: the relative
    durations of one stage's F, B and W as positive ints (see "Unequal costs" above).

    Every stage runs each micro-batch's ``F``, ``B`` and ``W`` in that order, micro-batches in
    increasing order within each kind; at most ``2 * num_stages`` stage micro-batches are between
    their ``F`` and their ``W`` on any rank.

    Example::

        >>> plan = zero_bubble_v_plan(2, 2)
        >>> plan.name, plan.num_stages, plan.placement
        ('ZB-V', 4, 'v')
    """
    _check(num_stages, n_microbatches)
    costs = check_costs(costs)
    p = num_stages
    limit = 2 * p

    def policy(rank: RankView):  # chunk 0 is stage r (down the V), chunk 1 stage 2p-1-r (back up)
        if rank.weights and rank.alive >= limit - 1:
            return W, rank.weights[0][0]          # free memory before the bound blocks a forward
        if 1 in rank.forward and rank.alive < limit:
            return F, 1
        if 0 in rank.forward and rank.alive < limit - 1:
            return F, 0                           # keeps one slot for chunk 1: no deadlock
        if rank.backward:
            return B, min(rank.backward, key=lambda c: rank.next_b[c])
        return (W, rank.weights[0][0]) if rank.weights else None

    name = "ZB-V" if costs == (1, 1, 1) else f"ZB-V(costs={costs})"
    return list_schedule(name, [(r, 2 * p - 1 - r) for r in range(p)], n_microbatches, costs, policy, 2, "v")


def zero_bubble_v_theory(num_ranks: int, n_microbatches: int) -> float:
    """ZB-V's idle share with unit F, B and W per stage: ``(p-1)/(6m+p-1)`` (valid for ``m >= p``).

    Each rank runs ``6m`` stage actions; it waits ``r`` steps for the first forward wave and
    ``p-1-r`` steps after its last action for the backward wave to finish elsewhere. ZB-H1 (one
    stage of double size per rank) is ``(p-1)/(3m+p-1)``: twice the idle time.

    Example::

        >>> round(zero_bubble_v_theory(4, 8), 3)      # ZB-H1: 0.111
        0.059
    """
    p, m = num_ranks, n_microbatches
    return (p - 1) / (6 * m + p - 1)


__all__ = ["zero_bubble_v_plan", "zero_bubble_v_theory"]
