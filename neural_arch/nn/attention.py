"""Attention layers: ``MultiheadAttention`` (PyTorch's contract) and ``CausalSelfAttention`` (the GPT block's).

:class:`MultiheadAttention` is ``torch.nn.MultiheadAttention``: query/key/value in, ``(output, weights)``
out, torch's parameter names (``in_proj_weight``/``in_proj_bias``, or ``q_proj_weight``/``k_proj_weight``/
``v_proj_weight`` when ``kdim``/``vdim`` differ, and an ``out_proj`` Linear) so a torch state dict loads,
and torch's masks (boolean True = *not* allowed; float masks are added).

:class:`CausalSelfAttention` is the GPT block's self-attention. Its ``q_proj``, ``k_proj``, ``v_proj`` and
``out_proj`` are separate ``Linear`` layers (rather than one fused QKV matrix) so tensor parallelism can
shard them by heads: split q/k/v by output rows (column parallel) and ``out_proj`` by input columns (row
parallel). ``forward`` infers the local number of heads from the projection width, so a sharded copy needs
no other change; ``attention_fn`` lets context parallelism swap in ring attention, and ``kv_cache`` serves
incremental decoding.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> attn = nn.CausalSelfAttention(embed_dim=8, num_heads=2)
    >>> attn(np.zeros((3, 5, 8), dtype=np.float32)).shape
    (3, 5, 8)
    >>> mha = nn.MultiheadAttention(embed_dim=8, num_heads=2, batch_first=True)
    >>> x = np.zeros((3, 5, 8), dtype=np.float32)
    >>> out, weights = mha(x, x, x)
    >>> out.shape, weights.shape
    ((3, 5, 8), (3, 5, 5))
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.linear import Linear
from neural_arch.nn.module import Module
from neural_arch.nn.normalization import Dropout
from neural_arch.nn.parameter import Parameter

__all__ = ["CausalSelfAttention", "MultiheadAttention", "causal_mask"]

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


class CausalSelfAttention(Module):
    """The GPT block's self-attention over ``x`` of shape ``(batch, time, embed_dim)``; returns the same shape.

    (Before torch's :class:`MultiheadAttention` contract arrived this class was called
    ``MultiheadAttention``; its attribute names, state-dict keys and ``forward`` are unchanged, and a model
    pickled under the old name loads as this class.)

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
        >>> attn = nn.CausalSelfAttention(embed_dim=8, num_heads=2)          # causal by default
        >>> attn(na.randn(2, 5, 8)).shape
        (2, 5, 8)
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, causal: bool = True,
                 bias: bool = True, dtype=np.float32):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"CausalSelfAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
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
                f"CausalSelfAttention expects x of shape (batch, time, embed_dim), got {tuple(x.shape)}"
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


def _mask_array(mask, name: str):
    """The array behind a mask given as a Tensor or an array (None stays None)."""
    if mask is None:
        return None
    m = mask.data if isinstance(mask, Tensor) else mask
    if not hasattr(m, "dtype"):
        m = np.asarray(m)
    if m.dtype != bool and m.dtype.kind != "f":
        raise TypeError(f"MultiheadAttention: {name} must be boolean (True = not allowed) or floating "
                        f"(added to the scores), got dtype {m.dtype}")
    return m


