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

Example (every rank, after ``receive_plan`` / ``broadcast_plan``)::

    engine = DecodeEngine(model)                   # model: nn.GPT, parallelized or not
    tokens = engine.step(plan, batcher.sample_token if rank == 0 else None)     # {slot: token}
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import no_grad
from neural_arch.nn.kv_cache import KVCache

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

    def __init__(self, model):
        self.model = model.eval()
        self.caches: dict[int, KVCache] = {}
        self.last: dict[int, int] = {}
        first = next(iter(model.parameters()))
        self.xp = _backend.get_array_module(first.data)

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
        xp, model = self.xp, self.model
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
        ids = xp.asarray([[self.last[s]] for s in slots], dtype=np.int64)
        logits = model(ids, attention_mask=mask, kv_cache=batch)
        tokens = self._choose(slots, samples, logits.data[:, -1, :], sample_token)
        for j, c in enumerate(caches):
            start = width - lengths[j]
            c.key_cache = [xp.ascontiguousarray(k[j:j + 1, :, start:]) for k in batch.key_cache]
            c.value_cache = [xp.ascontiguousarray(v[j:j + 1, :, start:]) for v in batch.value_cache]
        return [int(t) for t in _backend.to_host(tokens)]
