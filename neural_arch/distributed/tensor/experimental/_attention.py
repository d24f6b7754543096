"""Context parallelism: attention over a sequence that is sharded across ranks.

Each rank of a context-parallel (CP) group of size ``cp`` holds ``T / cp`` positions of every
activation. Everything position-wise (embeddings, MLP, LayerNorm, the loss) needs nothing; only
attention mixes positions, and two algorithms provide it:

* :func:`ring_attention` (Ring Attention / torch's ``context_parallel``): every rank keeps its
  queries; the K/V blocks travel round the ring, one hop per step, the next block's send/recv
  posted *before* the current block's compute so the transfer hides behind it. Each step yields a
  partial output and its log-sum-exp; :func:`~neural_arch.core.ops_attention.merge_partial`
  combines them exactly. With ``is_causal`` a block whose keys all lie after every local query is
  skipped. The backward is a custom one (no autograd through the sends): K/V travel again, and the
  dK/dV accumulators travel with them and arrive back at their owner after ``cp`` hops.
  ``rotate="allgather"`` (torch's ``set_rotate_method("allgather")``) gathers K/V once instead and
  reduce-scatters dK/dV in the backward.
* :func:`ulysses_attention` (DeepSpeed-Ulysses): an all-to-all turns sequence-sharded q/k/v into
  head-sharded full-sequence ones, attention runs locally, a second all-to-all turns the output
  back. The number of heads must divide by ``cp``.

Layouts (:func:`shard_sequence`): with ``load_balance=True`` the sequence is cut into ``2 cp``
chunks and rank r holds chunks r and ``2cp-1-r`` (the head-tail layout: under a causal mask every
rank then has the same amount of unmasked work); otherwise rank r holds the r-th contiguous chunk.
**The sequence length must divide by 2 cp (load-balanced) or cp (contiguous)**; anything else is a
clear ``ValueError`` asking the caller to pad. Padding is left to the caller on purpose: at the end
of a causal sequence it changes no real position's output, and the caller's loss can ignore the
padded targets (``ignore_index``); padding silently here would change the shapes and the loss the
caller sees, and non-causal attention would need a key mask that ring attention does not take.

Example (every rank of ``group``; ``q``, ``k``, ``v`` are ``(B, H, T, D)`` on every rank)::

    from neural_arch.distributed.tensor.experimental import ring_attention, shard_sequence, unshard_sequence
    ql, kl, vl = (shard_sequence(x, 2, group) for x in (q, k, v))     # (B, H, T/cp, D)
    out_local = ring_attention(ql, kl, vl, group=group, is_causal=True)
    out = unshard_sequence(out_local, 2, group)                        # == sdpa(q, k, v, is_causal=True)

    with context_parallel(mesh, buffers=[x, y], buffer_seq_dims=[1, 1]):   # torch's form
        loss = F.cross_entropy(model(x), y)                                # model's sdpa is now ring attention
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from neural_arch.backend import get_array_module as _xp
from neural_arch.core import ops_attention as _attn
from neural_arch.core.autograd import Node
from neural_arch.core.op_utils import _needs, _result
from neural_arch.core.ops_shape import cat, stack
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.device_mesh import resolve_group_or_mesh

__all__ = [
    "ContextParallelAttention",
    "context_parallel",
    "context_parallel_unshard",
    "ring_attention",
    "ring_stats",
    "sequence_positions",
    "set_rotate_method",
    "shard_sequence",
    "ulysses_attention",
    "unshard_sequence",
]

# p2p tags of the ring (distinct from user tags in the usual small range)
_KV_TAG = 3101
_DKV_TAG = 3102
_ROTATE_METHODS = {"p2p": "p2p", "alltoall": "p2p", "allgather": "allgather"}


class _ContextParallelOptions:
    """torch's ``_cp_options``: the defaults :func:`context_parallel` uses."""

    def __init__(self):
        self.enable_load_balance = True
        self.rotate_method = "p2p"


_cp_options = _ContextParallelOptions()

# What the last ring_attention call on this process moved and waited for (read by the benchmark):
# bytes sent, seconds of attention compute, seconds spent waiting for transfers that were not done.
# "skipped": K/V blocks of the forward that no local query may see (causal), so never computed.
ring_stats = {"bytes_sent": 0, "compute_s": 0.0, "wait_s": 0.0, "steps": 0, "skipped": 0}


