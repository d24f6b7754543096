"""Functions the context-parallel tests run on every rank of a RankPool (module level: pickled by reference).

Every rank draws the same global q/k/v (float64) from a seed, computes full attention and its
gradients single-process with the textbook formula, then runs the context-parallel algorithm on
its share of the sequence; each case returns the largest difference (forward, dq, dk, dv).
Subgroups of size cp = 1..world are made once per process and reused.
"""

from __future__ import annotations

import numpy as np

_GROUPS: dict = {}


def _cp_group(cp: int):
    """The group of global ranks [0, cp) (None on the other ranks); every rank calls new_group once."""
    import neural_arch.distributed as dist

    if cp not in _GROUPS:
        g = dist.new_group(list(range(cp)))
        _GROUPS[cp] = None if g is dist.GroupMember.NON_GROUP_MEMBER else g
    return _GROUPS[cp]


def _naive(q, k, v, causal):
    import neural_arch.nn.functional as F

    s = F.matmul(q, k.transpose(-1, -2)) * (1.0 / np.sqrt(q.shape[-1]))
    if causal:
        t = q.shape[-2]
        s = s + np.where(np.tril(np.ones((t, t), bool)), 0.0, -np.inf)
    return F.matmul(F.softmax(s, axis=-1), v)


def attention_cases(cases):
    """``cases``: list of (algorithm, cp, causal, load_balance, T, seed); returns per case
    (diffs, K/V blocks the ring skipped), or None where this rank is outside the case's group."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor.experimental import (
        ring_attention,
        ring_stats,
        shard_sequence,
        ulysses_attention,
        unshard_sequence,
    )

    for c in range(1, _world() + 1):  # the same new_group calls in the same order on every rank
        _cp_group(c)
    results = []
    for algo, cp, causal, lb, T, seed in cases:
        g = _cp_group(cp)
        if g is None:
            results.append(None)
            continue
        rng = np.random.default_rng(seed)
        B, H, D = 1, 12, 2
        q, k, v, up = (rng.standard_normal((B, H, T, D)) for _ in range(4))
        leaves = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
        ref = _naive(*leaves, causal)
        ref.backward(Tensor(up))
        mine = [Tensor(shard_sequence(a, 2, g, lb), requires_grad=True) for a in (q, k, v)]
        if algo == "ulysses":
            out = ulysses_attention(*mine, group=g, is_causal=causal, load_balance=lb)
        else:
            out = ring_attention(*mine, group=g, is_causal=causal, rotate=algo, load_balance=lb, block_size=2)
        skipped = ring_stats["skipped"] if algo != "ulysses" else None
        out.backward(Tensor(shard_sequence(up, 2, g, lb)))
        diffs = [float(np.abs(out.data - shard_sequence(ref.data, 2, g, lb)).max())]
        for t_mine, t_ref in zip(mine, leaves):
            diffs.append(float(np.abs(t_mine.grad.data - shard_sequence(t_ref.grad.data, 2, g, lb)).max()))
        whole = unshard_sequence(out.data, 2, g, lb)                    # the round trip of the layout
        whole_t = unshard_sequence(out, 2, g, lb)                       # differentiable form
        diffs.append(max(float(np.abs(whole - ref.data).max()), float(np.abs(whole_t.data - ref.data).max())))
        results.append((diffs, skipped))
    return results


def _world():
    import neural_arch.distributed as dist

    return dist.get_world_size()


def error_cases():
    """The clear errors: a length that does not divide, heads that do not divide (on the whole world)."""
    from neural_arch.distributed.tensor.experimental import shard_sequence, ulysses_attention

    n = _world()
    out = {}
    try:
        shard_sequence(np.zeros((1, 2 * n + 1, 3)), 1, None, True)
    except ValueError as exc:
        out["length"] = str(exc)
    x = np.zeros((1, n + 1, 2, 2))
    try:
        ulysses_attention(x, x, x)
    except ValueError as exc:
        out["heads"] = str(exc)
    return out


def context_manager_case(rotate: str, seed: int = 0):
    """torch's form: context_parallel(mesh, buffers=[...]) around a CausalSelfAttention call (the GPT block's attention)."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.tensor.experimental import context_parallel, set_rotate_method

    n = dist.get_world_size()
    mesh = dist.init_device_mesh("cpu", (n,), mesh_dim_names=("cp",))
    manual_seed(seed)
    attn = nn.CausalSelfAttention(8, 2, dtype=np.float64)
    x_full = np.random.default_rng(seed).standard_normal((2, 4 * n, 8))
    ref = attn(x_full).data
    x = Tensor(x_full.copy())
    set_rotate_method(rotate)
    try:
        with context_parallel(mesh["cp"], buffers=[x], buffer_seq_dims=[1]):
            local_shape = tuple(x.shape)
            y = attn(x)
    finally:
        set_rotate_method("alltoall")
    from neural_arch.distributed.tensor.experimental import shard_sequence

    return {"shape": local_shape, "restored": tuple(x.shape) == x_full.shape,
            "diff": float(np.abs(y.data - shard_sequence(ref, 1, mesh["cp"])).max())}


