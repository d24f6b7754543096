"""Scaled dot-product attention, computed blockwise with an online softmax (FlashAttention's recurrence).

``scaled_dot_product_attention(q, k, v)`` has PyTorch's semantics on ``(..., L, E)`` queries and
``(..., S, E)`` / ``(..., S, Ev)`` keys and values, but never builds the ``(L, S)`` score matrix:
it walks tiles of ``block_size`` queries x ``block_size`` keys and keeps, per query, the running
maximum ``m`` and the running sum ``l`` of ``exp(score - m)``; each new key block rescales what
came before by ``exp(m_old - m_new)``. Scores held at once are one tile, O(block^2) per (batch,
head), instead of O(L x S); a tile the mask hides entirely (above the causal diagonal) is never
computed. The backward recomputes each tile's probabilities from the saved log-sum-exp
``lse = m + log(l)`` (one float per query), so it stores no probabilities either.

The same two array kernels (:func:`attention_forward`, :func:`attention_backward`) serve context
parallelism: a rank computes (output, lse) against each K/V block it receives and merges them with
:func:`merge_partial` (``lse`` is exactly what makes partial softmaxes mergeable).

Conventions (written down because PyTorch's kernels differ among themselves here):

* a boolean ``attn_mask`` is True where a query *may* attend; a float mask is added to the scores;
* ``is_causal`` is top-left aligned (query i sees keys j <= i), as ``torch.tril(ones(L, S))``;
* a query row whose keys are all masked gets output 0 and ``lse = -inf`` (FlashAttention's
  convention; PyTorch's math kernel gives NaN), so merging it with other blocks is a no-op;
* dropout regenerates each block's mask from one seed drawn from the global generator, so the
  backward needs no stored mask (on a GPU the masks come from the device generator and are kept);
  a float ``attn_mask`` Tensor with ``requires_grad`` gets its gradient (as torch: a learned bias),
  the score gradient summed down to the mask's shape (held whole: O(L x S), only then);
* a mask must be boolean or floating (torch's rule): an integer 0/1 mask is a ``TypeError``, since
  adding it to the scores would silently attend everywhere.

Example::

    >>> import numpy as np
    >>> import neural_arch.nn.functional as F
    >>> from neural_arch import Tensor
    >>> q = Tensor(np.ones((2, 4, 6, 8)), requires_grad=True)     # (B, H, T, D)
    >>> out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    >>> out.shape
    (2, 4, 6, 8)
    >>> out, lse = F.scaled_dot_product_attention(q, q, q, return_lse=True)
    >>> lse.shape
    (2, 4, 6)
"""

from __future__ import annotations

import math

import numpy as np

from .autograd import Node
from .op_utils import _needs, _result, _same_device, _xp, ones_vector, unbroadcast
from .rng import get_generator
from .tensor import Tensor
from .thread_pool import parallel_chunks, splits

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "AttentionMask",
    "attention_backward",
    "attention_forward",
    "local_attention",
    "merge_partial",
    "scaled_dot_product_attention",
]

DEFAULT_BLOCK_SIZE = 128  # queries and keys per tile: scores held at once are (..., 128, 128)

# A stack of replacements for scaled_dot_product_attention (context parallelism installs one):
# `core` may not import `distributed`, so the distributed layer registers itself here instead.
_OVERRIDES: list = []


