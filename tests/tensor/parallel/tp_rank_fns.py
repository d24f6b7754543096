"""Functions the tensor-parallel tests run on every rank of a RankPool (module level: pickled by reference).

Each returns plain numbers (largest differences) or small lists, so the tests assert in the
parent. References are computed in the same process, single-process, from the same seed.
"""

from __future__ import annotations

import numpy as np

TP_PLAN_SHAPE = {"vocab_size": 16, "block_size": 8, "n_layer": 2, "n_head": 4, "n_embd": 16}


def _dist():
    import neural_arch.distributed as dist

    return dist


def _g(t):
    """A Tensor's gradient as a NumPy array."""
    g = t.grad
    return None if g is None else np.asarray(g.data)


# ---------------------------------------------------------------------------------- groups
def seed_groups(tp_size: int):
    """Seed 004's setup_process_groups: each rank names its own tp and dp group."""
    dist = _dist()
    world, rank = dist.get_world_size(), dist.get_rank()
    tp_rank = rank % tp_size
    tp_ranks = list(range(rank - tp_rank, rank - tp_rank + tp_size))
    tp_group = dist.new_group(tp_ranks)
    dp_size = world // tp_size
    dp_ranks = [i * tp_size + tp_rank for i in range(dp_size)]
    dp_group = dist.new_group(dp_ranks)
    return tp_group, dp_group


def groups_run(tp_size: int):
    """Seed-style groups, torch-style new_group, subgroups, split_group: members and a sum in each."""
    dist = _dist()
    rank = dist.get_rank()
    out = {}
    tp, dp = seed_groups(tp_size)
    for name, g in (("tp", tp), ("dp", dp)):
        a = np.array([float(rank)])
        dist.all_reduce(a, group=g)
        out[name] = (list(g.ranks), float(a[0]), dist.get_rank(g))
    pair = dist.new_group([0, 1])                        # torch style: every rank, same list
    out["pair"] = None if pair is dist.GroupMember.NON_GROUP_MEMBER else list(pair.ranks)
    mine, groups = dist.new_subgroups(tp_size)
    out["subgroups"] = (list(mine.ranks), len(groups))
    world = dist.get_world_size()
    odd_even = [[r for r in range(world) if r % 2 == 0], [r for r in range(world) if r % 2]]
    mine, _ = dist.new_subgroups_by_enumeration(odd_even)
    out["enum"] = list(mine.ranks)
    sg = dist.split_group(split_ranks=odd_even)
    a = np.array([1.0])
    dist.all_reduce(a, group=sg)
    out["split"] = (list(sg.ranks), float(a[0]))
    return out


def mismatch_run(kind: str):
    """An inconsistent new_group call; returns the error each rank saw (then a normal call works)."""
    dist = _dist()
    rank, world = dist.get_rank(), dist.get_world_size()
    if kind == "overlap":
        ranks = [0, 1] if rank == 0 else [1, 2] if world > 2 else [0]
    else:  # "differs": torch style but rank 0 disagrees
        ranks = [0] if rank == 0 else [0, 1]
    try:
        dist.new_group(ranks)
        err = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        err = (type(exc).__name__, str(exc))
    ok = dist.new_group(list(range(world)))
    a = np.array([1.0])
    dist.all_reduce(a, group=ok)
    return err, float(a[0])


def mesh_run(shape, names):
    from neural_arch.distributed.device_mesh import init_device_mesh

    dist = _dist()
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))
    out = {"repr": repr(mesh), "str": str(mesh), "mesh": mesh.mesh.tolist(), "size": mesh.size(),
           "coord": mesh.get_coordinate()}
    for n in names:
        g = mesh.get_group(n)
        a = np.array([float(dist.get_rank())])
        dist.all_reduce(a, group=g)
        sub = mesh[n]
        out[n] = (list(g.ranks), mesh.get_local_rank(n), float(a[0]), sub.mesh.tolist(), sub.size(),
                  sub.get_group() is g)
    return out


# ---------------------------------------------------------------------------------- differentiable collectives
def _xs(world: int, shape, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for _ in range(world)], [rng.normal(size=shape) for _ in range(world)]


