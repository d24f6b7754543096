"""Sharding propagation property checks, run on every rank of the DTensor RankPool (and in-process
on a world of one): for random shapes (dims smaller than the mesh included) and random placements
that an op has a rule for, the op on the DTensor then ``full_tensor`` equals the op on the full
tensor, and the gradient of a loss through it equals the single-process gradient (float64, 1e-10).

Every rank draws the same cases from the same seed (the collectives must match). Each function
returns a list of failure strings (empty when every case holds).
"""

from __future__ import annotations

from operator import methodcaller

import numpy as np
from dtensor_rank_fns import TOL, _partial_coeff, _piece

# a few cases per op and mesh keep the pool's time small; the seeds vary per call
CASES = 3


def _meshes():
    import neural_arch.distributed as dist
    from neural_arch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    meshes = [("1d", init_device_mesh("cpu", (world,)))]
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        meshes += [("2x2", mesh2), ("tp-sub", mesh2["tp"])]
    return meshes


def _placements(rng, mesh, ndim: int, shardable, partial: bool = False):
    """One random placement per mesh dim: Replicate, a Shard of an allowed dim (each tensor dim on at
    most one mesh dim), or Partial when the op is linear."""
    from neural_arch.distributed.tensor import Partial, Replicate, Shard

    out, used = [], set()
    for _ in range(mesh.ndim):
        options = [Replicate()] + [Shard(d) for d in shardable if d not in used]
        if partial:
            options.append(Partial())
        p = options[rng.integers(len(options))]
        if p.is_shard():
            used.add(p.dim)
        out.append(p)
    return out


