"""Exploring tensor-parallel rank functions (tests/tensor/parallel/test_tp_explore.py runs them).

Each builds the same seeded dense model on every rank, shards a copy with ``parallelize_module``
under the drawn options, and returns the largest difference from the dense model (output, loss,
every parameter's gradient, the sharded gradient compared with the matching slice of the dense
one), or the error every rank raised (``(type name, message)``).
"""

from __future__ import annotations

import numpy as np


def _g(t):
    return np.asarray(t.grad.data)


def _slice_of(full, p):
    """The piece of the dense array ``full`` that the (possibly sharded) parameter ``p`` holds here."""
    from neural_arch.distributed.tensor import DTensor, Shard

    if not isinstance(p, DTensor):
        return full
    (pl,) = p.placements
    if not isinstance(pl, Shard):
        return full
    n, r = p.device_mesh.size(), p.device_mesh.get_local_rank()
    step = full.shape[pl.dim] // n
    return np.take(full, np.arange(r * step, (r + 1) * step), axis=pl.dim)


def mlp_run(case: dict):
    """fc1 (Colwise) -> tanh -> fc2 (Rowwise) [-> head] under the drawn layouts, against the dense MLP."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    from neural_arch.distributed.tensor.placement_types import Replicate, Shard

    dtype = np.dtype(case["dtype"])
    cin, hid, cout, bias = case["cin"], case["hid"], case["cout"], case["bias"]
    seq = case["seq"]   # True: (B, T, C) with the LayerNorm in a sequence-parallel region

    def build():
        manual_seed(case["seed"])
        mods = {"fc1": nn.Linear(cin, hid, bias=bias, dtype=dtype), "act": nn.Tanh(),
                "fc2": nn.Linear(hid, cout, bias=bias, dtype=dtype)}
        if seq:
            mods["ln"] = nn.LayerNorm(cout)
            mods["fc3"] = nn.Linear(cout, hid, bias=bias, dtype=dtype)
            mods["fc4"] = nn.Linear(hid, cout, bias=bias, dtype=dtype)
        m = nn.Sequential()
        for k, v in mods.items():
            m.add_module(k, v)
        return m.double() if dtype == np.float64 else m

    ref, tp = build(), build()
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    if seq:
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel(output_layouts=Shard(1)),
                "ln": SequenceParallel(), "fc3": ColwiseParallel(input_layouts=Shard(1)),
                "fc4": RowwiseParallel()}
    else:
        plan = {"fc1": ColwiseParallel(output_layouts=Replicate() if case["gather"] else None),
                "fc2": RowwiseParallel(input_layouts=Replicate() if case["gather"] else None)}
    try:
        parallelize_module(tp, mesh, plan)
    except (ValueError, NotImplementedError) as exc:
        return {"error": (type(exc).__name__, str(exc))}
    rng = np.random.default_rng(case["seed"])
    shape = (case["batch"], case["t"], cin) if seq or case["t"] else (case["batch"], cin)
    x = rng.normal(size=shape).astype(dtype)
    target = rng.normal(size=shape[:-1] + (cout,)).astype(dtype)
    y_ref = ref(Tensor(x, requires_grad=True))
    loss_ref = ((y_ref - Tensor(target)) ** 2).sum()
    loss_ref.backward()
    try:
        y = tp(Tensor(x, requires_grad=True))
    except ValueError as exc:
        return {"error": (type(exc).__name__, str(exc))}
    y_full = np.asarray(y.data)
    loss = ((y - Tensor(target)) ** 2).sum()
    loss.backward()
    out = {"error": None, "dtype": str(y.data.dtype),
           "out": float(np.abs(y_full - np.asarray(y_ref.data)).max(initial=0.0)),
           "loss": abs(float(loss.item()) - float(loss_ref.item())), "grad": 0.0, "missing": []}
    ref_params = dict(ref.named_parameters())
    for name, p in tp.named_parameters():
        if p.grad is None:
            out["missing"].append(name)
            continue
        want = _slice_of(_g(ref_params[name]), p)
        out["grad"] = max(out["grad"], float(np.abs(_g(p) - want).max(initial=0.0)))
    return out


def vocab_loss_run(case: dict):
    """vocab_parallel_cross_entropy on this rank's logits slice against F.cross_entropy on the whole."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor.parallel import vocab_parallel_cross_entropy

    world, rank = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(case["seed"])
    vocab, shape, dtype = case["vocab"], tuple(case["shape"]), np.dtype(case["dtype"])
    logits = (rng.normal(size=shape + (vocab,)) * 3).astype(dtype)
    target = rng.integers(0, vocab, size=shape)
    ign = case["ignore_index"]
    if case["n_ignored"]:
        flat = target.reshape(-1)
        flat[: case["n_ignored"]] = ign
    per = vocab // world
    full = Tensor(logits, requires_grad=True)
    ref = F.cross_entropy(full.reshape(-1, vocab), target.reshape(-1), ignore_index=ign,
                          reduction=case["reduction"])
    if case["reduction"] == "none":
        ref = ref.reshape(shape)
    w = np.random.default_rng(7).normal(size=ref.shape).astype(dtype)
    (ref * Tensor(w)).sum().backward()
    local = Tensor(np.ascontiguousarray(logits[..., rank * per:(rank + 1) * per]), requires_grad=True)
    try:
        got = vocab_parallel_cross_entropy(local, target, ignore_index=ign, reduction=case["reduction"])
    except (ValueError, IndexError) as exc:
        return {"error": (type(exc).__name__, str(exc))}
    (got * Tensor(w)).sum().backward()
    gv, rv = np.asarray(got.data), np.asarray(ref.data)
    both_nan = bool(np.isnan(gv).all() and np.isnan(rv).all())
    return {"error": None, "shape": (tuple(gv.shape), tuple(rv.shape)), "dtype": str(gv.dtype),
            "loss": 0.0 if both_nan else float(np.nan_to_num(np.abs(gv - rv), nan=np.inf).max()),
            "grad": float(np.nan_to_num(np.abs(np.asarray(local.grad.data)
                                               - np.asarray(full.grad.data)[..., rank * per:(rank + 1) * per]),
                                        nan=np.inf).max()) if not both_nan else 0.0}


