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

This module also holds :func:`list_schedule`, the time-stepped list scheduler that ZB-V
(:mod:`.zero_bubble_v`) and interleaved zero bubble (:mod:`.zero_bubble_interleaved`) share: the
engine owns dependencies, micro-batch order and the time steps, and each schedule passes only
its placement and a small priority ``policy`` (ZB-H1 keeps its own loop: it inserts ``W``'s into
1F1B's fixed F/B order rather than choosing F/B actions).

Example::

    >>> from neural_arch.distributed.pipelining.zero_bubble import zero_bubble_plan
    >>> plan = zero_bubble_plan(2, 3)
    >>> [str(a) for a in plan.compute(1)]
    ['F0@s1', 'B0@s1', 'F1@s1', 'B1@s1', 'W0@s1', 'F2@s1', 'B2@s1', 'W1@s1', 'W2@s1']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from neural_arch.distributed.pipelining.schedules import (
    Action,
    B,
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

    Example::

        >>> from neural_arch.distributed.pipelining.schedules import format_schedule
        >>> print(format_schedule(zero_bubble_plan(2, 2)))
        ZB-H1 (ranks=2, microbatches=2)
        rank 0 | F0 F1 .. B0 W0 B1 W1
        rank 1 | .. F0 B0 F1 B1 W0 W1
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


class RankView(NamedTuple):
    """What a list-scheduler policy sees of one free rank at one time step (see :func:`list_schedule`).

    ``alive``: stage micro-batches between their ``F`` and their ``W`` on this rank; ``forward`` /
    ``backward``: the chunks (0 .. v-1, the rank's stages in increasing order) whose next ``F`` /
    ``B`` could start now; ``next_b``: per chunk, the micro-batch its next ``B`` is;
    ``weights``: ``(chunk, micro-batch)`` whose ``B`` ran and ``W`` did not, oldest first.

    Example::

        def policy(view):                          # a list-scheduler policy
            if view.backward:
                return ("B", view.backward[0])     # run a B when one is ready
            return ("F", view.forward[0]) if view.forward else None
    """

    alive: int
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    next_b: tuple[int, ...]
    weights: tuple[tuple[int, int], ...]


def check_costs(costs) -> tuple[int, int, int]:
    """``costs`` as a tuple of 3 positive ints (relative F, B, W durations), or ValueError.

    Example::

        >>> check_costs((2, 1, 1))
        (2, 1, 1)
        >>> check_costs((1, 0, 1))
        Traceback (most recent call last):
        ...
        ValueError: costs=(1, 0, 1) must be 3 positive ints, ...
    """
    if (not isinstance(costs, (tuple, list)) or len(costs) != 3
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in costs)):
        raise ValueError(f"costs={costs!r} must be 3 positive ints, the relative durations of F, B and W, "
                         "e.g. costs=(2, 1, 1) when a forward takes twice a B or a W")
    return tuple(costs)


def list_schedule(name: str, stages_of: list[tuple[int, ...]], n_microbatches: int, costs: tuple[int, int, int],
                  policy: Callable[[RankView], tuple[str, int] | None], virtual_stages: int,
                  placement: str) -> PipelinePlan:
    """The list scheduler shared by ZB-V and interleaved zero bubble: walk all ranks in unit time steps
    (F, B, W of one stage take ``costs``); whenever a rank is free, ask ``policy`` which action to
    run -- ``(kind, chunk)`` -- or None to idle one step.

    ``stages_of[r]`` are rank r's stages in increasing order (chunk c is ``stages_of[r][c]``). The
    engine owns the dependencies (an ``F`` after the previous stage's ``F``, a ``B`` after its own
    ``F`` and the next stage's ``B``, a ``W`` after its ``B``) and keeps every stage's micro-batches
    in increasing order within each kind; the policy owns priorities and the memory bound. The plan
    records the order only, so it runs deadlock-free whatever the real durations are.

    >>> plan = list_schedule("one rank", [(0,)], 2, (1, 1, 1),
    ...                      lambda v: (B, 0) if v.backward else (F, 0) if v.forward else (W, 0), 1, "loop")
    >>> [str(a) for a in plan.compute(0)]
    ['F0@s0', 'B0@s0', 'F1@s0', 'B1@s0', 'W0@s0', 'W1@s0']
    """
    p, m, v = len(stages_of), n_microbatches, virtual_stages
    cost = dict(zip((F, B, W), costs))
    last = p * v - 1
    busy = [0] * p                                   # per rank: time its running action ends
    nxt = {k: [[0] * v for _ in range(p)] for k in (F, B, W)}  # kind -> rank -> chunk -> next micro-batch
    f_end: dict[tuple[int, int], int] = {}           # (stage, micro-batch) -> end time of its F
    b_end: dict[tuple[int, int], int] = {}
    w_queue: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    out: list[list[Action]] = [[] for _ in range(p)]

    def f_ready(r: int, c: int, t: int) -> bool:
        s, i = stages_of[r][c], nxt[F][r][c]
        if i >= m:
            return False
        done = 0 if s == 0 else f_end.get((s - 1, i))
        return done is not None and done <= t

    def b_ready(r: int, c: int, t: int) -> bool:
        s, i = stages_of[r][c], nxt[B][r][c]
        if i >= nxt[F][r][c] or f_end[(s, i)] > t:
            return False
        done = f_end[(s, i)] if s == last else b_end.get((s + 1, i))
        return done is not None and done <= t

    remaining, t = 3 * p * v * m, 0
    while remaining:
        for r in range(p):
            if busy[r] > t:
                continue
            view = RankView(sum(nxt[F][r][c] - nxt[W][r][c] for c in range(v)),
                            tuple(c for c in range(v) if f_ready(r, c, t)),
                            tuple(c for c in range(v) if b_ready(r, c, t)), tuple(nxt[B][r]), tuple(w_queue[r]))
            choice = policy(view)
            if choice is None:
                continue
            kind, c = choice
            runnable = {F: view.forward, B: view.backward, W: [w[0] for w in view.weights]}[kind]
            if c not in runnable:  # a policy bug, not a user error: say so rather than build a wrong plan
                raise RuntimeError(f"{name}: the policy chose {kind} on chunk {c} of rank {r}, which cannot run now")
            s, i = stages_of[r][c], nxt[kind][r][c]
            nxt[kind][r][c] += 1
            out[r].append(Action(kind, i, s))
            busy[r] = t + cost[kind]
            remaining -= 1
            if kind == F:
                f_end[(s, i)] = busy[r]
            elif kind == B:
                b_end[(s, i)] = busy[r]
                w_queue[r].append((c, i))
            else:
                w_queue[r].remove((c, i))
        t += 1
        if t > 12 * p * v * m * max(costs) + 8:  # a policy that starves itself: a clear error, not a hang
            raise RuntimeError(f"{name}: the list scheduler stopped making progress (p={p}, m={m}, v={v})")
    return with_communication(name, out, p, m, virtual_stages=v, placement=placement)


def zero_bubble_theory(num_ranks: int, n_microbatches: int) -> float:
    """ZB-H1's idle share with unit F, B and W: ``(p-1)/(3m+p-1)`` (valid for ``m >= p``).

    1F1B's is ``(p-1)/(m+p-1)`` = ``3(p-1)/(3m+3(p-1))`` with the same unit costs.

    Example::

        >>> round(zero_bubble_theory(4, 8), 3)       # 1F1B: 0.273
        0.111
    """
    p, m = num_ranks, n_microbatches
    return (p - 1) / (3 * m + p - 1)


__all__ = ["RankView", "check_costs", "list_schedule", "zero_bubble_plan", "zero_bubble_theory"]
