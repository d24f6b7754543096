"""Save FSDP + Adam mid-training and resume on another world size (functions RankPool ranks run).

A tiny float64 model (flat buffers that need padding on 2 ranks) trains on a fixed global batch
(each rank its slice); the uninterrupted run is compared with a run saved after ``FIRST`` steps
and resumed, on 2 ranks (FSDP, ZeRO-1 under DDP, ZeRO-2) or one process (plain model), for
``THEN`` more steps.
"""

from __future__ import annotations

import numpy as np

FIRST, THEN, LR, WD = 2, 2, 0.05, 0.01


def build():
    from neural_arch import nn

    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(5, 7, dtype=np.float64), nn.Tanh(), nn.Linear(7, 3, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape)
    return model


def batch(world: int, rank: int):
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(6, 5)), rng.integers(0, 3, size=6)
    n = len(X) // world
    return X[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def _setup(kind: str):
    """(model to train and save, optimizer): "plain" (one process), "fsdp", "zero1" (under DDP), "zero2"."""
    from neural_arch import nn, optim

    model = build()
    if kind == "fsdp":
        from neural_arch.distributed.fsdp import FSDP

        model = FSDP(model, auto_wrap_policy={nn.Linear})
    elif kind.startswith("zero"):
        from neural_arch.distributed import DistributedDataParallel
        from neural_arch.distributed.optim import ZeroRedundancyOptimizer

        stage = int(kind[-1])
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=stage, lr=LR, weight_decay=WD,
                                      bucket_cap_mb=0.0002)  # several buckets, params split across ranks
        return (DistributedDataParallel(model) if stage == 1 else model), opt
    return model, optim.Adam(model.parameters(), lr=LR, weight_decay=WD)


def _train(model, opt, steps: int, world: int, rank: int) -> float:
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor

    X, y = batch(world, rank)
    loss = None
    for _ in range(steps):
        loss = F.cross_entropy(model(Tensor(X)), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return float(loss.data)


def _full(model) -> dict:
    return {k: np.asarray(v) for k, v in model.state_dict().items()}


def save(model, opt, directory: str) -> None:
    from neural_arch.distributed import checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "step": FIRST}, checkpoint_id=directory)


def resume(directory: str, kind: str = "plain", world: int = 1, rank: int = 0) -> dict:
    """A fresh model and optimizer, loaded from ``directory``, trained ``THEN`` steps: full params."""
    from neural_arch.distributed import checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, opt = _setup(kind)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": -1}
    dcp.load(state, checkpoint_id=directory)
    assert state["step"] == FIRST
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    _train(model, opt, THEN, world, rank)
    return _full(model)


def save_and_resume(root: str, single_dir: str, single_first: dict) -> dict:
    """On 2 ranks, for FSDP, ZeRO-2 and ZeRO-1: train, save, train on (uninterrupted); resume from
    that checkpoint and (FSDP) from the single process's one. FSDP first tries the naive save
    (which must raise)."""
    import neural_arch.distributed as dist
    from neural_arch.distributed import checkpoint as dcp

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for kind in ("fsdp", "zero2", "zero1"):
        model, opt = _setup(kind)
        _train(model, opt, FIRST, world, rank)
        if kind == "fsdp":
            from neural_arch.distributed.fsdp import FSDP

            out["fsdp_full_osd"] = FSDP.optim_state_dict(model, opt)  # FULL_STATE_DICT: whole arrays
            try:  # the checkpoint module's old pattern: each rank's Adam shard under one replicated key
                dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=f"{root}/naive")
                out["naive_error"] = None
            except dcp.CheckpointError as exc:
                out["naive_error"] = str(exc)
        save(model, opt, f"{root}/{kind}")
        _train(model, opt, THEN, world, rank)
        out[kind] = _full(model)
        out[f"{kind}_2_2"] = resume(f"{root}/{kind}", kind, world, rank)
    try:  # a plain value is replicated too: the checkpoint would keep one rank's
        dcp.save({"loss": 1.0 + rank, "w": np.zeros(3)}, checkpoint_id=f"{root}/plain")
        out["plain_error"] = None
    except dcp.CheckpointError as exc:
        out["plain_error"] = str(exc)
    out["fsdp_1_2"] = resume(single_dir, "fsdp", world, rank)
    out["fsdp_1_2_full"] = resume_full(single_first, world, rank)
    return out


def resume_full(first: dict, world: int, rank: int) -> dict:
    """torch's FSDP path without a checkpoint: full model and optimizer state dicts loaded with
    ``load_state_dict`` / ``FSDP.optim_state_dict_to_load``, then ``THEN`` steps."""
    from neural_arch.distributed.fsdp import FSDP

    model, opt = _setup("fsdp")
    model.load_state_dict(first["model"])
    opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, first["optim"]))
    _train(model, opt, THEN, world, rank)
    return _full(model)


def single_process_first_steps(directory: str) -> tuple[dict, dict]:
    """One process, no process group: train ``FIRST`` steps, save, train on. Returns the final
    full params and the model and optimizer state dicts (by name, whole) after ``FIRST`` steps."""
    from neural_arch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model, opt = _setup("plain")
    _train(model, opt, FIRST, 1, 0)
    first = {"model": _full(model), "optim": get_optimizer_state_dict(model, opt)}
    save(model, opt, directory)
    _train(model, opt, THEN, 1, 0)
    return _full(model), first
