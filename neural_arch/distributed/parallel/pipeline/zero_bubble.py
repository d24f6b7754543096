"""ZB-H1, the zero-bubble schedule of Qi et al. ("Zero Bubble Pipeline Parallelism", 2023), as data.

The backward of a micro-batch is split in two actions: ``B`` computes only the gradient of the
stage's *input* (what the previous stage waits for) and ``W`` the gradient of the stage's
*weights* (what nobody waits for). Only ``B`` is on the critical path between ranks, so the
backward wave travels one ``B`` per hop instead of one ``B + W``, and the ``W`` actions fill
the idle slots that 1F1B leaves.

How the plan is built (a pure function of ``p`` and ``m``): every rank keeps 1F1B's order of
``F`` and ``B`` actions; a list scheduler then walks all ranks in time with unit costs
(F = B = W = 1) and, on each rank, inserts that rank's oldest pending ``W`` whenever the next
``F``/``B`` is not ready yet (its message has not arrived) or when running another ``F``
would exceed the memory bound. The remaining ``W`` actions close the list. The bound is
1F1B's peak: **at most p micro-batches whose W has not run** on any rank (1F1B holds p on
rank 0, so the job's peak activation memory is unchanged; later ranks use part of that
allowance, as in the paper's ZB-H1).

With unit costs the bubble is ``(p-1)/(3m+p-1)`` for ``m >= p`` -- a third of 1F1B's idle
time ``3(p-1)`` (1F1B runs ``B`` and ``W`` as one action of cost 2).

Example::

    >>> from neural_arch.distributed.parallel.pipeline.zero_bubble import zero_bubble_plan
    >>> plan = zero_bubble_plan(2, 3)
    >>> [str(a) for a in plan.compute(1)]
    ['F0@s1', 'B0@s1', 'F1@s1', 'B1@s1', 'W0@s1', 'F2@s1', 'B2@s1', 'W1@s1', 'W2@s1']
"""

from __future__ import annotations

from neural_arch.distributed.parallel.pipeline.schedules import (
    Action,
    F,
    PipelinePlan,
    W,
    _check,
    one_f_one_b_plan,
    with_communication,
)


def zero_bubble_plan(num_stages: int, n_microbatches: int) -> PipelinePlan:
    """ZB-H1 for ``num_stages`` ranks (one stage each) and ``n_microbatches`` micro-batches.

    Every rank runs each micro-batch's ``F``, ``B`` and ``W`` (in that order, micro-batches in
    increasing order within each kind); at most ``num_stages`` micro-batches are between their
    ``F`` and their ``W`` on any rank.
    """
    _check(num_stages, n_microbatches)
    p, m = num_stages, n_microbatches
    base = one_f_one_b_plan(p, m)
    fb = [[a for a in base.compute(r)] for r in range(p)]
    limit = p
    pos = [0] * p          # next F/B in 1F1B order
    clock = [0] * p
    n_f, n_b, n_w = [0] * p, [0] * p, [0] * p
    f_end: dict[tuple[int, int], int] = {}
    b_end: dict[tuple[int, int], int] = {}
    out: list[list[Action]] = [[] for _ in range(p)]

    def ready_at(r: int):
        a = fb[r][pos[r]]
        if a.kind == F:
            return 0 if r == 0 else f_end.get((r - 1, a.microbatch))
        return f_end[(r, a.microbatch)] if r == p - 1 else b_end.get((r + 1, a.microbatch))

    def unfinished(r: int) -> bool:
        return pos[r] < len(fb[r]) or n_w[r] < n_b[r]

    while any(unfinished(r) for r in range(p)):
        best = None  # (start time, rank, kind)
        for r in range(p):
            if not unfinished(r):
                continue
            if pos[r] == len(fb[r]):
                choice = (clock[r], W)
            else:
                nxt = fb[r][pos[r]].kind
                t_ready = ready_at(r)
                over = nxt == F and n_f[r] - n_w[r] >= limit
                if over or ((t_ready is None or t_ready > clock[r]) and n_w[r] < n_b[r]):
                    choice = (clock[r], W) if n_w[r] < n_b[r] else None
                elif t_ready is not None:
                    choice = (max(clock[r], t_ready), nxt)
                else:
                    choice = None  # waiting on another rank: decided once that rank moves on
            if choice is not None and (best is None or (choice[0], r) < best[:2]):
                best = (choice[0], r, choice[1])
        if best is None:  # cannot happen for 1F1B's order; kept as a clear error, not a hang
            raise RuntimeError(f"zero_bubble_plan({p}, {m}): the list scheduler found no runnable action")
        start, r, kind = best
        clock[r] = start + 1
        if kind == W:
            out[r].append(Action(W, n_w[r], r))
            n_w[r] += 1
            continue
        a = fb[r][pos[r]]
        pos[r] += 1
        out[r].append(a)
        if kind == F:
            n_f[r] += 1
            f_end[(r, a.microbatch)] = clock[r]
        else:
            n_b[r] += 1
            b_end[(r, a.microbatch)] = clock[r]
    return with_communication("ZB-H1", out, p, m)


def zero_bubble_theory(num_ranks: int, n_microbatches: int) -> float:
    """ZB-H1's idle share with unit F, B and W: ``(p-1)/(3m+p-1)`` (valid for ``m >= p``).

    1F1B's is ``(p-1)/(m+p-1)`` = ``3(p-1)/(3m+3(p-1))`` with the same unit costs.
    """
    p, m = num_ranks, n_microbatches
    return (p - 1) / (3 * m + p - 1)


__all__ = ["zero_bubble_plan", "zero_bubble_theory"]
