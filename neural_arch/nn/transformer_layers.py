"""torch's encoder-decoder transformer: ``TransformerEncoderLayer``, ``TransformerEncoder``,
``TransformerDecoderLayer``, ``TransformerDecoder`` and ``Transformer`` ("Attention Is All You Need").

Same arguments, defaults, submodule names and state-dict keys as ``torch.nn`` (``self_attn.in_proj_weight``,
``linear1.weight``, ``norm1.weight``, ``encoder.layers.0....``), so a ported script builds the same model and
``load_state_dict`` takes torch's weights. Built from this package's :class:`~neural_arch.nn.attention.MultiheadAttention`,
``Linear``, ``LayerNorm`` and ``Dropout``. (The GPT model's own pre-norm block is
:class:`~neural_arch.nn.transformer.TransformerBlock`.)

Masks are torch's: boolean True = *not* allowed to attend, float masks are added to the scores.
One difference from torch, in what torch does only as an inference shortcut: torch's "fast path"
(eval mode, no grad, ``batch_first``, ...) may return zeros at the padded positions of
``src_key_padding_mask``; here those positions hold the ordinary computed values. Read only the
unpadded positions, in both.

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn.transformer_layers import TransformerEncoder, TransformerEncoderLayer
    >>> layer = TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    >>> enc = TransformerEncoder(layer, num_layers=2)
    >>> enc(na.randn(3, 5, 8)).shape
    (3, 5, 8)
    >>> sorted(k for k in enc.state_dict() if k.startswith("layers.0.self_attn"))
    ['layers.0.self_attn.in_proj_bias', 'layers.0.self_attn.in_proj_weight', 'layers.0.self_attn.out_proj.bias', 'layers.0.self_attn.out_proj.weight']
"""

from __future__ import annotations

import copy

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.attention import MultiheadAttention
from neural_arch.nn.container import ModuleList
from neural_arch.nn.linear import Linear
from neural_arch.nn.module import Module
from neural_arch.nn.normalization import Dropout, LayerNorm

__all__ = ["Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerEncoderLayer"]


