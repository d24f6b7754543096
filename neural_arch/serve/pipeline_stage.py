"""Pipeline-parallel serving (``--pp``): which blocks a rank's stage runs, and the messages between stages.

With ``--pp P --tp T`` the server runs ``P T`` ranks: world rank ``s T + t`` is tensor-parallel rank
``t`` of pipeline stage ``s``, which holds blocks ``[start, stop)`` of the GPT (equal block counts, as
:class:`~neural_arch.distributed.pipelining.PipelineGenerator` splits them) and their share of every
request's KV cache. Every rank still receives each step plan (one broadcast over the world), and each
stage runs the step's forwards in the plan's order -- each joining prompt alone, then the decode batch:

* stage 0 embeds token ids (a prompt, or each decoding request's last token, which the plan
  carries); every later stage receives the hidden states from the rank of the same tensor-parallel
  index in the stage before, and each stage but the last sends its own on. The receiver knows the
  shapes from the plan (``(1, T, C)`` per join, ``(B, 1, C)`` for the decode batch), so no header
  is sent;
* the last stage chooses the tokens as tensor-parallel serving does (vocabulary-parallel greedy,
  gathered logits when some request samples), and its tensor-parallel rank 0 sends them to rank 0
  with the whole-vocabulary logits of the sampling requests; rank 0 draws for those from their own
  generators (as without pipeline) and hands the tokens out.

The steps do not overlap: within a step one stage computes at a time, so ``--pp`` spreads the
model's weights and caches over more ranks, not its time. Overlapping stages would need several
batches in flight, as ``PipelineGenerator`` keeps several requests.

Example (what ``neural_arch.serve.worker`` does on every rank of a ``--pp 2 --tp 2`` server)::

    stage = PipelineStage(world, n_blocks=len(model.blocks), num_stages=2)     # world rank 3: stage 1, tp rank 1
    engine = DecodeEngine(model, stage=stage)
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.pipelining import p2p
from neural_arch.distributed.pipelining.split import even_split_points

__all__ = ["PipelineStage"]

#: Tags of serving's pipeline messages (apart from the training schedules' and PipelineGenerator's).
HIDDEN_TAG, TOKENS_TAG, LOGITS_TAG = 4000, 4001, 4002


class PipelineStage:
    """This rank's pipeline stage in a server of ``num_stages`` stages over the ``group`` (the world).

    Args:
        group: the server's whole group; its size is ``num_stages`` times the tensor-parallel size.
        n_blocks: the GPT's block count (at least ``num_stages``).
        num_stages: pipeline stages.

    Example::

        >>> class World:                                  # 4 ranks, this one rank 3
        ...     def size(self): return 4
        ...     def rank(self): return 3
        >>> PipelineStage(World(), n_blocks=5, num_stages=2)
        PipelineStage(stage 1 of 2, tp rank 1 of 2, blocks [3, 5), first=False, last=True)
    """

    def __init__(self, group, n_blocks: int, num_stages: int):
        size, rank = group.size(), group.rank()
        if num_stages < 1 or size % num_stages:
            raise ValueError(f"PipelineStage: {num_stages} stages do not divide the {size} ranks")
        if n_blocks < num_stages:
            raise ValueError(f"PipelineStage: {n_blocks} blocks cannot fill {num_stages} stages")
        self.group, self.num_stages = group, int(num_stages)
        self.tp = size // self.num_stages
        self.stage, self.tp_rank = divmod(rank, self.tp)
        bounds = [0, *even_split_points(n_blocks, self.num_stages), n_blocks]
        self.start, self.stop = bounds[self.stage], bounds[self.stage + 1]
        self.first, self.last = self.stage == 0, self.stage == self.num_stages - 1
        self.prev = None if self.first else rank - self.tp
        self.next = None if self.last else rank + self.tp
        self._sends: list = []

    def _describe(self, what: str):
        return lambda: f"pipeline serving stage {self.stage} (tp rank {self.tp_rank}): {what}"

    def recv_hidden(self, shape, dtype, xp):
        """The hidden states ``shape`` from the stage before."""
        buf = xp.empty(shape, dtype=dtype)
        self._recv(buf, self.prev, HIDDEN_TAG, "hidden states from the stage before")
        return buf

    def send_hidden(self, hidden) -> None:
        """Hidden states on to the next stage (not waited for until :meth:`flush`)."""
        self._send(hidden, self.next, HIDDEN_TAG, "hidden states to the next stage")

    def send_choice(self, tokens, sampled_logits) -> None:
        """Last stage, tensor-parallel rank 0: the step's tokens (and the sampling rows' logits) to rank 0."""
        self._send(np.ascontiguousarray(tokens, dtype=np.int64), 0, TOKENS_TAG, "tokens to rank 0")
        if sampled_logits is not None:
            self._send(sampled_logits, 0, LOGITS_TAG, "sampling logits to rank 0")

    def recv_choice(self, n_tokens: int, n_sampled: int, vocab_size: int, dtype):
        """Rank 0: the last stage's ``(n_tokens,)`` tokens and ``(n_sampled, vocab_size)`` logits (or None)."""
        source = (self.num_stages - 1) * self.tp
        tokens = np.empty(n_tokens, dtype=np.int64)
        self._recv(tokens, source, TOKENS_TAG, "tokens from the last stage")
        logits = None
        if n_sampled:
            logits = np.empty((n_sampled, vocab_size), dtype=dtype)
            self._recv(logits, source, LOGITS_TAG, "sampling logits from the last stage")
        return tokens, logits

    def flush(self) -> None:
        """Wait for this step's sends (so their buffers may go)."""
        sends, self._sends = self._sends, []
        for work, _, describe in sends:
            if work is not None:
                p2p.wait(work, self.group.backend, describe)

    def _send(self, array, peer: int, tag: int, what: str) -> None:
        backend, describe = self.group.backend, self._describe(what)
        array = np.ascontiguousarray(array) if isinstance(array, np.ndarray) else array
        work = p2p.start(lambda: backend.send(array, peer, tag, async_op=True), describe)
        self._sends.append((work, array, describe))   # the array stays alive until its send is done

    def _recv(self, buf, peer: int, tag: int, what: str) -> None:
        backend, describe = self.group.backend, self._describe(what)
        work = p2p.start(lambda: backend.recv(buf, peer, tag, async_op=True), describe)
        if work is not None:
            p2p.wait(work, backend, describe)

    def __repr__(self) -> str:
        return (f"PipelineStage(stage {self.stage} of {self.num_stages}, tp rank {self.tp_rank} of {self.tp}, "
                f"blocks [{self.start}, {self.stop}), first={self.first}, last={self.last})")
