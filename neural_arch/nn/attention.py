"""Causal multi-head self-attention.

``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` are separate ``Linear`` layers (rather than
one fused QKV matrix) so tensor parallelism can shard them by heads: split q/k/v by output rows
(column parallel) and ``out_proj`` by input columns (row parallel). ``forward`` infers the local
number of heads from the projection width, so a sharded copy needs no other change.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> attn = nn.MultiheadAttention(embed_dim=8, num_heads=2)
    >>> attn(np.zeros((3, 5, 8), dtype=np.float32)).shape
    (3, 5, 8)
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn.linear import Linear
from neural_arch.nn.module import Module
from neural_arch.nn.normalization import Dropout

__all__ = ["MultiheadAttention", "causal_mask"]

# A large finite negative rather than -inf: adding it keeps every row finite, so a fully masked row
# (impossible when causal, possible with user masks) gives a uniform softmax instead of NaNs.
_MASK_VALUE = -1e9


def causal_mask(t: int, dtype=np.float32, device="cpu"):
    """Additive ``(t, t)`` mask: 0 on and below the diagonal, a large negative value above it.

    Example::

        >>> from neural_arch.nn.attention import causal_mask
        >>> (causal_mask(3) < 0).astype(int).tolist()
        [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    """
    mask = np.triu(np.full((t, t), _MASK_VALUE, dtype=dtype), k=1)
    return _backend.to_device(mask, device)


class MultiheadAttention(Module):
    """Self-attention over ``x`` of shape ``(batch, time, embed_dim)``; returns the same shape.

    Args:
        embed_dim: model width C; must be divisible by ``num_heads``.
        num_heads: number of heads H (head size D = C / H).
        dropout: dropout on the attention weights and on the output projection.
            Attention is :func:`neural_arch.nn.functional.scaled_dot_product_attention` (blockwise:
            no (T, T) matrix is kept); set ``attention_fn`` to a function with its signature
            (e.g. ring attention) to replace it.
        causal: if True (the default) position t attends only to positions <= t (also across a
            ``kv_cache``: the new queries sit after the cached positions).
        bias: whether the four projections have biases.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> attn = nn.MultiheadAttention(embed_dim=8, num_heads=2)          # causal by default
        >>> attn(na.randn(2, 5, 8)).shape
        (2, 5, 8)
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, causal: bool = True,
                 bias: bool = True, dtype=np.float32):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        self.embed_dim = int(embed_dim)
        self.num_heads = int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.causal = bool(causal)
        self.q_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.k_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.v_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.attn_dropout = Dropout(dropout)
        self.resid_dropout = Dropout(dropout)
        # Who computes attention: None = F.scaled_dot_product_attention; context parallelism sets
        # ring or Ulysses attention here (same signature), so the module itself stays unchanged.
        self.attention_fn = None

    def forward(self, x, attn_mask=None, kv_cache=None, layer_idx: int = 0):
        """Attention of ``x`` over itself, or over ``kv_cache``'s keys/values plus its own.

        Args:
            x: ``(B, T, C)``.
            attn_mask: optional mask over the keys, broadcastable to ``(B, H, T, S)`` where ``S`` is
                ``past + T`` (``past`` = positions already in ``kv_cache``): boolean True = attend,
                or float, added to the scores. It is combined with the causal mask (when ``causal``),
                not a replacement for it; ``GPT`` passes its padding mask here as ``(B, 1, 1, S)``.
            kv_cache: a :class:`~neural_arch.nn.kv_cache.KVCache`; this layer's keys and values are
                appended to slot ``layer_idx`` and the queries (at positions ``past .. past + T - 1``)
                attend over all of them (incremental decoding).
        """
        x = x if isinstance(x, Tensor) else Tensor(x)
        if x.ndim != 3:
            raise ValueError(
                f"MultiheadAttention expects x of shape (batch, time, embed_dim), got {tuple(x.shape)}"
            )
        b, t, _ = x.shape
        d = self.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = q.shape[-1] // d  # local heads: fewer than num_heads when the projections are sharded
        # (B, T, H*D) -> (B, H, T, D)
        q = q.reshape(b, t, h, d).permute(0, 2, 1, 3)
        k = k.reshape(b, t, h, d).permute(0, 2, 1, 3)
        v = v.reshape(b, t, h, d).permute(0, 2, 1, 3)
        p = self.attn_dropout.p if self.training else 0.0
        attend = getattr(self, "attention_fn", None) or F.scaled_dot_product_attention  # older pickles lack it
        if attn_mask is None and kv_cache is None:
            y = attend(q, k, v, dropout_p=p, is_causal=self.causal)  # (B, H, T, D), blockwise
        else:
            past = 0
            if kv_cache is not None:
                past = kv_cache.get_seq_length(layer_idx)
                k, v = (Tensor._wrap(a) for a in kv_cache.update(k, v, layer_idx))
            y = attend(q, k, v, attn_mask=self._mask(attn_mask, t, past, q.data), dropout_p=p)
        y = y.permute(0, 2, 1, 3).reshape(b, t, h * d)
        return self.resid_dropout(self.out_proj(y))

    def _mask(self, attn_mask, t: int, past: int, like):
        """``attn_mask`` (or None) combined with the causal mask of queries ``past .. past+t-1`` over
        keys ``0 .. past+t-1`` (``is_causal`` alone is top-left aligned, wrong once a cache holds a past)."""
        xp = _backend.get_array_module(like)
        m = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
        m = None if m is None else xp.asarray(m)
        if not self.causal:
            return m
        keep = xp.arange(past + t)[None, :] <= (past + xp.arange(t))[:, None]   # (T, S)
        if m is None:
            return keep
        if m.dtype == bool:
            return m & keep
        return xp.where(keep, m.astype(like.dtype), like.dtype.type(-np.inf))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"
