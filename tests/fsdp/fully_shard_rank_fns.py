"""Functions the fully_shard (FSDP2) tests run on every rank of a RankPool (pickled by reference).

:func:`train_run` trains a small model under ``fully_shard`` (each block, then the root) on this
rank's part of the global batch, and the same model in one process on the whole batch, and returns
the largest difference of the full parameters after Adam steps, plus what the case checks.
"""

from __future__ import annotations

import numpy as np

BATCH = 24      # divisible by every data-parallel degree used (1, 2, 3, 4) times 2 micro-batches


def build(dtype=np.float64, seed: int = 0):
    from neural_arch import nn

    # rows 7, 6 and 3 over 4 ranks: torch.chunk gives (2,2,2,1), (2,2,2,0) and (1,1,1,0) rows;
    # the blocks' hidden size 6 splits over a tensor-parallel dimension of 2
    def block():
        return nn.Sequential(nn.Linear(7, 6, dtype=dtype), nn.GELU(), nn.Linear(6, 7, dtype=dtype))

    model = nn.Sequential(nn.Linear(4, 7, dtype=dtype), nn.GELU(), block(), block(), nn.Linear(7, 3, dtype=dtype))
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    return model


def data(dtype=np.float64, seed: int = 3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(BATCH, 4)).astype(dtype), rng.normal(size=(BATCH, 3)).astype(dtype)


def loss_of(out, y):
    from neural_arch.core.tensor import Tensor

    d = out - Tensor(y.astype(out.dtype))
    return (d * d).mean()


def reference(steps: int, micro: int, dtype=np.float64, param_dtype=None, clip=None, clipped=None):
    """Single-process training on the whole batch (``micro`` micro-batches summed per step).
    With ``param_dtype``: forward and backward on a ``param_dtype`` copy of the parameters, the
    gradients cast back (the casts ``MixedPrecisionPolicy`` makes). With ``clip``: the gradients
    are clipped to that global norm before each step; ``clipped`` (a dict) gets the first step's
    norm and clipped gradients."""
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor

    model, (X, Y) = build(dtype), data(dtype)
    opt = optim.Adam(model.parameters(), lr=0.05)
    for step in range(steps):
        for xs, ys in zip(np.split(X, micro), np.split(Y, micro)):
            if param_dtype is None:
                loss_of(model(Tensor(xs)), ys).backward()
                continue
            low = build(param_dtype)
            for p, q in zip(low.parameters(), model.parameters()):
                p.data[...] = q.data.astype(param_dtype)
            loss_of(low(Tensor(xs.astype(param_dtype))), ys).backward()
            for p, q in zip(low.parameters(), model.parameters()):
                g = p.grad.data.astype(dtype)
                q.grad = g if q.grad is None else q.grad.data + g
        if clip is not None:
            norm = optim.clip_grad_norm_(model.parameters(), clip)
            if step == 0 and clipped is not None:
                clipped.update({"norm": norm, **{n: p.grad.data.copy() for n, p in model.named_parameters()}})
        opt.step()
        opt.zero_grad()
    return model


def _my_rows(X, dp_rank: int, dp_size: int):
    n = len(X) // dp_size
    return X[dp_rank * n:(dp_rank + 1) * n]


def _poison_on_release():
    """Make every reshard overwrite the gathered buffer with NaN (what returning its memory may do):
    a backward that reads it without re-gathering gives NaN gradients."""
    from neural_arch.distributed.fsdp import storage

    original = storage.release

    def release(arr):
        arr[...] = np.nan
        return original(arr)

    storage.release = release
    return lambda: setattr(storage, "release", original)