def collective_grad_run(op: str, seed: int = 0):
    """Forward value and gradient of ``op`` vs the analytic single-process computation (max abs diff)."""
    import neural_arch.distributed.nn.functional as dfn
    from neural_arch.core.tensor import Tensor

    dist = _dist()
    n, r = dist.get_world_size(), dist.get_rank()
    shape = (2 * n, 3 * n)
    xs, ws = _xs(n, shape, seed)
    replicated_in = op in ("copy_to", "scatter_to")
    x = Tensor(xs[0] if replicated_in else xs[r], requires_grad=True)
    if op == "all_reduce":
        y = dfn.all_reduce(x)
        want_y, want_g = sum(xs), sum(ws)
    elif op == "broadcast":
        y = dfn.broadcast(x, src=n - 1)
        want_y = xs[n - 1]
        want_g = sum(ws) if r == n - 1 else np.zeros(shape)
    elif op.startswith("all_gather:"):
        d = int(op.split(":")[1])
        y = dfn.all_gather(x, dim=d)
        want_y = np.concatenate(xs, axis=d)
        chunk = [slice(None)] * 2
        chunk[d] = slice(r * shape[d], (r + 1) * shape[d])
        ws = [np.concatenate([w] * n, axis=d) * (i + 1) for i, w in enumerate(ws)]  # match y's shape
        want_g = sum(w[tuple(chunk)] for w in ws)
    elif op == "all_gather_tuple":
        ys = dfn.all_gather(x)
        loss = sum(((i + 1.0) * ys[i] * Tensor(ws[r])).sum() for i in range(n))
        loss.backward()
        want_g = sum((r + 1.0) * w for w in ws)
        return max(float(np.abs(ys[i].data - xs[i]).max()) for i in range(n)), float(np.abs(_g(x) - want_g).max())
    elif op == "reduce_scatter":
        y = dfn.reduce_scatter(x, dim=0)
        step = shape[0] // n
        want_y = sum(xs)[r * step:(r + 1) * step]
        ws = [w[:step] for w in ws]
        want_g = np.concatenate(ws, axis=0)
    elif op == "all_to_all":
        y = dfn.all_to_all_single(x)
        step = shape[0] // n
        want_y = np.concatenate([xs[s][r * step:(r + 1) * step] for s in range(n)], axis=0)
        want_g = np.concatenate([ws[d][r * step:(r + 1) * step] for d in range(n)], axis=0)
    elif op == "copy_to":
        y = dfn.copy_to_tensor_model_parallel_region(x)
        want_y, want_g = xs[0], sum(ws)
    elif op == "reduce_from":
        y = dfn.reduce_from_tensor_model_parallel_region(x)
        ws = [ws[0]] * n          # the loss after "g" is the same on every rank
        want_y, want_g = sum(xs), ws[0]
    elif op == "scatter_to":
        y = dfn.scatter_to_tensor_model_parallel_region(x)
        step = shape[1] // n
        want_y = xs[0][:, r * step:(r + 1) * step]
        ws = [w[:, :step] for w in ws]
        want_g = np.concatenate(ws, axis=1)
    elif op == "gather_from":
        y = dfn.gather_from_tensor_model_parallel_region(x)
        want_y = np.concatenate(xs, axis=-1)
        w = np.concatenate(ws, axis=-1)
        ws = [w] * n
        want_g = w[:, r * shape[1]:(r + 1) * shape[1]]
    else:
        raise ValueError(op)
    (y * Tensor(ws[r])).sum().backward()
    return float(np.abs(y.data - want_y).max()), float(np.abs(_g(x) - want_g).max())


