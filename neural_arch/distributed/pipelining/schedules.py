"""Pipeline schedules as plain data: build them, print them, simulate them.

A schedule is, for every pipeline rank, the list of :class:`Action` records it runs in order:
compute actions ``F`` (forward of one micro-batch through one stage) and ``B`` (its backward),
and the point-to-point actions around them, ``RECV_F`` / ``SEND_F`` (activations, towards the
last stage) and ``RECV_B`` / ``SEND_B`` (gradients, towards the first stage). The executor
(:mod:`neural_arch.distributed.pipelining.executor`) runs exactly these lists, so the
tests that simulate them here (deadlock freedom, forward-before-backward, activations in
flight, bubble fraction) test the schedules that run.

==================================  =================================================  ==================
builder                             order on rank r of p (m micro-batches)             bubble (unit F, B)
==================================  =================================================  ==================
``gpipe_plan(p, m)``                all m forwards, then all m backwards               (p-1)/(m+p-1)
``one_f_one_b_plan(p, m)``          p-r-1 warm-up forwards, then F/B alternate         (p-1)/(m+p-1)
                                    (at most p-r activations alive: PipeDream-flush)
``interleaved_1f1b_plan(p, m, v)``  v stage chunks per rank (stage c*p+r), Megatron's  (p-1)/(v*m+p-1)
                                    interleaved order; m a multiple of p
==================================  =================================================  ==================

Stages are numbered ``0 .. p*v-1``. The ``"loop"`` placement puts stage ``s`` on rank ``s % p``
(chunk ``s // p``); the ``"v"`` placement of ZB-V (:mod:`.zero_bubble_v`, v = 2) puts stages ``r``
and ``2p-1-r`` on rank r, so the first and the last stage share rank 0 and stages ``p-1`` and
``p`` share rank ``p-1`` (see :func:`stage_to_rank`). Two consecutive stages on one rank hand
the activation (and its gradient) over locally: no SEND/RECV.

Example::

    >>> from neural_arch.distributed.pipelining.schedules import one_f_one_b_plan, format_schedule
    >>> plan = one_f_one_b_plan(2, 3)
    >>> [str(a) for a in plan.compute(0)]
    ['F0@s0', 'F1@s0', 'B0@s0', 'F2@s0', 'B1@s0', 'B2@s0']
    >>> print(format_schedule(plan))          # doctest: +SKIP
    1F1B (ranks=2, microbatches=3)
    rank 0 | F0 F1 .. B0 F2 B1 .. B2
    rank 1 | .. F0 B0 F1 B1 F2 B2 ..
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

F, B, W = "F", "B", "W"
SEND_F, RECV_F, SEND_B, RECV_B = "SEND_F", "RECV_F", "SEND_B", "RECV_B"
COMPUTE = (F, B, W)
COMM = (SEND_F, RECV_F, SEND_B, RECV_B)


class Action(NamedTuple):
    """One thing one rank does: ``kind`` on micro-batch ``microbatch`` of stage ``stage``.

    ``peer`` is the pipeline rank a SEND/RECV talks to (None for compute). Printed as
    ``F3`` (stage implied by the rank) or ``F3@s5`` when a rank holds several stages.

    Example::

        >>> str(Action("F", 3, 5)), Action("F", 3, 5).label()
        ('F3@s5', 'F3')
    """

    kind: str
    microbatch: int
    stage: int
    peer: int | None = None

    def label(self, chunks: int = 1, num_ranks: int = 1) -> str:
        base = f"{self.kind}{self.microbatch}"
        if chunks > 1:
            base += "abcdefghijklmnopqrstuvwxyz"[(self.stage // num_ranks) % 26]
        return base

    def __str__(self) -> str:
        text = f"{self.kind}{self.microbatch}@s{self.stage}"
        if self.peer is not None:
            text += f"->r{self.peer}" if self.kind.startswith("SEND") else f"<-r{self.peer}"
        return text if self.kind not in COMPUTE or self.peer is not None else f"{self.kind}{self.microbatch}@s{self.stage}"


@dataclass(frozen=True)
class PipelinePlan:
    """A pipeline schedule for ``num_ranks`` ranks, ``n_microbatches`` micro-batches and
    ``virtual_stages`` stage chunks per rank. ``by_rank[r]`` is rank r's actions in order.

    Example::

        >>> plan = gpipe_plan(2, 2)
        >>> plan.num_stages, [str(a) for a in plan.compute(1)]
        (2, ['F0@s1', 'F1@s1', 'B0@s1', 'B1@s1'])
    """

    name: str
    num_ranks: int
    n_microbatches: int
    virtual_stages: int
    by_rank: tuple[tuple[Action, ...], ...]
    placement: str = "loop"  # "loop" (stage s on rank s % p) or "v" (see stage_to_rank)

    @property
    def num_stages(self) -> int:
        return self.num_ranks * self.virtual_stages

    def for_rank(self, rank: int) -> tuple[Action, ...]:
        return self.by_rank[rank]

    def compute(self, rank: int) -> list[Action]:
        """Rank ``rank``'s compute actions (F/B/W) only, in order."""
        return [a for a in self.by_rank[rank] if a.kind in COMPUTE]

    def stage_rank(self, stage: int) -> int:
        return stage_to_rank(stage, self.num_ranks, self.num_stages, self.placement)

    def __len__(self) -> int:
        return sum(len(actions) for actions in self.by_rank)


