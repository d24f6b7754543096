"""Interleaved zero bubble, as data -- torch's ``ScheduleInterleavedZeroBubble``: interleaved 1F1B's
loop placement with every backward split into ``B`` and ``W`` (Qi et al., "Zero Bubble Pipeline
Parallelism", 2023; the ``W`` actions fill the idle slots).

Placement: the model is cut into ``p * v`` stages and stage ``s`` runs on rank ``s % p`` (chunk
``s // p``), as in :func:`~.schedules.interleaved_1f1b_plan`. As in ZB-H1 (:mod:`.zero_bubble`)
``B`` computes only the input gradient (on the critical path) and ``W`` the weight gradients
(deferred).

How the plan is built (a pure function of ``p``, ``m``, ``v`` and the relative costs, default F = B
= W = 1 per stage): the list scheduler shared with ZB-V (:func:`.zero_bubble.list_schedule`) walks
all ranks in unit time steps and, whenever a rank is free, runs the first of

1. the oldest pending ``W`` if the rank holds the memory bound's worth of micro-batches;
2. a ready ``B``, the oldest micro-batch first (a later chunk first among equals): ``B`` is what
   the previous stage waits for;
3. a ready ``F``, the latest chunk first (the micro-batch nearest the loss moves on);
4. the oldest pending ``W`` (it fills what would be a bubble);

and idles otherwise. **Memory bound**: at most ``v p + p - 1`` stage micro-batches between their
``F`` and their ``W`` on any rank -- interleaved 1F1B's peak on rank 0 (``(v-1)p + 2(p-1)``
warm-up forwards plus one), so the job's peak activation memory is interleaved 1F1B's.

**n_microbatches**: any ``m >= 1`` (interleaved 1F1B needs a multiple of ``p``; torch's
``ScheduleInterleavedZeroBubble`` needs ``m`` to split into equal rounds). With unit costs the
simulated bubble is ``(p-1)/(3vm+p-1)`` (:func:`interleaved_zero_bubble_theory`: only the ramps
are idle) for every ``m >= p`` with p <= 4, v <= 3, m <= 16 but one (p=4, v=2, m=5: 0.143 for
0.091); always below ZB-H1's ``(p-1)/(3m+p-1)`` and, where it exists (m a multiple of p),
interleaved 1F1B's ``(p-1)/(vm+p-1)``, at equal work. The greedy scheduler has no
closed-form deadlock proof: it was checked to finish (and the simulator to accept its plans) for
p <= 6, v <= 3, m <= 32 and ten F:B:W cost ratios from 1:1:1 to 1:10:1 and 10:1:1; a stall would
raise RuntimeError when the plan is built -- identically on every rank, before any message --
never hang a step. With strongly unequal costs (B ten times F) its bubble can exceed ZB-H1's.

Example::

    >>> from neural_arch.distributed.pipelining.schedules import simulate
    >>> plan = interleaved_zero_bubble_plan(2, 4, 2)
    >>> [str(a) for a in plan.compute(1)][:6]      # rank 1 holds stages 1 and 3 (the loss)
    ['F0@s1', 'F1@s1', 'F0@s3', 'B0@s3', 'F1@s3', 'B0@s1']
    >>> round(simulate(plan, w_time=1.0).bubble_fraction, 4) == round(interleaved_zero_bubble_theory(2, 4, 2), 4)
    True
"""

from __future__ import annotations

from neural_arch.distributed.pipelining.schedules import B, F, PipelinePlan, W, _check
from neural_arch.distributed.pipelining.zero_bubble import RankView, check_costs, list_schedule


def interleaved_zero_bubble_plan(num_stages: int, n_microbatches: int, virtual_stages: int,
                                 costs: tuple[int, int, int] = (1, 1, 1)) -> PipelinePlan:
    """Interleaved zero bubble for ``num_stages`` pipeline *ranks*, each holding ``virtual_stages``
    stages ``r, r+p, ...`` (loop placement), ``n_microbatches`` micro-batches (any ``>= 1``);
    ``costs``: the relative durations of one stage's F, B and W as positive ints.

    Every stage runs each micro-batch's ``F``, ``B`` and ``W`` in that order, micro-batches in
    increasing order within each kind; at most ``v p + p - 1`` stage micro-batches are between
    their ``F`` and their ``W`` on any rank (interleaved 1F1B's peak).

    Example::

        >>> plan = interleaved_zero_bubble_plan(2, 4, 2)
        >>> plan.name, plan.num_stages
        ('InterleavedZB', 4)
    """
    _check(num_stages, n_microbatches, virtual_stages)
    costs = check_costs(costs)
    p, v = num_stages, virtual_stages
    limit = v * p + p - 1

    def policy(rank: RankView):
        if rank.weights and rank.alive >= limit:
            return W, rank.weights[0][0]          # the bound blocks every forward: free memory first
        if rank.backward:
            return B, min(rank.backward, key=lambda c: (rank.next_b[c], -c))
        if rank.forward and rank.alive < limit:
            return F, max(rank.forward)
        return (W, rank.weights[0][0]) if rank.weights else None

    name = "InterleavedZB" if costs == (1, 1, 1) else f"InterleavedZB(costs={costs})"
    stages_of = [tuple(c * p + r for c in range(v)) for r in range(p)]
    return list_schedule(name, stages_of, n_microbatches, costs, policy, v, "loop")


def interleaved_zero_bubble_memory_bound(num_ranks: int, virtual_stages: int) -> int:
    """``v p + p - 1``: the most stage micro-batches alive (F done, W not) on any rank -- interleaved
    1F1B's peak on rank 0 (its warm-up ``(v-1)p + 2(p-1)`` plus the first steady forward).

    Example::

        >>> interleaved_zero_bubble_memory_bound(4, 2)   # v p + p - 1
        11
    """
    return virtual_stages * num_ranks + num_ranks - 1


def interleaved_zero_bubble_theory(num_ranks: int, n_microbatches: int, virtual_stages: int) -> float:
    """The idle share with unit F, B and W per stage when the ramps are the only idle time:
    ``(p-1)/(3vm+p-1)`` (each rank runs ``3vm`` stage actions and waits ``p-1`` of them while the
    first forward wave arrives and the last backward wave leaves). ZB-H1 is ``(p-1)/(3m+p-1)``.

    Example::

        >>> round(interleaved_zero_bubble_theory(4, 8, 2), 3)
        0.059
    """
    p, m, v = num_ranks, n_microbatches, virtual_stages
    return (p - 1) / (3 * v * m + p - 1)


__all__ = ["interleaved_zero_bubble_memory_bound", "interleaved_zero_bubble_plan", "interleaved_zero_bubble_theory"]
