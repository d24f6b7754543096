"""Pipeline-parallel generation: each stage holds its blocks' KV caches, several requests in flight.

Training pipelines overlap stages with micro-batches (1F1B); decoding has no backward, but it has
a loop instead: the token that the **last** stage chooses for step ``s`` is the input of the
**first** stage at step ``s + 1``. One request alone therefore keeps one stage busy at a time (a
bubble of ``(p - 1) / p``). With ``m`` requests (micro-batches) in flight every stage goes round
them in a fixed order, ``for step: for request:`` -- while stage ``k`` runs request ``r`` the others
run requests ``r - 1``, ``r - 2``, ... -- and with ``m >= p`` the token of request ``r`` is back at
the first stage before its turn comes again, so no stage waits in the steady state.

The schedule is plain data (:func:`decode_plan`: one list of :class:`DecodeAction` per stage, as
the training schedules are), printed by :func:`format_decode_timeline` and simulated by
:func:`simulate_decode` (the unit tests check deadlock freedom and the makespan against
:func:`decode_makespan`); :class:`PipelineGenerator` runs exactly these lists on real ranks.

=============================  ==============================================================
unit forward per stage         makespan of ``n`` steps of ``m`` requests over ``p`` stages
=============================  ==============================================================
``m >= p`` (pipeline full)     ``n m + p - 1``: every stage busy but for the fill and drain
``m < p``                      ``n p + m - 1``: the token loop (``p`` stages long) is the limit
=============================  ==============================================================

What each stage holds and sends:

* **KV caches**: stage ``k`` runs blocks ``[start, stop)`` of the GPT (split as
  :func:`~neural_arch.distributed.pipelining.split.pipeline` splits it) and keeps one
  :class:`~neural_arch.nn.kv_cache.KVCache` per request for those blocks only: ``1 / p`` of the
  single-process cache per rank.
* **Activations** ``(B_r, T, n_embd)`` go forward on one tag per edge (``T`` = the prompt's length
  at the prefill, 1 after), flattened with one more element: 1, or 0 for a leave (below); every
  rank is called with the same prompts, so each receiver knows the shape and no header is sent.
* **Tokens** ``(B_r,)`` int64 and an "ended" flag go from the last stage back to the first on their
  own tag.
* The first stage embeds (positions per sequence, as ``GPT.forward`` counts them: left padding with
  an ``attention_mask`` is supported), the last applies ``ln_f`` and the head and chooses the token
  (greedy, or sampling with the request's own generator: the same rule as ``GPT.generate``).
* At the end the last stage broadcasts every request's tokens, so every rank returns them.

With ``eos_token_id`` a request whose sequences all emitted it **leaves the schedule** at that step
(the others go on): the token the last stage sends back carries an "ended" flag, the first stage
then sends a leave in place of the request's next activation, and each middle stage passes it on,
so every stage drops the request where the plan would have it next (:func:`decode_plan` with
``request_steps``; simulated like the full schedule). Without an end the schedule is fixed in
advance and every stage knows what comes next without asking.

Example (every rank of a 2-rank group, the model built from the same seed everywhere)::

    gen = PipelineGenerator(nn.GPT(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=32))
    outs = gen.generate([prompt_a, prompt_b, prompt_c], max_new_tokens=8)   # one (B_r, T_r + 8) array each
    print(format_decode_timeline(simulate_decode(decode_plan(2, 3, 8)), 2))
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import no_grad
from neural_arch.distributed.device_mesh import resolve_group_or_mesh
from neural_arch.distributed.pipelining import p2p
from neural_arch.distributed.pipelining.schedules import DeadlockError
from neural_arch.distributed.pipelining.split import even_split_points
from neural_arch.nn.kv_cache import KVCache
from neural_arch.nn.transformer import (
    _CAPACITY_MOE,
    GPT,
    _check_sampling,
    _check_token_ids,
    _eos_ids,
    _left_padding_mask,
    _next_token,
    capacity_limited_moe,
)

__all__ = ["DecodeAction", "DecodeEvent", "PipelineGenerator", "decode_makespan", "decode_plan",
           "format_decode_timeline", "simulate_decode"]

FORWARD, SEND_ACT, RECV_ACT, SEND_TOKEN, RECV_TOKEN = "FORWARD", "SEND_ACT", "RECV_ACT", "SEND_TOKEN", "RECV_TOKEN"
#: A request ended: sent on the activation edge in place of its next activation (see :func:`decode_plan`).
SEND_LEAVE = "SEND_LEAVE"
#: Tags of generation's messages: activations on ``ACT_TAG_BASE + edge``, tokens on ``TOKEN_TAG``
#: (apart from the training schedules' tags, so a stray training message can never be read as one).
ACT_TAG_BASE = 3000
TOKEN_TAG = 2999


class DecodeAction(NamedTuple):
    """One thing one stage does for step ``step`` of request ``request``.

    ``kind`` is ``FORWARD`` (run the stage; the last stage also chooses the token), ``SEND_ACT`` /
    ``RECV_ACT`` (the activation to / from the next / previous stage; what is received may instead
    be a ``SEND_LEAVE``: the request ended), ``SEND_TOKEN`` / ``RECV_TOKEN`` (the chosen token, last
    stage -> first stage, with a flag saying whether the request ended) or ``SEND_LEAVE``. ``peer``
    is the other stage.

    Example::

        >>> str(DecodeAction(FORWARD, 1, 0, 0)), str(DecodeAction(SEND_ACT, 1, 0, 0, 1))
        ('F1.0', 'SEND_ACT1.0->s1')
    """

    kind: str
    request: int
    step: int
    stage: int
    peer: int | None = None

    def __str__(self) -> str:
        if self.kind == FORWARD:
            return f"F{self.request}.{self.step}"
        arrow = "->" if self.kind.startswith("SEND") else "<-"
        return f"{self.kind}{self.request}.{self.step}{arrow}s{self.peer}"


def _stage_actions(num_stages: int, stage: int, n_requests: int, n_steps: int, ended):
    """Stage ``stage``'s actions, one at a time; ``ended(request, step)`` says whether ``step`` was that
    request's last. It is asked only once this stage can know: on the last stage after the forward
    that chose the token, on the first after the token came back, on a middle stage after the message
    from the stage before (an activation, or the news that the request left). So the same code gives
    the plan as data (:func:`decode_plan`, the lengths known in advance) and the run
    (:class:`PipelineGenerator` answers from the messages as they arrive)."""
    p, k, last = num_stages, stage, num_stages - 1
    alive = list(range(n_requests))
    for s in range(n_steps):
        for r in list(alive):
            if s > 0 and k == 0 and p > 1:
                yield DecodeAction(RECV_TOKEN, r, s - 1, k, last)
            elif k > 0:
                yield DecodeAction(RECV_ACT, r, s, k, k - 1)
            if s > 0 and k < last and ended(r, s - 1):
                # the request left: pass the news on (the last stage decided it, so it needs none)
                if k + 1 < last:
                    yield DecodeAction(SEND_LEAVE, r, s, k, k + 1)
                alive.remove(r)
                continue
            yield DecodeAction(FORWARD, r, s, k)
            if k < last:
                yield DecodeAction(SEND_ACT, r, s, k, k + 1)
                continue
            if s < n_steps - 1 and p > 1:
                yield DecodeAction(SEND_TOKEN, r, s, k, 0)
            if ended(r, s):
                alive.remove(r)


def decode_plan(num_stages: int, n_requests: int, n_steps: int,
                request_steps: Sequence[int] | None = None) -> list[list[DecodeAction]]:
    """Every stage's actions for ``n_steps`` steps (step 0 = the prefill) of ``n_requests`` requests.

    Each stage goes ``for step: for request:`` -- receive (the activation, or at the first stage
    the token of the step before), forward, send (the activation on, or at the last stage the token
    back). Sends do not block, so the only waits are the receives.

    ``request_steps[r]`` (default ``n_steps`` each) is how many steps request ``r`` runs: one that
    ends early (every sequence emitted the end-of-sequence token) **leaves the schedule**. The last
    stage chose that token and drops the request at once; the token it sends back says "ended", so
    the first stage runs no further step for it and sends ``SEND_LEAVE`` in place of the next
    activation, which each middle stage passes on (the stage before the last excepted). A request of
    ``L`` steps then costs what it would cost with ``n_steps = L``.

    Example::

        >>> [str(a) for a in decode_plan(2, 2, 2)[0]]
        ['F0.0', 'SEND_ACT0.0->s1', 'F1.0', 'SEND_ACT1.0->s1', 'RECV_TOKEN0.0<-s1', 'F0.1', 'SEND_ACT0.1->s1', 'RECV_TOKEN1.0<-s1', 'F1.1', 'SEND_ACT1.1->s1']
        >>> [str(a) for a in decode_plan(3, 1, 3, request_steps=[1])[0]]      # request 0 ends at its prefill
        ['F0.0', 'SEND_ACT0.0->s1', 'RECV_TOKEN0.0<-s2', 'SEND_LEAVE0.1->s1']
    """
    for name, value, low in (("num_stages", num_stages, 1), ("n_requests", n_requests, 1), ("n_steps", n_steps, 0)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"decode_plan: {name} must be an int >= {low}, got {value!r}")
    if request_steps is None:
        request_steps = [n_steps] * n_requests
    request_steps = [int(x) for x in request_steps]
    if len(request_steps) != n_requests or any(not 1 <= x <= n_steps for x in request_steps):
        raise ValueError(f"decode_plan: request_steps must hold {n_requests} step counts in [1, {n_steps}], "
                         f"got {request_steps}")
    return [list(_stage_actions(num_stages, k, n_requests, n_steps, lambda r, s: s == request_steps[r] - 1))
            for k in range(num_stages)]


class DecodeEvent(NamedTuple):
    """A simulated forward: ``stage`` ran step ``step`` of request ``request`` from ``start`` to ``end``.

    Example::

        >>> DecodeEvent(0, 1, 0, 0.0, 1.0).end
        1.0
    """

    stage: int
    request: int
    step: int
    start: float
    end: float


def simulate_decode(plan: Sequence[Sequence[DecodeAction]], forward_time: float = 1.0,
                    comm_time: float = 0.0) -> list[DecodeEvent]:
    """Run ``plan`` on a model of the machine: every forward takes ``forward_time``, a message arrives
    ``comm_time`` after its send, sends never block, a receive waits for its message.

    Returns the forwards in the order they ran; raises ``DeadlockError`` if some stage waits for a
    message that no stage will send.

    Example::

        >>> events = simulate_decode(decode_plan(2, 2, 3))
        >>> max(e.end for e in events) == decode_makespan(2, 2, 3)
        True
    """
    p = len(plan)
    pos, clock = [0] * p, [0.0] * p
    sent: dict = {}          # (kind, request, step, receiver) -> arrival time
    events: list[DecodeEvent] = []
    while any(pos[k] < len(plan[k]) for k in range(p)):
        progressed = False
        for k in range(p):
            while pos[k] < len(plan[k]):
                a = plan[k][pos[k]]
                if a.kind in (RECV_ACT, RECV_TOKEN):
                    key = ("ACT" if a.kind == RECV_ACT else "TOKEN", a.request, a.step, k)
                    if key not in sent:
                        break
                    clock[k] = max(clock[k], sent.pop(key))
                elif a.kind == FORWARD:
                    events.append(DecodeEvent(k, a.request, a.step, clock[k], clock[k] + forward_time))
                    clock[k] += forward_time
                else:
                    kind = "TOKEN" if a.kind == SEND_TOKEN else "ACT"   # a leave travels where the activation would
                    sent[(kind, a.request, a.step, a.peer)] = clock[k] + comm_time
                pos[k] += 1
                progressed = True
        if not progressed:
            stuck = {k: str(plan[k][pos[k]]) for k in range(p) if pos[k] < len(plan[k])}
            raise DeadlockError(f"simulate_decode: every unfinished stage waits for a message nobody sends: {stuck}")
    return events


def decode_makespan(num_stages: int, n_requests: int, n_steps: int) -> int:
    """The simulated length (unit forwards, free messages) of :func:`decode_plan`: ``n max(m, p) +
    min(m, p) - 1`` -- see the module docstring.

    Example::

        >>> decode_makespan(4, 4, 10), decode_makespan(4, 1, 10)     # full pipeline vs one request
        (43, 40)
    """
    p, m, n = num_stages, n_requests, n_steps
    return n * max(m, p) + min(m, p) - 1 if n else 0


def format_decode_timeline(events: Sequence[DecodeEvent], num_stages: int, title: str = "") -> str:
    """One line per stage, one column per unit of time: ``r.s`` (request ``r``, step ``s``) or ``..``.

    Example::

        >>> print(format_decode_timeline(simulate_decode(decode_plan(2, 2, 2)), 2))
        stage 0 | 0.0 1.0 0.1 1.1 ...
        stage 1 | ... 0.0 1.0 0.1 1.1
    """
    end = round(max((e.end for e in events), default=0))
    width = max([len(f"{e.request}.{e.step}") for e in events] + [2])
    rows = [["." * width] * end for _ in range(num_stages)]
    for e in events:
        for t in range(round(e.start), round(e.end)):
            rows[e.stage][t] = f"{e.request}.{e.step}".ljust(width)
    lines = [title] if title else []
    lines += [f"stage {k} | " + " ".join(row) for k, row in enumerate(rows)]
    return "\n".join(line.rstrip() for line in lines)


class PipelineGenerator:
    """Greedy (or sampled) generation of a ``GPT`` split over the ranks of ``group``, one stage each.

    Every rank builds the same model (the same seed or checkpoint) and calls :meth:`generate` with
    the same arguments; stage ``k = group.rank()`` runs blocks ``[start, stop)`` (``split_points``
    as in :func:`~neural_arch.distributed.pipelining.split.pipeline`, default: equal block counts).
    Only this stage's blocks (and the embeddings on the first, ``ln_f`` and the head on the last)
    are used here; the rest of the model may be dropped to save memory.

    Args:
        model: an ``nn.GPT``.
        group: the pipeline group (ProcessGroup or None = world); its size is the number of stages.
        split_points: where stages 1, 2, ... start (block indices), or None.

    Example::

        gen = PipelineGenerator(model)                       # 2 ranks: blocks split in halves
        a, b = gen.generate([prompt_a, prompt_b], max_new_tokens=6)
    """

    def __init__(self, model: GPT, group=None, split_points: Sequence[int] | None = None):
        if not isinstance(model, GPT):
            raise TypeError(f"PipelineGenerator: model must be an nn.GPT, got {type(model).__name__}")
        self.model = model
        self.group = resolve_group_or_mesh(group, "PipelineGenerator")
        self.num_stages, self.stage = self.group.size(), self.group.rank()
        n_blocks = len(model.blocks)
        if split_points is None:
            split_points = even_split_points(n_blocks, self.num_stages)
        bounds = [0, *[int(s) for s in split_points], n_blocks]
        if len(bounds) != self.num_stages + 1 or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"PipelineGenerator: split_points={list(split_points)} must cut the {n_blocks} blocks "
                             f"into {self.num_stages} non-empty stages (one per rank of the group)")
        self.start, self.stop = bounds[self.stage], bounds[self.stage + 1]
        self.first, self.last = self.stage == 0, self.stage == self.num_stages - 1
        #: The schedule of the last :meth:`generate` call, this stage's list (for printing).
        self.actions: list[DecodeAction] = []
        #: The last call's KV caches, one per request, holding this stage's blocks only.
        self.caches: list[KVCache] = []

    # -- one stage's forward -----------------------------------------------------------------------
    def _forward(self, x, mask, cache: KVCache):
        """This stage on ``x`` (token ids on the first stage, else hidden states) with the request's
        cache; ``mask`` ``(B, past + T)`` bool. Returns hidden states, or logits on the last stage."""
        m = self.model
        xp = _backend.get_array_module(mask)
        past = cache.get_seq_length(0)
        key_mask = mask[:, None, None, :]
        if self.first:
            # the positions GPT.forward gives: padding does not count (cumsum(mask) - 1)
            positions = xp.maximum(xp.cumsum(mask, axis=1) - 1, 0)[:, past:]
            x = m.embed(x, positions)
        for local, i in enumerate(range(self.start, self.stop)):
            x = m.blocks[i](x, attn_mask=key_mask, kv_cache=cache, layer_idx=local)
        return m.logits_from_hidden(x) if self.last else x

    def generate(self, prompts: Sequence, max_new_tokens: int, *, attention_masks: Sequence | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, generators: Sequence | None = None, eos_token_id=None) -> list:
        """Extend each request's ``(B_r, T_r)`` prompt by up to ``max_new_tokens`` tokens; every rank
        returns the same list of ``(B_r, T_r + n_r)`` int64 arrays.

        The requests are the pipeline's micro-batches (all in flight at once, see the module
        docstring). ``attention_masks`` (one ``(B_r, T_r)`` left-padding mask per request, or None),
        the sampling arguments and ``eos_token_id`` mean what they mean for ``GPT.generate``: a
        request whose every sequence emitted ``eos_token_id`` (an int or a list) leaves the schedule
        at once (``n_r < max_new_tokens``; its finished sequences are filled with the first
        ``eos_token_id``), and the others go on. Request ``r`` draws from ``generators[r]`` (a
        ``numpy.random.Generator``; only the last stage draws), so with the generators seeded alike
        the tokens are ``GPT.generate``'s on that request alone.

        Example::

            outs = gen.generate([np.array([[1, 2, 3]]), np.array([[4, 5], [6, 7]])], max_new_tokens=4)
        """
        model, group = self.model, self.group
        backend = group.backend
        prompts = [np.asarray(getattr(q, "data", q)) for q in prompts]
        m, n = len(prompts), int(max_new_tokens)
        if m == 0 or n < 1:
            raise ValueError(f"PipelineGenerator.generate: need at least one prompt and max_new_tokens >= 1 "
                             f"(got {m} prompts, max_new_tokens={max_new_tokens})")
        for r, q in enumerate(prompts):
            if q.ndim != 2 or q.shape[1] == 0:
                raise ValueError(f"PipelineGenerator.generate: prompt {r} must be token ids (batch, time) with at "
                                 f"least one token, got shape {q.shape}")
            if q.shape[1] + n > model.block_size:
                raise ValueError(f"PipelineGenerator.generate: prompt {r} has {q.shape[1]} tokens; plus "
                                 f"max_new_tokens {n} that exceeds block_size {model.block_size}")
        # GPT.generate's checks, on every rank before any message (every rank raises the same error): a
        # negative id would embed as row vocab_size + id, a right-padded mask would continue the padding
        prompts = [_check_token_ids(q, model.vocab_size, f"PipelineGenerator.generate: prompt {r}")
                   for r, q in enumerate(prompts)]
        _check_sampling(do_sample, temperature, top_k, top_p, "PipelineGenerator.generate")
        if attention_masks is not None and len(attention_masks) != m:
            raise ValueError(f"PipelineGenerator.generate: {len(attention_masks)} attention_masks for {m} prompts; "
                             "give one per prompt (None for an unpadded one)")
        masks = [np.ones(q.shape, dtype=bool) if attention_masks is None or attention_masks[r] is None
                 else _left_padding_mask(np.asarray(getattr(attention_masks[r], "data", attention_masks[r])), q.shape,
                                         np, f"PipelineGenerator.generate: prompt {r}")
                 for r, q in enumerate(prompts)]
        if capacity_limited_moe(model):
            raise ValueError(f"PipelineGenerator.generate: {_CAPACITY_MOE}")
        if generators is not None and len(generators) != m:   # else only the last stage would fail, the rest wait
            raise ValueError(f"PipelineGenerator.generate: {len(generators)} generators for {m} prompts; give one "
                             "per prompt")
        eos = _eos_ids(eos_token_id, "PipelineGenerator.generate")
        first_param = next(iter(model.parameters()))
        xp = _backend.get_array_module(first_param.data)
        dtype, width = first_param.data.dtype, model.n_embd
        gens = list(generators) if generators is not None else [np.random.default_rng(0) for _ in prompts]
        caches = self.caches = [KVCache() for _ in prompts]
        out_tokens = [np.zeros((q.shape[0], n), dtype=np.int64) for q in prompts]
        finished = [np.zeros(q.shape[0], dtype=bool) for q in prompts]   # per sequence (last stage)
        ended: dict = {}        # request -> its last step, once this stage knows it
        inbox: dict = {}        # (request, step) -> the input of this stage's next forward
        outputs: dict = {}      # (request, step) -> what this stage sends on
        sends: list = []
        self.actions = []

        def describe(a: DecodeAction):
            return lambda: f"pipeline generation stage {self.stage} ({a})"

        def send(arr, a: DecodeAction, tag: int):
            sends.append((p2p.start(lambda: backend.send(arr, a.peer, tag, async_op=True), describe(a)), arr,
                          describe(a)))

        def recv(buf, a: DecodeAction, tag: int):
            p2p.wait(p2p.start(lambda: backend.recv(buf, a.peer, tag, async_op=True), describe(a)), backend,
                     describe(a))

        was_training = model.training
        model.eval()
        try:
            with no_grad():
                # the schedule is built as it runs: whether a request goes on is known only from the
                # messages (see _stage_actions); without eos it is exactly decode_plan(p, m, n)[stage]
                for a in _stage_actions(self.num_stages, self.stage, m, n, lambda r, s: ended.get(r) == s):
                    self.actions.append(a)
                    r, s = a.request, a.step
                    b = prompts[r].shape[0]
                    if a.kind == RECV_ACT:
                        # the activation and one flag (1: it is one, 0: the request left instead)
                        t = prompts[r].shape[1] if s == 0 else 1
                        buf = xp.empty(b * t * width + 1, dtype=dtype)
                        recv(buf, a, ACT_TAG_BASE + a.peer)
                        if float(buf[-1]) == 0.0:
                            ended[r] = s - 1
                        else:
                            inbox[(r, s)] = buf[:-1].reshape(b, t, width)
                    elif a.kind == RECV_TOKEN:
                        buf = np.empty(b + 1, dtype=np.int64)     # the tokens and the "ended" flag
                        recv(buf, a, TOKEN_TAG)
                        out_tokens[r][:, s] = buf[:-1]
                        if buf[-1]:
                            ended[r] = s
                    elif a.kind == FORWARD:
                        step_mask = np.concatenate([masks[r], np.ones((b, s), dtype=bool)], axis=1)
                        if self.first:
                            x = prompts[r] if s == 0 else out_tokens[r][:, s - 1:s]
                        else:
                            x = inbox.pop((r, s))
                        y = self._forward(xp.asarray(x), xp.asarray(step_mask), caches[r])
                        if self.last:
                            nxt = _backend.to_host(
                                _next_token(y.data[:, -1, :], do_sample, temperature, top_k, top_p, gens[r], xp))
                            if eos is not None:   # GPT.generate's rule: a finished sequence repeats eos[0]
                                nxt = np.where(finished[r], eos[0], nxt)
                                finished[r] |= np.isin(nxt, eos)
                                if finished[r].all():
                                    ended[r] = s
                            out_tokens[r][:, s] = nxt
                        else:
                            outputs[(r, s)] = y.data
                    elif a.kind == SEND_ACT:
                        y = outputs.pop((r, s))
                        send(xp.concatenate([y.reshape(-1), xp.ones(1, dtype=dtype)]), a, ACT_TAG_BASE + self.stage)
                    elif a.kind == SEND_LEAVE:
                        send(xp.zeros(b * width + 1, dtype=dtype), a, ACT_TAG_BASE + self.stage)
                    else:  # SEND_TOKEN
                        send(np.append(out_tokens[r][:, s], np.int64(ended.get(r) == s)), a, TOKEN_TAG)
                    if len(sends) > 64:   # bound the buffers kept alive for sends in flight
                        work, _, desc = sends.pop(0)
                        if work is not None:
                            p2p.wait(work, backend, desc)
                for work, _, desc in sends:
                    if work is not None:
                        p2p.wait(work, backend, desc)
        finally:
            model.train(was_training)
        if self.num_stages > 1:
            # the last stage chose every token: one broadcast gives every rank all of them (every stage
            # knows where each request ended: the tokens' flags and the leaves told it)
            flat = np.ascontiguousarray(np.concatenate([t.ravel() for t in out_tokens]))
            backend.broadcast(flat, root=self.num_stages - 1)
            at = 0
            for t in out_tokens:
                t[...] = flat[at:at + t.size].reshape(t.shape)
                at += t.size
        return [np.concatenate([q, t[:, :ended.get(r, n - 1) + 1]], axis=1)
                for r, (q, t) in enumerate(zip(prompts, out_tokens))]

    def __repr__(self) -> str:
        return (f"PipelineGenerator(stage {self.stage} of {self.num_stages}, blocks [{self.start}, {self.stop}), "
                f"first={self.first}, last={self.last})")
