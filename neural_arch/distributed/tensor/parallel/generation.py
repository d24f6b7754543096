"""Tensor-parallel generation: choosing the next token from vocabulary-parallel logits.

A model from :func:`~neural_arch.distributed.tensor.parallel.gpt.parallelize_gpt` generates with the
ordinary :meth:`neural_arch.nn.GPT.generate`; every rank of the tp group calls it with the same prompt
(and mask). What makes that work:

* **KV cache sharded by heads.** ``q_proj``/``k_proj``/``v_proj`` are column-parallel, so each rank
  computes ``n_head / p`` whole heads and attention infers its local head count from the projection
  width; each rank's :class:`~neural_arch.nn.kv_cache.KVCache` therefore holds
  ``(B, n_head / p, S, head_dim)`` -- its own heads, ``1 / p`` of the single-process cache -- with no
  change to the cache or the attention.
* **Collectives per step** (prefill and every decode step alike), with ``L`` blocks and the default
  ``loss_parallel=True``: one all-reduce closing each of Megatron's parallel blocks, i.e. two per
  transformer block (``attn.out_proj`` and ``mlp.fc2``, both row-parallel), one all-reduce for the
  vocabulary-parallel token embedding, and the token choice below (one all-gather; one more
  broadcast when sampling). Greedy: ``2 L + 1`` all-reduces and 1 all-gather per step.
* **Token choice** (:class:`VocabParallelTokenSelector`, installed as ``model.token_selector``):

  - *greedy* is done **vocabulary-parallel**: each rank takes the argmax of its ``V / p`` logits and
    the ranks all-gather one ``(value, global id)`` pair per sequence; the winner is the first rank
    holding the largest value, so ties and NaNs resolve to the lowest id exactly as ``argmax`` over
    the whole vocabulary does. It moves ``2 B p`` numbers instead of the ``B V`` a gather would.
  - *sampling* **gathers** the last position's logits ``(B, V)`` (only that position, not the whole
    sequence) and applies the single-process rule (temperature, top-k, top-p, one uniform per row):
    top-k and top-p need a global sort of the distribution, which would cost more round trips
    vocabulary-parallel than one gather of ``B V`` numbers (Megatron's inference gathers too). Then
    **rank 0's tokens are broadcast**: every rank draws from its own generator (so its state advances
    in step with rank 0's, and rank 0's draw is the single-process draw when the generators were
    seeded alike), but only rank 0's choice is kept, so the ranks can never disagree, even when their
    generators did not start in the same state.

With ``loss_parallel=False`` the head already all-gathers the logits (every position): greedy then
needs no further collective, sampling only the broadcast.

Not supported: ``sequence_parallel=True`` (a decode step has one position, which cannot be split
over the ranks; parallelize the same weights without it for inference: the selector raises a
``ValueError`` saying so once the prompt's forward has run, and a prompt whose length does not divide
by ``p`` already fails in that forward) and context parallelism.

Example (every rank of the tp group; the model built from the same seed everywhere)::

    model = parallelize_gpt(nn.GPT(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=32), tp_group)
    out = model.generate(prompt, max_new_tokens=8)        # the same tokens on every rank
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.distributed.device_mesh import resolve_group_or_mesh

__all__ = ["VocabParallelTokenSelector", "vocab_parallel_argmax"]


def vocab_parallel_argmax(logits, group):
    """``argmax`` over the whole vocabulary of logits sharded by vocabulary: ``(B, V/p)`` -> ``(B,)`` ids.

    Rank ``r`` holds ids ``[r V/p, (r+1) V/p)``. One all-gather of a ``(value, id)`` pair per row;
    the result equals ``argmax`` of the gathered ``(B, V)`` logits (first index on ties, first NaN).

    Example (2 ranks, vocabulary of 4; rank 0 holds ``[[1, 5]]``, rank 1 ``[[5, 2]]``)::

        vocab_parallel_argmax(local_logits, tp_group)     # array([1]) on both ranks (the tie goes to id 1)
    """
    group = resolve_group_or_mesh(group, "vocab_parallel_argmax")
    xp = _backend.get_array_module(logits)
    n, r = group.size(), group.rank()
    local = xp.argmax(logits, axis=-1)
    if n == 1:
        return local.astype(np.int64)
    value = xp.take_along_axis(logits, local[:, None], axis=-1)[:, 0]
    # float64 holds every float32/float16 logit and every id below 2**53 exactly
    pair = xp.stack([value.astype(np.float64), (local + r * logits.shape[-1]).astype(np.float64)], axis=-1)
    table = xp.empty((n,) + tuple(pair.shape), dtype=np.float64)
    group.backend.allgather(table, xp.ascontiguousarray(pair))
    winner = xp.argmax(table[..., 0], axis=0)   # the first rank holding the largest (or a NaN) value
    return table[winner, xp.arange(table.shape[1]), 1].astype(np.int64)


class VocabParallelTokenSelector:
    """``GPT.generate``'s token choice under tensor parallelism (``model.token_selector``).

    Called as ``selector(last_logits, choose, do_sample)`` with this rank's last-position logits
    (``(B, V/p)`` when the head is vocabulary-parallel, ``(B, V)`` when it gathers) and ``choose``, the
    single-process rule for whole-vocabulary logits; returns the same ``(B,)`` ids on every rank.
    Greedy is vocabulary-parallel (:func:`vocab_parallel_argmax`); sampling gathers the logits, draws,
    and keeps rank 0's draw (broadcast). See the module docstring for why.

    Args:
        process_group: the tensor-parallel group (ProcessGroup, 1-d DeviceMesh, None = world).
        vocab_size: the whole vocabulary (tells sharded logits from gathered ones).
        sequence_parallel: the model was parallelized with ``sequence_parallel=True``: calling raises
            a ``ValueError`` saying what to do instead (a decode step cannot be split by sequence).

    Example::

        model.token_selector = VocabParallelTokenSelector(tp_group, model.vocab_size)   # parallelize_gpt does this
        out = model.generate(prompt, max_new_tokens=8, do_sample=True, top_k=10)
    """

    def __init__(self, process_group, vocab_size: int, *, sequence_parallel: bool = False):
        self.process_group = resolve_group_or_mesh(process_group, "VocabParallelTokenSelector")
        self.vocab_size = int(vocab_size)
        self.sequence_parallel = bool(sequence_parallel)

    def __call__(self, last_logits, choose, do_sample: bool):
        group = self.process_group
        if self.sequence_parallel and group.size() > 1:
            # the prompt's forward ran (its length divides by p) but a decode step holds one position
            raise ValueError("generate: a model parallelized with sequence_parallel=True cannot decode (each "
                             f"step has one position to split over {group.size()} ranks); parallelize the same "
                             "weights with sequence_parallel=False for inference")
        if group.size() == 1:
            return choose(last_logits)
        xp = _backend.get_array_module(last_logits)
        sharded = last_logits.shape[-1] != self.vocab_size
        if not do_sample:
            # gathered logits are byte-identical on every rank, so every rank's argmax agrees
            return vocab_parallel_argmax(last_logits, group) if sharded else choose(last_logits)
        if sharded:
            table = xp.empty((group.size(),) + tuple(last_logits.shape), dtype=last_logits.dtype)
            group.backend.allgather(table, xp.ascontiguousarray(last_logits))
            last_logits = xp.concatenate(list(table), axis=-1)
        tokens = xp.ascontiguousarray(choose(last_logits).astype(np.int64))
        group.backend.broadcast(tokens, root=0)
        return tokens

    def __repr__(self) -> str:
        return (f"VocabParallelTokenSelector(vocab_size={self.vocab_size}, rank {self.process_group.rank()} "
                f"of {self.process_group.size()})")