def _activation_fn(activation):
    """torch's ``_get_activation_fn``: "relu"/"gelu" by name, or any callable (a function or a Module)."""
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise RuntimeError(f"activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise TypeError(f"activation must be 'relu', 'gelu' or a callable, got {type(activation).__name__}")
    return activation


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _seq_len(x, batch_first: bool):
    """torch's ``_get_seq_len``: the sequence length of ``x`` (unbatched ``(S, E)`` or batched)."""
    shape = x.shape
    if len(shape) == 2:
        return shape[0]
    return shape[1 if batch_first else 0]


def _detect_is_causal_mask(mask, is_causal, size) -> bool:
    """torch's ``_detect_is_causal_mask``: True when told so, or, when ``is_causal`` is None, when ``mask``
    equals :meth:`Transformer.generate_square_subsequent_mask` of its size. Only a hint: the mask itself
    is always applied here, so the answer never changes a result."""
    make_causal = is_causal is True
    if is_causal is None and mask is not None:
        m = mask.data if isinstance(mask, Tensor) else mask
        sz = size if size is not None else m.shape[-2]
        if tuple(m.shape) == (sz, sz) and m.dtype != bool:
            ref = np.triu(np.full((sz, sz), -np.inf), k=1)
            make_causal = bool(np.array_equal(_backend.to_host(m).astype(np.float64), ref))
    return make_causal


def _clones(module: Module, n: int) -> ModuleList:
    # independent deep copies, as torch's _get_clones: each layer trains its own weights
    return ModuleList([copy.deepcopy(module) for _ in range(int(n))])


class TransformerEncoderLayer(Module):
    """torch's ``nn.TransformerEncoderLayer``: self-attention then a feed-forward block, each with a
    residual connection and a LayerNorm (after the residual by default, before the block with ``norm_first``).

    Args:
        d_model: model width E.
        nhead: attention heads (``d_model`` divisible by it).
        dim_feedforward: hidden width of the feed-forward block (default 2048).
        dropout: dropout on the attention weights, after each block, and inside the feed-forward block.
        activation: ``"relu"`` (default), ``"gelu"`` or a callable (a function or a Module).
        layer_norm_eps: LayerNorm epsilon (1e-5).
        batch_first: inputs are ``(N, S, E)`` when True, ``(S, N, E)`` (torch's default) when False.
        norm_first: pre-norm (``x + sa(norm1(x))``) instead of post-norm (``norm1(x + sa(x))``).
        bias: biases in the Linear layers, the attention and the LayerNorms.
        device, dtype: where and in which dtype the parameters are made (float32 by default).

    Submodules (torch's names): ``self_attn``, ``linear1``, ``dropout``, ``linear2``, ``norm1``, ``norm2``,
    ``dropout1``, ``dropout2``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.transformer_layers import TransformerEncoderLayer
        >>> layer = TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
        >>> layer(na.randn(5, 3, 8)).shape                      # (S, N, E)
        (5, 3, 8)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        dtype = np.float32 if dtype is None else dtype
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype, device=device)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype, device=device)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation_relu_or_gelu = {"relu": 1, "gelu": 2}.get(activation, 0) if isinstance(activation, str) else 0
        self.activation = _activation_fn(activation)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        """Run the layer on ``src``.

        Args:
            src: ``(S, N, E)`` (``(N, S, E)`` with ``batch_first``) or unbatched ``(S, E)``.
            src_mask: ``(S, S)`` or ``(N * nhead, S, S)``; boolean True = not allowed, or float, added.
            src_key_padding_mask: ``(N, S)`` (``(S,)`` unbatched); True marks padding keys.
            is_causal: a hint that ``src_mask`` is the causal mask. Without a ``src_mask`` the causal
                mask is applied (torch raises and asks for the mask instead).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.transformer_layers import Transformer, TransformerEncoderLayer
            >>> layer = TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
            >>> mask = Transformer.generate_square_subsequent_mask(4)
            >>> layer(na.randn(2, 4, 8), src_mask=mask, is_causal=True).shape
            (2, 4, 8)
        """
        x = _as_tensor(src)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=bool(is_causal))[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerDecoderLayer(Module):
    """torch's ``nn.TransformerDecoderLayer``: self-attention, attention over the encoder's ``memory``,
    then a feed-forward block, each with a residual connection and a LayerNorm (post-norm by default).

    Args: as :class:`TransformerEncoderLayer`. Submodules (torch's names): ``self_attn``,
    ``multihead_attn``, ``linear1``, ``dropout``, ``linear2``, ``norm1``, ``norm2``, ``norm3``,
    ``dropout1``, ``dropout2``, ``dropout3``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.transformer_layers import TransformerDecoderLayer
        >>> layer = TransformerDecoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
        >>> layer(na.randn(3, 4, 8), na.randn(3, 6, 8)).shape       # tgt (N, T, E), memory (N, S, E)
        (3, 4, 8)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        dtype = np.float32 if dtype is None else dtype
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype, device=device)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype, device=device)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation_fn(activation)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False):
        """Run the layer on ``tgt`` attending over ``memory``.

        Args:
            tgt: ``(T, N, E)`` (``(N, T, E)`` with ``batch_first``) or unbatched ``(T, E)``.
            memory: the encoder's output, ``(S, N, E)`` (batch first / unbatched likewise).
            tgt_mask: ``(T, T)`` or ``(N * nhead, T, T)``; memory_mask: ``(T, S)`` or ``(N * nhead, T, S)``.
            tgt_key_padding_mask: ``(N, T)``; memory_key_padding_mask: ``(N, S)``; True marks padding.
            tgt_is_causal, memory_is_causal: hints that the masks are causal; without the mask the
                causal mask is applied (torch raises and asks for the mask instead).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.transformer_layers import Transformer, TransformerDecoderLayer
            >>> layer = TransformerDecoderLayer(8, 2, 16).eval()
            >>> tgt, memory = na.randn(4, 2, 8), na.randn(6, 2, 8)
            >>> layer(tgt, memory, tgt_mask=Transformer.generate_square_subsequent_mask(4)).shape
            (4, 2, 8)
        """
        x = _as_tensor(tgt)
        memory = _as_tensor(memory)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=bool(is_causal))[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=bool(is_causal))[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout3(x)


class TransformerEncoder(Module):
    """torch's ``nn.TransformerEncoder``: ``num_layers`` deep copies of ``encoder_layer`` (``layers``, a
    ModuleList) run in turn, then the optional ``norm``.

    Args:
        encoder_layer: a :class:`TransformerEncoderLayer` (copied; the copies start with its weights).
        num_layers: how many copies.
        norm: an optional module applied to the output (``Transformer`` passes a LayerNorm).
        enable_nested_tensor, mask_check: accepted for torch compatibility; they select torch's inference
            fast path, which does not exist here (results are the same).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.transformer_layers import TransformerEncoder, TransformerEncoderLayer
        >>> enc = TransformerEncoder(TransformerEncoderLayer(8, 2, 16), num_layers=3)
        >>> len(enc.layers), enc(na.randn(5, 2, 8)).shape
        (3, (5, 2, 8))
    """

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = int(num_layers)
        self.norm = norm
        self.enable_nested_tensor = bool(enable_nested_tensor)
        self.mask_check = bool(mask_check)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        """Pass ``src`` through every layer (each gets ``mask`` and ``src_key_padding_mask``), then ``norm``.

        ``is_causal`` None (default) detects whether ``mask`` is the causal mask, as torch does.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.transformer_layers import TransformerEncoder, TransformerEncoderLayer
            >>> enc = TransformerEncoder(TransformerEncoderLayer(8, 2, 16, batch_first=True), 2).eval()
            >>> pad = na.tensor([[False, False, True]])
            >>> enc(na.randn(1, 3, 8), src_key_padding_mask=pad).shape
            (1, 3, 8)
        """
        output = _as_tensor(src)
        first = self.layers[0] if len(self.layers) else None
        batch_first = bool(getattr(getattr(first, "self_attn", None), "batch_first", False))
        is_causal = _detect_is_causal_mask(mask, is_causal, _seq_len(output, batch_first))
        for mod in self.layers:
            output = mod(output, src_mask=mask, is_causal=is_causal, src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            output = self.norm(output)
        return output


class TransformerDecoder(Module):
    """torch's ``nn.TransformerDecoder``: ``num_layers`` deep copies of ``decoder_layer`` (``layers``) run
    in turn over the same ``memory``, then the optional ``norm``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.transformer_layers import TransformerDecoder, TransformerDecoderLayer
        >>> dec = TransformerDecoder(TransformerDecoderLayer(8, 2, 16), num_layers=2)
        >>> dec(na.randn(4, 2, 8), na.randn(6, 2, 8)).shape
        (4, 2, 8)
    """

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = int(num_layers)
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal: bool = False):
        """Pass ``tgt`` through every layer (attending over ``memory``), then ``norm``; the masks as in
        :meth:`TransformerDecoderLayer.forward`. ``tgt_is_causal`` None detects a causal ``tgt_mask``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.transformer_layers import TransformerDecoder, TransformerDecoderLayer
            >>> dec = TransformerDecoder(TransformerDecoderLayer(8, 2, 16, batch_first=True), 1)
            >>> dec(na.randn(2, 4, 8), na.randn(2, 6, 8), memory_key_padding_mask=na.zeros(2, 6, dtype=na.bool)).shape
            (2, 4, 8)
        """
        output = _as_tensor(tgt)
        first = self.layers[0] if len(self.layers) else None
        batch_first = bool(getattr(getattr(first, "self_attn", None), "batch_first", False))
        tgt_is_causal = _detect_is_causal_mask(tgt_mask, tgt_is_causal, _seq_len(output, batch_first))
        for mod in self.layers:
            output = mod(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                         tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                         tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        if self.norm is not None:
            output = self.norm(output)
        return output


class Transformer(Module):
    """torch's ``nn.Transformer``: an encoder (``encoder``, with a final LayerNorm ``encoder.norm``) and a
    decoder (``decoder``, with ``decoder.norm``); every parameter with more than one dim is Xavier-uniform
    initialised, as torch does.

    Args:
        d_model: model width E (default 512).
        nhead: attention heads (default 8).
        num_encoder_layers: encoder layers (default 6).
        num_decoder_layers: decoder layers (default 6).
        dim_feedforward: hidden width of the feed-forward blocks (default 2048).
        dropout: dropout probability (default 0.1).
        activation: ``"relu"`` (default), ``"gelu"`` or a callable.
        custom_encoder: a module used instead of the built encoder.
        custom_decoder: a module used instead of the built decoder.
        layer_norm_eps: LayerNorm epsilon (default 1e-5).
        batch_first: ``(N, S, E)`` inputs and output when True (default False: ``(S, N, E)``).
        norm_first: pre-norm layers (default False).
        bias: biases in the Linear layers, the attention and the LayerNorms (default True).
        device: where the parameters are made.
        dtype: their dtype (float32 by default).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.transformer_layers import Transformer
        >>> model = Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
        ...                     dim_feedforward=16, batch_first=True)
        >>> src, tgt = na.randn(2, 6, 8), na.randn(2, 4, 8)
        >>> model(src, tgt, tgt_mask=Transformer.generate_square_subsequent_mask(4)).shape
        (2, 4, 8)
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        dtype = np.float32 if dtype is None else dtype
        kw = {"layer_norm_eps": layer_norm_eps, "batch_first": batch_first, "norm_first": norm_first, "bias": bias,
              "device": device, "dtype": dtype}
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, **kw)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, **kw)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype, device=device)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, norm)
        self._reset_parameters()
        self.d_model = int(d_model)
        self.nhead = int(nhead)
        self.batch_first = bool(batch_first)

    def _reset_parameters(self) -> None:
        # torch's initialisation: Xavier-uniform on every matrix (custom modules included), the rest kept
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        """Encode ``src``, then decode ``tgt`` over the encoding.

        Args:
            src: ``(S, N, E)`` (``(N, S, E)`` with ``batch_first``) or unbatched ``(S, E)``.
            tgt: ``(T, N, E)`` likewise.
            src_mask: ``(S, S)`` attention mask of the encoder (boolean True = not allowed, or float, added).
            tgt_mask: ``(T, T)`` attention mask of the decoder's self-attention.
            memory_mask: ``(T, S)`` attention mask of the decoder's attention over the encoding.
            src_key_padding_mask: ``(N, S)``, True marks padding in ``src``.
            tgt_key_padding_mask: ``(N, T)``, True marks padding in ``tgt``.
            memory_key_padding_mask: ``(N, S)``, True marks padding in the encoding.
            src_is_causal: hint for ``src_mask`` (None: detected, as torch).
            tgt_is_causal: hint for ``tgt_mask`` (None: detected, as torch).
            memory_is_causal: hint for ``memory_mask``.

        Returns ``(T, N, E)`` (``(N, T, E)`` with ``batch_first``).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.transformer_layers import Transformer
            >>> model = Transformer(8, 2, 1, 1, 16)
            >>> model(na.randn(6, 2, 8), na.randn(4, 2, 8)).shape
            (4, 2, 8)
        """
        src, tgt = _as_tensor(src), _as_tensor(tgt)
        is_batched = src.ndim == 3
        if not self.batch_first and is_batched and src.shape[1] != tgt.shape[1]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if self.batch_first and is_batched and src.shape[0] != tgt.shape[0]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """A ``(sz, sz)`` float mask: ``-inf`` above the diagonal, 0 on and below it (position i may attend
        to positions j <= i), as torch's.

        Example::

            >>> from neural_arch.nn.transformer_layers import Transformer
            >>> Transformer.generate_square_subsequent_mask(3).tolist()
            [[0.0, -inf, -inf], [0.0, 0.0, -inf], [0.0, 0.0, 0.0]]
        """
        dtype = np.float32 if dtype is None else dtype
        mask = np.triu(np.full((int(sz), int(sz)), -np.inf, dtype=dtype), k=1)
        return Tensor(mask if device is None else _backend.to_device(mask, device))