class AttentionMask:
    """Which (query, key) pairs take part, tile by tile.

    ``kind`` is ``"none"``, ``"causal"`` (key position <= query position; positions given, so a
    sharded or reordered sequence works), ``"bool"`` (True = attend) or ``"add"`` (added to scores).
    :meth:`tile` returns ``(skip, keep, add)`` for queries ``[i0, i1)`` x keys ``[j0, j1)``: ``skip``
    when no pair of the tile takes part (it costs nothing), else a boolean ``keep`` and/or an additive array.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_attention import AttentionMask
        >>> mask = AttentionMask("causal", q_pos=np.arange(4), k_pos=np.arange(4))
        >>> mask.tile(0, 2, 2, 4)[0]              # queries 0-1 never see keys 2-3: the tile is skipped
        True
    """

    __slots__ = ("k_pos", "kind", "mask", "q_pos")

    def __init__(self, kind: str = "none", q_pos=None, k_pos=None, mask=None):
        self.kind, self.q_pos, self.k_pos, self.mask = kind, q_pos, k_pos, mask

    @classmethod
    def causal(cls, q_pos, k_pos) -> AttentionMask:
        return cls("causal", np.asarray(q_pos), np.asarray(k_pos))

    def hides(self, i0: int, i1: int, j0: int, j1: int) -> bool:
        """True when no query of ``[i0, i1)`` may see any key of ``[j0, j1)`` (nothing is built)."""
        if self.kind == "causal":
            return bool(self.k_pos[j0:j1].min() > self.q_pos[i0:i1].max())
        if self.kind == "bool":
            return not self.mask[..., i0:i1, j0:j1].any()
        return False

    def tile(self, i0: int, i1: int, j0: int, j1: int, xp=np):
        """``(skip, keep, add)`` for queries ``[i0, i1)`` against keys ``[j0, j1)``."""
        if self.kind == "none":
            return False, None, None
        if self.kind == "causal":
            qp, kp = self.q_pos[i0:i1], self.k_pos[j0:j1]
            if kp.max() <= qp.min():
                return False, None, None          # every query sees every key: no mask needed
            if kp.min() > qp.max():
                return True, None, None           # no query sees any key: skip the tile
            if xp is np:
                return False, kp[None, :] <= qp[:, None], None
            # built on the device from position runs: no host-to-device copy per tile
            return False, _device_positions(kp, xp)[None, :] <= _device_positions(qp, xp)[:, None], None
        part = self.mask[..., i0:i1, j0:j1]
        if self.kind == "bool":
            return (not part.any()), part, None
        return False, None, part


def _device_positions(pos, xp):
    """``xp.asarray(pos)`` for ascending int positions made of a few contiguous runs (every layout
    here), built with ``xp.arange`` on the device instead of copied from the host."""
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    runs = [xp.arange(int(r[0]), int(r[-1]) + 1) for r in np.split(pos, breaks) if r.size]
    return runs[0] if len(runs) == 1 else xp.concatenate(runs)


class _Dropout:
    """Dropout of the attention probabilities, block by block, the same masks in forward and backward.

    On the host each tile's mask is a pure function of (seed, tile position): regenerated in the
    backward, nothing stored. On a device the masks come from the device generator (no host copy)
    and are kept for the backward (one float per score: O(L x S), only when dropout is on).
    """

    __slots__ = ("masks", "p", "seed")

    def __init__(self, seed: int, p: float):
        self.seed, self.p, self.masks = seed, p, {}

    def keep(self, i0: int, j0: int, shape, xp, dtype):
        """The scaled keep-mask (0 or 1/(1-p)) of the tile at queries ``i0``, keys ``j0``."""
        if self.p >= 1.0:
            return xp.zeros(shape, dtype=dtype)
        if xp is np:
            keep = np.random.default_rng([self.seed, i0, j0]).random(shape, dtype=np.float32) >= self.p
            return keep.astype(dtype) * dtype.type(1.0 / (1.0 - self.p))
        z = self.masks.get((i0, j0))
        if z is None:
            keep = xp.random.random(shape, dtype=xp.float32) >= self.p
            z = self.masks[(i0, j0)] = keep.astype(dtype) * dtype.type(1.0 / (1.0 - self.p))
        return z


def _swap(a):
    return a.swapaxes(-1, -2)


def _scores(qi, kb, sc, keep, add, xp, dtype):
    s = qi @ _swap(kb)
    s *= sc  # in place: the same arithmetic as (q @ k^T) * sc without a second score-sized array
    if add is not None:
        if xp is np and s.shape == add.shape and s.dtype == add.dtype:
            s += add
        else:
            s = s + add
    if keep is not None:
        if xp is np and s.shape[-2:] == keep.shape[-2:] and keep.ndim <= s.ndim:
            np.copyto(s, dtype.type(-np.inf), where=~keep)  # in place, same values as np.where
        else:
            s = xp.where(keep, s, dtype.type(-np.inf))
    return s


