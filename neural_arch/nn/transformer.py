"""A pre-LayerNorm transformer block and a small GPT-style language model.

``GPT`` keeps its pieces addressable for model parallelism: ``tok_emb``, ``pos_emb``, ``drop``,
``blocks`` (a ``ModuleList`` of ``TransformerBlock``), ``ln_f`` and ``head``; each block has
``ln1``, ``attn`` (``q_proj``/``k_proj``/``v_proj``/``out_proj``), ``ln2`` and ``mlp``
(``fc1``, ``act``, ``fc2``, ``drop``). A pipeline stage can run ``embed`` → some blocks →
``logits_from_hidden`` without touching ``forward``.

``GPT.generate`` decodes autoregressively with a :class:`~neural_arch.nn.kv_cache.KVCache`
(greedy, or sampling with temperature / top-k / top-p); prompts of different lengths are
left-padded and described by an ``attention_mask``, positions counted per sequence (HF's way).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> model = nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    >>> model(np.zeros((4, 8), dtype=np.int64)).shape
    (4, 8, 16)
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import no_grad
from neural_arch.core.rng import numpy_generator
from neural_arch.core.tensor import Tensor
from neural_arch.nn import init
from neural_arch.nn.activation import GELU
from neural_arch.nn.attention import CausalSelfAttention
from neural_arch.nn.container import ModuleList, Sequential
from neural_arch.nn.kv_cache import KVCache
from neural_arch.nn.linear import Embedding, Linear
from neural_arch.nn.module import Module
from neural_arch.nn.moe import MoE
from neural_arch.nn.normalization import Dropout, LayerNorm

__all__ = ["GPT", "TransformerBlock", "capacity_limited_moe"]


def _ids(x):
    """The array behind token ids given as a Tensor, an array or a (nested) list."""
    if isinstance(x, Tensor):
        return x.data
    return x if hasattr(x, "shape") else np.asarray(x)


def _check_token_ids(raw, vocab_size: int, where: str):
    """``raw`` as int64 token ids, or a ``ValueError`` saying what is wrong: ids must be integers
    (integral floats pass, as ``F.embedding`` takes them) in ``[0, vocab_size)``. An embedding lookup
    with a negative id would read row ``vocab_size + id`` (NumPy's indexing), and ``astype(int64)``
    would truncate ``1.5`` to ``1``: both would generate from a prompt nobody gave."""
    xp = _backend.get_array_module(raw)
    kind = raw.dtype.kind
    if kind not in "iu" and not (kind == "f" and bool((raw == xp.round(raw)).all())):
        raise ValueError(f"{where}: token ids must be integers, got dtype {raw.dtype}"
                         + (" with a non-integral value" if kind == "f" else ""))
    if raw.size:
        low, high = int(raw.min()), int(raw.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{where}: token id {bad} is outside the vocabulary [0, {vocab_size})")
    return raw.astype(np.int64)


def _eos_ids(eos_token_id, where: str):
    """``eos_token_id`` (an int or a list of ints) as a non-empty 1-d int64 array, or None; a float
    such as ``2.5`` would otherwise be truncated to another token and an empty list fail mid-generation."""
    if eos_token_id is None:
        return None
    ids = np.atleast_1d(np.asarray(getattr(eos_token_id, "data", eos_token_id)))
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"{where}: eos_token_id must be an integer token id or a non-empty list of them, "
                         f"got {eos_token_id!r}")
    return ids.astype(np.int64)


def capacity_limited_moe(model) -> bool:
    """Whether ``model`` has an ``nn.MoE`` block with a ``capacity_factor`` (it drops tokens past an
    expert's capacity, a capacity counted over the tokens of one forward).

    Which tokens such a block drops depends on which tokens run together: a cached decoding step
    runs one token per sequence, padding takes capacity, and continuous batching mixes requests, so
    none of them would equal the full forward over the prefix. ``GPT.generate`` therefore refuses such
    a model with a cache or padding (``use_cache=False`` on unpadded prompts is the full forward of the
    batch each step, whose rows share the capacity), and the serving engine and
    ``PipelineGenerator`` refuse it outright.

    Example::

        >>> from neural_arch import nn
        >>> capacity_limited_moe(nn.GPT(16, 8, 1, 2, 8, moe_num_experts=2, moe_kwargs={"capacity_factor": 1.0}))
        True
    """
    return any(isinstance(m, MoE) and getattr(m, "capacity_factor", None) is not None for m in model.modules())


_CAPACITY_MOE = ("this model has MoE blocks with a capacity_factor, which drop tokens by what runs in one forward: "
                 "cached steps (one token per sequence) and padding would route differently from the full forward "
                 "over the prefix. Set capacity_factor = None on those blocks for generation (no token dropped)")


def _check_sampling(do_sample: bool, temperature, top_k, top_p, where: str) -> None:
    """A ``ValueError`` naming the sampling argument that is out of range (checked only when sampling)."""
    if not do_sample:
        return
    if not 0 < temperature < math.inf:   # inf would flatten every logit to 0: top-k/top-p then keep all
        raise ValueError(f"{where}: temperature must be finite and > 0 when sampling, got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or int(top_k) != top_k or top_k < 1):
        raise ValueError(f"{where}: top_k must be a positive integer or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"{where}: top_p must be in (0, 1] or None, got {top_p}")


def _left_padding_mask(attention_mask, shape: tuple, xp, where: str):
    """``attention_mask`` as a boolean array of ``shape`` describing left padding, or None; otherwise a
    ``ValueError`` (a right-padded prompt would be continued after its padding)."""
    if attention_mask is None:
        return None
    mask = xp.asarray(_ids(attention_mask)) != 0
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{where}: attention_mask must have the shape of idx {tuple(shape)}, got {tuple(mask.shape)}")
    if bool((mask[:, 1:] < mask[:, :-1]).any()) or not bool(mask[:, -1].all()):
        raise ValueError(f"{where}: attention_mask must describe LEFT padding (each row zeros then ones, its last "
                         "entry 1); pad prompts on the left")
    return mask


def _next_token(logits, do_sample: bool, temperature: float, top_k, top_p, gen, xp):
    """``(B, V)`` last-position logits -> ``(B,)`` int64 token ids (greedy or sampled, HF's order:
    temperature, then top-k, then top-p)."""
    if not do_sample:
        return xp.argmax(logits, axis=-1).astype(np.int64)
    scores = logits.astype(np.float64) / float(temperature)
    neg_inf = -np.inf
    if top_k is not None and int(top_k) < scores.shape[-1]:
        kth = xp.sort(scores, axis=-1)[:, -int(top_k)][:, None]
        scores = xp.where(scores < kth, neg_inf, scores)  # ties with the k-th value stay (as torch/HF)
    if top_p is not None and top_p < 1.0:
        # HF's TopPLogitsWarper, literally (so boundary cases round the same way): ascending order,
        # drop the tokens whose cumulative probability is <= 1 - top_p, keep the most likely one
        order = xp.argsort(scores, axis=-1, kind="stable")
        sorted_scores = xp.take_along_axis(scores, order, axis=-1)
        probs = xp.exp(sorted_scores - sorted_scores[:, -1:])
        probs = probs / probs.sum(axis=-1, keepdims=True)
        drop_sorted = xp.cumsum(probs, axis=-1) <= 1.0 - float(top_p)
        drop_sorted[:, -1] = False
        drop = xp.zeros_like(drop_sorted)
        drop[xp.arange(drop.shape[0])[:, None], order] = drop_sorted   # back to vocabulary order
        scores = xp.where(drop, neg_inf, scores)
    probs = xp.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = _backend.to_host(probs / probs.sum(axis=-1, keepdims=True))
    # inverse-CDF sampling with one uniform per row from the given numpy Generator
    cdf = np.cumsum(probs, axis=-1)
    u = gen.random(probs.shape[0]) * cdf[:, -1]
    choice = np.minimum((cdf <= u[:, None]).sum(axis=-1), probs.shape[-1] - 1).astype(np.int64)
    return xp.asarray(choice)


class TransformerBlock(Module):
    """``x + attn(ln1(x))`` then ``x + mlp(ln2(x))`` (pre-LN, as in GPT-2).

    The MLP is ``fc1`` (C -> mlp_ratio*C), GELU, ``fc2`` (back to C), dropout.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> block = nn.TransformerBlock(embed_dim=16, num_heads=2)
        >>> block(na.randn(2, 5, 16)).shape
        (2, 5, 16)
    """

    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                 causal: bool = True, num_experts: int = 0, moe_kwargs: dict | None = None):
        super().__init__()
        hidden = int(mlp_ratio * embed_dim)
        self.ln1 = LayerNorm(embed_dim)
        self.attn = CausalSelfAttention(embed_dim, num_heads, dropout=dropout, causal=causal)
        self.ln2 = LayerNorm(embed_dim)
        if num_experts:
            # A mixture of experts in place of the MLP (each expert the same fc1/GELU/fc2 shape).
            self.mlp = MoE(embed_dim, num_experts, hidden_dim=hidden, **(moe_kwargs or {}))
        else:
            self.mlp = Sequential(OrderedDict(
                fc1=Linear(embed_dim, hidden),
                act=GELU(),
                fc2=Linear(hidden, embed_dim),
                drop=Dropout(dropout),
            ))

    def forward(self, x, attn_mask=None, kv_cache=None, layer_idx: int = 0):
        """``attn_mask``, ``kv_cache`` and ``layer_idx`` go to :meth:`~neural_arch.nn.CausalSelfAttention.forward`."""
        if attn_mask is None and kv_cache is None:
            x = x + self.attn(self.ln1(x))
        else:
            x = x + self.attn(self.ln1(x), attn_mask=attn_mask, kv_cache=kv_cache, layer_idx=layer_idx)
        return x + self.mlp(self.ln2(x))


class GPT(Module):
    """A decoder-only language model: ``forward(idx)`` maps token ids ``(B, T)`` to logits ``(B, T, vocab)``.

    Args:
        vocab_size: number of token ids.
        block_size: the longest sequence the position embedding supports.
        n_layer, n_head, n_embd: depth, heads per block, width.
        dropout: dropout after the embeddings, on attention weights and after each residual branch.
        moe_num_experts: 0 (default) keeps every MLP dense; ``E > 0`` replaces the MLP of every
            ``moe_every``-th block (blocks ``moe_every - 1``, ``2 * moe_every - 1``, ...: 1 = every
            block, 2 = every other block as in GShard/Switch) with an ``nn.MoE`` of ``E`` experts.
        moe_kwargs: more ``nn.MoE`` arguments (``top_k``, ``capacity_factor``, ``aux_loss_coef``,
            ``z_loss_coef``). Add ``model.aux_loss`` (the sum over the MoE blocks) to the loss.

    Initialisation follows GPT-2: weights N(0, 0.02), biases 0, and the two residual output
    projections per block N(0, 0.02 / sqrt(2 * n_layer)) so the residual stream does not grow with depth.

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> model = nn.GPT(vocab_size=50, block_size=8, n_layer=2, n_head=2, n_embd=16)
        >>> model(np.zeros((3, 8), dtype=np.int64)).shape
        (3, 8, 50)
    """

    #: How :meth:`generate` turns the last position's logits into token ids; None (the default) chooses
    #: on this process with the whole vocabulary. Tensor parallelism installs a vocabulary-parallel one
    #: (:class:`~neural_arch.distributed.tensor.parallel.generation.VocabParallelTokenSelector`) whose logits
    #: are this rank's vocabulary shard: ``selector(last_logits, choose, do_sample) -> (B,) ids``, where
    #: ``choose(full_logits)`` is the single-process rule (greedy or the configured sampling). The hook keeps
    #: ``nn`` free of ``distributed`` imports.
    token_selector = None

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, *, moe_num_experts: int = 0, moe_every: int = 1,
                 moe_kwargs: dict | None = None):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("block_size", block_size),
                            ("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd)):
            if int(value) <= 0:
                raise ValueError(f"GPT: {name} must be a positive integer, got {value}")
        self.vocab_size, self.block_size = int(vocab_size), int(block_size)
        self.n_layer, self.n_head, self.n_embd = int(n_layer), int(n_head), int(n_embd)
        self.tok_emb = Embedding(vocab_size, n_embd)
        self.pos_emb = Embedding(block_size, n_embd)
        self.drop = Dropout(dropout)
        if int(moe_num_experts) < 0 or int(moe_every) <= 0:
            raise ValueError(f"GPT: moe_num_experts ({moe_num_experts}) must be >= 0 and moe_every "
                             f"({moe_every}) positive")
        self.moe_num_experts, self.moe_every = int(moe_num_experts), int(moe_every)
        self.blocks = ModuleList([
            TransformerBlock(n_embd, n_head, dropout=dropout, moe_kwargs=moe_kwargs,
                             num_experts=self.moe_num_experts if i % self.moe_every == self.moe_every - 1 else 0)
            for i in range(n_layer)])
        self.ln_f = LayerNorm(n_embd)
        self.head = Linear(n_embd, vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (Linear, Embedding)):
                init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, Linear) and module.bias is not None:
                init.zeros_(module.bias)
        resid_std = 0.02 / math.sqrt(2 * self.n_layer)
        for block in self.blocks:
            init.normal_(block.attn.out_proj.weight, 0.0, resid_std)
            for mlp in (block.mlp.experts if isinstance(block.mlp, MoE) else [block.mlp]):
                init.normal_(mlp.fc2.weight, 0.0, resid_std)

    @property
    def aux_loss(self):
        """The sum of the MoE blocks' auxiliary losses of the last forward (None without MoE blocks)."""
        losses = [b.mlp.aux_loss for b in self.blocks if isinstance(b.mlp, MoE) and b.mlp.aux_loss is not None]
        if not losses:
            return None
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        return total

    def embed(self, idx, position_ids=None):
        """Token + position embeddings (then dropout): ``(B, T)`` ids -> ``(B, T, n_embd)``.

        ``position_ids`` (``(T,)`` or ``(B, T)``) defaults to ``0 .. T-1``; :meth:`forward` passes
        per-sequence positions when it is given an ``attention_mask`` or a ``kv_cache``.
        """
        raw = _ids(idx)
        if raw.ndim != 2:
            raise ValueError(f"GPT expects token ids of shape (batch, time), got {tuple(raw.shape)}")
        t = raw.shape[1]
        xp = _backend.get_array_module(raw)
        if position_ids is None:
            if t > self.block_size:
                raise ValueError(
                    f"GPT: sequence length {t} exceeds block_size {self.block_size}; "
                    "crop the input or build the model with a larger block_size"
                )
            position_ids = xp.arange(t)
        elif t and int(position_ids.max()) >= self.block_size:
            raise ValueError(
                f"GPT: position {int(position_ids.max())} is past block_size {self.block_size} (positions "
                f"0 .. {self.block_size - 1} have embeddings); crop the input or build the model with a "
                "larger block_size"
            )
        return self.drop(self.tok_emb(raw) + self.pos_emb(position_ids))

    def logits_from_hidden(self, x):
        """Final LayerNorm and vocabulary projection: ``(B, T, n_embd)`` -> ``(B, T, vocab)``."""
        return self.head(self.ln_f(x))

    def forward(self, idx, attention_mask=None, kv_cache=None):
        """Logits ``(B, T, vocab)`` for token ids ``(B, T)``.

        Args:
            attention_mask: optional ``(B, past + T)`` of 1 (a token) and 0 (padding), covering the
                cached positions too (Hugging Face's convention). Padded keys are never attended
                and each sequence's positions count its tokens only: ``position = cumsum(mask) - 1``,
                so a left-padded prompt gets the same logits as the prompt alone.
            kv_cache: a :class:`~neural_arch.nn.kv_cache.KVCache` (see :meth:`generate`); ``idx``
                then holds only the new tokens, at positions after the ``past`` cached ones. Once a
                mask with padding came with the cache, every later step needs its ``attention_mask``
                too (a ``ValueError`` otherwise: the padding would be attended).
        """
        if attention_mask is None and kv_cache is None:
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.logits_from_hidden(x)
        raw = _ids(idx)
        if raw.ndim != 2:
            raise ValueError(f"GPT expects token ids of shape (batch, time), got {tuple(raw.shape)}")
        b, t = raw.shape
        xp = _backend.get_array_module(raw)
        past = 0 if kv_cache is None else kv_cache.get_seq_length(0)
        if past and (len(kv_cache) != len(self.blocks)
                     or any(kv_cache.get_seq_length(i) != past for i in range(1, len(kv_cache)))):
            # another model's cache, or one a failed forward left half updated: the layers would see
            # different pasts (positions from layer 0's, causal masks from their own)
            raise ValueError(f"GPT: the kv_cache holds {len(kv_cache)} layers of lengths "
                             f"{[kv_cache.get_seq_length(i) for i in range(len(kv_cache))]}, this model has "
                             f"{len(self.blocks)} blocks; use one KVCache per model and sequence batch (a new "
                             "one after a failed step)")
        key_mask = None
        if attention_mask is None:
            if past and getattr(kv_cache, "padded", False):
                # without the mask the padded keys would be attended and positions counted from the
                # padding: every padded sequence would get other logits, silently
                raise ValueError(f"GPT: the kv_cache holds padded sequences (an attention_mask with zeros "
                                 f"came with them); pass attention_mask of shape (batch, past + time) = "
                                 f"{(b, past + t)} on every step, the cached positions included")
            position_ids = past + xp.arange(t)
        else:
            am = xp.asarray(_ids(attention_mask))
            if tuple(am.shape) != (b, past + t):
                raise ValueError(f"GPT: attention_mask must have shape (batch, past + time) = {(b, past + t)} "
                                 f"(past = {past} cached positions), got {tuple(am.shape)}")
            am = am != 0
            if kv_cache is not None and not getattr(kv_cache, "padded", False) and not bool(am.all()):
                kv_cache.padded = True   # later steps must bring the mask too (see above)
            # per-sequence positions: padding does not count (HF's cumsum(mask) - 1; pads get 0, unused)
            position_ids = xp.maximum(xp.cumsum(am, axis=1) - 1, 0)[:, past:]
            key_mask = am[:, None, None, :]  # (B, 1, 1, S): broadcast over heads and queries
        x = self.embed(raw, position_ids)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask=key_mask, kv_cache=kv_cache, layer_idx=i)
        return self.logits_from_hidden(x)

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, do_sample: bool = False, eos_token_id=None, *,
                 attention_mask=None, generator: np.random.Generator | None = None, use_cache: bool = True):
        """Extend each sequence of ``idx`` ``(B, T)`` by up to ``max_new_tokens`` tokens.

        Greedy (argmax) when ``do_sample`` is False; otherwise samples from
        ``softmax(logits / temperature)`` after top-k then top-p (nucleus) filtering (Hugging Face's
        order and semantics: top-k keeps ties with the k-th logit, top-p keeps the smallest set of
        most likely tokens whose probability reaches ``top_p``, at least one). Draws come from
        ``generator`` (a ``neural_arch.Generator`` or ``numpy.random.Generator``) or the global one (``neural_arch.manual_seed``).

        Runs under ``no_grad`` in eval mode (the previous mode is restored) with a
        :class:`~neural_arch.nn.kv_cache.KVCache`: the prompt is run once, then one token per step,
        and each step's logits equal those of a full forward over the whole prefix
        (``use_cache=False`` recomputes them that way).

        Prompts of different lengths: **left-pad** them and pass ``attention_mask`` ``(B, T)``
        (1 = token, 0 = padding), as with Hugging Face. Padding is never attended and positions are
        counted per sequence, so a padded prompt generates what it would alone.

        A sequence that emits ``eos_token_id`` (an int or a list of ints) is finished: later
        positions are filled with (the first) ``eos_token_id``; generation stops once every
        sequence is finished, so the result may be shorter than ``T + max_new_tokens``.

        Raises ``ValueError`` when ``T + max_new_tokens`` exceeds ``block_size`` (the position
        embedding has no row for later positions): crop the prompt first, e.g.
        ``idx[:, -(block_size - max_new_tokens):]``. Also raises ``ValueError`` for token ids that are
        not integers in ``[0, vocab_size)``, and for a model with capacity-limited MoE blocks
        (:func:`capacity_limited_moe`) when cached or padded (their dropped tokens depend on what runs
        together).

        Returns ``(B, T + n)`` token ids, a Tensor if ``idx`` was one, else an array.

        Tensor parallel: on a model from ``parallelize_gpt`` every rank of the tp group calls this with
        the same arguments; each rank caches its own heads and :attr:`token_selector` chooses the
        tokens from the vocabulary-parallel logits, the same on every rank
        (``neural_arch.distributed.tensor.parallel.generation``).

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> model = nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
            >>> model.generate(np.array([[1, 2, 3]]), max_new_tokens=4).shape
            (1, 7)
        """
        try:
            raw = _ids(idx)
        except ValueError as exc:   # NumPy refuses ragged lists: say how to batch prompts of different lengths
            raise ValueError(f"GPT.generate: idx must be token ids of shape (batch, time) ({exc}); prompts of "
                             "different lengths: left-pad them and pass attention_mask (1 = token, 0 = padding)"
                             ) from None
        if raw.ndim != 2:
            raise ValueError(f"GPT.generate: idx must be token ids of shape (batch, time), got {tuple(raw.shape)}")
        if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
            raise ValueError(f"GPT.generate: max_new_tokens must be a non-negative integer, got {max_new_tokens}")
        b, t = raw.shape
        max_new_tokens = int(max_new_tokens)
        if t + max_new_tokens > self.block_size:
            raise ValueError(
                f"GPT.generate: the prompt length {t} plus max_new_tokens {max_new_tokens} = "
                f"{t + max_new_tokens} exceeds block_size {self.block_size}; crop the prompt "
                f"(idx[:, -(block_size - max_new_tokens):]) or ask for fewer tokens"
            )
        if t == 0:
            raise ValueError("GPT.generate: idx must hold at least one token per sequence")
        raw = _check_token_ids(raw, self.vocab_size, "GPT.generate")
        _check_sampling(do_sample, temperature, top_k, top_p, "GPT.generate")
        xp = _backend.get_array_module(raw)
        mask = _left_padding_mask(attention_mask, (b, t), xp, "GPT.generate")
        if capacity_limited_moe(self) and (use_cache or (mask is not None and not bool(mask.all()))):
            raise ValueError(f"GPT.generate: {_CAPACITY_MOE}, or pass use_cache=False with unpadded prompts")
        eos = _eos_ids(eos_token_id, "GPT.generate")
        if eos is not None:
            eos = xp.asarray(eos)
        gen = numpy_generator(generator)

        def choose(last_logits):
            return _next_token(last_logits, do_sample, temperature, top_k, top_p, gen, xp)

        was_training = self.training
        self.eval()
        try:
            with no_grad():
                out = raw.astype(np.int64)
                done = xp.zeros(b, dtype=bool)
                cache = KVCache() if use_cache else None
                step_ids, step_mask = out, mask
                for _ in range(max_new_tokens):
                    if use_cache:
                        logits = self(step_ids, attention_mask=step_mask, kv_cache=cache)
                    else:
                        logits = self(out, attention_mask=step_mask)
                    last = logits.data[:, -1, :]
                    if self.token_selector is None:
                        nxt = choose(last)
                    else:
                        nxt = self.token_selector(last, choose, do_sample)
                    if eos is not None:
                        nxt = xp.where(done, eos[0], nxt)
                        done = done | xp.isin(nxt, eos)
                    out = xp.concatenate([out, nxt[:, None]], axis=1)
                    step_ids = nxt[:, None]
                    if step_mask is not None:
                        step_mask = xp.concatenate([step_mask, xp.ones((b, 1), dtype=bool)], axis=1)
                    if eos is not None and bool(done.all()):
                        break
        finally:
            self.train(was_training)
        return Tensor(out) if isinstance(idx, Tensor) else out

    def extra_repr(self) -> str:
        moe = f", moe_num_experts={self.moe_num_experts}, moe_every={self.moe_every}" if self.moe_num_experts else ""
        return (f"vocab_size={self.vocab_size}, block_size={self.block_size}, n_layer={self.n_layer}, "
                f"n_head={self.n_head}, n_embd={self.n_embd}{moe}")
