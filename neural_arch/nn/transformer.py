"""A pre-LayerNorm transformer block and a small GPT-style language model.

``GPT`` keeps its pieces addressable for model parallelism: ``tok_emb``, ``pos_emb``, ``drop``,
``blocks`` (a ``ModuleList`` of ``TransformerBlock``), ``ln_f`` and ``head``; each block has
``ln1``, ``attn`` (``q_proj``/``k_proj``/``v_proj``/``out_proj``), ``ln2`` and ``mlp``
(``fc1``, ``act``, ``fc2``, ``drop``). A pipeline stage can run ``embed`` → some blocks →
``logits_from_hidden`` without touching ``forward``.

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
from neural_arch.core.tensor import Tensor
from neural_arch.nn import init
from neural_arch.nn.activation import GELU
from neural_arch.nn.attention import MultiheadAttention
from neural_arch.nn.container import ModuleList, Sequential
from neural_arch.nn.linear import Embedding, Linear
from neural_arch.nn.module import Module
from neural_arch.nn.moe import MoE
from neural_arch.nn.normalization import Dropout, LayerNorm

__all__ = ["TransformerBlock", "GPT"]


class TransformerBlock(Module):
    """``x + attn(ln1(x))`` then ``x + mlp(ln2(x))`` (pre-LN, as in GPT-2).

    The MLP is ``fc1`` (C -> mlp_ratio*C), GELU, ``fc2`` (back to C), dropout.
    """

    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                 causal: bool = True, num_experts: int = 0, moe_kwargs: dict | None = None):
        super().__init__()
        hidden = int(mlp_ratio * embed_dim)
        self.ln1 = LayerNorm(embed_dim)
        self.attn = MultiheadAttention(embed_dim, num_heads, dropout=dropout, causal=causal)
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

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
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
    """

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

    def embed(self, idx):
        """Token + position embeddings (then dropout): ``(B, T)`` ids -> ``(B, T, n_embd)``."""
        raw = idx.data if isinstance(idx, Tensor) else np.asarray(idx) if not hasattr(idx, "shape") else idx
        if raw.ndim != 2:
            raise ValueError(f"GPT expects token ids of shape (batch, time), got {tuple(raw.shape)}")
        t = raw.shape[1]
        if t > self.block_size:
            raise ValueError(
                f"GPT: sequence length {t} exceeds block_size {self.block_size}; "
                "crop the input or build the model with a larger block_size"
            )
        positions = _backend.get_array_module(raw).arange(t)
        return self.drop(self.tok_emb(raw) + self.pos_emb(positions))

    def logits_from_hidden(self, x):
        """Final LayerNorm and vocabulary projection: ``(B, T, n_embd)`` -> ``(B, T, vocab)``."""
        return self.head(self.ln_f(x))

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.logits_from_hidden(x)

    def extra_repr(self) -> str:
        moe = f", moe_num_experts={self.moe_num_experts}, moe_every={self.moe_every}" if self.moe_num_experts else ""
        return (f"vocab_size={self.vocab_size}, block_size={self.block_size}, n_layer={self.n_layer}, "
                f"n_head={self.n_head}, n_embd={self.n_embd}{moe}")
