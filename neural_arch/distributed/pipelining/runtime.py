"""The schedule classes users call: ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleZBH1``, ``ScheduleInterleavedZeroBubble`` and ``ScheduleZBVZeroBubble`` (zero bubble).

Each is two things (torch's names, torch's ``step`` API):

* **a plan builder**, usable without processes: ``Schedule1F1B(8).plan(num_stages=4)`` is the
  :class:`~.schedules.PipelinePlan` (printable with ``format_schedule``);
* **a runner** once bound to this rank's stage(s): ``Schedule1F1B(stage, 8, loss_fn)``; then
  ``step(x)`` on the first stage, ``step(target=y, losses=[])`` on the last, ``step()`` in
  between. The batch is cut into ``n_microbatches`` equal micro-batches along dimension 0;
  each micro-batch's loss is scaled by ``1/n_microbatches`` before its backward, so the
  gradients accumulated over the step equal those of the mean loss over the whole batch and
  one optimizer step equals a full-batch step.

ZB-V puts the first and the last stage on rank 0 (V placement), so there, as in torch, one call
takes both: ``step(x, target=y, losses=[])`` on rank 0 and ``step()`` on every other rank.

Example (two ranks)::

    stage = PipelineStage(pipe[rank], rank, 2)
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=F.cross_entropy)
    losses = []
    schedule.step(x) if rank == 0 else schedule.step(target=y, losses=losses)
    opt.step(); opt.zero_grad()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.pipelining.executor import execute, fail_before_execute
from neural_arch.distributed.pipelining.schedules import (
    Event,
    PipelinePlan,
    format_schedule,
    generate_stage_to_rank_mapping,
    gpipe_plan,
    interleaved_1f1b_plan,
    one_f_one_b_plan,
    stage_to_rank,
)
from neural_arch.distributed.pipelining.stage import PipelineStage
from neural_arch.distributed.pipelining.zero_bubble import check_costs, zero_bubble_plan
from neural_arch.distributed.pipelining.zero_bubble_interleaved import interleaved_zero_bubble_plan
from neural_arch.distributed.pipelining.zero_bubble_v import zero_bubble_v_plan


def _split(batch, m: int, what: str) -> list:
    # device arrays stay where they are (micro-batches are views); lists become NumPy arrays
    data = batch.data if isinstance(batch, Tensor) else batch if _backend.is_array(batch) else np.asarray(batch)
    if data.ndim == 0 or data.shape[0] % m:
        n = "a scalar" if data.ndim == 0 else f"{data.shape[0]} rows"
        raise ValueError(f"step(): {what} has {n}, which does not split into n_microbatches={m} equal "
                         f"micro-batches along dimension 0; use a batch size that is a multiple of {m}")
    size = data.shape[0] // m
    return [data[i * size:(i + 1) * size] for i in range(m)]


class PipelineSchedule:
    """Base of the schedule classes (see the module docstring).

    Example::

        >>> Schedule1F1B(4).plan(num_stages=2).name        # any subclass: a plan without processes
        '1F1B'
    """

    #: How stage indices map to ranks, ``"loop"`` (stage s on rank s % p) or ``"v"`` (ZB-V).
    placement = "loop"

    def __init__(self, stage_or_n_microbatches, n_microbatches: int | None = None,
                 loss_fn: Callable | None = None, scale_grads: bool = True, virtual_stages: int = 1):
        if isinstance(stage_or_n_microbatches, (PipelineStage, list, tuple)):
            stages = stage_or_n_microbatches
            stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
            if not stages or not all(isinstance(s, PipelineStage) for s in stages):
                raise TypeError(f"{type(self).__name__}: pass a PipelineStage (or a list of them for interleaved "
                                "schedules) and n_microbatches")
            self.stages: list[PipelineStage] = stages
        else:
            if n_microbatches is not None:
                raise TypeError(f"{type(self).__name__}(n_microbatches) builds a plan; to run one pass "
                                f"{type(self).__name__}(stage, n_microbatches, loss_fn)")
            n_microbatches, self.stages = stage_or_n_microbatches, []
        if not isinstance(n_microbatches, int) or isinstance(n_microbatches, bool) or n_microbatches < 1:
            raise ValueError(f"{type(self).__name__}: n_microbatches must be a positive int, got {n_microbatches!r}")
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn
        self.scale_grads = scale_grads
        self.virtual_stages = virtual_stages
        #: measured compute intervals of the last ``step`` (``time.perf_counter`` seconds)
        self.last_events: list[Event] = []
        if self.stages:
            self._check_stages()

    # -- plan ------------------------------------------------------------------------------------------
    def _build(self, num_ranks: int) -> PipelinePlan:
        raise NotImplementedError

    def plan(self, num_stages: int | None = None) -> PipelinePlan:
        """The plan for ``num_stages`` pipeline ranks (default: the bound stages' group size)."""
        if num_stages is None:
            if not self.stages:
                raise ValueError(f"{type(self).__name__}.plan(): pass num_stages (no stage is bound)")
            num_stages = self.stages[0].group.size()
        return self._build(num_stages)

    def format(self, num_stages: int | None = None) -> str:
        """ASCII time-line of :meth:`plan` (unit forward and backward times)."""
        return format_schedule(self.plan(num_stages))

    def _check_stages(self) -> None:
        groups = {id(s.group) for s in self.stages}
        if len(groups) != 1:
            raise ValueError(f"{type(self).__name__}: every stage on this rank must share one pipeline group")
        size = self.stages[0].group.size()
        expected = size * self.virtual_stages
        for s in self.stages:
            if s.num_stages != expected:
                raise ValueError(f"{type(self).__name__}: stage {s.stage_index} was built with num_stages="
                                 f"{s.num_stages}, but {size} ranks x virtual_stages={self.virtual_stages} "
                                 f"make {expected} stages")
        if len(self.stages) != self.virtual_stages:
            raise ValueError(f"{type(self).__name__}: this rank must hold {self.virtual_stages} stage(s), got "
                             f"{len(self.stages)}")
        rank = self.stages[0].group.rank()
        want = list(stage_indices(rank, size, self.virtual_stages, style=self.placement))
        got = [s.stage_index for s in self.stages]
        if sorted(got) != sorted(want):
            raise ValueError(f"{type(self).__name__}: stages={got} on group rank {rank} do not follow the "
                             f"{self.placement!r} placement; pass the stages "
                             f"stage_indices({rank}, {size}, {self.virtual_stages}, style={self.placement!r}) = {want}")
        for s in self.stages:
            s.stage_index_to_group_rank = generate_stage_to_rank_mapping(size, expected, self.placement)

    # -- run -------------------------------------------------------------------------------------------
    def step(self, *args, target=None, losses: list | None = None, **kwargs):
        """Run one pipelined forward+backward over the batch; gradients accumulate in the stages.

        First stage: ``step(x)``; last stage: ``step(target=y, losses=[])``; others: ``step()``.
        Returns the per-micro-batch losses (detached tensors) on the last stage, else None;
        ``losses`` (a list) is extended with them too.
        """
        if not self.stages:
            raise RuntimeError(f"{type(self).__name__} was built from n_microbatches only (a plan); bind it to "
                               f"this rank's stage: {type(self).__name__}(stage, n_microbatches, loss_fn)")
        if kwargs:
            raise TypeError(f"step() got unexpected keyword arguments {sorted(kwargs)}; pass the batch "
                            "positionally on the first stage and target= on the last")
        m = self.n_microbatches
        by_index = {s.stage_index: s for s in self.stages}
        has_first = any(s.is_first for s in self.stages)
        has_last = any(s.is_last for s in self.stages)
        try:
            if has_first and len(args) != 1:
                raise ValueError("step(): the first stage needs the input batch: step(x)")
            if not has_first and args:
                raise ValueError("step(): only the first stage takes an input batch; call step() here "
                                 "(with target= on the last stage)")
            if has_last and self.loss_fn is not None and target is None:
                raise ValueError("step(): the last stage computes loss_fn(output, target): pass target=")
            if has_last and self.loss_fn is None:
                raise ValueError(f"{type(self).__name__}: the last stage needs loss_fn= to start backward")
            inputs = _split(args[0], m, "the input") if has_first else None
            targets = _split(target, m, "target") if has_last and target is not None else None
        except ValueError as exc:
            # only this rank sees its arguments: the others would wait for it until their timeout
            fail_before_execute(by_index, "checking step()'s arguments", exc)
            raise
        plan = self.plan()
        events: list[Event] = []
        by_mb = execute(plan.for_rank(self.stages[0].group.rank()), by_index, inputs, targets, self.loss_fn, m,
                        events, scale=(1.0 / m) if self.scale_grads else 1.0)
        self.last_events = events
        for s in self.stages:
            s.sync_gradients()
        if not has_last:
            return None
        out = [by_mb[i].detach() for i in range(m)]
        if losses is not None:
            losses.extend(out)
        return out


class ScheduleGPipe(PipelineSchedule):
    """GPipe: all forwards, then all backwards. ``ScheduleGPipe(stage, n_microbatches, loss_fn)``
    runs; ``ScheduleGPipe(n_microbatches).plan(num_stages)`` is the plan.

    Example::

        >>> from neural_arch.distributed.pipelining.schedules import format_schedule
        >>> print(format_schedule(ScheduleGPipe(2).plan(num_stages=2)))
        GPipe (ranks=2, microbatches=2)
        rank 0 | F0 F1 .. .. B0 B1
        rank 1 | .. F0 F1 B0 B1 ..
    """

    def _build(self, num_ranks: int) -> PipelinePlan:
        return gpipe_plan(num_ranks, self.n_microbatches)


class Schedule1F1B(PipelineSchedule):
    """1F1B (PipeDream-flush): same bubble as GPipe, at most ``p - r`` activations alive on rank r.

    Example::

        schedule = Schedule1F1B(PipelineStage(pipe[rank], rank, 2), n_microbatches=4, loss_fn=F.cross_entropy)
        losses = []
        schedule.step(x) if rank == 0 else schedule.step(target=y, losses=losses)
    """

    def _build(self, num_ranks: int) -> PipelinePlan:
        return one_f_one_b_plan(num_ranks, self.n_microbatches)


class _LoopMultiStage(PipelineSchedule):
    """Constructor shared by the loop-placement multi-stage schedules (interleaved 1F1B, interleaved
    zero bubble): ``cls(stages, n_microbatches, loss_fn)`` runs, ``cls(n_microbatches,
    virtual_stages)`` is a plan builder; v is the number of stages passed."""

    def __init__(self, stages_or_n_microbatches, n_microbatches_or_virtual: int | None = None,
                 loss_fn: Callable | None = None, scale_grads: bool = True):
        if isinstance(stages_or_n_microbatches, (PipelineStage, list, tuple)):
            stages = stages_or_n_microbatches
            v = len(stages) if isinstance(stages, (list, tuple)) else 1
            super().__init__(stages, n_microbatches_or_virtual, loss_fn, scale_grads, virtual_stages=v)
        else:
            v = 1 if n_microbatches_or_virtual is None else n_microbatches_or_virtual
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{type(self).__name__}: virtual_stages must be a positive int, got {v!r}")
            super().__init__(stages_or_n_microbatches, None, loss_fn, scale_grads, virtual_stages=v)


class ScheduleInterleaved1F1B(_LoopMultiStage):
    """Interleaved 1F1B: each rank holds ``virtual_stages`` stages (``s, s+p, ...``).

    Run: ``ScheduleInterleaved1F1B([stage_r, stage_r_plus_p, ...], n_microbatches, loss_fn)``;
    plan: ``ScheduleInterleaved1F1B(n_microbatches, virtual_stages).plan(num_stages)``.

    Example::

        >>> ScheduleInterleaved1F1B(4, 2).plan(num_stages=2).num_stages     # 2 ranks, 2 stages each
        4
    """

    def _build(self, num_ranks: int) -> PipelinePlan:
        return interleaved_1f1b_plan(num_ranks, self.n_microbatches, self.virtual_stages)


class ScheduleInterleavedZeroBubble(_LoopMultiStage):
    """Interleaved zero bubble (torch's name): interleaved 1F1B's loop placement -- rank r holds
    stages ``r, r+p, ...`` -- with each backward split into ``B`` (input gradient) and ``W`` (weight
    gradients, deferred into idle slots); interleaved 1F1B's peak activation memory, a smaller bubble
    (about a third of it when F, B and W take equal time), any ``n_microbatches >= 1``
    (:mod:`.zero_bubble_interleaved`).
    Same gradients as interleaved 1F1B on the same stages, bitwise.

    Run: ``ScheduleInterleavedZeroBubble([stage_r, stage_r_plus_p, ...], n_microbatches, loss_fn)``
    (the stages ``stage_indices(rank, p, v)``); ``step(x)`` on rank 0, ``step(target=y)`` on rank
    p-1. Plan: ``ScheduleInterleavedZeroBubble(n_microbatches, virtual_stages).plan(num_stages=p)``.
    ``costs=(f, b, w)`` (keyword, not in torch): relative F, B, W durations as small ints, the same
    on every rank, as for :class:`ScheduleZBVZeroBubble`.

    Example::

        >>> plan = ScheduleInterleavedZeroBubble(4, 2).plan(num_stages=2)
        >>> plan.num_stages, any(a.kind == "W" for a in plan.compute(0))
        (4, True)
    """

    def __init__(self, stages_or_n_microbatches, n_microbatches_or_virtual: int | None = None,
                 loss_fn: Callable | None = None, scale_grads: bool = True, *,
                 costs: tuple[int, int, int] = (1, 1, 1)):
        self.costs = check_costs(costs)  # in the caller, before any step
        super().__init__(stages_or_n_microbatches, n_microbatches_or_virtual, loss_fn, scale_grads)

    def _build(self, num_ranks: int) -> PipelinePlan:
        return interleaved_zero_bubble_plan(num_ranks, self.n_microbatches, self.virtual_stages, self.costs)


class ScheduleZBH1(PipelineSchedule):
    """Zero-bubble ZB-H1: 1F1B's order with each backward split into ``B`` (input gradient, on the
    critical path) and ``W`` (Linear weight gradients, deferred into idle slots); at most p
    micro-batches between F and W on any rank (1F1B's peak). Same gradients as 1F1B, bitwise.

    Run: ``ScheduleZBH1(stage, n_microbatches, loss_fn)``; plan: ``ScheduleZBH1(m).plan(num_stages)``
    (see :mod:`.zero_bubble`).

    Example::

        >>> from neural_arch.distributed.pipelining.schedules import format_schedule
        >>> print(format_schedule(ScheduleZBH1(2).plan(num_stages=2)))
        ZB-H1 (ranks=2, microbatches=2)
        rank 0 | F0 F1 .. B0 W0 B1 W1
        rank 1 | .. F0 B0 F1 B1 W0 W1
    """

    def _build(self, num_ranks: int) -> PipelinePlan:
        return zero_bubble_plan(num_ranks, self.n_microbatches)


class ScheduleZBVZeroBubble(PipelineSchedule):
    """ZB-V (torch's name): two stages per rank in a V -- rank r holds stages ``r`` and ``2p-1-r`` --
    each backward split into ``B`` and ``W`` as in ZB-H1; 1F1B's peak activation memory, half of
    ZB-H1's bubble at equal work (:mod:`.zero_bubble_v`).

    Run: ``ScheduleZBVZeroBubble([stage_r, stage_2p_1_r], n_microbatches, loss_fn)`` (build the
    stages ``stage_indices(rank, p, 2, style="v")`` of a model cut into ``2p`` stages); then
    ``step(x, target=y, losses=[])`` on rank 0, which holds the first *and* the last stage, and
    ``step()`` elsewhere. Plan: ``ScheduleZBVZeroBubble(m).plan(num_stages=p)``.

    ``costs=(f, b, w)`` (keyword, not in torch): the measured relative durations of a stage's F, B
    and W as small ints; the plan is then built for them (the default V is bubble-free only for
    equal costs). Pass the same value on every rank.

    Example::

        stages = [PipelineStage(parts[s], s, 2 * p) for s in stage_indices(rank, p, 2, style="v")]
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=4, loss_fn=F.cross_entropy)
        schedule.step(x, target=y, losses=[]) if rank == 0 else schedule.step()
    """

    placement = "v"

    def __init__(self, stages_or_n_microbatches, n_microbatches: int | None = None,
                 loss_fn: Callable | None = None, scale_grads: bool = True, *,
                 costs: tuple[int, int, int] = (1, 1, 1)):
        self.costs = check_costs(costs)  # in the caller, before any step
        if isinstance(stages_or_n_microbatches, PipelineStage):
            # a wrong count of stages (one instead of two): ValueError, like the list case below
            raise ValueError("ScheduleZBVZeroBubble: stages must be a list of this rank's 2 stages "  # noqa: TRY004
                             "[stage r, stage 2p-1-r] (V placement), got one PipelineStage; build them with "
                             "stage_indices(rank, p, 2, style='v')")
        if isinstance(stages_or_n_microbatches, (list, tuple)) and len(stages_or_n_microbatches) != 2:
            raise ValueError(f"ScheduleZBVZeroBubble: stages must hold exactly 2 stages per rank (V placement), got "
                             f"{len(stages_or_n_microbatches)}; pass the stages stage_indices(rank, p, 2, style='v')")
        super().__init__(stages_or_n_microbatches, n_microbatches, loss_fn, scale_grads, virtual_stages=2)

    def _build(self, num_ranks: int) -> PipelinePlan:
        return zero_bubble_v_plan(num_ranks, self.n_microbatches, self.costs)


def stage_indices(rank: int, num_ranks: int, virtual_stages: int = 1, style: str = "loop") -> Sequence[int]:
    """The stage indices pipeline rank ``rank`` holds.

    ``style="loop"``: ``rank, rank + p, ...`` (``virtual_stages`` of them; GPipe, 1F1B, interleaved,
    ZB-H1, interleaved zero bubble). ``style="v"`` (``ScheduleZBVZeroBubble``,
    ``virtual_stages=2``): ``rank, 2p-1-rank``.

    >>> stage_indices(0, 2, 2), stage_indices(0, 2, 2, style="v")
    ([0, 2], [0, 3])
    """
    if style == "v" and virtual_stages != 2:
        raise ValueError(f"stage_indices(style='v'): the V placement holds exactly 2 stages per rank; pass "
                         f"virtual_stages=2, got {virtual_stages!r}")
    num_stages = num_ranks * virtual_stages   # the inverse of the one placement rule, stage_to_rank
    return [s for s in range(num_stages) if stage_to_rank(s, num_ranks, num_stages, style) == rank]


__all__ = ["PipelineSchedule", "Schedule1F1B", "ScheduleGPipe", "ScheduleInterleaved1F1B",
           "ScheduleInterleavedZeroBubble", "ScheduleZBH1", "ScheduleZBVZeroBubble", "stage_indices"]
