"""Rank functions of the comm-hook exploration tests (``test_comm_hooks_explore.py``; module level: pickled by reference).

:func:`hook_steps_run` feeds a comm hook the buckets DDP's reducer would hand it (a flat buffer of
this rank's local gradients, one slot per parameter) for a few steps and returns what the hook
delivered plus the state it kept (error-feedback residuals); the test computes the reference with
NumPy from the same seeded gradients of every rank. :func:`ddp_hook_run` runs real DDP backward
passes with a hook and without one, for the bitwise and compression checks through the reducer.

Example (on every rank of a RankPool)::

    out = hook_steps_run({"world": 2, "hook": "allreduce", "shapes": [[(3, 2), (1,)]], "steps": 1,
                          "dtype": "float64", "seed": 0})
"""

from __future__ import annotations

import itertools

import numpy as np
from pooled_groups import group_of


def local_grads(cfg: dict, step: int, rank: int) -> list[list[np.ndarray]]:
    """Rank ``rank``'s local gradients at ``step``: one list per bucket, one array per parameter
    (the same on every process for the same arguments: the test recomputes them for the reference)."""
    rng = np.random.default_rng([cfg["seed"], step, rank])
    dtype = np.dtype(cfg["dtype"])
    scale = cfg.get("scale", 1.0)
    return [[(scale * rng.standard_normal(shape)).astype(dtype) for shape in bucket] for bucket in cfg["shapes"]]


def make_state(cfg: dict, group):
    """The hook function and its state for ``cfg["hook"]`` (options from ``cfg``)."""
    from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook, topk_hook

    name = cfg["hook"]
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            group, matrix_approximation_rank=cfg.get("rank", 1), start_powerSGD_iter=cfg.get("start", 0),
            min_compression_rate=cfg.get("min_rate", 0.0), use_error_feedback=cfg.get("error_feedback", True),
            warm_start=cfg.get("warm_start", True), random_seed=cfg.get("hook_seed", 0))
        return state, powerSGD_hook.powerSGD_hook
    if name == "topk":
        state = topk_hook.TopKState(ratio=cfg.get("ratio", 0.1), process_group=group, start_iter=cfg.get("start", 0),
                                    warmup_iters=0, momentum=cfg.get("momentum", 0.0), spread=cfg.get("spread", False))
        return state, topk_hook.topk_hook
    return group, getattr(default_hooks, {"allreduce": "allreduce_hook", "fp16": "fp16_compress_hook",
                                          "bf16": "bf16_compress_hook"}[name])


def bucket_of(index: int, grads: list[np.ndarray], last: bool):
    """A GradBucket as DDP's reducer builds it: gradients back to back in one flat buffer."""
    from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import GradBucket

    flat = np.concatenate([g.reshape(-1) for g in grads]) if grads else np.zeros(0)
    slots, at = [], 0
    for g in grads:
        slots.append((at, at + g.size, g.shape))
        at += g.size
    return GradBucket(index, flat, slots, params=[f"p{i}" for i in range(len(grads))], last=last)


def hook_steps_run(cfg: dict):
    """Run ``cfg["hook"]`` over ``cfg["steps"]`` steps of ``cfg["shapes"]`` buckets.

    Returns (on members of the first ``cfg["world"]`` ranks; None elsewhere) a dict: ``delivered``
    (per step, per bucket: the flat array the hook's Work completed with), ``residual`` (per bucket,
    this rank's error-feedback memory after the last step, or None), ``pending`` (top-k spread
    delivery's pending array per bucket, or None) and ``same_buffer`` (whether every result was the
    bucket's own buffer, which a hook is allowed but not required to return)."""
    member = group_of(cfg["world"])
    if member is None:
        return None
    group, rank, _world = member
    state, hook = make_state(cfg, group)
    delivered = []
    for step in range(cfg["steps"]):
        buckets = [bucket_of(i, grads, last=i == len(cfg["shapes"]) - 1)
                   for i, grads in enumerate(local_grads(cfg, step, rank))]
        works = [hook(state, b) for b in buckets]        # every bucket handed over, then waited for
        delivered.append([np.array(w.result(), copy=True) for w in works])   # in order (DDP's end of backward)
    residual = pending = None
    if cfg["hook"] == "powersgd":
        residual = [state.error_dict.get(i) for i in range(len(cfg["shapes"]))]
    elif cfg["hook"] == "topk":
        residual = [state.residuals.get(i) for i in range(len(cfg["shapes"]))]
        if cfg.get("spread"):
            pending = [state.pending[i][0] if i in state.pending else None for i in range(len(cfg["shapes"]))]
    return {"delivered": delivered, "residual": residual, "pending": pending}


def ddp_hook_run(cfg: dict):
    """One DDP backward on a small model with ``cfg["hook"]`` and one without (same data, same
    bucket cap): returns ``(grads with the hook, grads without, this rank's local grads, n buckets)``
    as lists of float arrays, on members of the first ``cfg["world"]`` ranks (None elsewhere)."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor

    member = group_of(cfg["world"])
    if member is None:
        return None
    group, rank, _world = member
    dtype = np.dtype(cfg["dtype"])
    widths = cfg["widths"]

    def model():
        rng = np.random.default_rng(cfg["seed"])
        net = nn.Sequential(*[nn.Linear(a, b, dtype=dtype) for a, b in itertools.pairwise(widths)])
        for p in net.parameters():
            p.data[...] = rng.normal(0, 0.7, size=p.data.shape).astype(dtype)
        return net

    rng = np.random.default_rng([cfg["seed"], rank])
    X = rng.standard_normal((cfg["batch"], widths[0])).astype(dtype)
    y = rng.integers(0, widths[-1], cfg["batch"])

    def grads(hook_name):
        net = model()
        if hook_name == "local":
            F.cross_entropy(net(Tensor(X)), y).backward()
            return [p.grad.data.copy() for p in net.parameters()], 0
        ddp = dist.DistributedDataParallel(net, bucket_cap_mb=cfg["cap"], first_bucket_mb=cfg["cap"],
                                           process_group=group)
        if hook_name is not None:
            ddp.register_comm_hook(*make_state({**cfg, "hook": hook_name}, group))
        F.cross_entropy(ddp(Tensor(X)), y).backward()
        return [p.grad.data.copy() for p in net.parameters()], len(ddp.reducer.plan)

    hooked, n_buckets = grads(cfg["hook"])
    plain, _ = grads(None)
    local, _ = grads("local")
    return hooked, plain, local, n_buckets