def _one_tile(n_q: int, n_k: int, block: int, dropout, *arrays) -> bool:
    """Whether attention is a single tile: then the online softmax has nothing to merge, and the
    kernels below skip its running max/sum bookkeeping (the arithmetic of the tile is the same).
    ``arrays`` must share one dtype (the tiled loop casts into the query's dtype; these do not)."""
    return (dropout is None and 0 < n_q <= block and 0 < n_k <= block
            and all(a.dtype == arrays[0].dtype for a in arrays))


def _row_dots(xp, a, b=None):
    """``(a * b).sum(axis=-1)`` (``b``: all ones by default). On NumPy >= 2 ``np.vecdot``: several
    times faster than a sum over short rows, no temporary, and row by row (a chunk of heads gets
    exactly the values of the whole)."""
    vecdot = getattr(np, "vecdot", None) if xp is np else None
    if vecdot is None:
        return a.sum(axis=-1) if b is None else (a * b).sum(axis=-1)
    return vecdot(a, ones_vector(a.shape[-1], a.dtype) if b is None else b)


def _split_over_heads(xp, mask, q, *arrays) -> bool:
    """Whether a one-tile kernel may run as chunks of its first axis on the core's thread pool:
    NumPy arrays (a device's kernel runs as is), a first axis shared by every array, and a mask that
    is the same for every chunk (none or causal: a bool/additive mask has the leading dims too)."""
    lead = q.shape[:-2]
    return (xp is np and len(lead) >= 1 and lead[0] > 1 and mask.kind in ("none", "causal")
            and all(a.shape[:len(lead)] == lead for a in arrays) and splits(_work(q, *arrays[:2])))


def _work(q, k, v) -> int:
    """Element-passes of one attention kernel, for the thread pool's size threshold: its GEMMs
    and the half-dozen passes over the scores (queries x keys per head) dominate."""
    return math.prod(q.shape[:-1]) * (k.shape[-2] + v.shape[-1]) * 8


def _forward_one_tile(q, k, v, sc, mask, xp, dtype):
    """:func:`attention_forward` when every query and key fits in one tile: the same expressions as
    its loop's first (and only) iteration, with the zero-initialised accumulators folded away.

    The scores are built transposed, ``(..., keys, queries)`` (``k @ q^T``): each query's maximum and
    sum then run down a column, a reduction NumPy vectorises across the contiguous queries, where a
    row reduction over a few dozen keys walks one short row at a time; the output GEMM takes the
    probabilities transposed at no cost. Per head, so a chunk of heads gets the values of the whole.
    """
    lead, n_q, n_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    skip, keep, add = mask.tile(0, n_q, 0, n_k, xp)
    if skip:
        return (xp.zeros(lead + (n_q, v.shape[-1]), dtype=dtype),
                xp.full(lead + (n_q,), -np.inf, dtype=dtype))
    s_t = _scores(k, q, sc, None if keep is None else _swap(keep), None if add is None else _swap(add), xp, dtype)
    m = s_t.max(axis=-2)
    m_safe = xp.where(xp.isneginf(m), dtype.type(0), m)
    s_t -= m_safe[..., None, :]
    p_t = xp.exp(s_t, out=s_t)
    total = _column_sums(xp, p_t)
    acc = _swap(p_t) @ v
    seen = total > 0
    denom = xp.where(seen, total, dtype.type(1))
    lse = xp.where(seen, m_safe + xp.log(denom), dtype.type(-np.inf))
    acc /= denom[..., None]
    return acc, lse