# ---------------------------------------------------------------------------------- layers
def layers_run(seed: int = 0):
    """Column/Row/VocabParallel layers and vocab-parallel CE vs their single-process layers."""
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.tensor.parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        vocab_parallel_cross_entropy,
    )

    dist = _dist()
    n, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(seed)
    diffs = {}
    x = rng.normal(size=(3, 5, 6))
    # MLP: column -> gelu -> row, built from the same seed as the dense pair
    manual_seed(seed)
    fc1, fc2 = nn.Linear(6, 4 * n, dtype=np.float64), nn.Linear(4 * n, 6, dtype=np.float64)
    manual_seed(seed)
    c = ColumnParallelLinear(6, 4 * n, dtype=np.float64)
    rw = RowParallelLinear(4 * n, 6, dtype=np.float64)
    xr, xt = Tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
    ref = fc2(F.gelu(fc1(xr)))
    out = rw(F.gelu(c(xt)))
    (ref * ref).sum().backward()
    (out * out).sum().backward()
    step = 4
    diffs["mlp_out"] = float(np.abs(out.data - ref.data).max())
    diffs["mlp_dx"] = float(np.abs(_g(xt) - _g(xr)).max())
    diffs["col_w"] = float(np.abs(_g(c.weight) - _g(fc1.weight)[r * step:(r + 1) * step]).max())
    diffs["col_b"] = float(np.abs(_g(c.bias) - _g(fc1.bias)[r * step:(r + 1) * step]).max())
    diffs["row_w"] = float(np.abs(_g(rw.weight) - _g(fc2.weight)[:, r * step:(r + 1) * step]).max())
    diffs["row_b"] = float(np.abs(_g(rw.bias) - _g(fc2.bias)).max())
    diffs["init"] = float(np.abs(c.weight.data - fc1.weight.data[r * step:(r + 1) * step]).max())
    # gather_output / input_is_parallel=False
    manual_seed(seed + 1)
    dense = nn.Linear(6, 2 * n, dtype=np.float64)
    manual_seed(seed + 1)
    cg = ColumnParallelLinear(6, 2 * n, gather_output=True, dtype=np.float64)
    manual_seed(seed + 2)
    dense_r = nn.Linear(2 * n, 3, dtype=np.float64)
    manual_seed(seed + 2)
    rs = RowParallelLinear(2 * n, 3, input_is_parallel=False, dtype=np.float64)
    xr, xt = Tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
    ref = dense_r(dense(xr)).sum()
    out = rs(cg(xt)).sum()
    ref.backward()
    out.backward()
    diffs["gather_scatter"] = max(abs(float(out.data) - float(ref.data)), float(np.abs(_g(xt) - _g(xr)).max()))
    # vocab-parallel embedding
    manual_seed(seed + 3)
    emb = nn.Embedding(4 * n, 5, dtype=np.float64)
    manual_seed(seed + 3)
    vemb = VocabParallelEmbedding(4 * n, 5, dtype=np.float64)
    ids = rng.integers(0, 4 * n, size=(3, 7))
    w = rng.normal(size=(3, 7, 5))
    ref, out = emb(ids), vemb(ids)
    (ref * Tensor(w)).sum().backward()
    (out * Tensor(w)).sum().backward()
    diffs["emb_out"] = float(np.abs(out.data - ref.data).max())
    diffs["emb_w"] = float(np.abs(_g(vemb.weight) - _g(emb.weight)[r * 4:(r + 1) * 4]).max())
    # vocab-parallel cross-entropy, with an ignored target, every reduction
    logits = rng.normal(size=(4, 3, 2 * n)) * 3
    tgt = rng.integers(0, 2 * n, size=(4, 3))
    tgt[0, 0] = -100
    for reduction in ("mean", "sum", "none"):
        lr = Tensor(logits, requires_grad=True)
        lt = Tensor(np.ascontiguousarray(logits[..., r * 2:(r + 1) * 2]), requires_grad=True)
        ref = F.cross_entropy(lr.reshape(-1, 2 * n), tgt.reshape(-1), reduction=reduction)
        out = vocab_parallel_cross_entropy(lt, tgt, reduction=reduction)
        upstream = rng.normal(size=tgt.shape)
        if reduction == "none":
            (ref * Tensor(upstream.reshape(-1))).sum().backward()
            (out * Tensor(upstream)).sum().backward()
            dv = float(np.abs(out.data.reshape(-1) - ref.data).max())
        else:
            ref.backward()
            out.backward()
            dv = abs(float(out.data) - float(ref.data))
        dg = float(np.abs(_g(lt) - _g(lr)[..., r * 2:(r + 1) * 2]).max())
        diffs[f"ce_{reduction}"] = max(dv, dg)
    return diffs


