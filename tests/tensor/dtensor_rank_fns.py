"""Functions the DTensor tests run on every rank of a RankPool (and in-process on a world of one).

Each returns a list of failure strings (empty when every case holds), so the tests assert in the
parent. References are computed here from the full tensor with an independent ``torch.chunk``
layout (NumPy slicing), in float64.
"""

from __future__ import annotations

import itertools

import numpy as np

TOL = 1e-10


def _chunk(length: int, n: int, i: int) -> slice:
    """torch.chunk: chunks of ceil(length / n); the tail ranks get fewer or none."""
    step = -(-length // n)
    return slice(min(i * step, length), min((i + 1) * step, length))


def _piece(full, mesh, placements):
    """The reference local piece of ``full`` under non-Partial placements (Partial read as Replicate)."""
    index = [slice(None)] * full.ndim
    coord = mesh.get_coordinate()
    for k, p in enumerate(placements):
        if p.is_shard():
            index[p.dim] = _chunk(full.shape[p.dim], mesh.size(k), coord[k])
    return full[tuple(index)]


def _partial_coeff(mesh, placements) -> float:
    """The factor this rank's term carries so that the Partial dims reduce to the global value."""
    coeff = 1.0
    for k, p in enumerate(placements):
        if p.is_partial():
            n, c = mesh.size(k), mesh.get_local_rank(k)
            coeff *= 2.0 * (c + 1) / (n * (n + 1)) if p.reduce_op == "sum" else 2.0 * (c + 1) / (n + 1)
    return coeff


def _placement_lists(mesh_ndim: int, tensor_ndim: int):
    from neural_arch.distributed.tensor import Partial, Replicate, Shard

    options = [Replicate(), Partial()] + [Shard(d) for d in range(tensor_ndim)]
    if mesh_ndim == 1:
        options.append(Partial("avg"))
    out = []
    for combo in itertools.product(options, repeat=mesh_ndim):
        dims = [p.dim for p in combo if p.is_shard()]
        if len(dims) == len(set(dims)):
            out.append(list(combo))
    return out


def _one_case(mesh, full, w, src, dst, tag: str) -> list[str]:
    """src -> dst -> full_tensor on ``mesh``: forward pieces and every gradient against the full math."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import DTensor, Replicate, distribute_tensor

    bad = []
    base_pl = [Replicate() if p.is_partial() else p for p in src]
    base = distribute_tensor(Tensor(full, requires_grad=True), mesh, base_pl, src_data_rank=None)
    coeff = _partial_coeff(mesh, src)
    term = base.to_local() * Tensor(np.array(coeff))
    dt = DTensor.from_local(term, mesh, src, shape=full.shape)
    out = dt.redistribute(mesh, dst)
    if tuple(out.shape) != full.shape or out.placements != tuple(_norm(dst, full.ndim)):
        bad.append(f"{tag}: metadata {out.shape} {out.placements}")
    if not any(p.is_partial() for p in dst):
        want = _piece(full, mesh, dst)
        got = out.to_local().data
        if got.shape != want.shape or np.abs(got - want).max(initial=0) > TOL:
            bad.append(f"{tag}: local piece {got.shape} vs {want.shape}")
    whole = out.full_tensor()
    if np.abs(whole.data - full).max(initial=0) > TOL:
        bad.append(f"{tag}: full_tensor differs by {np.abs(whole.data - full).max()}")
    (whole * Tensor(w)).sum().backward()   # the same loss on every rank: d/dfull = w
    got = base.grad.to_local().data
    want = coeff * _piece(w, mesh, base_pl)
    if got.shape != want.shape or np.abs(got - want).max(initial=0) > TOL:
        bad.append(f"{tag}: gradient differs by {np.abs(got - want).max(initial=0) if got.shape == want.shape else got.shape}")
    return bad


def _norm(placements, ndim):
    from neural_arch.distributed.tensor import Shard

    return [Shard(p.dim % ndim) if p.is_shard() else p for p in placements]


def transitions_run(seed: int = 0, full_sweep: bool = True) -> list[str]:
    """Every transition on a 2x2 mesh, a 1-d mesh of the world and a 1-d sub-mesh; uneven shapes."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    rng = np.random.default_rng(seed)
    meshes = [("1d", init_device_mesh("cpu", (world,)))]
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        meshes += [("2x2", mesh2), ("tp-sub", mesh2["tp"]), ("dp-sub", mesh2["dp"])]
    # 5 rows over 4 ranks: 2,2,1,0; 2 rows over 4: 1,1,0,0; 3 over 2: 2,1
    shapes = [(5, 3), (2, 7)]
    bad = []
    for name, mesh in meshes:
        for shape in shapes:
            full, w = rng.normal(size=shape), rng.normal(size=shape)
            pls = _placement_lists(mesh.ndim, len(shape))
            for src, dst in itertools.product(pls, pls):
                bad += _one_case(mesh, full, w, src, dst, f"{name} {shape} {src}->{dst}")
    # a 3-d tensor on the 2-d mesh: a sample of transitions including Shard(2) and negative dims
    if world == 4:
        from neural_arch.distributed.tensor import Partial, Replicate, Shard

        full, w = rng.normal(size=(3, 5, 2)), rng.normal(size=(3, 5, 2))
        cases = [([Shard(2), Shard(0)], [Shard(0), Shard(2)]), ([Partial(), Shard(-1)], [Shard(1), Replicate()]),
                 ([Shard(1), Partial()], [Shard(-1), Shard(1)]), ([Replicate(), Shard(1)], [Partial(), Shard(0)])]
        for src, dst in cases:
            bad += _one_case(meshes[1][1], full, w, src, dst, f"2x2 3-d {src}->{dst}")
    return bad


def partial_grad_run(seed: int = 0) -> list[str]:
    """Each rank's loss is its own term (grad_placements=Partial): all-gather's backward reduce-scatters."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import Partial, Shard, distribute_tensor

    world, rank = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(seed)
    bad = []
    for shape, mesh_shape, pl in [((5, 3), (world,), [Shard(0)]), ((3, 5), (2, 2), [Shard(0), Shard(1)])]:
        mesh = init_device_mesh("cpu", mesh_shape)
        full = rng.normal(size=shape)
        ws = [rng.normal(size=shape) for _ in range(world)]          # rank r's loss: sum(w_r * full)
        dt = distribute_tensor(Tensor(full, requires_grad=True), mesh, pl, src_data_rank=None)
        whole = dt.full_tensor(grad_placements=[Partial()] * mesh.ndim)
        (whole * Tensor(ws[rank])).sum().backward()
        want = _piece(sum(ws), mesh, pl)
        got = dt.grad.to_local().data
        if np.abs(got - want).max(initial=0) > TOL:
            bad.append(f"{mesh_shape} {pl}: partial-grad differs by {np.abs(got - want).max()}")
    return bad


def distribute_and_check_run(seed: int = 0) -> dict:
    """distribute_tensor's src_data_rank broadcast; from_local(run_check) infers uneven shapes and
    raises on every rank together."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2))
    mine = np.full((5, 3), float(rank))          # different on each rank: src_data_rank picks one
    out = {}
    dt = distribute_tensor(Tensor(mine), mesh, [Shard(0), Replicate()], src_data_rank=3)
    out["src3"] = float(np.abs(dt.full_tensor().data - 3.0).max())
    local = np.zeros((_chunk(5, 4, rank).stop - _chunk(5, 4, rank).start, 3))   # rows 2,2,1,0
    flat = init_device_mesh("cpu", (4,))
    out["inferred"] = DTensor.from_local(Tensor(local), flat, [Shard(0)], run_check=True).shape
    out["torch_rule"] = DTensor.from_local(Tensor(np.zeros((2, 3))), flat, [Shard(0)]).shape
    try:
        wrong = np.zeros((2, 3)) if rank == 3 else local      # rank 3 should hold 0 rows
        DTensor.from_local(Tensor(wrong), flat, [Shard(0)], run_check=True, shape=(5, 3))
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    return out


def _leaf_dtensor(full, mesh, placements):
    """(dt, base, coeff): ``dt`` holds ``full`` under ``placements`` (Partial terms weighted by
    ``coeff``), built from the leaf ``base`` whose gradient the caller checks."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import DTensor, Replicate, distribute_tensor

    base_pl = [Replicate() if p.is_partial() else p for p in placements]
    base = distribute_tensor(Tensor(full, requires_grad=True), mesh, base_pl, src_data_rank=None)
    coeff = _partial_coeff(mesh, placements)
    term = base.to_local() * Tensor(np.array(coeff))
    return DTensor.from_local(term, mesh, placements, shape=full.shape), base, coeff, base_pl


def matmul_run(seed: int = 0) -> list[str]:
    """DTensor @ DTensor (and + - * on the way) under every sharding rule on each mesh dim, with grads."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import Partial, Replicate, Shard

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, 2) if world == 4 else (1, 1))
    rng = np.random.default_rng(seed)
    A, B, W = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
    rules = [(Shard(0), Replicate()), (Replicate(), Shard(1)), (Shard(1), Shard(0)), (Partial(), Replicate()),
             (Replicate(), Partial()), (Replicate(), Replicate())]
    bad = []
    for r0, r1 in itertools.product(rules, rules):
        pa, pb = [r0[0], r1[0]], [r0[1], r1[1]]
        if any(len([p for p in pl if p.is_shard()]) != len({p.dim for p in pl if p.is_shard()}) for pl in (pa, pb)):
            continue  # one tensor dim sharded on both mesh dims: not supported
        a, abase, ca, apl = _leaf_dtensor(A, mesh, pa)
        b, bbase, cb, bpl = _leaf_dtensor(B, mesh, pb)
        c = (a * 2.0 - a + (-a) + a) @ (b + b - b)
        full = c.full_tensor()
        tag = f"{pa} @ {pb} -> {c.placements}"
        if np.abs(full.data - A @ B).max() > TOL:
            bad.append(f"{tag}: forward differs by {np.abs(full.data - A @ B).max()}")
        (full * Tensor(W)).sum().backward()
        for name, base, coeff, pl, want in [("A", abase, ca, apl, W @ B.T), ("B", bbase, cb, bpl, A.T @ W)]:
            got, exp = base.grad.to_local().data, coeff * _piece(want, mesh, pl)
            if got.shape != exp.shape or np.abs(got - exp).max(initial=0) > TOL:
                bad.append(f"{tag}: grad {name} differs")
    return bad