def misuse_run(kind: str):
    """A plan the sharding cannot honour: the error every rank raised, or None if it went through."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_gpt,
        parallelize_module,
    )

    manual_seed(0)
    group = dist.new_group(list(range(dist.get_world_size())))
    try:
        if kind == "tied_gpt":             # nanoGPT-style tied embedding / LM head
            w = dist.get_world_size()
            model = nn.GPT(vocab_size=2 * w, block_size=4, n_layer=1, n_head=w, n_embd=2 * w).double()
            model.head.weight = model.tok_emb.weight
            parallelize_gpt(model, group)
        elif kind == "tied_linear":        # two Linears sharing one weight, one of them sharded
            w = 2 * dist.get_world_size()
            model = nn.Sequential(nn.Linear(w, w, dtype=np.float64), nn.Linear(w, w, dtype=np.float64))
            model[1].weight = model[0].weight
            parallelize_module(model, group, {"0": ColwiseParallel()})
        elif kind == "sequence_parallel_twice":  # two plan keys matching one LayerNorm
            model = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 3, dtype=np.float64))
            parallelize_module(model, group, {"0": SequenceParallel(), "[0]": SequenceParallel()})
        elif kind == "rowwise_twice":
            model = nn.Sequential(nn.Linear(2 * dist.get_world_size(), 3, dtype=np.float64))
            parallelize_module(model, group, {"0": RowwiseParallel()})
            parallelize_module(model, group, {"0": RowwiseParallel()})
        else:
            raise AssertionError(kind)
    except (ValueError, TypeError, NotImplementedError) as exc:
        return (type(exc).__name__, str(exc))
    return None


def gpt_run(case: dict):
    """parallelize_gpt (loss_parallel, sequence_parallel) on a random small GPT: the loss and every
    parameter's gradient against the dense GPT in float64."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy

    def build():
        manual_seed(case["seed"])
        return nn.GPT(vocab_size=case["vocab"], block_size=8, n_layer=1, n_head=case["n_head"],
                      n_embd=case["n_head"] * case["head_dim"]).double()

    ref, tp = build(), build()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rng = np.random.default_rng(case["seed"])
    idx = rng.integers(0, case["vocab"], size=(case["batch"], case["t"]))
    tgt = rng.integers(0, case["vocab"], size=(case["batch"], case["t"]))
    logits = ref(Tensor(idx))
    v = case["vocab"]
    loss_ref = F.cross_entropy(logits.reshape(-1, v), tgt.reshape(-1))
    loss_ref.backward()
    try:
        parallelize_gpt(tp, mesh, loss_parallel=case["loss_parallel"], sequence_parallel=case["sp"])
        out = tp(Tensor(idx))
    except (ValueError, NotImplementedError) as exc:
        return {"error": (type(exc).__name__, str(exc))}
    if case["loss_parallel"]:
        loss = vocab_parallel_cross_entropy(out, tgt, process_group=mesh)
    else:
        loss = F.cross_entropy(out.reshape(-1, v), tgt.reshape(-1))
    loss.backward()
    res = {"error": None, "loss": abs(float(loss.item()) - float(loss_ref.item())), "grad": 0.0, "missing": []}
    ref_params = dict(ref.named_parameters())
    for name, p in tp.named_parameters():
        if p.grad is None:
            res["missing"].append(name)
            continue
        want = _slice_of(_g(ref_params[name]), p)
        res["grad"] = max(res["grad"], float(np.abs(_g(p) - want).max(initial=0.0)))
    return res