# ---------------------------------------------------------------------------------- GPT
def _gpt(seed: int, cfg=None):
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed

    manual_seed(seed)
    return nn.GPT(**(cfg or TP_PLAN_SHAPE)).double()


def _local_slice(ref_array, tp_model, name, group):
    """The slice of a full (single-process) array that ``name`` holds on this rank."""
    from neural_arch.distributed.tensor.parallel.state_dict import _shard_specs

    spec = _shard_specs(tp_model).get(name)
    if spec is None:
        return ref_array
    dim = spec[0]
    n, r = group.size(), group.rank()
    step = ref_array.shape[dim] // n
    index = [slice(None)] * ref_array.ndim
    index[dim] = slice(r * step, (r + 1) * step)
    return ref_array[tuple(index)]


def _param_diff(tp_model, ref_model, group, what: str) -> float:
    ref = dict(ref_model.named_parameters())
    worst = 0.0
    for name, p in tp_model.named_parameters():
        a = np.asarray(p.data) if what == "data" else _g(p)
        b = np.asarray(ref[name].data) if what == "data" else _g(ref[name])
        worst = max(worst, float(np.abs(a - _local_slice(b, tp_model, name, group)).max()))
    return worst


def _batch(seed: int, rows: int, cfg=None):
    cfg = cfg or TP_PLAN_SHAPE
    rng = np.random.default_rng(seed + 100)
    idx = rng.integers(0, cfg["vocab_size"], size=(rows, cfg["block_size"]))
    tgt = rng.integers(0, cfg["vocab_size"], size=(rows, cfg["block_size"]))
    return idx, tgt


def gpt_tp_run(loss_parallel: bool, steps: int = 3, seed: int = 0, sequence_parallel: bool = False):
    """TP GPT over the world vs single-process GPT: logits, every gradient, params after Adam steps."""
    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy

    dist = _dist()
    group = dist.get_default_group()
    ref = _gpt(seed)
    tp = parallelize_gpt(_gpt(seed), None, loss_parallel=loss_parallel, sequence_parallel=sequence_parallel)
    V = TP_PLAN_SHAPE["vocab_size"]
    o_ref, o_tp = optim.Adam(ref.parameters(), lr=1e-2), optim.Adam(tp.parameters(), lr=1e-2)
    out = {"logits": 0.0, "grads": 0.0, "params": 0.0, "loss": 0.0,
           "init": _param_diff(tp, ref, group, "data")}
    for step in range(steps):
        idx, tgt = _batch(seed + step, 3)
        lr_, lt = ref(idx), tp(idx)
        loss_r = F.cross_entropy(lr_.reshape(-1, V), tgt.reshape(-1))
        if loss_parallel:
            loss_t = vocab_parallel_cross_entropy(lt, tgt)
            n, r = group.size(), group.rank()
            per = V // n
            full = np.asarray(lr_.data)[..., r * per:(r + 1) * per]
        else:
            loss_t = F.cross_entropy(lt.reshape(-1, V), tgt.reshape(-1))
            full = np.asarray(lr_.data)
        out["logits"] = max(out["logits"], float(np.abs(np.asarray(lt.data) - full).max()))
        out["loss"] = max(out["loss"], abs(float(loss_t.data) - float(loss_r.data)))
        o_ref.zero_grad()
        o_tp.zero_grad()
        loss_r.backward()
        loss_t.backward()
        out["grads"] = max(out["grads"], _param_diff(tp, ref, group, "grad"))
        o_ref.step()
        o_tp.step()
        out["params"] = max(out["params"], _param_diff(tp, ref, group, "data"))
    out["steps"] = steps
    return out