def _column_sums(xp, a):
    """``a.sum(axis=-2)``: on NumPy float32/float64 a vector-matrix product per matrix (``ones @ a``,
    one BLAS call per matrix, so a chunk of heads gets exactly the values of the whole), which reads
    ``a`` once at full speed where NumPy's sum over the second-last axis is several times slower."""
    if xp is np and a.dtype in (np.float32, np.float64):
        return np.matmul(ones_vector(a.shape[-2], a.dtype), a)
    return a.sum(axis=-2)


def _backward_one_tile(q, k, v, dout, lse_safe, delta, sc, mask, xp, dtype, dmask=None):
    """:func:`attention_backward` for a single tile: the loop body's arithmetic, written in place
    (``dmask``, when given, receives the gradient of the scores before scaling)."""
    skip, keep, add = mask.tile(0, q.shape[-2], 0, k.shape[-2], xp)
    if skip:
        return xp.zeros(q.shape, dtype=dtype), xp.zeros(k.shape, dtype=dtype), xp.zeros(v.shape, dtype=dtype)
    s = _scores(q, k, sc, keep, add, xp, dtype)
    s -= lse_safe[..., None]
    p = xp.exp(s, out=s)
    ds = dout @ _swap(v)  # dp
    dv = _swap(p) @ dout
    ds -= delta[..., None]
    ds *= p
    if dmask is not None:
        dmask[...] = ds
    ds *= sc
    return ds @ k, _swap(ds) @ q, dv


def attention_forward(q, k, v, scale: float, mask: AttentionMask | None = None,
                      block: int = DEFAULT_BLOCK_SIZE, dropout=None):
    """Arrays in, ``(out, lse)`` out: ``out`` (..., L, Ev), ``lse`` (..., L) (``-inf`` where nothing is seen).

    Tiles of ``block`` queries x ``block`` keys, keys in the inner loop (FlashAttention-2's order:
    one query tile's running max, sum and output stay small); a tile the mask hides entirely is
    never computed (what makes the causal and the load-balanced layouts cheap).
    ``dropout`` is ``None`` or a :class:`_Dropout`. ``q``, ``k``, ``v`` must share their leading dims.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_attention import attention_forward
        >>> q = k = np.ones((1, 4, 8))
        >>> v = np.arange(4.0).reshape(1, 4, 1) * np.ones(8)
        >>> out, lse = attention_forward(q, k, v, scale=8 ** -0.5)
        >>> out[0, :, 0].tolist()                 # equal scores: the mean of the values
        [1.5, 1.5, 1.5, 1.5]
    """
    xp = _xp(q)
    mask = mask or AttentionMask()
    dtype = q.dtype
    sc = dtype.type(scale)
    lead, n_q, n_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    if _one_tile(n_q, n_k, block, dropout, q, k, v):
        if not _split_over_heads(xp, mask, q, k, v):
            return _forward_one_tile(q, k, v, sc, mask, xp, dtype)
        out = np.empty(lead + (n_q, v.shape[-1]), dtype=dtype)
        lse = np.empty(lead + (n_q,), dtype=dtype)

        def chunk(lo, hi):
            out[lo:hi], lse[lo:hi] = _forward_one_tile(q[lo:hi], k[lo:hi], v[lo:hi], sc, mask, xp, dtype)

        parallel_chunks(lead[0], chunk, work=_work(q, k, v))
        return out, lse
    out = xp.zeros(lead + (n_q, v.shape[-1]), dtype=dtype)
    lse = xp.full(lead + (n_q,), -np.inf, dtype=dtype)
    for i0 in range(0, n_q, block):
        i1 = min(i0 + block, n_q)
        qi = q[..., i0:i1, :]
        acc = xp.zeros(lead + (i1 - i0, v.shape[-1]), dtype=dtype)
        m = xp.full(lead + (i1 - i0,), -np.inf, dtype=dtype)
        m_safe = xp.zeros_like(m)
        total = xp.zeros_like(m)
        for j0 in range(0, n_k, block):
            j1 = min(j0 + block, n_k)
            skip, keep, add = mask.tile(i0, i1, j0, j1, xp)
            if skip:
                continue
            s = _scores(qi, k[..., j0:j1, :], sc, keep, add, xp, dtype)
            m_new = xp.maximum(m, s.max(axis=-1))
            # a row that has seen only masked keys keeps m = -inf; shift by 0 there (exp(-inf) = 0, no NaN)
            m_new_safe = xp.where(xp.isneginf(m_new), dtype.type(0), m_new)
            p = xp.exp(s - m_new_safe[..., None])
            corr = xp.exp(m - m_new_safe)
            total = total * corr + p.sum(axis=-1)
            if dropout is not None:
                p = p * dropout.keep(i0, j0, p.shape, xp, dtype)
            acc = acc * corr[..., None] + p @ v[..., j0:j1, :]
            m, m_safe = m_new, m_new_safe
        seen = total > 0
        lse[..., i0:i1] = xp.where(seen, m_safe + xp.log(xp.where(seen, total, dtype.type(1))), dtype.type(-np.inf))
        out[..., i0:i1, :] = acc / xp.where(seen, total, dtype.type(1))[..., None]
    return out, lse


