"""Run one rank's list of pipeline actions: the only place a schedule turns into compute and p2p.

For every action of :class:`~neural_arch.distributed.pipelining.schedules.Action`:

* ``RECV_F`` / ``RECV_B`` post an asynchronous receive (the first activation of a step on an
  edge is preceded by the shape header, see :mod:`.p2p`); ``F`` / ``B`` wait for it;
* ``F`` / ``B`` run the stage's forward / backward of one micro-batch;
* ``SEND_F`` / ``SEND_B`` post an ``isend`` and go on computing while it travels; every send is
  waited for (with the backend's timeout) before :func:`execute` returns.

* ``W`` (zero-bubble schedules) adds one micro-batch's deferred weight gradients.
* two consecutive stages on this rank (ZB-V's stages ``p-1`` and ``p``; interleaved on one rank)
  hand over locally: the plan has no SEND/RECV between them, the ``F`` of the later stage takes
  a copy of the earlier one's output and the ``B`` of the earlier stage takes the later one's
  input gradient -- the same arrays a message would carry, so results do not depend on placement.

A failed or timed-out send/receive raises :class:`~.p2p.PipelineError` naming this stage, the
peer stage and both global ranks; it is prefixed with the stage that caused the failure, which
every rank learns through :mod:`~neural_arch.distributed.pipelining.failure` (a dead stage two hops
away included).

Example::

    events = []
    losses = execute(plan.for_rank(rank), stages, inputs, targets, loss_fn, n_microbatches, events)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from neural_arch.distributed.pipelining import failure, p2p
from neural_arch.distributed.pipelining.schedules import (
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    Action,
    B,
    Event,
    F,
    W,
)
from neural_arch.distributed.pipelining.stage import PipelineStage


class _Step:
    """State of one ``execute`` call on one rank."""

    def __init__(self, stages: dict[int, PipelineStage], n_microbatches: int):
        self.stages = stages
        self.m = n_microbatches
        any_stage = next(iter(stages.values()))
        self.group = any_stage.group
        self.backend = any_stage.group.backend
        self.recvs: dict[tuple, tuple] = {}    # (kind, mb, stage) -> (work, buffer)
        self.sends: list[tuple] = []           # (work, buffer, describe)
        self.outputs: dict[tuple, np.ndarray] = {}  # (F|B, mb, stage) -> array to send
        self.meta_seen: set = set()            # edges whose header went/came this step
        self.act_shape: dict[int, tuple] = {}  # stage -> (shape, dtype) of its output (for RECV_B)
        self.losses: dict[int, object] = {}

    def describe(self, a: Action):
        stage = self.stages.get(a.stage)
        peer_stage = a.stage + 1 if a.kind in (SEND_F, RECV_B) else a.stage - 1
        peer_global = self.group.global_rank(a.peer) if a.peer is not None else "?"
        me = self.group.ranks[self.group.rank()]
        verb = {SEND_F: "sending the activation of micro-batch {mb} to",
                RECV_F: "receiving the activation of micro-batch {mb} from",
                SEND_B: "sending the input gradient of micro-batch {mb} to",
                RECV_B: "receiving the output gradient of micro-batch {mb} from"}[a.kind].format(mb=a.microbatch)
        n = stage.num_stages if stage is not None else "?"

        def describe():
            return (f"pipeline stage {a.stage} of {n} (global rank {me}): {verb} stage {peer_stage} "
                    f"(global rank {peer_global})")
        describe.action = a  # a failed wait reports which exchange it was (see failure.py)
        return describe


def execute(actions: Sequence[Action], stages: dict[int, PipelineStage], inputs: Sequence | None,
            targets: Sequence | None, loss_fn, n_microbatches: int, events: list[Event] | None = None,
            scale: float | None = None) -> dict[int, object]:
    """Run ``actions`` (one rank's list) with ``stages`` (stage index -> PipelineStage on this rank).

    ``inputs`` / ``targets``: per-micro-batch arrays for the first / last stage (None elsewhere).
    Backward of the last stage starts from ``loss * scale`` (default ``1 / n_microbatches``, so
    the accumulated gradients equal those of the mean loss over the whole batch). Returns
    ``{microbatch: loss}`` on the rank with the last stage; ``events`` collects measured
    compute intervals (``time.perf_counter``).

    A stage with ``W`` actions in ``actions`` runs split backwards: its ``B`` computes input
    gradients only and its ``W`` the Linear weight gradients (:mod:`.weight_grad`).

    If the step fails, every rank's error names the stage that caused it
    (:mod:`~neural_arch.distributed.pipelining.failure`).

    Example::

        plan = one_f_one_b_plan(num_stages=2, n_microbatches=4)
        losses = execute(plan.for_rank(rank), {rank: stage}, inputs, targets, loss_fn, n_microbatches=4)
    """
    st = _Step(stages, n_microbatches)
    scale = 1.0 / n_microbatches if scale is None else scale
    backend = st.backend
    split = {a.stage for a in actions if a.kind == W}
    step = failure.next_step(st.group)
    a = None
    try:
        for a in actions:
            stage = stages.get(a.stage)
            if stage is None:
                raise ValueError(f"the schedule runs stage {a.stage} on this rank, but this rank holds stages "
                                 f"{sorted(stages)}; build the schedule from this rank's stages")
            if a.kind == RECV_F:
                _post_recv_activation(st, a, stage.xp)
            elif a.kind == RECV_B:
                shape, dtype = st.act_shape[a.stage]
                buf = stage.xp.empty(shape, dtype)   # on the stage's device: no host staging
                describe = st.describe(a)
                tag = p2p.edge_tag(a.stage + 1, False)
                work = p2p.start(lambda buf=buf, a=a, tag=tag: backend.recv(buf, a.peer, tag, async_op=True), describe)
                st.recvs[(B, a.microbatch, a.stage)] = (work, buf, describe)
            elif a.kind == F:
                x = inputs[a.microbatch] if stage.is_first else _take(st, F, a)
                t0 = time.perf_counter()
                target = targets[a.microbatch] if stage.is_last and targets is not None else None
                out = stage.forward_one_chunk(a.microbatch, x, target, loss_fn, split_backward=a.stage in split)
                if stage.is_last:
                    st.losses[a.microbatch] = stage._cache[a.microbatch][2]
                else:
                    arr = stage.xp.ascontiguousarray(out.data)
                    st.outputs[(F, a.microbatch, a.stage)] = arr
                    st.act_shape[a.stage] = (arr.shape, arr.dtype)
                if events is not None:
                    events.append(Event(st.group.rank(), a, t0, time.perf_counter()))
            elif a.kind == B:
                grad = None if stage.is_last else _take(st, B, a)
                t0 = time.perf_counter()
                gin = stage.backward_one_chunk(a.microbatch, grad, scale)
                if gin is not None:
                    st.outputs[(B, a.microbatch, a.stage)] = gin
                if events is not None:
                    events.append(Event(st.group.rank(), a, t0, time.perf_counter()))
            elif a.kind == W:
                t0 = time.perf_counter()
                stage.backward_weight_one_chunk(a.microbatch)
                if events is not None:
                    events.append(Event(st.group.rank(), a, t0, time.perf_counter()))
            elif a.kind in (SEND_F, SEND_B):
                _send(st, a)
            else:
                raise ValueError(f"unknown pipeline action kind {a.kind!r}")
        a = None
        for work, _buf, describe in st.sends:
            p2p.wait(work, backend, describe)
    except BaseException as exc:
        for stage in stages.values():
            stage.clear()
        if isinstance(exc, Exception) and st.group.size() > 1:
            named = _name_culprit(st, step, a, exc)
            if named is not None:
                raise named from exc
        raise
    return st.losses


def fail_before_execute(stages: dict, what: str, exc: Exception) -> None:
    """This rank's ``schedule.step()`` refused its arguments (a batch that does not split into the
    micro-batches, a missing target): tell the other pipeline ranks, as a failed action would.

    They are already waiting for this rank's first activation or gradient; without this they would
    wait until the group's timeout. The step is numbered as :func:`execute` numbers it, this rank is
    recorded as the culprit and the group poisoned, so every rank raises at once naming this stage.

    Example::

        try:
            inputs = _split(x, m, "the input")
        except ValueError as exc:
            fail_before_execute({0: stage}, "step()'s arguments", exc)
            raise
    """
    group = next(iter(stages.values())).group
    if group.size() < 2:
        return
    _blame_self(group, failure.next_step(group), min(stages), what, -1, exc)


def _blame_self(group, step: int, stage: int, what: str, microbatch: int, exc: Exception) -> None:
    """This rank's own action (or its arguments) failed: record it as the step's culprit, poison the
    group so every waiting rank raises at once naming it, and note that on ``exc``."""
    me = group.ranks[group.rank()]
    error = f"{type(exc).__name__}: {str(exc)[:1500]}"
    failure.record(group, step, me, {"kind": "self", "rank": me, "stage": stage, "action": what,
                                     "microbatch": microbatch, "error": error})
    where = f" (micro-batch {microbatch})" if microbatch >= 0 else ""
    text = f"pipeline stage {stage} (global rank {me}) failed in {what}{where}: {error}"
    failure.poison(group, text)
    exc.add_note(text + "; the other pipeline stages were told")


def _name_culprit(st: _Step, step: int, a: Action | None, exc: Exception) -> Exception | None:
    """Record this rank's part in the failed step, find the culprit, return the error to raise
    (None: re-raise ``exc`` itself, with a note). See :mod:`~neural_arch.distributed.pipelining.failure`."""
    group = st.group
    me = group.ranks[group.rank()]
    if isinstance(exc, p2p.PipelineError) and exc.action is not None:
        a = exc.action
        peer_stage = a.stage + 1 if a.kind in (SEND_F, RECV_B) else a.stage - 1
        peer = group.global_rank(a.peer)
        theirs = {SEND_F: RECV_F, RECV_F: SEND_F, SEND_B: RECV_B, RECV_B: SEND_B}[a.kind]
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        failure.record(group, step, me, {
            "kind": "wait", "rank": me, "stage": a.stage, "peer": peer, "peer_stage": peer_stage,
            "action": f"{theirs}{a.microbatch}@s{peer_stage}", "microbatch": a.microbatch,
            "error": f"{type(cause).__name__}: {str(cause)[:1500]}"})
        found = failure.culprit(group, step, me)
        if found is None:
            return None
        return p2p.PipelineError(f"{found[1]} -- seen on stage {a.stage} (global rank {me}) as: {exc}")
    # this rank's own action failed (compute, or the schedule itself): it is the culprit
    if a is None:
        _blame_self(group, step, min(st.stages), "waiting for its sends", -1, exc)
    else:
        _blame_self(group, step, a.stage, str(a), a.microbatch, exc)
    return None


def _post_recv_activation(st: _Step, a: Action, xp=np) -> None:
    backend = st.backend
    tag = p2p.edge_tag(a.stage - 1, True)
    describe = st.describe(a)
    if a.stage not in st.meta_seen:  # first activation of this step on this edge: the header first
        meta = np.empty(p2p.META_LEN, np.int64)
        work = p2p.start(lambda: backend.recv(meta, a.peer, tag, async_op=True), describe)
        p2p.wait(work, backend, describe)
        st.meta_seen.add(a.stage)
        st.act_shape[("in", a.stage)] = p2p.decode_meta(meta)
    shape, dtype = st.act_shape[("in", a.stage)]
    buf = xp.empty(shape, dtype)
    work = p2p.start(lambda: backend.recv(buf, a.peer, tag, async_op=True), describe)
    st.recvs[(F, a.microbatch, a.stage)] = (work, buf, describe)


def _take(st: _Step, kind: str, a: Action) -> np.ndarray:
    src = a.stage - 1 if kind == F else a.stage + 1
    if src in st.stages:  # local hand-off: the neighbouring stage ran on this rank, earlier in the list
        try:
            # a copy, as a message would deliver: the two stages never share a buffer
            return st.outputs.pop((kind, a.microbatch, src)).copy()
        except KeyError:
            raise ValueError(f"the schedule runs {a} before {kind}{a.microbatch}@s{src}, whose output it takes "
                             "over on this rank; run the neighbouring stage first") from None
    try:
        work, buf, describe = st.recvs.pop((kind, a.microbatch, a.stage))
    except KeyError:
        what = "RECV_F" if kind == F else "RECV_B"
        raise ValueError(f"the schedule runs {a} before its {what}; every F of a stage > 0 and every B of a "
                         "stage before the last needs a receive first (see schedules.with_communication)") from None
    p2p.wait(work, st.backend, describe)
    return buf


def _send(st: _Step, a: Action) -> None:
    kind = F if a.kind == SEND_F else B
    try:
        arr = st.outputs.pop((kind, a.microbatch, a.stage))
    except KeyError:
        raise ValueError(f"the schedule runs {a} before the {kind}{a.microbatch} that produces it") from None
    backend = st.backend
    tag = p2p.edge_tag(a.stage, kind == F)
    describe = st.describe(a)
    if kind == F and ("out", a.stage) not in st.meta_seen:
        meta = p2p.encode_meta(arr)
        st.meta_seen.add(("out", a.stage))
        st.sends.append((p2p.start(lambda: backend.send(meta, a.peer, tag, async_op=True), describe), meta, describe))
    # finished sends release their buffers (and report failures early); the rest stay referenced
    pending = []
    for item in st.sends:
        if item[0].is_completed():
            p2p.wait(item[0], backend, item[2])
        else:
            pending.append(item)
    st.sends = pending
    st.sends.append((p2p.start(lambda: backend.send(arr, a.peer, tag, async_op=True), describe), arr, describe))


__all__ = ["execute"]