def state_dict_run(seed: int = 0):
    """Full state dict -> TP model -> full state dict round trip; sharded entries; wrapper API."""
    from neural_arch.distributed.model_parallel import TensorParallel
    from neural_arch.distributed.tensor.parallel import (
        ShardedArray,
        full_state_dict,
        load_full_state_dict,
        parallelize_gpt,
        sharded_state_dict,
    )

    dist = _dist()
    ref = _gpt(seed + 5)                            # different weights than the TP model below
    tp = parallelize_gpt(_gpt(seed), None)
    load_full_state_dict(tp, ref.state_dict())
    back = full_state_dict(tp)
    sd_ref = ref.state_dict()
    diff = max(float(np.abs(back[k] - sd_ref[k]).max()) for k in sd_ref)
    same_keys = list(back) == list(sd_ref)
    sharded = sharded_state_dict(tp)
    n_sharded = sum(isinstance(v, ShardedArray) for v in sharded.values())
    shapes_ok = all(v.global_shape == sd_ref[k].shape for k, v in sharded.items() if isinstance(v, ShardedArray))
    wrapped = TensorParallel(_gpt(seed))
    idx, _ = _batch(seed, 2)
    logits_diff = float(np.abs(np.asarray(wrapped(idx).data) - np.asarray(_gpt(seed)(idx).data)).max())
    wrapped_full = wrapped.full_state_dict()
    wdiff = max(float(np.abs(wrapped_full[k] - _gpt(seed).state_dict()[k]).max()) for k in sd_ref)
    try:
        load_full_state_dict(tp, {k: v[:1] if v.ndim else v for k, v in sd_ref.items()})
        bad = None
    except ValueError as exc:
        bad = str(exc)
    del dist
    return {"diff": diff, "same_keys": same_keys, "n_sharded": n_sharded, "shapes_ok": shapes_ok,
            "wrapped_logits": logits_diff, "wrapped_full": wdiff, "bad": bad}