def _input(full, mesh, placements):
    """A DTensor of ``full`` under ``placements`` (Partial terms weighted to sum to ``full``), and
    the leaf DTensor its gradient lands on, with the factor that gradient carries."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import DTensor, Replicate, distribute_tensor

    base_pl = [Replicate() if p.is_partial() else p for p in placements]
    base = distribute_tensor(Tensor(full, requires_grad=True), mesh, base_pl, src_data_rank=None)
    coeff = _partial_coeff(mesh, placements)
    if coeff == 1.0:
        return base, base, base_pl, coeff
    term = base.to_local() * Tensor(np.array(coeff))
    return DTensor.from_local(term, mesh, placements, shape=full.shape), base, base_pl, coeff


def _check(tag, out, ref_out, got_grads, ref_grads, bad):
    whole = out.full_tensor().data
    if whole.shape != ref_out.shape or np.abs(whole - ref_out).max(initial=0) > TOL:
        bad.append(f"{tag}: output {whole.shape} vs {ref_out.shape}, "
                   f"diff {np.abs(whole - ref_out).max(initial=0) if whole.shape == ref_out.shape else '-'}")
    for name, (got, want) in enumerate(zip(got_grads, ref_grads)):
        if got is None or got.shape != want.shape or np.abs(got - want).max(initial=0) > TOL:
            bad.append(f"{tag}: gradient {name} differs")


def _run_case(tag, mesh, full, placements, op, rng, bad):
    """The method call ``op`` on the DTensor of ``full`` against the same call on the full Tensor:
    output and input gradient (loss = sum(out * w), the same on every rank)."""
    from neural_arch.core.tensor import Tensor

    dt, base, base_pl, coeff = _input(full, mesh, placements)
    try:
        out = op(dt)
    except NotImplementedError as exc:
        bad.append(f"{tag}: raised {exc}")
        return
    xf = Tensor(full, requires_grad=True)
    ref = op(xf)
    w = rng.normal(size=ref.shape)
    (ref * Tensor(w)).sum().backward()
    whole = out.full_tensor()
    (whole * Tensor(w)).sum().backward()
    want = coeff * _piece(xf.grad.data, mesh, base_pl)
    got = None if base.grad is None else base.grad.to_local().data
    _check(tag, out, ref.data, [got], [want], bad)


def _shape(rng, ndim: int, low: int = 1, high: int = 5):
    return tuple(int(s) for s in rng.integers(low, high + 1, size=ndim))


def pointwise_and_reductions_run(seed: int = 0) -> list[str]:
    """Unary elementwise ops, sum/mean (Partial inputs included), softmax/log_softmax."""
    rng = np.random.default_rng(seed)
    bad = []
    unary = ["exp", "tanh", "relu", "gelu", "sigmoid"]
    for name, mesh in _meshes():
        for case in range(CASES):
            shape = _shape(rng, int(rng.integers(1, 4)))
            full = rng.normal(size=shape)
            op = unary[int(rng.integers(len(unary)))]
            pl = _placements(rng, mesh, len(shape), range(len(shape)))
            _run_case(f"{name} {op} {shape} {pl}", mesh, full, pl, methodcaller(op), rng, bad)

            dims = [d for d in range(len(shape)) if rng.random() < 0.5]
            dim = None if not dims or rng.random() < 0.2 else (dims[0] if len(dims) == 1 else tuple(dims))
            keep = bool(rng.integers(2))
            for red in ("sum", "mean"):
                pl = _placements(rng, mesh, len(shape), range(len(shape)), partial=True)
                _run_case(f"{name} {red}(dim={dim}, keepdim={keep}) {shape} {pl}", mesh, full, pl,
                          methodcaller(red, dim=dim, keepdim=keep), rng, bad)

            axis = int(rng.integers(len(shape)))
            pl = _placements(rng, mesh, len(shape), [d for d in range(len(shape)) if d != axis])
            for sm in ("softmax", "log_softmax"):
                _run_case(f"{name} {sm}({axis}) {shape} {pl}", mesh, full, pl, methodcaller(sm, axis), rng, bad)
    return bad


def views_run(seed: int = 0) -> list[str]:
    """transpose / permute with any placements; reshape that keeps a sharded dim, splits an unsharded
    one, or flattens a run led by a sharded dim cut into whole pieces."""
    rng = np.random.default_rng(seed)
    bad = []
    for name, mesh in _meshes():
        n = mesh.size(0)
        for case in range(CASES):
            shape = _shape(rng, 3)
            full = rng.normal(size=shape)
            perm = tuple(int(d) for d in rng.permutation(3))
            pl = _placements(rng, mesh, 3, range(3), partial=True)
            _run_case(f"{name} permute{perm} {shape} {pl}", mesh, full, pl, methodcaller("permute", *perm), rng, bad)
            a, b = (int(x) for x in rng.choice(3, size=2, replace=False))
            _run_case(f"{name} transpose({a},{b}) {shape} {pl}", mesh, full, pl, methodcaller("transpose", a, b),
                      rng, bad)
            # (B, T, C) -> (B, T, 2, C): split the unsharded last dim, B and T may be sharded
            shape = _shape(rng, 2) + (2 * int(rng.integers(1, 3)),)
            full = rng.normal(size=shape)
            new = shape[:2] + (2, shape[2] // 2)
            pl = _placements(rng, mesh, 3, (0, 1), partial=True)
            _run_case(f"{name} reshape{new} {shape} {pl}", mesh, full, pl, methodcaller("reshape", new), rng, bad)
            # (B, T, V) -> (B*T, V) with B sharded over the first mesh dim in whole pieces (B = n * k)
            shape = (n * int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(2, 4)))
            full = rng.normal(size=shape)
            from neural_arch.distributed.tensor import Replicate, Shard

            pl = [Shard(0)] + [Replicate() if rng.random() < 0.5 else Shard(2) for _ in range(mesh.ndim - 1)]
            _run_case(f"{name} reshape(-1, V) {shape} {pl}", mesh, full, pl, methodcaller("reshape", -1, shape[2]),
                      rng, bad)
    return bad


def layer_norm_embedding_loss_run(seed: int = 0) -> list[str]:
    """layer_norm (weight and bias gradients too), embedding (every table layout, sharded ids),
    cross_entropy (sharded batch, sharded classes, ignore_index, every reduction)."""
    from neural_arch.core.ops_loss import cross_entropy as ref_ce
    from neural_arch.core.ops_nn import embedding as ref_embedding
    from neural_arch.core.ops_nn import layer_norm as ref_ln
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import Replicate, Shard, distribute_tensor
    from neural_arch.distributed.tensor._ops import cross_entropy, embedding, layer_norm

    rng = np.random.default_rng(seed)
    bad = []

    def param(full, mesh, pl):
        return distribute_tensor(Tensor(full, requires_grad=True), mesh, pl, src_data_rank=None)

    for name, mesh in _meshes():
        rep = [Replicate()] * mesh.ndim
        for case in range(CASES):
            # layer norm over the last dim of (B, T, C)
            shape = _shape(rng, 3)
            full, wf, bf = rng.normal(size=shape), rng.normal(size=shape[-1:]), rng.normal(size=shape[-1:])
            pl = _placements(rng, mesh, 3, (0, 1))
            x, base, base_pl, _ = _input(full, mesh, pl)
            w, b = param(wf, mesh, rep), param(bf, mesh, rep)
            out = layer_norm(x, shape[-1:], w, b)
            xs, ws, bs = Tensor(full, requires_grad=True), Tensor(wf, requires_grad=True), Tensor(bf, requires_grad=True)
            ref = ref_ln(xs, shape[-1:], ws, bs)
            g = rng.normal(size=shape)
            (ref * Tensor(g)).sum().backward()
            (out.full_tensor() * Tensor(g)).sum().backward()
            _check(f"{name} layer_norm {shape} {pl}", out, ref.data,
                   [base.grad.to_local().data, w.grad.to_local().data, b.grad.to_local().data],
                   [_piece(xs.grad.data, mesh, base_pl), ws.grad.data, bs.grad.data], bad)

            # embedding: table (V, D) in any layout with replicated ids, or a replicated table with sharded ids
            V, D = int(rng.integers(1, 7)), int(rng.integers(1, 4))
            ids_shape = _shape(rng, 2)
            ids = rng.integers(0, V, size=ids_shape)
            wf = rng.normal(size=(V, D))
            if rng.random() < 0.5:
                wpl, ids_arg = _placements(rng, mesh, 2, (0, 1)), ids
            else:
                ipl = _placements(rng, mesh, 2, (0, 1))
                wpl, ids_arg = rep, distribute_tensor(Tensor(ids), mesh, ipl, src_data_rank=None)
            w = param(wf, mesh, wpl)
            out = embedding(ids_arg, w)
            ws = Tensor(wf, requires_grad=True)
            ref = ref_embedding(ids, ws)
            g = rng.normal(size=ref.shape)
            (ref * Tensor(g)).sum().backward()
            (out.full_tensor() * Tensor(g)).sum().backward()
            _check(f"{name} embedding V={V} {wpl} ids {getattr(ids_arg, 'placements', 'full')}", out, ref.data,
                   [w.grad.to_local().data], [_piece(ws.grad.data, mesh, wpl)], bad)

            # cross entropy: (N, C) or (N, C, T), batch and/or class dims sharded, some targets ignored
            three = rng.random() < 0.5
            N, C = int(rng.integers(1, 6)), int(rng.integers(1, 7))
            shape = (N, C, int(rng.integers(1, 4))) if three else (N, C)
            full = rng.normal(size=shape)
            tgt = rng.integers(0, C, size=shape[:1] + shape[2:])
            tgt[rng.random(tgt.shape) < 0.2] = -100
            reduction = ("mean", "sum", "none")[int(rng.integers(3))]
            pl = _placements(rng, mesh, len(shape), range(len(shape)))
            x, base, base_pl, _ = _input(full, mesh, pl)
            if rng.random() < 0.5:
                t_pl = [Shard(p.dim - (p.dim > 1)) if p.is_shard() and p.dim != 1 else Replicate() for p in pl]
                tgt_arg = distribute_tensor(Tensor(tgt), mesh, t_pl, src_data_rank=None)
            else:
                tgt_arg = tgt
            out = cross_entropy(x, tgt_arg, reduction=reduction)
            xs = Tensor(full, requires_grad=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                ref = ref_ce(xs, tgt, reduction=reduction)
                g = rng.normal(size=ref.shape)
                (ref * Tensor(g)).sum().backward()
                (out.full_tensor() * Tensor(g)).sum().backward()
            tag = f"{name} cross_entropy {shape} {pl} {reduction}"
            if np.isnan(ref.data).any():  # every target ignored: both NaN
                if not np.isnan(out.full_tensor().data).all():
                    bad.append(f"{tag}: expected NaN")
                continue
            _check(tag, out, ref.data, [base.grad.to_local().data], [_piece(xs.grad.data, mesh, base_pl)], bad)
    return bad


def _error_cases(x, xp, w, table, ids) -> list:
    from neural_arch.distributed.tensor._ops import cross_entropy, embedding, layer_norm

    return [
        ("softmax(dim=1)", lambda: x.softmax(1)), ("log_softmax(dim=-1)", lambda: x.log_softmax(-1)),
        ("layer_norm", lambda: layer_norm(x, (6,), w)), ("exp()", lambda: xp.exp()),
        ("softmax(dim=0)", lambda: xp.softmax(0)), ("embedding", lambda: embedding(ids, table)),
        ("cross_entropy", lambda: cross_entropy(xp, np.zeros(4, dtype=np.int64))),
        ("DTensor.max", lambda: x.max()), ("reshape(24,)", lambda: x.reshape(24)),
    ]


def errors_run(seed: int = 0) -> list[str]:
    """Layouts without a rule raise NotImplementedError naming the op and the placements (checked on
    metadata only, so every rank raises before any collective)."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    bad = []
    for name, mesh in _meshes():
        rest = [Replicate()] * (mesh.ndim - 1)
        x = distribute_tensor(Tensor(np.ones((4, 6))), mesh, [Shard(1)] + rest, src_data_rank=None)
        xp = distribute_tensor(Tensor(np.ones((4, 6))), mesh, [Partial()] + rest, src_data_rank=None)
        w = distribute_tensor(Tensor(np.ones(6)), mesh, [Replicate()] * mesh.ndim, src_data_rank=None)
        table = distribute_tensor(Tensor(np.ones((8, 3))), mesh, [Shard(0)] + rest, src_data_rank=None)
        ids = distribute_tensor(Tensor(np.zeros((4, 2), dtype=np.int64)), mesh, [Shard(0)] + rest, src_data_rank=None)
        for op, fn in _error_cases(x, xp, w, table, ids):
            try:
                fn()
                bad.append(f"{name} {op}: no error")
            except NotImplementedError as exc:
                if op not in str(exc) or "Shard(dim=" not in str(exc) and "Partial(" not in str(exc):
                    bad.append(f"{name} {op}: the error does not name the op and placements: {exc}")
    return bad
