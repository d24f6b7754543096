"""Rank functions of test_cp_explore.py (module level: pickled by reference into the RankPool).

Every rank draws the same global q/k/v from each case's seed, computes attention and its gradients
with a plain NumPy float64 reference, runs the context-parallel algorithm on its share and returns
the largest differences; the layout helpers are checked by a round trip.
"""

from __future__ import annotations

import numpy as np

_GROUPS: dict = {}


def _groups():
    """Groups of ranks [0, cp) for every cp (None outside), made once, in the same order on every rank."""
    import neural_arch.distributed as dist

    if not _GROUPS:
        for cp in range(1, dist.get_world_size() + 1):
            g = dist.new_group(list(range(cp)))
            _GROUPS[cp] = None if g is dist.GroupMember.NON_GROUP_MEMBER else g
    return _GROUPS


def _reference(q, k, v, causal, scale, g):
    """Float64 attention and its gradients, the textbook way (the whole (T, T) matrix)."""
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    return p @ v, ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


def attention_cases(cases):
    """``cases``: (algo, cp, causal, load_balance, lead, T, D, Dv, scale, dtype, block, seed) tuples.
    Per case: None outside the cp group, else the max |difference| of (out, dq, dk, dv, unshard)."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor.experimental import (
        ring_attention,
        shard_sequence,
        ulysses_attention,
        unshard_sequence,
    )

    groups = _groups()
    results = []
    for algo, cp, causal, lb, lead, T, D, Dv, scale, dtype, block, seed in cases:
        g = groups[cp]
        if g is None:
            results.append(None)
            continue
        rng = np.random.default_rng(seed)
        lead = tuple(lead)
        q, k, v, up = (rng.standard_normal(lead + (T, w)) for w in (D, D, Dv, Dv))
        sc = 1.0 / np.sqrt(D) if scale is None else scale
        ref = _reference(q, k, v, causal, sc, up)
        dim = len(lead)
        mine = [Tensor(shard_sequence(a.astype(dtype), dim, g, lb), requires_grad=True) for a in (q, k, v)]
        if algo == "ulysses":
            out = ulysses_attention(*mine, group=g, is_causal=causal, load_balance=lb, scale=scale, block_size=block)
        else:
            out = ring_attention(*mine, group=g, is_causal=causal, rotate=algo, load_balance=lb, scale=scale,
                                 block_size=block)
        out.backward(Tensor(shard_sequence(up.astype(dtype), dim, g, lb)))
        diffs = [float(np.abs(out.data - shard_sequence(ref[0], dim, g, lb)).max())]
        diffs += [float(np.abs(t.grad.data - shard_sequence(r, dim, g, lb)).max()) for t, r in zip(mine, ref[1:])]
        diffs.append(float(np.abs(unshard_sequence(out, dim, g, lb).data - ref[0]).max()))
        results.append((diffs, str(out.dtype)))
    return results


def layout_cases(cases):
    """``cases``: (cp, shape, seq_dim, load_balance). Per case: None outside the group, else
    (round trip exact, the gradient of unshard(shard(x)).sum() * cp-weights, or the error text)."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor.experimental import shard_sequence, unshard_sequence

    groups = _groups()
    results = []
    for cp, shape, seq_dim, lb in cases:
        g = groups[cp]
        if g is None:
            results.append(None)
            continue
        x = np.arange(float(np.prod(shape))).reshape(shape)
        try:
            local = shard_sequence(x, seq_dim, g, lb)
        except ValueError as exc:
            results.append(("error", str(exc)))
            continue
        whole = unshard_sequence(local, seq_dim, g, lb)
        t = Tensor(x.copy(), requires_grad=True)
        whole_t = unshard_sequence(shard_sequence(t, seq_dim, g, lb), seq_dim, g, lb)
        whole_t.sum().backward()
        # every rank's loss sums the whole sequence: each position's gradient is cp (summed over ranks)
        # and lands on the owner's share only
        results.append(("ok", bool(np.array_equal(whole, x)), bool(np.array_equal(whole_t.data, x)),
                        shard_sequence(t.grad.data, seq_dim, g, lb).tolist(), float(t.grad.data.sum())))
    return results


def bad_input_cases():
    """Inputs that must be clear errors, on the whole world: the message of each (or 'no error')."""
    from neural_arch.distributed.tensor.experimental import ring_attention, ulysses_attention

    out = {}
    n = _world()
    q = np.zeros((1, n, 2 * n, 2))

    def run(name, fn):
        try:
            fn()
            out[name] = "no error"
        except (ValueError, NotImplementedError, TypeError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"

    run("ring_kv_len", lambda: ring_attention(q, np.zeros((1, n, 4 * n, 2)), np.zeros((1, n, 4 * n, 2))))
    run("ulysses_k_heads", lambda: ulysses_attention(q, np.zeros((2, n // 2 or 1, 2 * n, 2)),
                                                     np.zeros((2, n // 2 or 1, 2 * n, 2))))
    run("ulysses_k_len", lambda: ulysses_attention(q, np.zeros((1, n, 4 * n, 1)), np.zeros((1, n, 4 * n, 1))))
    run("ring_odd_local", lambda: ring_attention(np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 2)),
                                                 np.zeros((1, 1, 3, 2))))
    run("lse_in_context_parallel", lambda: _sdpa_lse_under_context_parallel(n))
    return out


def _sdpa_lse_under_context_parallel(n):
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch.distributed.tensor.experimental import context_parallel

    mesh = dist.init_device_mesh("cpu", (n,), mesh_dim_names=("cp",))
    x = np.zeros((1, 1, 2 * n, 2))
    with context_parallel(mesh["cp"]):
        F.scaled_dot_product_attention(x, x, x, return_lse=True)


def _world():
    import neural_arch.distributed as dist

    return dist.get_world_size()