def hybrid_gpt_run(use_mesh: bool, steps: int = 3, seed: int = 0):
    """2 (dp) x 2 (tp): DDP over the dp group of each TP shard vs single-process on the global batch."""
    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.distributed import DistributedDataParallel as DDP
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy

    dist = _dist()
    tp_size = 2
    if use_mesh:
        mesh = init_device_mesh("cpu", (dist.get_world_size() // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
        tp_group, dp_group = mesh.get_group("tp"), mesh.get_group("dp")
    else:
        tp_group, dp_group = seed_groups(tp_size)
    dp_rank, dp_size = dp_group.rank(), dp_group.size()
    ref = _gpt(seed)
    tp = parallelize_gpt(_gpt(seed), tp_group, loss_parallel=True)
    model = DDP(tp, process_group=dp_group)
    V, B = TP_PLAN_SHAPE["vocab_size"], 2
    o_ref, o_tp = optim.Adam(ref.parameters(), lr=1e-2), optim.Adam(model.parameters(), lr=1e-2)
    worst_g = 0.0
    for step in range(steps):
        idx, tgt = _batch(seed + step, B * dp_size)
        mine = slice(dp_rank * B, (dp_rank + 1) * B)
        o_ref.zero_grad()
        o_tp.zero_grad()
        F.cross_entropy(ref(idx).reshape(-1, V), tgt.reshape(-1)).backward()
        vocab_parallel_cross_entropy(model(idx[mine]), tgt[mine], process_group=tp_group).backward()
        worst_g = max(worst_g, _param_diff(tp, ref, tp_group, "grad"))
        o_ref.step()
        o_tp.step()
    return {"grads": worst_g, "params": _param_diff(tp, ref, tp_group, "data"),
            "tp": list(tp_group.ranks), "dp": list(dp_group.ranks)}


# ---------------------------------------------------------------------------------- sketched
def _seed_sketched_model(nn, SKLinear, dtype=np.float64, sizes=(1024, [512, 256, 128], 10),
                         ratios=(0.5, 0.6, 0.7, 0.8)):
    """Seed 004's DistributedSketchedModel, verbatim in structure."""
    input_size, hidden_sizes, output_size = sizes

    class DistributedSketchedModel(nn.Module):
        def __init__(self, input_size, hidden_sizes, output_size, sketch_ratios):
            super().__init__()
            layers = []
            prev_size = input_size
            for hidden_size, sketch_ratio in zip(hidden_sizes, sketch_ratios):
                sketch_size = int(prev_size * sketch_ratio)
                layers.append(SKLinear(prev_size, hidden_size, sketch_size, dtype=dtype))
                layers.append(nn.ReLU())
                prev_size = hidden_size
            final_sketch_size = int(prev_size * sketch_ratios[-1])
            layers.append(SKLinear(prev_size, output_size, final_sketch_size, dtype=dtype))
            self.model = nn.Sequential(*layers)

        def forward(self, x):
            return self.model(x)

    return DistributedSketchedModel(input_size, hidden_sizes, output_size, list(ratios))


def sketched_ddp_run(steps: int = 3, seed: int = 0):
    """Seed 004's sketched model under DDP (per-rank batches) vs single-process on the global batch."""
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed import DistributedDataParallel as DDP
    from neural_arch.nn.sketched import SKLinear

    dist = _dist()
    n, r = dist.get_world_size(), dist.get_rank()
    manual_seed(seed)
    ref = _seed_sketched_model(nn, SKLinear)
    manual_seed(seed)
    model = DDP(_seed_sketched_model(nn, SKLinear))
    o_ref, o = optim.Adam(ref.parameters(), lr=1e-3), optim.Adam(model.parameters(), lr=1e-3)
    B = 4
    rng = np.random.default_rng(seed + 1)
    losses = []
    for _ in range(steps):
        X = rng.normal(size=(B * n, 1024))
        y = rng.integers(0, 10, size=B * n)
        o_ref.zero_grad()
        o.zero_grad()
        lr_ = F.cross_entropy(ref(Tensor(X)), y)
        lr_.backward()
        F.cross_entropy(model(Tensor(X[r * B:(r + 1) * B])), y[r * B:(r + 1) * B]).backward()
        o_ref.step()
        o.step()
        losses.append(float(lr_.data))
    ref_p = dict(ref.named_parameters())
    diff = max(float(np.abs(p.data - ref_p[k].data).max()) for k, p in model.module.named_parameters())
    sk = [m for m in model.module.modules() if isinstance(m, SKLinear)]
    sketch = np.concatenate([m.sketch_matrix.data.reshape(-1)[:8] for m in sk])
    return {"diff": diff, "losses": losses, "sketch": sketch.tolist()}


def tp_sketched_run(seed: int = 0, use_seed_groups: bool = False, steps: int = 2):
    """TensorParallelSKLinear / TensorParallelModel == single-process SKLinear stack (values, grads, steps).

    With ``use_seed_groups`` (4 ranks): seed 004's HybridParallelTrainer layout, DDP over the dp group.
    """
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed import DistributedDataParallel as DDP
    from neural_arch.distributed.tensor.parallel import TensorParallelModel
    from neural_arch.nn.sketched import SKLinear

    dist = _dist()
    configs = [{"in_features": 12, "out_features": 8, "sketch_size": 6}, {"in_features": 8, "out_features": 8, "sketch_size": 5},
               {"in_features": 8, "out_features": 4, "sketch_size": 4}]
    if use_seed_groups:
        tp_group, dp_group = seed_groups(2)
    else:
        tp_group, dp_group = dist.get_default_group(), None
    manual_seed(seed)
    ref_layers = [SKLinear(c["in_features"], c["out_features"], c["sketch_size"], dtype=np.float64) for c in configs]
    ref = nn.Sequential(ref_layers[0], nn.ReLU(), ref_layers[1], nn.ReLU(), ref_layers[2])
    manual_seed(seed)
    tp = TensorParallelModel(configs, tp_group, dtype=np.float64)
    model = DDP(tp, process_group=dp_group) if dp_group is not None else tp
    dp_rank, dp_size = (dp_group.rank(), dp_group.size()) if dp_group is not None else (0, 1)
    o_ref, o = optim.SGD(ref.parameters(), lr=0.1), optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(seed + 3)
    B = 3
    worst_out = worst_g = 0.0
    n, r = tp_group.size(), tp_group.rank()
    for _ in range(steps):
        X = rng.normal(size=(B * dp_size, 12))
        y = rng.integers(0, 4, size=B * dp_size)
        mine = slice(dp_rank * B, (dp_rank + 1) * B)
        o_ref.zero_grad()
        o.zero_grad()
        out_r = ref(Tensor(X))
        out_t = model(Tensor(X[mine]))
        worst_out = max(worst_out, float(np.abs(out_t.data - out_r.data[mine]).max()))
        F.cross_entropy(out_r, y).backward()
        F.cross_entropy(out_t, y[mine]).backward()
        for layer, rl in zip(tp.layers, ref_layers):
            step = rl.out_features // n
            worst_g = max(worst_g, float(np.abs(_g(layer.local_sklinear.weight_u)
                                                - _g(rl.weight_u)[r * step:(r + 1) * step]).max()))
        o_ref.step()
        o.step()
    worst_p = 0.0
    for layer, rl in zip(tp.layers, ref_layers):
        step = rl.out_features // n
        worst_p = max(worst_p, float(np.abs(layer.local_sklinear.weight_u.data
                                            - rl.weight_u.data[r * step:(r + 1) * step]).max()),
                      float(np.abs(layer.local_sklinear.sketch_matrix.data - rl.sketch_matrix.data).max()))
    return {"out": worst_out, "grads": worst_g, "params": worst_p}


def sequence_parallel_block_run(seed: int = 3):
    """A pre-LN MLP block with a plan of SequenceParallel + Shard(1) styles vs the same block on one
    process: each rank feeds its positions and must get exactly its positions of the output, and
    every gradient (including the LayerNorm's and the row-parallel bias, which see only part of the
    sequence) must equal the single-process one."""
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        Shard,
        parallelize_module,
    )

    dist = _dist()
    group = dist.get_default_group()
    n, r = group.size(), group.rank()

    def block():
        manual_seed(seed)
        return nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).double()

    ref, tp = block(), block()
    parallelize_module(tp, group, {"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1)),
                                   "3": RowwiseParallel(output_layouts=Shard(1))})
    x = np.random.default_rng(seed).normal(size=(3, 4 * n, 8))
    step = x.shape[1] // n
    mine = slice(r * step, (r + 1) * step)
    xr, xt = Tensor(x, requires_grad=True), Tensor(np.ascontiguousarray(x[:, mine]), requires_grad=True)
    yr, yt = ref(xr), tp(xt)
    w = np.random.default_rng(seed + 1).normal(size=yr.shape)
    (yr * Tensor(w)).sum().backward()
    (yt * Tensor(np.ascontiguousarray(w[:, mine]))).sum().backward()
    return {"out": float(np.abs(np.asarray(yt.data) - np.asarray(yr.data)[:, mine]).max()),
            "x_grad": float(np.abs(_g(xt) - _g(xr)[:, mine]).max()),
            "grads": _param_diff(tp, ref, group, "grad"),
            "shape": tuple(yt.shape)}