# -- placement -----------------------------------------------------------------------------------

PLACEMENTS = ("loop", "v")


def stage_to_rank(stage: int, num_ranks: int, num_stages: int, style: str = "loop") -> int:
    """The pipeline rank that runs ``stage`` of ``num_stages`` on ``num_ranks`` ranks.

    ``"loop"`` (GPipe, 1F1B, interleaved): ``stage % num_ranks``. ``"v"`` (ZB-V, two stages per
    rank): stage ``s < p`` on rank ``s``, stage ``s >= p`` on rank ``2p-1-s`` -- down the ranks
    and back up, like torch's ``generate_stage_to_rank_mapping(..., style="v")``.

    >>> [stage_to_rank(s, 3, 6, "v") for s in range(6)]
    [0, 1, 2, 2, 1, 0]
    """
    if style == "loop":
        return stage % num_ranks
    if style == "v":
        if num_stages != 2 * num_ranks:
            raise ValueError(f"the V placement needs exactly 2 stages per rank: num_stages={num_stages} on "
                             f"{num_ranks} ranks; pass num_stages={2 * num_ranks}")
        return stage if stage < num_ranks else num_stages - 1 - stage
    raise ValueError(f"placement style={style!r} must be one of {PLACEMENTS}")


def generate_stage_to_rank_mapping(num_ranks: int, num_stages: int, style: str = "loop") -> dict[int, int]:
    """torch's name: ``{stage: rank}`` for every stage (see :func:`stage_to_rank`).

    >>> generate_stage_to_rank_mapping(2, 4, style="v")
    {0: 0, 1: 1, 2: 1, 3: 0}
    """
    return {s: stage_to_rank(s, num_ranks, num_stages, style) for s in range(num_stages)}


# -- builders ------------------------------------------------------------------------------------