def gpt_cp_case(load_balance: bool, algorithm: str = "ring", steps: int = 2, seed: int = 0):
    """GPT trained with context parallelism over the world vs single-process on the whole sequence."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.tensor.experimental import shard_sequence
    from neural_arch.distributed.tensor.parallel.gpt import parallelize_gpt

    cfg = {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 4, "n_embd": 8}
    V = cfg["vocab_size"]
    manual_seed(seed)
    ref = nn.GPT(**cfg).double()
    manual_seed(seed)
    cp = parallelize_gpt(nn.GPT(**cfg).double(), None, context_parallel=True, load_balance=load_balance,
                         cp_algorithm=algorithm)
    o_ref, o_cp = optim.Adam(ref.parameters(), lr=1e-2), optim.Adam(cp.parameters(), lr=1e-2)
    out = {"loss": 0.0, "grads": 0.0, "params": 0.0}
    g = dist.get_default_group()
    for step in range(steps):
        rng = np.random.default_rng(seed + step)
        idx = rng.integers(0, V, size=(2, cfg["block_size"]))
        tgt = rng.integers(0, V, size=(2, cfg["block_size"]))
        loss_r = F.cross_entropy(ref(idx).reshape(-1, V), tgt.reshape(-1))
        local_idx, local_tgt = shard_sequence(idx, 1, g, load_balance), shard_sequence(tgt, 1, g, load_balance)
        loss_c = F.cross_entropy(cp(local_idx).reshape(-1, V), local_tgt.reshape(-1))
        total = np.array([float(loss_c.data)])
        dist.all_reduce(total)
        out["loss"] = max(out["loss"], abs(total[0] / g.size() - float(loss_r.data)))
        o_ref.zero_grad()
        o_cp.zero_grad()
        loss_r.backward()
        loss_c.backward()
        rp = dict(ref.named_parameters())
        for name, p in cp.named_parameters():
            out["grads"] = max(out["grads"], float(np.abs(p.grad.data - rp[name].grad.data).max()))
        o_ref.step()
        o_cp.step()
        for name, p in cp.named_parameters():
            out["params"] = max(out["params"], float(np.abs(p.data - rp[name].data).max()))
    return out


def gpt_tp_cp_case(steps: int = 2, seed: int = 0):
    """A 2 (cp) x 2 (tp) mesh: tensor parallelism over "tp", context parallelism over "cp", vs
    single-process training (loss per step and the full parameters after each Adam step)."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.tensor.experimental import shard_sequence
    from neural_arch.distributed.tensor.parallel.gpt import parallelize_gpt
    from neural_arch.distributed.tensor.parallel.state_dict import full_state_dict

    cfg = {"vocab_size": 12, "block_size": 8, "n_layer": 1, "n_head": 4, "n_embd": 8}
    V = cfg["vocab_size"]
    mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    manual_seed(seed)
    ref = nn.GPT(**cfg).double()
    manual_seed(seed)
    model = parallelize_gpt(nn.GPT(**cfg).double(), mesh["tp"], loss_parallel=False)
    parallelize_gpt(model, mesh["cp"], context_parallel=True)
    o_ref, o_par = optim.Adam(ref.parameters(), lr=1e-2), optim.Adam(model.parameters(), lr=1e-2)
    out = {"loss": 0.0, "params": 0.0}
    for step in range(steps):
        rng = np.random.default_rng(seed + step)
        idx = rng.integers(0, V, size=(2, cfg["block_size"]))
        tgt = rng.integers(0, V, size=(2, cfg["block_size"]))
        loss_r = F.cross_entropy(ref(idx).reshape(-1, V), tgt.reshape(-1))
        cp = mesh["cp"]
        loss_p = F.cross_entropy(model(shard_sequence(idx, 1, cp)).reshape(-1, V),
                                 shard_sequence(tgt, 1, cp).reshape(-1))
        total = np.array([float(loss_p.data)])
        dist.all_reduce(total, group=cp.get_group())
        out["loss"] = max(out["loss"], abs(total[0] / 2 - float(loss_r.data)))
        o_ref.zero_grad()
        o_par.zero_grad()
        loss_r.backward()
        loss_p.backward()
        o_ref.step()
        o_par.step()
        full, sd = full_state_dict(model), ref.state_dict()
        out["params"] = max(out["params"], max(float(np.abs(full[k] - sd[k]).max()) for k in sd))
    return out


def padded_case(seed: int = 3):
    """The documented way round a length that does not divide: pad at the end, causal ring attention,
    drop the padding: the real positions' output and gradients equal full attention on the real ones."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor.experimental import ring_attention, shard_sequence, unshard_sequence

    n = _world()
    T, parts = 2 * 2 * n - 1, 2 * n          # one short of a multiple of 2 cp
    padded = -(-T // parts) * parts
    rng = np.random.default_rng(seed)
    q, k, v, up = (rng.standard_normal((1, 2, T, 3)) for _ in range(4))
    leaves = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
    ref = _naive(*leaves, True)
    ref.backward(Tensor(up))

    def pad(a):
        return np.concatenate([a, np.zeros(a.shape[:2] + (padded - T, a.shape[3]))], axis=2)

    mine = [Tensor(shard_sequence(pad(a), 2, None), requires_grad=True) for a in (q, k, v)]
    out = ring_attention(*mine, is_causal=True)
    out.backward(Tensor(shard_sequence(pad(up), 2, None)))  # zero upstream gradient on the padding
    whole = unshard_sequence(out.data, 2, None)[:, :, :T]
    grads = [unshard_sequence(t.grad.data, 2, None)[:, :, :T] for t in mine]
    return max([float(np.abs(whole - ref.data).max())]
               + [float(np.abs(g - t.grad.data).max()) for g, t in zip(grads, leaves)])