def attention_backward(q, k, v, out, dout, lse, scale: float, mask: AttentionMask | None = None,
                       block: int = DEFAULT_BLOCK_SIZE, dropout=None, delta=None, dmask=None):
    """Gradients ``(dq, dk, dv)`` of attention of ``q`` over ``k``/``v``, given the *final* ``out``,
    its gradient ``dout`` and the *final* ``lse`` (over every key the queries see, possibly more
    keys than these: a ring attention rank passes its global row statistics and one K/V block).

    ``delta`` = rowsum(dout * out) may be passed precomputed (it is the same for every block).
    ``dmask``: None, or a zeroed ``(..., L, S)`` array that receives the gradient of the scores
    (that of an additive mask; tiles the mask hides entirely stay 0).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_attention import attention_backward, attention_forward
        >>> q = k = v = np.ones((1, 4, 8))
        >>> out, lse = attention_forward(q, k, v, scale=8 ** -0.5)
        >>> dq, dk, dv = attention_backward(q, k, v, out, np.ones_like(out), lse, scale=8 ** -0.5)
        >>> dv.sum(axis=-1).round(6).tolist()     # each key gets a quarter of every query's gradient
        [[8.0, 8.0, 8.0, 8.0]]
    """
    xp = _xp(q)
    mask = mask or AttentionMask()
    dtype = q.dtype
    n_q, n_k = q.shape[-2], k.shape[-2]
    sc = dtype.type(scale)
    if delta is None:
        delta = _row_dots(xp, dout, out)
    lse_safe = xp.where(xp.isneginf(lse), dtype.type(np.inf), lse)  # exp(s - inf) = 0 for unseen rows
    if _one_tile(n_q, n_k, block, dropout, q, k, v, dout, lse_safe, delta):
        if dmask is not None or not _split_over_heads(xp, mask, q, k, v, dout, lse_safe, delta):
            return _backward_one_tile(q, k, v, dout, lse_safe, delta, sc, mask, xp, dtype, dmask)
        dq, dk, dv = (np.empty(a.shape, dtype=dtype) for a in (q, k, v))

        def chunk(lo, hi):
            dq[lo:hi], dk[lo:hi], dv[lo:hi] = _backward_one_tile(
                q[lo:hi], k[lo:hi], v[lo:hi], dout[lo:hi], lse_safe[lo:hi], delta[lo:hi], sc, mask, xp, dtype)

        parallel_chunks(q.shape[0], chunk, work=_work(q, k, v))
        return dq, dk, dv
    dq = xp.zeros(q.shape, dtype=dtype)
    dk = xp.zeros(k.shape, dtype=dtype)
    dv = xp.zeros(v.shape, dtype=dtype)
    for i0 in range(0, n_q, block):
        i1 = min(i0 + block, n_q)
        qi, doi = q[..., i0:i1, :], dout[..., i0:i1, :]
        lse_i, delta_i = lse_safe[..., i0:i1, None], delta[..., i0:i1, None]
        for j0 in range(0, n_k, block):
            j1 = min(j0 + block, n_k)
            skip, keep, add = mask.tile(i0, i1, j0, j1, xp)
            if skip:
                continue
            kb, vb = k[..., j0:j1, :], v[..., j0:j1, :]
            p = xp.exp(_scores(qi, kb, sc, keep, add, xp, dtype) - lse_i)
            dp = doi @ _swap(vb)
            if dropout is not None:
                z = dropout.keep(i0, j0, p.shape, xp, dtype)
                dv[..., j0:j1, :] += _swap(p * z) @ doi
                dp = dp * z
            else:
                dv[..., j0:j1, :] += _swap(p) @ doi
            ds = p * (dp - delta_i)
            if dmask is not None:
                dmask[..., i0:i1, j0:j1] = ds
            ds = ds * sc
            dq[..., i0:i1, :] += ds @ kb
            dk[..., j0:j1, :] += _swap(ds) @ qi
    return dq, dk, dv