def _check(num_ranks: int, n_microbatches: int, virtual_stages: int = 1) -> None:
    for name, value in (("num_stages", num_ranks), ("n_microbatches", n_microbatches),
                        ("virtual_stages", virtual_stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def with_communication(name: str, compute: Sequence[Sequence[Action]], num_ranks: int, n_microbatches: int,
                       virtual_stages: int = 1, placement: str = "loop") -> PipelinePlan:
    """Insert RECV before and SEND after each compute action that needs one (torch's lowering).

    ``compute[r]`` lists rank r's F/B/W actions. A forward of stage s > 0 first receives its input
    from stage s-1; a forward of stage s < S-1 then sends its output to stage s+1. A backward of
    stage s < S-1 first receives its output's gradient from stage s+1; a backward of stage s > 0
    then sends its input's gradient to stage s-1. When the neighbouring stage lives on the same
    rank (``placement``, see :func:`stage_to_rank`) nothing is sent: the executor hands the
    array over locally.

    Example::

        >>> plan = with_communication("two", [[Action("F", 0, 0)], [Action("F", 0, 1)]], 2, 1)
        >>> [[str(a) for a in acts] for acts in plan.by_rank]
        [['F0@s0', 'SEND_F0@s0->r1'], ['RECV_F0@s1<-r0', 'F0@s1']]
    """
    num_stages = num_ranks * virtual_stages
    last = num_stages - 1

    def rank_of(stage: int) -> int:
        return stage_to_rank(stage, num_ranks, num_stages, placement)

    by_rank = []
    for actions in compute:
        out: list[Action] = []
        for a in actions:
            s, me = a.stage, rank_of(a.stage)
            prev = rank_of(s - 1) if s > 0 else me
            nxt = rank_of(s + 1) if s < last else me
            if a.kind == F:
                if prev != me:
                    out.append(Action(RECV_F, a.microbatch, s, prev))
                out.append(a)
                if nxt != me:
                    out.append(Action(SEND_F, a.microbatch, s, nxt))
            elif a.kind == B:
                if nxt != me:
                    out.append(Action(RECV_B, a.microbatch, s, nxt))
                out.append(a)
                if prev != me:
                    out.append(Action(SEND_B, a.microbatch, s, prev))
            else:
                out.append(a)
        by_rank.append(tuple(out))
    return PipelinePlan(name, num_ranks, n_microbatches, virtual_stages, tuple(by_rank), placement)


def gpipe_plan(num_stages: int, n_microbatches: int) -> PipelinePlan:
    """GPipe: every rank runs all forwards, then all backwards (m activations alive per stage).

    Example::

        >>> print(format_schedule(gpipe_plan(2, 2)))
        GPipe (ranks=2, microbatches=2)
        rank 0 | F0 F1 .. .. B0 B1
        rank 1 | .. F0 F1 B0 B1 ..
    """
    _check(num_stages, n_microbatches)
    compute = [[Action(F, i, r) for i in range(n_microbatches)] + [Action(B, i, r) for i in range(n_microbatches)]
               for r in range(num_stages)]
    return with_communication("GPipe", compute, num_stages, n_microbatches)


def one_f_one_b_plan(num_stages: int, n_microbatches: int) -> PipelinePlan:
    """1F1B (PipeDream-flush): ``p-r-1`` warm-up forwards, then one forward / one backward.

    Rank r never holds more than ``p - r`` micro-batches' activations (GPipe holds m).

    Example::

        >>> [str(a) for a in one_f_one_b_plan(2, 3).compute(0)]
        ['F0@s0', 'F1@s0', 'B0@s0', 'F2@s0', 'B1@s0', 'B2@s0']
    """
    _check(num_stages, n_microbatches)
    p, m = num_stages, n_microbatches
    compute = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts = [Action(F, i, r) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action(F, warmup + i, r), Action(B, i, r)]
        acts += [Action(B, i, r) for i in range(m - warmup, m)]
        compute.append(acts)
    return with_communication("1F1B", compute, p, m)


def interleaved_1f1b_plan(num_stages: int, n_microbatches: int, virtual_stages: int) -> PipelinePlan:
    """Megatron-LM's interleaved 1F1B: rank r holds stages ``r, r+p, ..., r+(v-1)p``.

    ``num_stages`` is the number of pipeline *ranks* p; the model is cut into ``p * v`` stages.
    Virtual micro-batch k (of m*v) is micro-batch ``(k // (p v)) p + k % p`` on chunk
    ``(k // p) % v`` (backwards visit the chunks in reverse). Warm-up is ``2(p-r-1) + (v-1)p``
    forwards. Needs ``n_microbatches % num_stages == 0`` (Megatron's rule).

    Example::

        >>> plan = interleaved_1f1b_plan(2, 4, virtual_stages=2)
        >>> plan.num_stages, sorted({a.stage for a in plan.compute(0)})
        (4, [0, 2])
    """
    _check(num_stages, n_microbatches, virtual_stages)
    p, m, v = num_stages, n_microbatches, virtual_stages
    if m % p:
        raise ValueError(f"interleaved 1F1B needs n_microbatches ({m}) to be a multiple of the number of "
                         f"pipeline ranks ({p}); use n_microbatches={((m + p - 1) // p) * p}")
    total = m * v

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k % (p * v)) // p
        if not forward:
            chunk = v - 1 - chunk
        return (k // (p * v)) * p + k % p, chunk

    compute = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        acts = []
        for k in range(warmup):
            mb, c = virtual(k, True)
            acts.append(Action(F, mb, c * p + r))
        for k in range(total - warmup):
            mb, c = virtual(warmup + k, True)
            acts.append(Action(F, mb, c * p + r))
            mb, c = virtual(k, False)
            acts.append(Action(B, mb, c * p + r))
        for k in range(total - warmup, total):
            mb, c = virtual(k, False)
            acts.append(Action(B, mb, c * p + r))
        compute.append(acts)
    name = "Interleaved1F1B" if v > 1 else "Interleaved1F1B(v=1)"
    return with_communication(name, compute, p, m, v)


# -- simulation ----------------------------------------------------------------------------------


class DeadlockError(RuntimeError):
    """A simulated schedule stopped with ranks still waiting on receives nobody will send.

    Example::

        >>> bad = PipelinePlan("bad", 2, 1, 1, ((Action("RECV_B", 0, 0, 1),), (Action("RECV_F", 0, 1, 0),)))
        >>> try:
        ...     simulate(bad)
        ... except DeadlockError as exc:
        ...     print(exc)
        schedule deadlocks: rank 0 waits at RECV_B0@s0<-r1; rank 1 waits at RECV_F0@s1<-r0
    """


@dataclass(frozen=True)
class Event:
    """One compute action of a simulated (or measured) run: rank, action, start and end time.

    Example::

        >>> simulate(gpipe_plan(2, 2)).events[0]
        Event(rank=0, action=Action(kind='F', microbatch=0, stage=0, peer=None), start=0.0, end=1.0)
    """

    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Simulation:
    """The outcome of :func:`simulate`: the compute ``events``, the ``makespan``, and per rank the
    most micro-batch activations alive at once (``max_in_flight``).

    Example::

        >>> sim = simulate(gpipe_plan(2, 2))
        >>> sim.makespan, sim.max_in_flight, round(sim.bubble_fraction, 3)
        (6.0, (2, 2), 0.333)
    """

    plan: PipelinePlan
    events: tuple[Event, ...]
    makespan: float
    max_in_flight: tuple[int, ...]  # per rank: most micro-batch activations alive at once

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.events, self.plan.num_ranks)


def bubble_fraction(events: Sequence[Event], num_ranks: int) -> float:
    """Idle share of ``num_ranks`` ranks between the first start and the last end of ``events``.

    Example::

        >>> round(bubble_fraction(simulate(one_f_one_b_plan(4, 8)).events, 4), 3)
        0.273
    """
    if not events:
        return 0.0
    start = min(e.start for e in events)
    span = max(e.end for e in events) - start
    busy = sum(e.end - e.start for e in events)
    return 1.0 - busy / (num_ranks * span) if span > 0 else 0.0


def simulate(plan: PipelinePlan, f_time: float = 1.0, b_time: float = 1.0, comm_time: float = 0.0,
             w_time: float = 0.0) -> Simulation:
    """Run ``plan`` on a model machine: sends never block, a RECV waits for its message.

    Every stage's forward takes ``f_time / v`` and backward ``b_time / v`` (a stage chunk is
    1/v of a rank's layers); a message is available ``comm_time`` after the compute that made
    it ends. ``w_time`` is the weight-gradient share of a backward: a ``W`` action takes
    ``w_time / v``, and a ``B`` whose micro-batch has no ``W`` in the plan (GPipe, 1F1B: input
    and weight gradients in one action) takes ``(b_time + w_time) / v``, so split and fused
    plans are compared at equal total work. Messages travel on FIFO channels
    ``(src, dst, kind, stage)``; a receive that finds the wrong micro-batch at the head of its
    channel, a rank that waits forever, a backward before its forward, a ``W`` before its
    ``B``, or a message never received raise :class:`DeadlockError`.

    ``max_in_flight`` counts a micro-batch from its ``F`` to the action that frees the last of
    its saved tensors: its ``W`` when the plan has one, else its ``B``.

    Example::

        >>> simulate(one_f_one_b_plan(2, 4), f_time=1.0, b_time=2.0).makespan
        15.0
    """
    v, p = plan.virtual_stages, plan.num_ranks
    split = {(a.microbatch, a.stage) for acts in plan.by_rank for a in acts if a.kind == W}
    durations = {F: f_time / v, B: b_time / v, W: w_time / v}
    fused_b = (b_time + w_time) / v
    channels: dict[tuple, list[tuple[int, float]]] = {}
    pos = [0] * p
    clock = [0.0] * p
    done_at: dict[tuple[int, str, int, int], float] = {}  # (rank, kind, mb, stage) -> end time
    events: list[Event] = []
    alive = [0] * p
    most = [0] * p
    forwards: set = set()
    backwards: set = set()
    progress = True
    while progress:
        progress = False
        for r in range(p):
            actions = plan.by_rank[r]
            while pos[r] < len(actions):
                a = actions[pos[r]]
                if a.kind in (SEND_F, SEND_B):
                    kind = F if a.kind == SEND_F else B
                    ready = done_at.get((r, kind, a.microbatch, a.stage))
                    if ready is None:
                        raise DeadlockError(f"rank {r}: {a} before its {kind}{a.microbatch}")
                    dest_stage = a.stage + 1 if kind == F else a.stage - 1
                    if plan.stage_rank(dest_stage) != a.peer:
                        raise DeadlockError(f"rank {r}: {a} goes to rank {a.peer}, but stage {dest_stage} "
                                            f"lives on rank {plan.stage_rank(dest_stage)}")
                    channels.setdefault((r, a.peer, kind, dest_stage), []).append((a.microbatch, ready + comm_time))
                elif a.kind in (RECV_F, RECV_B):
                    kind = F if a.kind == RECV_F else B
                    queue = channels.get((a.peer, r, kind, a.stage))
                    if not queue:
                        break  # blocked: try the other ranks
                    mb, t = queue.pop(0)
                    if mb != a.microbatch:
                        raise DeadlockError(f"rank {r}: {a} got micro-batch {mb} first: sender and receiver "
                                            "disagree about the order on this channel")
                    clock[r] = max(clock[r], t)
                else:
                    key = (a.microbatch, a.stage)
                    local = _local_input(plan, r, a)
                    if local is not None and (local[1], local[0]) not in (forwards if a.kind == F else backwards):
                        raise DeadlockError(f"rank {r}: {a} runs before {a.kind}{a.microbatch}@s{local[0]}, whose "
                                            "output it takes over on this rank")
                    if a.kind == B and key not in forwards:
                        raise DeadlockError(f"rank {r}: {a} runs before F{a.microbatch}@s{a.stage}")
                    if a.kind == W and key not in backwards:
                        raise DeadlockError(f"rank {r}: {a} runs before B{a.microbatch}@s{a.stage}")
                    if a.kind == F:
                        forwards.add(key)
                        alive[r] += 1
                        most[r] = max(most[r], alive[r])
                    elif a.kind == B:
                        backwards.add(key)
                        if key not in split:
                            alive[r] -= 1
                    else:
                        alive[r] -= 1
                    cost = fused_b if a.kind == B and key not in split else durations[a.kind]
                    start, clock[r] = clock[r], clock[r] + cost
                    done_at[(r, a.kind, a.microbatch, a.stage)] = clock[r]
                    events.append(Event(r, a, start, clock[r]))
                pos[r] += 1
                progress = True
    stuck = [(r, plan.by_rank[r][pos[r]]) for r in range(p) if pos[r] < len(plan.by_rank[r])]
    if stuck:
        raise DeadlockError("schedule deadlocks: " + "; ".join(f"rank {r} waits at {a}" for r, a in stuck))
    leftover = {k: q for k, q in channels.items() if q}
    if leftover:
        raise DeadlockError(f"messages sent but never received: {leftover}")
    makespan = max((e.end for e in events), default=0.0)
    return Simulation(plan, tuple(events), makespan, tuple(most))


def _local_input(plan: PipelinePlan, rank: int, a: Action) -> tuple[int, int] | None:
    """(stage, micro-batch) whose output ``a`` takes over on the same rank (no message), or None."""
    src = a.stage - 1 if a.kind == F else a.stage + 1 if a.kind == B else -1
    if not 0 <= src < plan.num_stages or plan.stage_rank(src) != rank:
        return None
    return src, a.microbatch


def theoretical_bubble(num_ranks: int, n_microbatches: int, virtual_stages: int = 1) -> float:
    """``(p-1) / (v m + p - 1)``: the idle share of GPipe/1F1B (v=1) and interleaved 1F1B.

    Example::

        >>> round(theoretical_bubble(4, 8), 3), round(theoretical_bubble(4, 8, virtual_stages=2), 3)
        (0.273, 0.158)
    """
    p, m, v = num_ranks, n_microbatches, virtual_stages
    return (p - 1) / (v * m + p - 1)


def format_timeline(events: Sequence[Event], num_ranks: int, title: str = "", chunks: int = 1,
                    slot: float | None = None) -> str:
    """An ASCII time-line, one row per rank; each ``slot`` of time is one 3-character cell.

    Example::

        >>> print(format_timeline(simulate(gpipe_plan(2, 2)).events, 2))
        rank 0 | F0 F1 .. .. B0 B1
        rank 1 | .. F0 F1 B0 B1 ..
    """
    events = list(events)
    if not events:
        return title
    slot = slot or min(e.end - e.start for e in events if e.end > e.start)
    width = max(len(e.action.label(chunks, num_ranks)) for e in events)
    end = max(e.end for e in events)
    ncells = round(end / slot)
    rows = []
    for r in range(num_ranks):
        cells = ["." * width] * ncells
        for e in events:
            if e.rank != r:
                continue
            first, last = round(e.start / slot), round(e.end / slot)
            for c in range(first, max(last, first + 1)):
                if c < ncells:
                    cells[c] = e.action.label(chunks, num_ranks).ljust(width)
        rows.append(f"rank {r} | " + " ".join(cells))
    return "\n".join(([title] if title else []) + rows)


def format_schedule(plan: PipelinePlan, f_time: float = 1.0, b_time: float = 1.0, w_time: float | None = None) -> str:
    """``plan`` simulated with unit compute times, as an ASCII time-line per rank.

    ``w_time`` defaults to 1 for plans with ``W`` actions (unit F, B, W) and 0 otherwise.

    Example::

        >>> print(format_schedule(one_f_one_b_plan(2, 2)))
        1F1B (ranks=2, microbatches=2)
        rank 0 | F0 F1 .. B0 .. B1
        rank 1 | .. F0 B0 F1 B1 ..
    """
    if w_time is None:
        w_time = 1.0 if any(a.kind == W for acts in plan.by_rank for a in acts) else 0.0
    sim = simulate(plan, f_time, b_time, w_time=w_time)
    title = (f"{plan.name} (ranks={plan.num_ranks}, microbatches={plan.n_microbatches}"
             + (f", virtual_stages={plan.virtual_stages})" if plan.virtual_stages > 1 else ")"))
    return format_timeline(sim.events, plan.num_ranks, title, plan.virtual_stages)


def format_actions(plan: PipelinePlan) -> str:
    """Every rank's full action list, communication included, one line per rank.

    Example::

        >>> print(format_actions(gpipe_plan(2, 1)))
        rank 0: F0@s0 SEND_F0@s0->r1 RECV_B0@s0<-r1 B0@s0
        rank 1: RECV_F0@s1<-r0 F0@s1 B0@s1 SEND_B0@s1->r0
    """
    return "\n".join(f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(plan.by_rank))


__all__ = [
    "RECV_B",
    "RECV_F",
    "SEND_B",
    "SEND_F",
    "Action",
    "B",
    "DeadlockError",
    "Event",
    "F",
    "PipelinePlan",
    "Simulation",
    "W",
    "bubble_fraction",
    "format_actions",
    "format_schedule",
    "format_timeline",
    "generate_stage_to_rank_mapping",
    "gpipe_plan",
    "interleaved_1f1b_plan",
    "one_f_one_b_plan",
    "simulate",
    "stage_to_rank",
    "theoretical_bubble",
    "with_communication",
]
