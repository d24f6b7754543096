"""Rank functions of the sharded-optimizer exploration tests (``test_shard_explore.py``; module level:
pickled by reference).

:func:`zero_case_run` trains a small MLP with ``ZeroRedundancyOptimizer`` (stage 1 under DDP, or
stage 2 alone) and :func:`fsdp_case_run` with ``FullyShardedDataParallel`` or ``fully_shard``,
under what a hypothesis example draws (layer sizes whose parameter counts do not divide the world
size, a frozen parameter, SGD with momentum and weight
decay or Adam/AdamW, clipping by the global norm, a state-dict round trip), next to a plain
single-process copy trained on the global batch. Each returns a dict of differences (float64:
all must be <= 1e-10).

Example (on every rank of a RankPool)::

    out = zero_case_run({"sizes": (3, 5, 2), "stage": 2, "opt": "sgd", "frozen": True, "steps": 2})
    assert max(out.values()) <= 1e-10
"""

from __future__ import annotations

import numpy as np
from pooled_groups import group_of


def _head_cls():
    from neural_arch import nn

    class SometimesHead(nn.Module):
        """``body`` (the MLP), then ``head`` only while ``use_head`` is true (a parameter unused in some
        steps on every rank: single-process optimizers then skip it, momentum and weight decay too)."""

        def __init__(self, body, head):
            super().__init__()
            self.body, self.head = body, head
            self.use_head = True

        def forward(self, x):
            h = self.body(x)
            return self.head(h) if self.use_head else h

    return SometimesHead


def build(cfg: dict, seed: int):
    from neural_arch import nn

    dtype = np.dtype(cfg.get("dtype", "float64"))
    d_in, hidden, d_out = cfg["sizes"]
    layers = (nn.Linear(d_in, hidden, dtype=dtype), nn.Tanh(), nn.Linear(hidden, d_out, dtype=dtype))
    model = nn.Sequential(*layers)
    first = model[0]
    if cfg.get("head"):
        model = _head_cls()(model, nn.Linear(d_out, d_out, dtype=dtype))
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    if cfg.get("frozen"):      # left out of the optimizer (ours, like torch's, wants trainable ones)
        first.weight.requires_grad = False
    if cfg.get("frozen_layer"):
        first.requires_grad_(False)
    return model


def _trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def make_opt(cfg: dict, params, zero: dict | None = None):
    """The optimizer ``cfg["opt"]`` names; ``zero``: ZeroRedundancyOptimizer's arguments (else a plain one)."""
    from neural_arch import optim

    cls, kw = {"sgd": (optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.05}),
               "adam": (optim.Adam, {"lr": 0.05}),
               "adamw": (optim.AdamW, {"lr": 0.05, "weight_decay": 0.1})}[cfg.get("opt", "adam")]
    if zero is None:
        return cls(params, **kw)
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, cls, **zero, **kw)


def _data(cfg: dict, step: int, n: int):
    dtype = np.dtype(cfg.get("dtype", "float64"))
    rng = np.random.default_rng(step)
    X = rng.normal(size=(n, cfg["sizes"][0])).astype(dtype)
    return X, rng.integers(0, cfg["sizes"][2], size=n)


def _loss(model, X, y):
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor

    return F.cross_entropy(model(Tensor(X)), y)


def _reference(cfg: dict, world: int, seed: int = 0):
    """Single-process training on the global batch (from ``seed``'s weights): the final model, its
    optimizer and the norms."""
    from neural_arch import optim

    ref = build(cfg, seed)
    opt = make_opt(cfg, _trainable(ref))
    norms = []
    for step in range(cfg["steps"]):
        X, y = _data(cfg, step, world * cfg["B"])
        ref.use_head = step % 2 == 0
        _loss(ref, X, y).backward()
        if cfg.get("clip"):
            norms.append(float(optim.clip_grad_norm_(ref.parameters(), cfg["clip"], cfg.get("norm_type", 2.0))))
        opt.step()
        opt.zero_grad()
    return ref, opt, norms


