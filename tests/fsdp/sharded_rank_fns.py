"""Functions the sharded-training tests run on every rank of a RankPool (pickled by reference).

:func:`equivalence_run` trains one small model with a sharded strategy (ZeRO-1, ZeRO-1 under
DDP, ZeRO-2, FSDP with any sharding strategy) on each rank's part of the global batch, and a
plain single-process copy on the whole global batch, and returns the largest parameter
difference after several Adam steps, plus checks specific to the strategy.
"""

from __future__ import annotations

import os

import numpy as np


def build(seed: int, dtype):
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    # sizes chosen so flat buffers need padding on 2 and 3 ranks (112, 272, 68 elements)
    model = nn.Sequential(nn.Linear(6, 16, dtype=dtype), nn.ReLU(),
                          nn.Sequential(nn.Linear(16, 16, dtype=dtype), nn.Tanh()),
                          nn.Linear(16, 4, dtype=dtype))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    return model


def data(n: int, dtype, seed: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6)).astype(dtype)
    y = (X[:, :4].argmax(axis=1) + (X[:, 4] > 0)).astype(np.int64) % 4
    return X, y


def _loss(model, X, y):
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor

    return F.cross_entropy(model(Tensor(X)), y)


def _reference(cfg, X, y, dtype, seed=0):
    from neural_arch import optim

    ref = build(seed, dtype)
    opt = optim.Adam(ref.parameters(), lr=0.05, weight_decay=cfg.get("wd", 0.0))
    for _ in range(cfg.get("steps", 4)):
        _loss(ref, X, y).backward()
        if cfg.get("clip"):
            optim.clip_grad_norm_(ref.parameters(), cfg["clip"])
        opt.step()
        opt.zero_grad()
    return ref, opt


def equivalence_run(cfg):
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.distributed.fsdp import FSDP, MixedPrecision, ShardingStrategy, StateDictType
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = np.dtype(cfg.get("dtype", "float64"))
    B = cfg.get("B", 3)
    X, y = data(world * B, dtype)
    mine = slice(rank * B, (rank + 1) * B)
    kind = cfg["kind"]
    extra = {}
    if cfg.get("shard_size"):
        os.environ["NEURAL_ARCH_FSDP_SHARD_SIZE"] = str(cfg["shard_size"])

    if kind.startswith("zero"):
        model = build(0, dtype)
        run_model = dist.DistributedDataParallel(model) if kind == "zero1-ddp" else model
        stage = 2 if kind == "zero2" else 1
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=stage, lr=0.05,
                                      weight_decay=cfg.get("wd", 0.0), bucket_cap_mb=cfg.get("cap", 25.0))
        for _ in range(cfg.get("steps", 4)):
            _loss(run_model, X[mine], y[mine]).backward()
            if kind == "zero1":  # what DDP does: average the gradients
                for p in model.parameters():
                    dist.all_reduce(p.grad, dist.ReduceOp.AVG)
            if stage == 2:
                extra["no_full_grads"] = all(p.grad is None for p in model.parameters())
                extra["shard_elems"] = sum(int(s.grad.data.size) for s in opt._shards)
            opt.step()
            opt.zero_grad()
        got = model.state_dict()
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            ref, ref_opt = _reference(cfg, X, y, dtype)
            sd, rsd = opt.state_dict(), ref_opt.state_dict()
            extra["state_diff"] = max(float(np.abs(np.asarray(sd["state"][i][k]) - np.asarray(v)).max())
                                      for i, st in rsd["state"].items() for k, v in st.items() if k != "step")
            extra["steps_equal"] = all(sd["state"][i]["step"] == st["step"] for i, st in rsd["state"].items())
        else:
            ref, _ = _reference(cfg, X, y, dtype)
            try:
                opt.state_dict()
                extra["non_root_state_dict_raises"] = False
            except RuntimeError:
                extra["non_root_state_dict_raises"] = True
    else:
        model = build(rank + 10, dtype)  # rank-specific init: sync_module_states must fix it
        if cfg.get("ckpt"):
            from neural_arch.utils.checkpoint import apply_activation_checkpointing

            apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.Linear))
        mp = None
        if cfg.get("mp"):
            mp = MixedPrecision(param_dtype=np.dtype(cfg["mp"]), reduce_dtype=np.float32)
        fsdp = FSDP(model, sharding_strategy=ShardingStrategy[cfg["strategy"]], auto_wrap_policy={nn.Linear},
                    sync_module_states=True, mixed_precision=mp)
        opt = optim.Adam(fsdp.parameters(), lr=0.05, weight_decay=cfg.get("wd", 0.0))
        for _ in range(cfg.get("steps", 4)):
            _loss(fsdp, X[mine], y[mine]).backward()
            extra["orig_grads_dropped"] = all(p.grad is None for p in model.parameters())
            if cfg.get("clip"):
                fsdp.clip_grad_norm_(cfg["clip"])
            opt.step()
            opt.zero_grad()
        got = fsdp.state_dict()
        with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
            shard_sd = fsdp.state_dict()
            for u in fsdp._units:
                u.flat_param.data[...] = 0
            fsdp.load_state_dict(shard_sd)
        extra["sharded_roundtrip"] = max(float(np.abs(got[k] - v).max()) for k, v in fsdp.state_dict().items())
        extra["shard_elems"] = sum(int(u.flat_param.data.size) for u in fsdp._units)
        ref, _ = _reference(cfg, X, y, dtype, seed=10)  # rank 0's initial weights
    want = ref.state_dict()
    diff = max(float(np.abs(np.asarray(got[k], dtype=np.float64) - v).max()) for k, v in want.items())
    return diff, extra


def scaler_overflow_run(_):
    """Sharded GradScaler: an inf on rank 1 only must make *every* rank skip the step."""
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.distributed.fsdp import FSDP, ShardedGradScaler

    rank = dist.get_rank()
    model = build(0, np.float64)
    fsdp = FSDP(model, auto_wrap_policy={nn.Linear})
    opt = optim.SGD(fsdp.parameters(), lr=0.1)
    scaler = ShardedGradScaler(init_scale=4.0, growth_interval=1)
    X, y = data(2 * dist.get_world_size(), np.float64)
    before = [u.flat_param.data.copy() for u in fsdp._units]
    scaler.scale(_loss(fsdp, X[2 * rank:2 * rank + 2], y[2 * rank:2 * rank + 2])).backward()
    if rank == 1:
        fsdp._units[0].flat_param.grad.data[0] = np.inf
    skipped = scaler.step(opt) is None and all(np.array_equal(b, u.flat_param.data) for b, u in zip(before, fsdp._units))
    scaler.update()
    return skipped, scaler.get_scale()