def _nested_box(full, mesh, placements):
    """The reference piece under plain Shards, then ``_StridedShard`` s cutting inside them."""
    from neural_arch.distributed.tensor.placement_types import _StridedShard

    index = [slice(0, n) for n in full.shape]
    coord = mesh.get_coordinate()
    order = [k for k, p in enumerate(placements) if p.is_shard() and not isinstance(p, _StridedShard)]
    order += [k for k, p in enumerate(placements) if isinstance(p, _StridedShard)]
    for k in order:
        d = placements[k].dim
        inner = _chunk(index[d].stop - index[d].start, mesh.size(k), coord[k])
        index[d] = slice(index[d].start + inner.start, index[d].start + inner.stop)
    return full[tuple(index)]


def strided_run(seed: int = 0) -> list[str]:
    """``_StridedShard`` inside a ``Shard`` on the 2x2 mesh (FSDP x TP's column-parallel layout): the
    local box, every transition to and from it with gradients, uneven chunks down to zero rows; and
    ``DeviceMesh.from_group`` over the mesh's groups."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from neural_arch.distributed.tensor import Replicate, Shard, distribute_tensor
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset
    from neural_arch.distributed.tensor.placement_types import _StridedShard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rng = np.random.default_rng(seed)
    strided = [_StridedShard(0, split_factor=2), Shard(0)]
    layouts = [[Replicate(), Replicate()], [Replicate(), Shard(0)], [Shard(1), Shard(0)], [Shard(0), Replicate()],
               [Shard(0), Shard(1)], [Replicate(), Shard(1)]]
    bad = []
    for shape in [(5, 3), (7, 2), (1, 3)]:   # rows per tp chunk 3,2 / 4,3 / 1,0, then per dp chunk
        full, w = rng.normal(size=shape), rng.normal(size=shape)
        want = _nested_box(full, mesh, strided)
        local_shape, offsets = compute_local_shape_and_global_offset(shape, mesh, strided)
        if local_shape != want.shape or not np.array_equal(full[tuple(slice(o, o + n) for o, n in
                                                                    zip(offsets, local_shape))], want):
            bad.append(f"{shape}: compute_local_shape_and_global_offset {local_shape} at {offsets}")
        for src, dst in [(strided, d) for d in layouts] + [(s, strided) for s in layouts] + [(strided, strided)]:
            tag = f"{shape} {src}->{dst}"
            base = distribute_tensor(Tensor(full, requires_grad=True), mesh, src, src_data_rank=None)
            if not np.array_equal(base.to_local().data, _nested_box(full, mesh, src)):
                bad.append(f"{tag}: distribute_tensor's piece")
            out = base.redistribute(mesh, dst)
            if out.placements != tuple(dst) or not np.array_equal(out.to_local().data, _nested_box(full, mesh, dst)):
                bad.append(f"{tag}: redistributed piece {out.to_local().shape} {out.placements}")
            whole = out.full_tensor()
            if np.abs(whole.data - full).max(initial=0) > TOL:
                bad.append(f"{tag}: full_tensor")
            (whole * Tensor(w)).sum().backward()
            got = base.grad.to_local().data
            if got.shape != _nested_box(w, mesh, src).shape or np.abs(got - _nested_box(w, mesh, src)).max(initial=0) > TOL:
                bad.append(f"{tag}: gradient")
    tp = DeviceMesh.from_group(mesh.get_group("tp"), "cpu")
    if tp.get_group() is not mesh.get_group("tp") or tp.mesh.tolist() != mesh["tp"].mesh.tolist():
        bad.append(f"from_group: {tp!r}")
    both = DeviceMesh.from_group([mesh.get_group("dp"), mesh.get_group("tp")], "cpu", mesh.mesh,
                                 mesh_dim_names=("dp", "tp"))
    if both != mesh or both.get_coordinate() != mesh.get_coordinate() or both.get_group("dp") is not mesh.get_group("dp"):
        bad.append(f"from_group (2-d): {both!r}")
    try:
        DeviceMesh.from_group([mesh.get_group("tp"), mesh.get_group("dp")], "cpu", mesh.mesh)
        bad.append("from_group: groups in the wrong order were accepted")
    except ValueError as e:
        if "along dimension" not in str(e):
            bad.append(f"from_group error: {e}")
    if mesh["tp"]._get_root_mesh() is not mesh or mesh["dp"]["dp"]._get_root_mesh() is not mesh:
        bad.append("a sub-mesh does not know its root mesh")
    return bad