def merge_partial(out, lse, out_b, lse_b):
    """Merge two partial attentions of the same queries over disjoint key sets (arrays).

    ``lse = log(exp(lse) + exp(lse_b))`` and each output is weighted by its share of the mass;
    a side with ``lse = -inf`` (saw nothing) contributes nothing.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_attention import merge_partial
        >>> out, lse = merge_partial(np.array([[0.0]]), np.array([0.0]), np.array([[2.0]]), np.array([0.0]))
        >>> out.tolist(), round(float(lse[0]), 4)  # equal mass on both sides: the mean; lse = log 2
        ([[1.0]], 0.6931)
    """
    xp = _xp(out)
    new = xp.logaddexp(lse, lse_b)
    safe = xp.where(xp.isneginf(new), out.dtype.type(0), new)
    w_a = xp.exp(lse - safe)[..., None]
    w_b = xp.exp(lse_b - safe)[..., None]
    return out * w_a + out_b * w_b, new


def _as_tensor(x, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return Tensor(x)
    raise TypeError(f"scaled_dot_product_attention: {name} must be a Tensor or an array, got {type(x).__name__}")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, *,
                                 return_lse: bool = False, block_size: int | None = None):
    """``softmax(q @ k^T * scale + mask) @ v`` with PyTorch's arguments, computed blockwise.

    Args:
        query: ``(..., L, E)``; key ``(..., S, E)``; value ``(..., S, Ev)`` (leading dims broadcast).
        attn_mask: boolean (True = attend) or float (added), broadcastable to ``(..., L, S)``.
        dropout_p: dropout on the attention probabilities (pass 0.0 in eval, as with torch).
        is_causal: query i attends to keys j <= i; may not be combined with ``attn_mask``.
        scale: defaults to ``1 / sqrt(E)``.
        return_lse: also return the log-sum-exp of each query's scaled scores, ``(..., L)``
            (a constant Tensor: it is for merging partial results, not for differentiating).
        block_size: queries and keys per tile (scores held at once: block_size^2 per head); default 128.

    Returns the ``(..., L, Ev)`` output (and the lse with ``return_lse``). Inside
    :func:`neural_arch.distributed.tensor.experimental.context_parallel` the call is replaced by
    ring attention over the sequence-sharded inputs.

    >>> import numpy as np
    >>> q = np.random.default_rng(0).standard_normal((1, 2, 5, 4))
    >>> y = scaled_dot_product_attention(q, q, q, is_causal=True, block_size=2)
    >>> y.shape
    (1, 2, 5, 4)
    """
    if _OVERRIDES and return_lse:
        # the override attends across ranks; this rank's arrays alone would give a partial lse silently
        raise NotImplementedError("scaled_dot_product_attention(return_lse=True) is not available inside "
                                  "context_parallel: call neural_arch.core.ops_attention.local_attention for "
                                  "this rank's partial (output, lse)")
    if _OVERRIDES:
        return _OVERRIDES[-1](query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale)
    return local_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, return_lse=return_lse,
                           block_size=block_size)