def train_run(cfg):
    import neural_arch.distributed as dist
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor, no_grad
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.flight_recorder.buffer import RECORDER
    from neural_arch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )
    from neural_arch.distributed.tensor import DTensor

    world = dist.get_world_size()
    kind = cfg.get("kind", "fsdp")
    steps, micro = cfg.get("steps", 3), cfg.get("micro", 1)
    mp = MixedPrecisionPolicy(param_dtype=cfg.get("param_dtype"), reduce_dtype=cfg.get("reduce_dtype"))
    model, (X, Y) = build(), data()
    if kind == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        dp_rank, dp_size = mesh.get_coordinate()[0] * mesh.size(1) + mesh.get_coordinate()[1], world
    elif kind == "tp":
        from neural_arch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        full = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        for name in ("2", "3"):      # each block's MLP: fc1 column-, fc2 row-parallel (Megatron)
            parallelize_module(model.get_submodule(name), full["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        mesh = full["dp"]
        dp_rank, dp_size = full.get_local_rank("dp"), full.size("dp")
    else:
        mesh = init_device_mesh("cpu", (world,))
        dp_rank, dp_size = dist.get_rank(), world
    reshard = cfg.get("reshard_after_forward", True)
    offload = CPUOffloadPolicy() if cfg.get("offload") else OffloadPolicy()   # host arrays: a no-op
    for name in ("2", "3"):
        fully_shard(model.get_submodule(name), mesh=mesh, reshard_after_forward=reshard, mp_policy=mp,
                    offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    params = list(model.named_parameters())
    out = {"all_dtensor": all(isinstance(p, DTensor) for _, p in params),
           "is_fsdp": isinstance(model, FSDPModule) and isinstance(model[2], FSDPModule),
           "placements": sorted({str(p.placements) for _, p in params})}
    opt = optim.Adam(model.parameters(), lr=0.05)
    restore = _poison_on_release() if reshard else (lambda: None)
    import time

    mark = time.time()
    try:
        for step in range(steps):
            for k, (xs, ys) in enumerate(zip(np.split(_my_rows(X, dp_rank, dp_size), micro),
                                             np.split(_my_rows(Y, dp_rank, dp_size), micro))):
                model.set_requires_gradient_sync(k == micro - 1)
                loss_of(model(Tensor(xs)), ys).backward()
                if k < micro - 1:
                    out["grad_after_unsynced"] = [p.grad is None for _, p in params]
            if step == 0:
                out["records"] = [(r["op"], r["dtype"]) for r in RECORDER.snapshot() if (r["t_start"] or 0) >= mark]
                out["sharded_between_steps"] = all(isinstance(p, DTensor) for p in model.parameters())
            if cfg.get("clip") is not None:   # the global norm of DTensor-sharded gradients
                norm = optim.clip_grad_norm_(model.parameters(), cfg["clip"])
                if step == 0:
                    out["clipped"] = {"norm": norm, **{n: p.grad.full_tensor().data for n, p in params}}
            opt.step()
            opt.zero_grad()
    finally:
        restore()
    clipped: dict = {}
    ref = dict(reference(steps, micro, param_dtype=cfg.get("param_dtype"), clip=cfg.get("clip"),
                         clipped=clipped).named_parameters())
    worst = 0.0
    with no_grad():
        for name, p in params:
            # FSDP x TP: the parameter is a DTensor on the (dp, tp) mesh: full_tensor() is the whole weight
            worst = max(worst, float(np.max(np.abs(p.full_tensor().data - ref[name].data))))
    out["worst"] = worst
    if cfg.get("clip") is not None:
        got = out.pop("clipped")
        out["clip_norm"] = (got["norm"], clipped["norm"])
        out["clip_grad_worst"] = max(float(np.max(np.abs(got[n] - clipped[n]))) for n, _ in params)
    if kind == "tp":  # (dp placement, tp placement) on the (dp, tp) root mesh, TP's global shape
        out["tp_layout"] = {n: (tuple(p.placements), p.device_mesh.mesh.tolist(), p.dtensor_shape)
                            for n, p in params if n.startswith("2.")}
    out["nan"] = any(not np.isfinite(p.data).all() for _, p in params)
    return out


def gpt_run(steps: int = 2):
    """A tiny ``nn.GPT`` (float64): ``fully_shard`` on each block, then the root, against one process."""
    import neural_arch as na
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, no_grad
    from neural_arch.distributed.fsdp import fully_shard

    def build_gpt():
        na.manual_seed(0)
        return nn.GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=6).double()

    def loss(model, x, y):
        return F.cross_entropy(model(Tensor(x)).reshape(-1, 11), y.reshape(-1))

    rng = np.random.default_rng(1)
    X, Y = rng.integers(0, 11, size=(8, 8)), rng.integers(0, 11, size=(8, 8))
    world, rank = dist.get_world_size(), dist.get_rank()
    model = build_gpt()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = optim.Adam(model.parameters(), lr=0.01)
    n = len(X) // world
    for _ in range(steps):
        loss(model, X[rank * n:(rank + 1) * n], Y[rank * n:(rank + 1) * n]).backward()
        opt.step()
        opt.zero_grad()
    ref = build_gpt()
    ref_opt = optim.Adam(ref.parameters(), lr=0.01)
    for _ in range(steps):
        loss(ref, X, Y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    want = dict(ref.named_parameters())
    with no_grad():
        return max(float(np.abs(p.full_tensor().data - want[k].data).max()) for k, p in model.named_parameters())