def set_rotate_method(rotate_method: str) -> None:
    """How :func:`context_parallel` moves K/V: ``"alltoall"``/``"p2p"`` (the ring) or ``"allgather"``.

    Example::

        set_rotate_method("allgather")               # before entering context_parallel(...)
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    if rotate_method not in _ROTATE_METHODS:
        raise ValueError(f"set_rotate_method: {rotate_method!r} is not one of 'alltoall', 'p2p', 'allgather'")
    _cp_options.rotate_method = _ROTATE_METHODS[rotate_method]


# ---------------------------------------------------------------------------------- layouts
def _group(group, op: str):
    return resolve_group_or_mesh(group, op)


def _check_len(total: int, size: int, load_balance: bool, op: str) -> int:
    parts = 2 * size if load_balance else size
    if total % parts:
        how = f"2 x cp = {parts} chunks (load_balance=True)" if load_balance else f"cp = {parts} chunks"
        raise ValueError(f"{op}: the sequence length {total} does not divide into {how}; pad the sequence "
                         f"at its end to a multiple of {parts} (with is_causal no real position sees the "
                         "padding; give the padded targets ignore_index=-100 in the loss), or change the "
                         "context-parallel size")
    return total // parts


def sequence_positions(local_len: int, rank: int, size: int, load_balance: bool = True) -> np.ndarray:
    """The global positions of rank ``rank``'s ``local_len`` tokens (int64, ascending).

    >>> sequence_positions(2, 0, 2).tolist(), sequence_positions(2, 1, 2).tolist()
    ([0, 3], [1, 2])
    >>> sequence_positions(2, 1, 2, load_balance=False).tolist()
    [2, 3]
    """
    if not load_balance:
        return np.arange(rank * local_len, (rank + 1) * local_len)
    if local_len % 2:
        raise ValueError(f"a load-balanced shard holds two equal chunks; its length {local_len} is odd")
    c = local_len // 2
    return np.concatenate([np.arange(rank * c, (rank + 1) * c),
                           np.arange((2 * size - 1 - rank) * c, (2 * size - rank) * c)])


def _slices(ndim: int, dim: int, start: int, stop: int) -> tuple:
    index = [slice(None)] * ndim
    index[dim] = slice(start, stop)
    return tuple(index)


def _concat(pieces, dim):
    if isinstance(pieces[0], Tensor):
        return pieces[0] if len(pieces) == 1 else cat(pieces, dim)
    return pieces[0] if len(pieces) == 1 else _xp(pieces[0]).concatenate(pieces, axis=dim)


def shard_sequence(x, seq_dim: int, group=None, load_balance: bool = True):
    """This rank's share of ``x`` (the whole sequence, the same on every rank) along ``seq_dim``.

    ``load_balance=True``: chunks r and 2cp-1-r of 2cp chunks; else the r-th of cp contiguous
    chunks. A Tensor gives a Tensor (differentiable: slicing), an array an array.

    >>> # rank 1 of 2, T = 8:  load-balanced -> positions [2, 3, 4, 5]; contiguous -> [4, 5, 6, 7]
    """
    g = _group(group, "shard_sequence")
    dim = seq_dim % x.ndim
    n, r = g.size(), g.rank()
    c = _check_len(x.shape[dim], n, load_balance, "shard_sequence")
    if not load_balance:
        return x[_slices(x.ndim, dim, r * c, (r + 1) * c)]
    tail = 2 * n - 1 - r
    return _concat([x[_slices(x.ndim, dim, r * c, (r + 1) * c)], x[_slices(x.ndim, dim, tail * c, (tail + 1) * c)]],
                   dim)


def unshard_sequence(x_local, seq_dim: int, group=None, load_balance: bool = True):
    """The whole sequence from every rank's share (the inverse of :func:`shard_sequence`).

    A Tensor goes through the differentiable all-gather (torch semantics: its backward sums the
    gradients of every rank's loss and keeps this rank's share); an array is gathered plainly.

    Example::

        x_local = shard_sequence(x, seq_dim=1, group=cp_group)
        whole = unshard_sequence(x_local, seq_dim=1, group=cp_group)     # equal to x on every rank
    """
    from neural_arch.distributed.nn.functional import _gather_dim, all_gather

    g = _group(group, "unshard_sequence")
    dim = seq_dim % x_local.ndim
    n = g.size()
    local = x_local.shape[dim]
    full = all_gather(x_local, group=g, dim=dim) if isinstance(x_local, Tensor) else _gather_dim(g, x_local, dim)
    if not load_balance:
        return full
    c = _check_len(local * n, n, True, "unshard_sequence")
    # gathered order: rank 0's (chunk 0, chunk 2n-1), rank 1's (chunk 1, chunk 2n-2), ...
    where = [2 * i if i < n else 2 * (2 * n - 1 - i) + 1 for i in range(2 * n)]
    return _concat([full[_slices(full.ndim, dim, w * c, (w + 1) * c)] for w in where], dim)


def context_parallel_unshard(mesh, buffers, seq_dims):
    """torch's ``context_parallel_unshard``: the whole sequences of ``buffers`` (load-balanced layout).

    Example::

        with context_parallel(mesh, buffers=[idx, targets], buffer_seq_dims=[1, 1]):
            logits = model(idx)
        (full_logits,) = context_parallel_unshard(mesh, [logits], [1])
    """
    return [unshard_sequence(b, d, mesh, _cp_options.enable_load_balance) for b, d in zip(buffers, seq_dims)]


# ---------------------------------------------------------------------------------- ring attention
def _tensor(x, name: str, op: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return Tensor(x)
    raise TypeError(f"{op}: {name} must be a Tensor or an array, got {type(x).__name__}")


class _Ring:
    """The posted transfers of one ring step; ``wait()`` waits for them and counts the stall."""

    def __init__(self, group):
        self.backend = group.backend
        self.n, self.r = group.size(), group.rank()
        self.right, self.left = (self.r + 1) % self.n, (self.r - 1) % self.n
        self.works: list = []

    def send(self, array, tag: int):
        work = self.backend.send(array, self.right, tag, async_op=True)
        self.works.append(work)
        ring_stats["bytes_sent"] += int(array.nbytes)
        return work

    def recv(self, array, tag: int):
        work = self.backend.recv(array, self.left, tag, async_op=True)
        self.works.append(work)
        return work

    def wait(self, work=None) -> None:
        start = time.perf_counter()
        if work is not None:
            work.wait()
        else:
            for w in self.works:
                w.wait()
            self.works = []
        ring_stats["wait_s"] += time.perf_counter() - start


def _pack(k, v):
    """K and V side by side in one contiguous array: one message per hop instead of two."""
    xp = _xp(k)
    return xp.ascontiguousarray(xp.concatenate([k, v], axis=-1))


def _block_mask(is_causal, q_pos, src, n, local, load_balance):
    if not is_causal:
        return None
    return _attn.AttentionMask.causal(q_pos, sequence_positions(local, src, n, load_balance))


def _compute(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    ring_stats["compute_s"] += time.perf_counter() - start
    return out


def ring_attention(query, key, value, group=None, is_causal: bool = False, rotate: str = "p2p", *,
                   load_balance: bool = True, scale: float | None = None, block_size: int | None = None) -> Tensor:
    """Attention of this rank's queries over the *whole* (sequence-sharded) keys and values.

    Args:
        query, key, value: this rank's ``(..., T/cp, D)`` shares (:func:`shard_sequence` layout).
        group: the context-parallel group (a ProcessGroup, a 1-d DeviceMesh, or None = the world).
        is_causal: global causal mask (the positions come from the layout).
        rotate: ``"p2p"`` (the ring; torch's ``"alltoall"`` is accepted) or ``"allgather"``.
        load_balance: the layout of the shards (must match :func:`shard_sequence`'s).
        scale: defaults to ``1 / sqrt(D)``.

    Returns this rank's ``(..., T/cp, Dv)`` output: equal to the matching positions of full attention.

    >>> out = ring_attention(ql, kl, vl, group=cp_group, is_causal=True)  # doctest: +SKIP
    """
    op = "ring_attention"
    if rotate not in _ROTATE_METHODS:
        raise ValueError(f"{op}: rotate={rotate!r} must be 'p2p' (or 'alltoall') or 'allgather'")
    rotate = _ROTATE_METHODS[rotate]
    q, k, v = (_tensor(x, n, op) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if q.shape[:-1] != k.shape[:-1] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{op}: query {tuple(q.shape)}, key {tuple(k.shape)} and value {tuple(v.shape)} must be "
                         "(..., T/cp, D), (..., T/cp, D), (..., T/cp, Dv) shares of one sequence")
    g = _group(group, op)
    n, r = g.size(), g.rank()
    local = q.shape[-2]
    _check_len(local * n, n, load_balance, op)
    if local == 0:  # an empty sequence (on every rank alike): nothing to attend to, nothing to move
        return _attn.local_attention(q, k, v, scale=scale)
    d = q.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    block = _attn.DEFAULT_BLOCK_SIZE if block_size is None else int(block_size)
    q_pos = sequence_positions(local, r, n, load_balance)
    xp = _xp(q.data)
    qd = q.data
    kd, vd = k.data, v.data
    for key_ in ring_stats:
        ring_stats[key_] = 0.0 if key_.endswith("_s") else 0

    def mask(src):
        return _block_mask(is_causal, q_pos, src, n, local, load_balance)

    out = lse = None
    table = None
    if rotate == "allgather" and n > 1:
        packed = _pack(kd, vd)
        table = xp.empty((n,) + packed.shape, dtype=packed.dtype)
        g.backend.allgather(table, packed)
        ring_stats["bytes_sent"] += int(packed.nbytes) * (n - 1)
        del packed
    ring = _Ring(g)
    # K and V travel as two messages from their own buffers (no packed copy); one block in use and
    # one arriving is all a rank holds of the others' K/V
    cur = (kd, vd) if table is not None or n == 1 else (xp.ascontiguousarray(kd), xp.ascontiguousarray(vd))
    for s in range(n):
        src = (r - s) % n
        if table is not None:
            cur = _split(table[src], d)
        elif s < n - 1:
            nxt = (xp.empty_like(cur[0]), xp.empty_like(cur[1]))
            for buf in nxt:                # the next block travels while this one is computed
                ring.recv(buf, _KV_TAG)
            for buf in cur:
                ring.send(buf, _KV_TAG)
        m = mask(src)
        if m is not None and m.hides(0, local, 0, local):
            ring_stats["skipped"] += 1     # every key after every local query: nothing to compute
        else:
            o_b, l_b = _compute(_attn.attention_forward, qd, cur[0], cur[1], sc, m, block)
            out, lse = (o_b, l_b) if out is None else _merge_into(out, lse, o_b, l_b)
        ring_stats["steps"] += 1
        if table is None and s < n - 1:
            ring.wait()               # the next block (and this one's send) must be through
            cur = nxt
    del table, cur  # the backward moves K/V again: only out and lse (1/cp of the whole) stay held
    node = None
    if _needs(q, k, v):
        def backward(grad):
            return _ring_backward(g, grad, qd, kd, vd, out, lse, sc, mask, block, rotate)

        node = Node(backward, (q, k, v), "RingAttention", saved=(q, k, v))
    return _result(out, node)


def _merge_into(out, lse, o_b, l_b):
    """:func:`~neural_arch.core.ops_attention.merge_partial` in place (``out`` and ``o_b`` are ours):
    no output-sized temporaries beyond the two weights' broadcast."""
    xp = _xp(out)
    new = xp.logaddexp(lse, l_b)
    safe = xp.where(xp.isneginf(new), out.dtype.type(0), new)
    out *= xp.exp(lse - safe)[..., None]
    o_b *= xp.exp(l_b - safe)[..., None]
    out += o_b
    return out, new


def _split(buf, d: int):
    return buf[..., :d], buf[..., d:]


def _ring_backward(g, grad, qd, kd, vd, out, lse, sc, mask, block, rotate):
    xp = _xp(grad)
    n, r = g.size(), g.rank()
    d = kd.shape[-1]
    delta = (grad * out).sum(axis=-1)
    dq = xp.zeros_like(qd)

    def contribution(src, k_src, v_src):
        m = mask(src)
        if m is not None and m.hides(0, qd.shape[-2], 0, k_src.shape[-2]):
            return 0, xp.zeros_like(k_src), xp.zeros_like(v_src)  # no local query sees this block
        return _compute(_attn.attention_backward, qd, k_src, v_src, out, grad, lse, sc, m, block, None, delta)

    if rotate == "allgather" and n > 1:
        packed = _pack(kd, vd)
        table = xp.empty((n,) + packed.shape, dtype=packed.dtype)
        g.backend.allgather(table, packed)
        dtable = xp.empty_like(table)
        for src in range(n):
            dq_b, dk_b, dv_b = contribution(src, *_split(table[src], d))
            dq += dq_b
            dtable[src] = _pack(dk_b, dv_b)
        del table
        own = xp.empty_like(packed)
        # (n, *kv) -> (n * kv.shape[0], ...): the backend scatters dim 0 in n equal chunks
        g.backend.reduce_scatter(own, dtable.reshape((n * packed.shape[0],) + packed.shape[1:]))
        ring_stats["bytes_sent"] += 2 * int(packed.nbytes) * (n - 1)
        dk, dv = _split(own, d)
    elif n == 1:
        dq, dk, dv = contribution(0, kd, vd)
    else:
        ring = _Ring(g)
        cur = (xp.ascontiguousarray(kd), xp.ascontiguousarray(vd))
        for s in range(n):
            src = (r - s) % n
            if s < n - 1:
                nxt = (xp.empty_like(cur[0]), xp.empty_like(cur[1]))
                kv_works = [ring.recv(buf, _KV_TAG) for buf in nxt] + [ring.send(buf, _KV_TAG) for buf in cur]
            if s > 0:  # the accumulators of block src, summed by the ranks it has visited
                acc = (xp.empty_like(cur[0]), xp.empty_like(cur[1]))
                recv_acc = [ring.recv(buf, _DKV_TAG) for buf in acc]
            dq_b, dk_b, dv_b = contribution(src, *cur)
            dq += dq_b
            if s > 0:
                for work in recv_acc:
                    ring.wait(work)
                dk_b += acc[0]
                dv_b += acc[1]
            for buf in (dk_b, dv_b):
                ring.send(buf, _DKV_TAG)   # on to the next rank; after n hops they are home
            if s < n - 1:
                # only this step's K/V transfers: a dK/dV send is received by the next rank one step
                # later, so waiting for it here could close a cycle of waits round the ring
                for work in kv_works:
                    ring.wait(work)
                cur = nxt
        dk, dv = xp.empty_like(cur[0]), xp.empty_like(cur[1])
        for buf in (dk, dv):
            ring.recv(buf, _DKV_TAG)
        ring.wait()
    return dq, xp.ascontiguousarray(dk), xp.ascontiguousarray(dv)


# ---------------------------------------------------------------------------------- Ulysses
def ulysses_attention(query, key, value, group=None, is_causal: bool = False, *, load_balance: bool = True,
                      scale: float | None = None, block_size: int | None = None) -> Tensor:
    """DeepSpeed-Ulysses attention of sequence-sharded ``(B, H, T/cp, D)`` q/k/v.

    All-to-all to head-sharded ``(B, H/cp, T, D)``, local attention over the whole sequence, all-to-all
    back. ``H`` must divide by the group size. Differentiable through the all-to-alls' adjoints.

    >>> out = ulysses_attention(ql, kl, vl, group=cp_group, is_causal=True)  # doctest: +SKIP
    """
    from neural_arch.distributed.nn.functional import all_to_all_single

    op = "ulysses_attention"
    q, k, v = (_tensor(x, n, op) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{op}: query, key and value must be (B, H, T/cp, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:-1] != k.shape[:-1] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        # the all-to-all reshapes k and v by the query's (B, H, T/cp): a different shape of the same
        # size would be cut into the wrong heads and positions without an error
        raise ValueError(f"{op}: query {tuple(q.shape)}, key {tuple(k.shape)} and value {tuple(v.shape)} must be "
                         "(B, H, T/cp, D), (B, H, T/cp, D), (B, H, T/cp, Dv) shares of one sequence")
    g = _group(group, op)
    n = g.size()
    b, heads, local, _ = q.shape
    if heads % n:
        raise ValueError(f"{op}: the number of heads ({heads}) must be divisible by the context-parallel size "
                         f"{n}: Ulysses gives every rank H/cp whole heads; use ring_attention otherwise")
    c = _check_len(local * n, n, load_balance, op) if load_balance else local
    h = heads // n

    def to_heads(x):
        y = all_to_all_single(x.reshape(b, n, h, local, x.shape[-1]).permute(1, 0, 2, 3, 4), group=g)
        if not load_balance:
            return cat([y[s] for s in range(n)], 2)
        firsts = [y[s][:, :, :c] for s in range(n)]
        lasts = [y[s][:, :, c:] for s in reversed(range(n))]
        return cat(firsts + lasts, 2)                                 # (B, H/cp, T, D) in global order

    full = _attn.local_attention(to_heads(q), to_heads(k), to_heads(v), is_causal=is_causal,
                                              scale=scale, block_size=block_size)
    dv = full.shape[-1]
    if load_balance:
        parts = [cat([full[:, :, s * c:(s + 1) * c], full[:, :, (2 * n - 1 - s) * c:(2 * n - s) * c]], 2)
                 for s in range(n)]
    else:
        parts = [full[:, :, s * local:(s + 1) * local] for s in range(n)]
    back = all_to_all_single(stack(parts, 0), group=g)               # (n: head group, B, H/cp, T/cp, Dv)
    return back.permute(1, 0, 2, 3, 4).reshape(b, heads, local, dv)


# ---------------------------------------------------------------------------------- torch's forms
class ContextParallelAttention:
    """A drop-in for ``F.scaled_dot_product_attention`` on sequence-sharded inputs (ring or Ulysses).

    ``nn.CausalSelfAttention.attention_fn`` takes one (``parallelize_gpt(..., context_parallel=True)``
    sets it); :func:`context_parallel` installs one for every attention call.

    Example::

        attn = ContextParallelAttention(cp_group, algorithm="ring")
        out = attn(q_local, k_local, v_local, is_causal=True)       # (B, H, T/cp, D) shares
    """

    def __init__(self, group, rotate: str = "p2p", load_balance: bool = True, algorithm: str = "ring"):
        if algorithm not in ("ring", "ulysses"):
            raise ValueError(f"ContextParallelAttention: algorithm={algorithm!r} must be 'ring' or 'ulysses'")
        self.group, self.rotate, self.load_balance, self.algorithm = group, rotate, load_balance, algorithm

    def __call__(self, query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                 scale: float | None = None):
        if attn_mask is not None or dropout_p > 0.0:
            raise NotImplementedError(
                "context-parallel attention supports is_causal and no mask, without dropout: got "
                f"attn_mask={'given' if attn_mask is not None else None}, dropout_p={dropout_p}; set the "
                "attention dropout to 0 (or call model.eval()) under context parallelism")
        if self.algorithm == "ulysses":
            return ulysses_attention(query, key, value, self.group, is_causal, load_balance=self.load_balance,
                                     scale=scale)
        return ring_attention(query, key, value, self.group, is_causal, self.rotate,
                              load_balance=self.load_balance, scale=scale)

    def __repr__(self) -> str:
        return f"ContextParallelAttention({self.algorithm}, rotate={self.rotate!r}, load_balance={self.load_balance})"


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """torch's ``context_parallel``: shard ``buffers`` along their sequence dims in place, and make
    every ``scaled_dot_product_attention`` call inside the block ring attention over ``mesh``.

    ``buffers`` are Tensors (their ``.data`` is replaced by this rank's share, load-balanced per
    ``_cp_options.enable_load_balance``) and get their whole data back on exit unless listed in
    ``no_restore_buffers``. The rotation follows :func:`set_rotate_method`.

    >>> with context_parallel(mesh, buffers=[x, y], buffer_seq_dims=[1, 1]):   # doctest: +SKIP
    ...     loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    """
    buffers = list(buffers or [])
    seq_dims = list(buffer_seq_dims or [])
    if len(buffers) != len(seq_dims):
        raise ValueError(f"context_parallel: {len(buffers)} buffers but {len(seq_dims)} buffer_seq_dims; "
                         "give one sequence dim per buffer")
    for i, b in enumerate(buffers):
        if not isinstance(b, Tensor):
            raise TypeError(f"context_parallel: buffers[{i}] is a {type(b).__name__}; pass Tensors (their data is "
                            "resharded in place), e.g. Tensor(array)")
    group = _group(mesh, "context_parallel")
    lb = _cp_options.enable_load_balance
    keep = {id(b) for b in (no_restore_buffers or ())}
    originals = [b.data for b in buffers]
    shards = [shard_sequence(b.data, d, group, lb) for b, d in zip(buffers, seq_dims)]  # all checked first
    attend = ContextParallelAttention(group, _cp_options.rotate_method, lb)
    for b, s in zip(buffers, shards):
        b.data = _xp(s).ascontiguousarray(s)
    _attn._OVERRIDES.append(attend)
    try:
        yield
    finally:
        _attn._OVERRIDES.remove(attend)
        for b, original in zip(buffers, originals):
            if id(b) not in keep:
                b.data = original