# ---------------------------------------------------------------------------------- generation
TP_GENERATE_SHAPE = {"vocab_size": 32, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 16}


class _Recorder:
    """A ``token_selector`` that records each step's last-position logits and how many collectives of
    each kind this process had run when the step's forward ended, then chooses as ``inner`` would."""

    def __init__(self, inner, counts):
        self.inner, self.counts = inner, counts
        self.logits, self.marks = [], []

    def __call__(self, last_logits, choose, do_sample):
        self.logits.append(np.array(last_logits))
        self.marks.append(dict(self.counts))
        return choose(last_logits) if self.inner is None else self.inner(last_logits, choose, do_sample)


def tp_generate_run(loss_parallel: bool, do_sample: bool = False, padded: bool = False, seed: int = 0,
                    max_new_tokens: int = 6, rank_seeds_differ: bool = False):
    """``generate`` on a TP GPT vs the single-process GPT with the same weights (float64).

    Returns the tokens of both, the largest logit difference over every step (against this rank's
    vocabulary slice when the head is vocabulary-parallel), the collectives per decode step
    (``{op: count}`` for each step after the first, with the choice of the step before it), the prefill's
    forward (``first_step``) and the last choice alone (``last_choice``), and the local KV cache's head count.
    """
    from neural_arch.distributed.tensor.parallel import parallelize_gpt
    from neural_arch.nn.kv_cache import KVCache
    from neural_arch.profiler import events

    dist = _dist()
    group = dist.get_default_group()
    n, r = group.size(), group.rank()
    cfg = TP_GENERATE_SHAPE
    ref = _gpt(seed, cfg)
    tp = parallelize_gpt(_gpt(seed, cfg), None, loss_parallel=loss_parallel)
    rng = np.random.default_rng(seed + 7)
    lengths = [5, 2, 4] if padded else [4, 4]
    width = max(lengths)
    idx = rng.integers(0, cfg["vocab_size"], size=(len(lengths), width))
    mask = np.array([[0] * (width - k) + [1] * k for k in lengths])
    idx = np.where(mask == 1, idx, 0)
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": do_sample, "temperature": 0.8, "top_k": 12,
              "top_p": 0.9}
    if padded:
        kwargs["attention_mask"] = mask

    counts: dict = {}

    def count(span):
        if span.category == "collective":
            counts[span.name] = counts.get(span.name, 0) + 1

    ref.token_selector = ref_rec = _Recorder(None, counts)
    tp.token_selector = tp_rec = _Recorder(tp.token_selector, counts)
    ref_tokens = ref.generate(idx, generator=np.random.default_rng(seed), **kwargs)
    gen_seed = seed + (r if rank_seeds_differ else 0)
    events.subscribe(count)
    try:
        tp_tokens = tp.generate(idx, generator=np.random.default_rng(gen_seed), **kwargs)
        end = dict(counts)
    finally:
        events.unsubscribe(count)
    marks = tp_rec.marks + [end]
    ops = sorted({op for m in marks for op in m})
    per_step = [{op: marks[i + 1].get(op, 0) - marks[i].get(op, 0) for op in ops
                 if marks[i + 1].get(op, 0) != marks[i].get(op, 0)} for i in range(len(marks) - 1)]
    last_choice = per_step.pop()
    worst = 0.0
    for a, b in zip(tp_rec.logits, ref_rec.logits):
        if a.shape[-1] != b.shape[-1]:
            per = b.shape[-1] // n
            b = b[:, r * per:(r + 1) * per]
        worst = max(worst, float(np.abs(a - b).max()))
    cache = KVCache()
    tp.token_selector = None
    tp(idx, kv_cache=cache, **({"attention_mask": mask} if padded else {}))
    return {"ref": ref_tokens.tolist(), "tp": tp_tokens.tolist(), "logits": worst, "steps": len(tp_rec.logits),
            "per_step": per_step, "first_step": tp_rec.marks[0], "last_choice": last_choice, "cache_heads": int(cache.key_cache[0].shape[1]),
            "n_layer": cfg["n_layer"]}