def local_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, *, return_lse: bool = False, block_size: int | None = None):
    """:func:`scaled_dot_product_attention` on this process's arrays, never replaced by an override
    (what context-parallel algorithms call for their local part).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.ops_attention import local_attention
        >>> q = k = v = np.ones((1, 2, 4, 8), np.float32)
        >>> local_attention(q, k, v, is_causal=True).shape
        (1, 2, 4, 8)
    """
    q, k, v = (_as_tensor(x, n) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(f"scaled_dot_product_attention: query, key and value need at least 2 dims (..., T, E); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: query (..., L, E) {tuple(q.shape)}, key (..., S, E) "
                         f"{tuple(k.shape)} and value (..., S, Ev) {tuple(v.shape)} do not fit together")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal=True, not both "
                         "(fold the causal mask into attn_mask)")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    block = DEFAULT_BLOCK_SIZE if block_size is None else int(block_size)
    if block < 1:
        raise ValueError(f"scaled_dot_product_attention: block_size must be >= 1, got {block_size}")
    _same_device([q.data, k.data, v.data], "scaled_dot_product_attention")
    xp = _xp(q.data)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = q.shape[:-2]
    if lead == k.shape[:-2] == v.shape[:-2]:  # the usual case: nothing to broadcast (nothing writes into these)
        qd, kd, vd = q.data, k.data, v.data
    else:
        lead = tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
        qd = xp.broadcast_to(q.data, lead + tuple(q.shape[-2:]))
        kd = xp.broadcast_to(k.data, lead + tuple(k.shape[-2:]))
        vd = xp.broadcast_to(v.data, lead + tuple(v.shape[-2:]))
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if is_causal:
        mask = AttentionMask.causal(np.arange(n_q), np.arange(n_k))
    elif attn_mask is not None:
        m = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
        m = xp.asarray(m)
        if m.dtype != bool and m.dtype.kind != "f":
            raise TypeError(f"scaled_dot_product_attention: attn_mask must be boolean (True = attend) or floating "
                            f"(added to the scores), got dtype {m.dtype}; for a 0/1 keep-mask pass mask.astype(bool)")
        try:
            m = xp.broadcast_to(m, lead + (n_q, n_k))
        except ValueError:
            raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {tuple(m.shape)} does not "
                             f"broadcast to (..., L, S) = {lead + (n_q, n_k)}") from None
        mask = AttentionMask("bool" if m.dtype == bool else "add", mask=m if m.dtype == bool else m.astype(qd.dtype))
    else:
        mask = AttentionMask()
    dropout = None
    if dropout_p > 0.0:
        dropout = _Dropout(int(get_generator().integers(0, 2**63 - 1)), float(dropout_p))
    out, lse = attention_forward(qd, kd, vd, sc, mask, block, dropout)
    node = None
    # an additive mask Tensor that requires grad (a learned bias) is an input like q, k, v
    bias = attn_mask if (mask.kind == "add" and isinstance(attn_mask, Tensor) and attn_mask.requires_grad) else None
    if _needs(q, k, v, bias):
        shapes = (q.shape, k.shape, v.shape)

        def backward(g):
            dmask = None if bias is None else xp.zeros(lead + (n_q, n_k), dtype=qd.dtype)
            dq, dk, dv = attention_backward(qd, kd, vd, out, g, lse, sc, mask, block, dropout, dmask=dmask)
            grads = tuple(unbroadcast(d, s) for d, s in zip((dq, dk, dv), shapes))
            if bias is None:
                return grads
            return grads + (unbroadcast(dmask, tuple(bias.shape)).astype(bias.dtype, copy=False),)

        parents = (q if q.requires_grad else None, k if k.requires_grad else None, v if v.requires_grad else None)
        # the backward recomputes the scores from q, k, v and a boolean mask (an additive one was copied)
        node = Node(backward, parents if bias is None else parents + (bias,), "ScaledDotProductAttention",
                    saved=(q, k, v, attn_mask if mask.kind == "bool" else None))
    result = _result(out, node)
    return (result, Tensor._wrap(lse)) if return_lse else result
