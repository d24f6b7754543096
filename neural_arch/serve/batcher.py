"""Continuous batching on rank 0: which requests join, decode and leave at each step, and how every
tensor-parallel rank is told.

A **step** is what every rank does together (``decode_step.DecodeEngine.step``): drop the caches of the
requests that left, run the prompt of each request that joins (its prefill, one token), then one
decode step of the running batch (one token for each running request). A request that arrives
while others are decoding joins at the **next** step -- it does not wait for the batch to finish --
and a request that has its ``max_new_tokens`` leaves the batch at once, freeing its place
(``max_batch`` requests run at a time; the others wait in arrival order). A request whose client
went away (:meth:`ContinuousBatcher.cancel`, called by its HTTP thread) leaves at the next step too:
its slot is free for a waiting request and its caches are dropped on every rank.

Rank 0 decides; the other ranks only follow, so they must be told each step exactly: rank 0
**broadcasts the step plan** (:class:`StepPlan`, an int64 array: never a pickle) before every step,
and every rank applies it to its own shard of the caches. It is **one broadcast** of a fixed size that
every rank computes alike (:func:`plan_capacity`: ``max_batch`` leaves, joins and decodes, and the
prompt tokens of the step's joins, which rank 0 keeps within ``max_prefill_tokens``, a prefill
budget like vLLM's ``max_num_batched_tokens``: the joins past it wait for the next step), so the
other ranks need no length first. The tokens need no message of their own: the tensor-parallel
token choice gives every rank the same ones. When nothing is running, rank 0
still broadcasts an empty plan every ``heartbeat`` seconds, so the other ranks never wait long
enough to time out, and a rank that died is noticed within one heartbeat.

Example (rank 0; ``engine`` is the ``decode_step.DecodeEngine`` every rank has)::

    batcher = ContinuousBatcher(max_batch=8, max_prefill_tokens=block_size)
    active = batcher.submit(GenerationRequest(prompt=[1, 2, 3], max_new_tokens=4))   # an HTTP thread
    plan = batcher.next_plan(wait_s=0.5)                                            # the main thread
    broadcast_plan(group, plan, plan_capacity(8, block_size))
    batcher.deliver(plan, engine.step(plan, batcher.sample_token))
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from neural_arch.nn.transformer import _next_token
from neural_arch.serve.protocol import GenerationRequest

__all__ = ["ActiveRequest", "ContinuousBatcher", "StepPlan", "broadcast_plan", "plan_capacity", "receive_plan"]

IDLE, STEP, STOP = 0, 1, 2


@dataclass
class StepPlan:
    """One step for every rank: ``leaves`` (slots whose caches go), ``joins`` (``(slot, sample,
    prompt)``: prefill these) and ``decode`` (``(slot, sample)``: one token each, in this order), and
    ``inputs``, each decoding slot's last token (what a pipeline's first stage embeds; a
    tensor-parallel rank already knows it, having chosen it with the others).

    ``sample`` says whether the slot's request samples (then the step gathers the logits and keeps
    rank 0's draw) or is greedy. Encoded as one int64 array by :meth:`encode`.

    Example::

        >>> plan = StepPlan(STEP, 7, leaves=[2], joins=[(3, False, [5, 6])], decode=[(1, True)])
        >>> StepPlan.decode_array(plan.encode()) == plan
        True
    """

    kind: int
    index: int
    leaves: list = field(default_factory=list)
    joins: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    inputs: list = field(default_factory=list)

    def encode(self) -> np.ndarray:
        """``[kind, index, #leaves, #joins, #decode, #inputs, leaves..., (slot, sample, len, prompt...)...,
        (slot, sample)..., inputs...]``."""
        out = [self.kind, self.index, len(self.leaves), len(self.joins), len(self.decode), len(self.inputs),
               *self.leaves]
        for slot, sample, prompt in self.joins:
            out += [slot, int(sample), len(prompt), *prompt]
        for slot, sample in self.decode:
            out += [slot, int(sample)]
        out += self.inputs
        return np.asarray(out, dtype=np.int64)

    @classmethod
    def decode_array(cls, a) -> StepPlan:
        """The plan :meth:`encode` wrote."""
        v = [int(x) for x in a]
        kind, index, n_leave, n_join, n_decode, n_input = v[:6]
        at = 6
        leaves = v[at:at + n_leave]
        at += n_leave
        joins = []
        for _ in range(n_join):
            slot, sample, n = v[at:at + 3]
            joins.append((slot, bool(sample), v[at + 3:at + 3 + n]))
            at += 3 + n
        decode = [(v[at + 2 * i], bool(v[at + 2 * i + 1])) for i in range(n_decode)]
        at += 2 * n_decode
        return cls(kind, index, leaves, joins, decode, v[at:at + n_input])


def plan_capacity(max_batch: int, max_prefill_tokens: int) -> int:
    """The int64 entries of the largest :meth:`StepPlan.encode`: the size of the one broadcast per step.

    At most ``max_batch`` requests run, so a step has at most ``max_batch`` leaves, and joins and
    decodes (with their headers and inputs) for ``max_batch`` requests together; its joins' prompts
    hold at most ``max_prefill_tokens`` tokens.

    Example::

        >>> plan_capacity(max_batch=8, max_prefill_tokens=256)        # about 2.5 KiB a step
        310
    """
    return 6 + 6 * int(max_batch) + int(max_prefill_tokens)


def broadcast_plan(group, plan: StepPlan, capacity: int) -> None:
    """Rank 0 sends ``plan`` to the group: **one** broadcast of ``capacity`` int64 entries (the
    plan's length first, then the plan, then zeros), ``capacity`` from :func:`plan_capacity`.

    Example::

        broadcast_plan(group, batcher.next_plan(0.5), capacity)   # rank 0; the others: receive_plan(group, capacity)
    """
    if group is None or group.size() == 1:
        return
    payload = plan.encode()
    if payload.size + 1 > capacity:
        raise ValueError(f"broadcast_plan: the plan has {payload.size} entries, more than the {capacity - 1} "
                         "plan_capacity allows; the batcher keeps within max_batch and max_prefill_tokens")
    buf = np.zeros(capacity, dtype=np.int64)
    buf[0] = payload.size
    buf[1:1 + payload.size] = payload
    group.backend.broadcast(buf, root=0)


def receive_plan(group, capacity: int) -> StepPlan:
    """The plan rank 0 broadcast (the other ranks' side of :func:`broadcast_plan`, the same ``capacity``).

    Example::

        plan = receive_plan(group, capacity)      # blocks until rank 0's next step or heartbeat
    """
    buf = np.zeros(capacity, dtype=np.int64)
    group.backend.broadcast(buf, root=0)
    return StepPlan.decode_array(buf[1:1 + int(buf[0])])


class ActiveRequest:
    """A request inside the server: its tokens so far and the events its HTTP thread reads.

    ``events`` yields ``("token", id)`` per token, then ``("done", None)``, or ``("error", status,
    sentence)``. ``first_step`` / ``last_step`` are the steps of its first and last token (two
    requests whose ranges overlap were decoded in the same batch).

    Example::

        >>> a = ActiveRequest(GenerationRequest(prompt=[1]), slot=0)
        >>> a.push(5, step=3); a.events.get_nowait(), a.first_step
        (('token', 5), 3)
    """

    def __init__(self, request: GenerationRequest, slot: int):
        self.request = request
        self.slot = slot
        self.tokens: list[int] = []
        self.events: queue.Queue = queue.Queue()
        self.generator = np.random.default_rng(request.seed)
        self.prefilled = False
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.submitted = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        #: Set by :meth:`ContinuousBatcher.cancel` (its client went away); it leaves at the next step.
        self.cancelled = False

    def push(self, token: int, step: int) -> None:
        """One more token, chosen at ``step``."""
        if self.first_step is None:
            self.first_step, self.first_token_at = step, time.monotonic()
        self.last_step = step
        self.tokens.append(int(token))
        self.events.put(("token", int(token)))

    @property
    def done(self) -> bool:
        """It has all the tokens it asked for."""
        return len(self.tokens) >= self.request.max_new_tokens

    def finish(self) -> None:
        self.finished_at = time.monotonic()
        self.events.put(("done", None))

    def fail(self, status: int, message: str) -> None:
        self.events.put(("error", status, message))


class ContinuousBatcher:
    """Rank 0's queue and running batch (thread-safe: HTTP threads submit, the main thread steps).

    Args:
        max_batch: requests decoded together at most; later ones wait in arrival order.
        max_prefill_tokens: prompt tokens that join in one step at most (None: no limit); a step's
            first join always fits, so it must be at least the longest prompt (``block_size - 1``).

    Example::

        >>> b = ContinuousBatcher(max_batch=2)
        >>> a = b.submit(GenerationRequest(prompt=[1, 2], max_new_tokens=1))
        >>> plan = b.next_plan(wait_s=0)
        >>> plan.joins, plan.decode
        ([(0, False, [1, 2])], [])
        >>> b.deliver(plan, {0: 9}); a.tokens, b.next_plan(wait_s=0).leaves
        ([9], [0])
    """

    def __init__(self, max_batch: int = 8, max_prefill_tokens: int | None = None):
        if int(max_batch) < 1:
            raise ValueError(f"ContinuousBatcher: max_batch must be >= 1, got {max_batch}")
        if max_prefill_tokens is not None and int(max_prefill_tokens) < 1:
            raise ValueError(f"ContinuousBatcher: max_prefill_tokens must be >= 1 or None, got {max_prefill_tokens}")
        self.max_batch = int(max_batch)
        self.max_prefill_tokens = None if max_prefill_tokens is None else int(max_prefill_tokens)
        #: Requests cancelled so far (their clients went away), for /health.
        self.cancelled = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: deque[ActiveRequest] = deque()
        self._running: dict[int, ActiveRequest] = {}
        self._leaving: list[int] = []
        self._slots = itertools.count()
        self.step_index = 0
        #: None while serving; the sentence saying why not once the ranks failed or stopped.
        self.failed: str | None = None

    def submit(self, request: GenerationRequest) -> ActiveRequest:
        """Queue ``request``; it joins the running batch at the next step with a free place."""
        with self._lock:
            if self.failed is not None:
                raise RuntimeError(self.failed)
            active = ActiveRequest(request, next(self._slots))
            self._waiting.append(active)
        self._wake.set()
        return active

    def counts(self) -> dict:
        """``{"running": n, "waiting": n, "steps": n}`` for /health."""
        with self._lock:
            return {"running": len(self._running), "waiting": len(self._waiting), "steps": self.step_index}

    def next_plan(self, wait_s: float) -> StepPlan:
        """The next step: leaves, joins (up to ``max_batch`` running), decode of the running prefilled
        requests. With nothing to do it waits up to ``wait_s`` for a request, then returns an IDLE plan
        (the heartbeat)."""
        with self._lock:
            idle = not self._running and not self._waiting
            if idle:
                self._wake.clear()
        if idle and wait_s > 0:
            self._wake.wait(wait_s)
        with self._lock:
            if any(a.cancelled for a in self._waiting):
                self._waiting = deque(a for a in self._waiting if not a.cancelled)
            for slot in [slot for slot, a in self._running.items() if a.cancelled]:
                del self._running[slot]      # only this (the stepping) thread changes the running batch
                self._leaving.append(slot)
            leaves, self._leaving = self._leaving, []
            decoding = [a for a in self._running.values() if a.prefilled]
            decode = [(a.slot, a.request.sampling) for a in decoding]
            inputs = [a.tokens[-1] for a in decoding]
            joins, budget = [], self.max_prefill_tokens
            while self._waiting and len(self._running) < self.max_batch:
                a = self._waiting[0]
                if budget is not None and joins and len(a.request.prompt) > budget:
                    break                    # the prefill budget of this step is spent: it joins next step
                self._waiting.popleft()
                if budget is not None:
                    budget -= len(a.request.prompt)
                self._running[a.slot] = a
                joins.append((a.slot, a.request.sampling, list(a.request.prompt)))
            kind = STEP if joins or decode else IDLE
            plan = StepPlan(kind, self.step_index, leaves, joins, decode, inputs)
            if kind == STEP:
                self.step_index += 1
            return plan

    def deliver(self, plan: StepPlan, tokens: dict) -> None:
        """Hand each slot's new token to its request; finished requests leave at the next step."""
        with self._lock:
            for slot, token in tokens.items():
                a = self._running[slot]
                a.prefilled = True
                if a.cancelled:
                    continue                 # nobody reads it; next_plan lets it go
                a.push(token, plan.index)
                if a.done:
                    del self._running[slot]
                    self._leaving.append(slot)
                    a.finish()

    def cancel(self, active: ActiveRequest) -> None:
        """``active``'s client went away: it leaves at the next step (waiting, it never joins), its
        slot and caches freed. Called from its HTTP thread; a finished request is left alone.

        Example::

            >>> b = ContinuousBatcher(max_batch=1)
            >>> a = b.submit(GenerationRequest(prompt=[1], max_new_tokens=5))
            >>> b.deliver(b.next_plan(wait_s=0), {0: 4}); b.cancel(a)
            >>> plan = b.next_plan(wait_s=0)
            >>> plan.leaves, plan.decode, b.counts()["running"], b.cancelled
            ([0], [], 0, 1)
        """
        with self._lock:
            if active.cancelled or active.finished_at is not None or self.failed is not None:
                return
            active.cancelled = True
            self.cancelled += 1
        self._wake.set()

    def sample_token(self, slot: int, logits) -> int:
        """Rank 0's draw for a sampling request from its whole-vocabulary logits ``(1, V)``."""
        a = self._running[slot]
        r = a.request
        xp = np
        return int(_next_token(logits, True, r.temperature, r.top_k, r.top_p, a.generator, xp)[0])

    def fail_all(self, status: int, message: str) -> list[ActiveRequest]:
        """Fail every running and waiting request with ``status`` and ``message``; refuse new ones."""
        with self._lock:
            self.failed = message
            victims = list(self._running.values()) + list(self._waiting)
            self._running.clear()
            self._waiting.clear()
        for a in victims:
            a.fail(status, message)
        self._wake.set()
        return victims