def vocab_parallel_argmax_run():
    """``vocab_parallel_argmax`` on this rank's vocabulary slice vs ``np.argmax`` of whole rows built to
    tie across the shard boundary, tie inside a shard, hold a NaN, or be all equal."""
    from neural_arch.distributed.tensor.parallel import vocab_parallel_argmax

    dist = _dist()
    group = dist.get_default_group()
    n, r = group.size(), group.rank()
    v = 4 * n
    rows = np.random.default_rng(5).normal(size=(6, v))
    rows[0, [1, v - 1]] = 9.0            # tie across shards: the lower id wins
    rows[1, [v - 2, v - 1]] = 9.0        # tie inside the last shard
    rows[2, v - 3] = np.nan              # NaN wins, as in np.argmax
    rows[3] = 1.0                        # all equal: id 0
    rows[4, [0, v - 1]] = np.nan         # first NaN
    per = v // n
    got = vocab_parallel_argmax(rows[:, r * per:(r + 1) * per].astype(np.float32), group)
    return got.tolist(), np.argmax(rows.astype(np.float32), axis=-1).tolist()


def sequence_parallel_generate_run():
    """``generate`` on a sequence-parallel TP GPT: the error each rank raises (a decode step has one position)."""
    from neural_arch.distributed.tensor.parallel import parallelize_gpt

    tp = parallelize_gpt(_gpt(0, TP_GENERATE_SHAPE), None, sequence_parallel=True)
    try:
        tp.generate(np.array([[1, 2, 3, 4]]), max_new_tokens=2)
    except ValueError as exc:
        return str(exc)
    return None