def _state_diff(got: dict, want: dict) -> float:
    """Largest difference between two plain optimizer state dicts (same keys, same steps)."""
    if set(got["state"]) != set(want["state"]):
        return float("inf")
    worst = 0.0
    for i, st in want["state"].items():
        if set(got["state"][i]) != set(st):
            return float("inf")
        for k, v in st.items():
            worst = max(worst, float(np.max(np.abs(np.asarray(got["state"][i][k], dtype=np.float64) - np.asarray(v)))))
    return worst


def zero_case_run(cfg: dict) -> dict:
    """ZeRO (``cfg["stage"]`` 1 under DDP, or 2) against single-process training; then the consolidated
    state loaded into a fresh ZeroRedundancyOptimizer, and into a plain optimizer on one process, must
    continue exactly like the reference."""
    import neural_arch.distributed as dist
    from neural_arch import optim

    member = group_of(cfg["world"])
    if member is None:
        return {}
    group, rank, world = member
    stage, B = cfg["stage"], cfg["B"]
    model = build(cfg, 0)
    ddp_args = {"find_unused_parameters": bool(cfg.get("head")), "process_group": group}
    run = dist.DistributedDataParallel(model, **ddp_args) if stage == 1 else model
    zero = {"stage": stage, "bucket_cap_mb": cfg.get("cap", 25.0), "process_group": group}
    opt = make_opt(cfg, _trainable(model), zero)
    out = {}
    norms = []

    def train(opt, steps, net, run):
        for step in steps:
            X, y = _data(cfg, step, world * B)
            net.use_head = step % 2 == 0
            _loss(run, X[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]).backward()
            if cfg.get("clip"):
                norms.append(float(opt.clip_grad_norm_(cfg["clip"], cfg.get("norm_type", 2.0))))
            opt.step()
            opt.zero_grad()

    train(opt, range(cfg["steps"]), model, run)
    ref, ref_opt, ref_norms = _reference(cfg, world)
    out["params"] = max(float(np.max(np.abs(p.data - q.data))) for p, q in zip(model.parameters(), ref.parameters()))
    if cfg.get("clip"):
        out["norms"] = max(abs(a - b) for a, b in zip(norms, ref_norms))
    opt.consolidate_state_dict(to=0)
    obj = [opt.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(obj, src=0, group=group)
    saved = obj[0]
    out["state"] = _state_diff(saved, ref_opt.state_dict())
    # a fresh optimizer on a fresh copy loads the consolidated state and takes one more step
    fresh = build(cfg, 0)
    fresh.load_state_dict(model.state_dict())
    run = dist.DistributedDataParallel(fresh, **ddp_args) if stage == 1 else fresh
    opt2 = make_opt(cfg, _trainable(fresh), zero)
    opt2.load_state_dict(saved)
    norms.clear()
    train(opt2, [cfg["steps"]], fresh, run)
    X, y = _data({**cfg}, cfg["steps"], world * B)
    ref.use_head = cfg["steps"] % 2 == 0
    _loss(ref, X, y).backward()
    if cfg.get("clip"):
        optim.clip_grad_norm_(ref.parameters(), cfg["clip"], cfg.get("norm_type", 2.0))
    # the same checkpoint in a plain optimizer on one process (the format is the plain one)
    plain = build(cfg, 0)
    plain.load_state_dict(model.state_dict())
    plain_opt = make_opt(cfg, _trainable(plain))
    plain_opt.load_state_dict(saved)
    if cfg.get("head"):
        plain.use_head = cfg["steps"] % 2 == 0
    _loss(plain, X, y).backward()
    if cfg.get("clip"):
        optim.clip_grad_norm_(plain.parameters(), cfg["clip"], cfg.get("norm_type", 2.0))
    plain_opt.step()
    ref_opt.step()
    out["resumed"] = max(float(np.max(np.abs(p.data - q.data))) for p, q in zip(fresh.parameters(), ref.parameters()))
    out["plain_resumed"] = max(float(np.max(np.abs(p.data - q.data)))
                               for p, q in zip(plain.parameters(), ref.parameters()))
    return out


def fsdp_case_run(cfg: dict) -> dict:
    """``FullyShardedDataParallel`` (``cfg["kind"] == "fsdp"``, ``cfg["strategy"]``) or ``fully_shard``
    (``"fully_shard"``) against single-process training on the global batch; with ``cfg["clip"]`` the
    returned global norms too; for ``FullyShardedDataParallel`` the full model and optimizer state dicts
    loaded into a fresh wrapper must then continue exactly like the reference."""
    from neural_arch import nn, optim

    member = group_of(cfg["world"])
    if member is None:
        return {}
    group, rank, world = member
    B = cfg["B"]
    model = build(cfg, 0 if cfg["kind"] == "fully_shard" else 10 + rank)
    if cfg["kind"] == "fsdp":
        from neural_arch.distributed.fsdp import FSDP, MixedPrecision, ShardingStrategy

        mp = MixedPrecision(param_dtype=np.float32, reduce_dtype=np.float32) if cfg.get("mp") else None

        def wrap(model):
            return FSDP(model, sharding_strategy=ShardingStrategy[cfg["strategy"]], process_group=group,
                        auto_wrap_policy={nn.Linear} if cfg.get("wrap") else None, sync_module_states=True,
                        mixed_precision=mp)
        try:
            run = wrap(model)
        except ValueError as exc:   # a unit with frozen and trainable parameters: torch's error
            return {"mixed_unit_error": 0.0 if "mixes frozen parameters" in str(exc) else float("inf")}
        params = list(run.parameters())
        clip = run.clip_grad_norm_
    else:
        from neural_arch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=np.float32, reduce_dtype=np.float32) if cfg.get("mp") else MixedPrecisionPolicy()
        from neural_arch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(group, "cpu")
        if cfg.get("wrap"):
            fully_shard(model[0], mesh=mesh, mp_policy=mp)
        run = fully_shard(model, mesh=mesh, mp_policy=mp)
        params = _trainable(model)
        clip = lambda max_norm, norm_type: optim.clip_grad_norm_(_trainable(model), max_norm, norm_type)
    opt = make_opt(cfg, [p for p in params if p.requires_grad])
    norms = []

    def train(run, opt, clip, steps):
        for step in steps:
            X, y = _data(cfg, step, world * B)
            _loss(run, X[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]).backward()
            if cfg.get("clip"):
                norms.append(float(clip(cfg["clip"], cfg.get("norm_type", 2.0))))
            opt.step()
            opt.zero_grad()

    train(run, opt, clip, range(cfg["steps"]))
    ref, ref_opt, ref_norms = _reference(cfg, world, 0 if cfg["kind"] == "fully_shard" else 10)
    # (fully_shard's state_dict() holds local shards, a documented difference: compare full tensors)
    full = run.state_dict() if cfg["kind"] == "fsdp" else {k: _full(v) for k, v in model.named_parameters()}
    want = ref.state_dict()
    out = {"params": max(float(np.max(np.abs(np.asarray(full[k], dtype=np.float64) - v))) for k, v in want.items())}
    if set(full) != set(want):
        out["keys"] = float("inf")
    if cfg.get("clip"):
        out["norms"] = max(abs(a - b) for a, b in zip(norms, ref_norms))
    import neural_arch.distributed as dist

    if cfg["kind"] == "fsdp" and world == dist.get_world_size():
        # resume: the full model and optimizer state dicts into a fresh wrapper, one more step each (on the
        # whole world only: FSDP.optim_state_dict gathers over the world, not the wrapper's group -- reported)
        osd = FSDP.optim_state_dict(run, opt)
        fresh = wrap(build(cfg, 20 + rank))
        fresh.load_state_dict(full)
        fresh_opt = make_opt(cfg, [p for p in fresh.parameters() if p.requires_grad])
        FSDP.optim_state_dict_to_load(fresh, fresh_opt, osd)
        train(fresh, fresh_opt, fresh.clip_grad_norm_, [cfg["steps"]])
        X, y = _data(cfg, cfg["steps"], world * B)
        _loss(ref, X, y).backward()
        if cfg.get("clip"):
            optim.clip_grad_norm_(ref.parameters(), cfg["clip"], cfg.get("norm_type", 2.0))
        ref_opt.step()
        got, want = fresh.state_dict(), ref.state_dict()
        out["resumed"] = max(float(np.max(np.abs(np.asarray(got[k], dtype=np.float64) - v))) for k, v in want.items())
    return out


def _full(value):
    """A state-dict value as a plain array (fully_shard's are DTensors)."""
    if hasattr(value, "full_tensor"):
        return value.full_tensor().data
    return getattr(value, "data", value)
