"""One step of the served model on every rank: prefill the joining requests, decode the running batch.

Each request keeps its own :class:`~neural_arch.nn.kv_cache.KVCache` (on a tensor-parallel rank: its
heads only, ``(1, n_head / p, length, head_dim)`` per layer). Requests in a batch have different
lengths, so a decode step **left-pads** their caches to the longest, runs the whole batch through
``GPT.forward`` with an ``attention_mask`` that hides the padding (positions are counted per sequence,
so each request sees exactly what it would alone), and cuts each request's cache back out of the
batch's. A joining request's prompt runs alone (its prefill), so it needs no padding at all.

The token choice is the tensor-parallel one (``model.token_selector``): greedy is a
vocabulary-parallel argmax, and a step in which some request samples gathers the logits and keeps
rank 0's draw (each sampling request draws from its own generator, on rank 0). Every rank therefore
ends the step with the same tokens and no further message.

With a :class:`~neural_arch.serve.pipeline_stage.PipelineStage` (``--pp``) the engine runs only its
stage's blocks on the same plan, receiving and sending hidden states, and the last stage's tokens go
to rank 0 (see ``pipeline_stage``); only rank 0's :meth:`DecodeEngine.step` returns the tokens then.

Example (every rank, after ``receive_plan`` / ``broadcast_plan``)::

    engine = DecodeEngine(model)                   # model: nn.GPT, parallelized or not
    tokens = engine.step(plan, batcher.sample_token if rank == 0 else None)     # {slot: token}
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import no_grad
from neural_arch.nn.kv_cache import KVCache
from neural_arch.nn.transformer import capacity_limited_moe

__all__ = ["DecodeEngine"]


class DecodeEngine:
    """The model and the KV caches of the requests in flight, one per slot.

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> from neural_arch.serve.batcher import StepPlan, STEP
        >>> engine = DecodeEngine(nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8))
        >>> first = engine.step(StepPlan(STEP, 0, joins=[(0, False, [1, 2, 3])]))
        >>> second = engine.step(StepPlan(STEP, 1, decode=[(0, False)]))
        >>> list(first), list(second), engine.caches[0].get_seq_length()
        ([0], [0], 4)
    """

    def __init__(self, model, stage=None):
        if capacity_limited_moe(model):
            raise ValueError("DecodeEngine: the model has MoE blocks with a capacity_factor, which drop tokens by "
                             "what runs in one forward: a batch of requests would change each other's tokens. Set "
                             "capacity_factor = None on those blocks to serve it (no token dropped)")
        self.model = model.eval()
        #: This rank's pipeline stage (``pipeline_stage.PipelineStage``), or None: the whole model.
        self.stage = stage
        self.caches: dict[int, KVCache] = {}
        self.last: dict[int, int] = {}
        first = next(iter(model.parameters()))
        self.xp = _backend.get_array_module(first.data)
        self.dtype = first.data.dtype

    def _choose(self, slots, samples, last_logits, sample_token):
        """The same ``(B,)`` tokens on every rank from this rank's last-position logits."""
        xp = self.xp

        def choose(full):
            tokens = xp.argmax(full, axis=-1).astype(np.int64)
            if sample_token is not None:
                for j, (slot, sample) in enumerate(zip(slots, samples)):
                    if sample:
                        tokens[j] = sample_token(slot, _backend.to_host(full[j:j + 1]))
            return tokens

        selector = self.model.token_selector
        if selector is None:
            return choose(last_logits)
        return selector(last_logits, choose, any(samples))

    def step(self, plan, sample_token=None) -> dict:
        """Apply ``plan`` (a :class:`~neural_arch.serve.batcher.StepPlan`); returns ``{slot: token}``.

        ``sample_token(slot, logits) -> int`` draws for a sampling slot (rank 0's batcher); None on the
        other ranks, whose choice is replaced by rank 0's.
        """
        xp, model = self.xp, self.model
        for slot in plan.leaves:
            self.caches.pop(slot, None)
            self.last.pop(slot, None)
        if self.stage is not None:
            return self._pipeline_step(plan, sample_token)
        out: dict[int, int] = {}
        with no_grad():
            for slot, sample, prompt in plan.joins:
                cache = KVCache()
                logits = model(xp.asarray([prompt], dtype=np.int64), kv_cache=cache)
                token = int(self._choose([slot], [sample], logits.data[:, -1, :], sample_token)[0])
                self.caches[slot], self.last[slot], out[slot] = cache, token, token
            if plan.decode:
                slots = [slot for slot, _ in plan.decode]
                samples = [sample for _, sample in plan.decode]
                tokens = self._decode(slots, samples, sample_token)
                for slot, token in zip(slots, tokens):
                    self.last[slot] = out[slot] = int(token)
        return out

    def _decode(self, slots, samples, sample_token):
        model = self.model
        batch, mask, lengths = self._pad_caches(slots)
        ids = self.xp.asarray([[self.last[s]] for s in slots], dtype=np.int64)
        logits = model(ids, attention_mask=mask, kv_cache=batch)
        tokens = self._choose(slots, samples, logits.data[:, -1, :], sample_token)
        self._unpad_caches(slots, batch, lengths)
        return [int(t) for t in _backend.to_host(tokens)]

    def _pad_caches(self, slots):
        """The slots' caches left-padded into one batch cache, its attention mask ``(B, longest + 1)``
        (the step's new position included) and their lengths."""
        xp = self.xp
        caches = [self.caches[s] for s in slots]
        lengths = [c.get_seq_length(0) for c in caches]
        b, width = len(slots), max(lengths)
        batch = KVCache()
        for layer in range(len(caches[0])):
            for store, source in ((batch.key_cache, "key_cache"), (batch.value_cache, "value_cache")):
                one = getattr(caches[0], source)[layer]
                padded = xp.zeros((b, one.shape[1], width, one.shape[3]), dtype=one.dtype)
                for j, c in enumerate(caches):
                    padded[j, :, width - lengths[j]:] = getattr(c, source)[layer][0]
                store.append(padded)
        mask = xp.zeros((b, width + 1), dtype=bool)
        for j, n in enumerate(lengths):
            mask[j, width - n:] = True
        return batch, mask, lengths

    def _unpad_caches(self, slots, batch, lengths) -> None:
        """Each slot's cache cut back out of the batch's (its new position included)."""
        xp, width = self.xp, max(lengths)
        for j, s in enumerate(slots):
            c, start = self.caches[s], width - lengths[j]
            c.key_cache = [xp.ascontiguousarray(k[j:j + 1, :, start:]) for k in batch.key_cache]
            c.value_cache = [xp.ascontiguousarray(v[j:j + 1, :, start:]) for v in batch.value_cache]

    # -- pipeline stages (--pp) ---------------------------------------------------------------------------
    def _stage_forward(self, x, mask, cache):
        """This stage's blocks on ``x`` (token ids on the first stage, else hidden states), as
        ``GPT.forward`` runs them: positions counted per sequence, padding never attended. Returns
        hidden states, or the logits on the last stage (arrays)."""
        model, stage, xp = self.model, self.stage, self.xp
        if mask is None:
            mask = xp.ones(tuple(x.shape[:2]), dtype=bool)
        past = cache.get_seq_length(0)
        if stage.first:
            x = model.embed(x, xp.maximum(xp.cumsum(mask, axis=1) - 1, 0)[:, past:])
        for local, i in enumerate(range(stage.start, stage.stop)):
            x = model.blocks[i](x, attn_mask=mask[:, None, None, :], kv_cache=cache, layer_idx=local)
        return (model.logits_from_hidden(x) if stage.last else x).data

    def _stage_run(self, x_or_shape, mask, cache, rows: list) -> None:
        """One forward of this stage: its input from the plan (first stage) or the stage before, its
        output on to the next stage, or (last stage) its last-position logits kept in ``rows``."""
        stage = self.stage
        x = x_or_shape if stage.first else stage.recv_hidden(x_or_shape, self.dtype, self.xp)
        y = self._stage_forward(x, mask, cache)
        if stage.last:
            rows.append(y[:, -1, :])
        else:
            stage.send_hidden(self.xp.ascontiguousarray(y))

    def _pipeline_step(self, plan, sample_token) -> dict:
        xp, stage, width = self.xp, self.stage, self.model.n_embd
        slots = [slot for slot, _, _ in plan.joins] + [slot for slot, _ in plan.decode]
        samples = [sample for _, sample, _ in plan.joins] + [sample for _, sample in plan.decode]
        rows: list = []
        with no_grad():
            for slot, _, prompt in plan.joins:
                self.caches[slot] = KVCache()
                ids = xp.asarray([prompt], dtype=np.int64)
                self._stage_run(ids if stage.first else (1, len(prompt), width), None, self.caches[slot], rows)
            if plan.decode:
                decoding = [slot for slot, _ in plan.decode]
                batch, mask, lengths = self._pad_caches(decoding)
                ids = xp.asarray([[t] for t in plan.inputs], dtype=np.int64)
                self._stage_run(ids if stage.first else (len(decoding), 1, width), mask, batch, rows)
                self._unpad_caches(decoding, batch, lengths)
        stage.flush()
        if not slots:
            return {}
        if stage.last:
            tokens, sampled = self._pipeline_choose(samples, xp.concatenate(rows, axis=0))
            if stage.tp_rank == 0:
                stage.send_choice(tokens, sampled)
                stage.flush()
            return {}
        if sample_token is None:        # every rank but rank 0: the tokens are rank 0's business
            return {}
        sampling = [j for j, sample in enumerate(samples) if sample]
        tokens, sampled = stage.recv_choice(len(slots), len(sampling), self.model.vocab_size, self.dtype)
        for row, j in enumerate(sampling):
            tokens[j] = sample_token(slots[j], sampled[row:row + 1])
        return {slot: int(t) for slot, t in zip(slots, tokens)}

    def _pipeline_choose(self, samples, last_logits):
        """Last stage: greedy tokens for every row (the tensor-parallel choice) and, when some row
        samples, the whole-vocabulary logits of those rows for rank 0 to draw from."""
        xp, kept = self.xp, {}

        def choose(full):
            kept["full"] = full
            return xp.argmax(full, axis=-1).astype(np.int64)

        selector = self.model.token_selector
        do_sample = any(samples)
        tokens = choose(last_logits) if selector is None else selector(last_logits, choose, do_sample)
        sampled = None
        if do_sample:
            rows = [j for j, sample in enumerate(samples) if sample]
            sampled = _backend.to_host(xp.ascontiguousarray(kept["full"][rows].astype(self.dtype)))
        return _backend.to_host(tokens).astype(np.int64), sampled