def _additive(mask, xp, dtype):
    """torch's ``_canonical_mask``: a boolean mask (True = not allowed) becomes 0 / -inf; a float one stays."""
    if mask.dtype == bool:
        return xp.where(xp.asarray(mask), dtype.type(-np.inf), dtype.type(0))
    return xp.asarray(mask).astype(dtype, copy=False)


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention``: attention of ``query`` over ``key``/``value``, returning
    ``(attn_output, attn_weights)``.

    Args:
        embed_dim: width E of the queries and of the output; must be divisible by ``num_heads``.
        num_heads: number of heads H (head size E / H).
        dropout: dropout on the attention weights (in training mode).
        bias: whether the input projections (``in_proj_bias``) and ``out_proj`` have biases.
        add_bias_kv, add_zero_attn: not implemented (raise ``NotImplementedError``).
        kdim, vdim: widths of ``key`` and ``value`` (default ``embed_dim``). When both equal
            ``embed_dim`` the projections are one ``in_proj_weight`` of shape ``(3E, E)``; otherwise
            ``q_proj_weight`` ``(E, E)``, ``k_proj_weight`` ``(E, kdim)`` and ``v_proj_weight``
            ``(E, vdim)`` -- torch's names, so ``load_state_dict`` takes a torch state dict.
        batch_first: inputs and output are ``(N, L, E)`` when True, ``(L, N, E)`` (torch's default) when False.
        device, dtype: where and in which dtype the parameters are created (float32 by default).

    Initialised as torch does: Xavier-uniform input projections, zero biases, ``out_proj`` a ``Linear``.
    For the GPT block's causal self-attention (key/value caches, tensor and context parallelism) see
    :class:`CausalSelfAttention`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> mha = nn.MultiheadAttention(8, 2)                       # (L, N, E) like torch
        >>> q, kv = na.randn(4, 3, 8), na.randn(6, 3, 8)
        >>> out, w = mha(q, kv, kv, key_padding_mask=na.zeros(3, 6, dtype=na.bool))
        >>> out.shape, w.shape
        ((4, 3, 8), (3, 4, 6))
        >>> sorted(mha.state_dict())
        ['in_proj_bias', 'in_proj_weight', 'out_proj.bias', 'out_proj.weight']
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if add_bias_kv:
            raise NotImplementedError("MultiheadAttention(add_bias_kv=True) is not implemented here: append "
                                      "a learned key/value row to key and value yourself, or leave it False")
        if add_zero_attn:
            raise NotImplementedError("MultiheadAttention(add_zero_attn=True) is not implemented here: append "
                                      "a zero row to key and value yourself, or leave it False")
        if int(embed_dim) <= 0 or int(num_heads) <= 0:
            raise ValueError(f"MultiheadAttention: embed_dim and num_heads must be positive, got "
                             f"{embed_dim} and {num_heads}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        dtype = np.float32 if dtype is None else dtype
        self.embed_dim = int(embed_dim)
        self.kdim = self.embed_dim if kdim is None else int(kdim)
        self.vdim = self.embed_dim if vdim is None else int(vdim)
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.num_heads = int(num_heads)
        self.dropout = float(dropout)
        self.batch_first = bool(batch_first)
        self.head_dim = self.embed_dim // self.num_heads
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(np.empty((3 * e, e), dtype=dtype), device=device)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = Parameter(np.empty((e, e), dtype=dtype), device=device)
            self.k_proj_weight = Parameter(np.empty((e, self.kdim), dtype=dtype), device=device)
            self.v_proj_weight = Parameter(np.empty((e, self.vdim), dtype=dtype), device=device)
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(np.empty((3 * e,), dtype=dtype), device=device)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(e, e, bias=bias, dtype=dtype, device=device)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def __setstate__(self, state):
        # A model pickled before the rename holds the GPT block's attention under this class's name
        # (its state has ``causal``): load it as the class it was, CausalSelfAttention.
        self.__dict__.update(state)
        if "causal" in state and "in_proj_bias" not in state.get("_parameters", {}):
            self.__class__ = CausalSelfAttention

    def _projection(self, i: int):
        """Weight and bias of projection ``i`` (0 = q, 1 = k, 2 = v), as torch slices them."""
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight[i * e:(i + 1) * e]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else self.in_proj_bias[i * e:(i + 1) * e]
        return w, b

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        """torch's ``MultiheadAttention.forward``.

        Args:
            query: ``(L, N, E)`` (``(N, L, E)`` with ``batch_first``), or ``(L, E)`` unbatched.
            key: ``(S, N, kdim)``; value: ``(S, N, vdim)`` (batch first / unbatched likewise).
            key_padding_mask: ``(N, S)`` (``(S,)`` unbatched): boolean True = that key is padding and
                is ignored; a float mask is added to the scores.
            need_weights: also return the attention weights (computed explicitly; without them the
                output comes from :func:`~neural_arch.nn.functional.scaled_dot_product_attention`,
                which never builds the ``(L, S)`` matrix).
            attn_mask: ``(L, S)`` or ``(N * num_heads, L, S)``: boolean True = *not* allowed to attend,
                or float, added to the scores.
            average_attn_weights: return the weights averaged over heads ``(N, L, S)`` instead of
                per head ``(N, num_heads, L, S)``.
            is_causal: a hint that ``attn_mask`` is the causal mask (torch's meaning). Without an
                ``attn_mask`` it applies the causal mask (query i attends keys j <= i), where torch
                asks for the mask instead.

        Returns ``(attn_output, attn_weights)``: the output in the layout of ``query``, and the weights
        after dropout (None when ``need_weights`` is False). A query whose keys are all masked gets NaN
        weights (as torch); its output is NaN with ``need_weights`` and 0 without (the fused kernel's
        convention).
        """
        query, key, value = (x if isinstance(x, Tensor) else Tensor(x) for x in (query, key, value))
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiheadAttention: query, key and value must all be 3-D (batched) or 2-D "
                             f"(unbatched), got shapes {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        elif self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        # from here on (L, N, E) as in torch's functional form
        tgt_len, bsz, e = query.shape
        src_len = key.shape[0]
        for name, x, width in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if x.shape[-1] != width:
                raise ValueError(f"MultiheadAttention: {name} has width {x.shape[-1]}, expected {width}")
        if key.shape[:2] != value.shape[:2] or key.shape[1] != bsz:
            raise ValueError(f"MultiheadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} must "
                             f"share (S, N), and N must be the query's ({bsz})")
        h, d = self.num_heads, self.head_dim
        q, k, v = (F.linear(x, *self._projection(i)) for i, x in enumerate((query, key, value)))
        # (T, N, E) -> (N, H, T, D)
        q = q.reshape(tgt_len, bsz, h, d).permute(1, 2, 0, 3)
        k = k.reshape(src_len, bsz, h, d).permute(1, 2, 0, 3)
        v = v.reshape(src_len, bsz, h, d).permute(1, 2, 0, 3)
        p = self.dropout if self.training else 0.0
        # the fused kernel applies a bare causal hint itself; anything else becomes one additive mask
        fused_causal = is_causal and attn_mask is None and key_padding_mask is None and not need_weights
        mask = None if fused_causal else self._merged_mask(attn_mask, key_padding_mask, is_causal, bsz, tgt_len,
                                                           src_len, batched, q.data)
        weights = None
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            if mask is not None:
                scores = scores + (mask if isinstance(mask, Tensor) else Tensor(mask))
            weights = F.dropout(F.softmax(scores, axis=-1), p=p, training=p > 0)
            y = weights @ v
            if average_attn_weights:
                weights = weights.mean(axis=1)
            if not batched:
                weights = weights.squeeze(0)
        elif fused_causal:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        y = self.out_proj(y.permute(2, 0, 1, 3).reshape(tgt_len, bsz, e))   # (L, N, E)
        if not batched:
            y = y.squeeze(1)
        elif self.batch_first:
            y = y.transpose(0, 1)
        return y, weights

    def _merged_mask(self, attn_mask, key_padding_mask, is_causal: bool, bsz: int, tgt_len: int, src_len: int,
                     batched: bool, like):
        """One additive mask broadcastable to ``(N, H, L, S)`` (or None), from torch's two masks and the
        causal hint (applied when no ``attn_mask`` is given). A float ``attn_mask`` Tensor that requires
        grad (a learned bias) stays a Tensor, so it gets its gradient as in torch."""
        xp = _backend.get_array_module(like)
        am = _mask_array(attn_mask, "attn_mask")
        kpm = _mask_array(key_padding_mask, "key_padding_mask")
        h = self.num_heads
        if am is None and is_causal:
            am = xp.triu(xp.ones((tgt_len, src_len), dtype=bool), k=1)
        out = None
        if am is not None:
            am = _additive(am, xp, like.dtype)
            if am.ndim == 2:
                if am.shape != (tgt_len, src_len):
                    raise ValueError(f"MultiheadAttention: a 2-D attn_mask must be (L, S) = {(tgt_len, src_len)}, "
                                     f"got {tuple(am.shape)}")
            elif am.ndim == 3:
                want = (bsz * h if batched else h, tgt_len, src_len)
                if am.shape != want:
                    raise ValueError(f"MultiheadAttention: a 3-D attn_mask must be (N * num_heads, L, S) = {want}, "
                                     f"got {tuple(am.shape)}")
                am = am.reshape(bsz, h, tgt_len, src_len)
            else:
                raise ValueError(f"MultiheadAttention: attn_mask must be 2-D or 3-D, got shape {tuple(am.shape)}")
            out = am
            if isinstance(attn_mask, Tensor) and attn_mask.requires_grad:
                out = attn_mask.to(like.dtype).reshape(*am.shape)      # the same values, in the graph
        if kpm is not None:
            want = (bsz, src_len) if batched else (src_len,)
            if tuple(kpm.shape) != want:
                raise ValueError(f"MultiheadAttention: key_padding_mask must be {'(N, S)' if batched else '(S,)'} "
                                 f"= {want}, got {tuple(kpm.shape)}")
            kpm = _additive(kpm, xp, like.dtype).reshape(bsz, 1, 1, src_len)
            out = kpm if out is None else out + (Tensor(kpm) if isinstance(out, Tensor) else kpm)
        return out

    def extra_repr(self) -> str:
        extra = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"
                f"{extra}, batch_first={self.batch_first}")
