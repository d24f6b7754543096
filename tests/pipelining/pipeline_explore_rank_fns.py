"""Exploring pipeline rank functions (tests/pipelining/test_pipeline_explore.py runs them).

:func:`equivalence_run` runs one ``step`` of the drawn schedule over a random MLP cut into stages
and compares this rank's stages with one process that runs the same micro-batches one after the
other, accumulating ``loss_fn(model(x_i), y_i) * scale`` (scale ``1/m`` with ``scale_grads``, else 1):
per-micro-batch losses, and every gradient of this rank's stages. Errors come back as
``(type name, message)`` so the test can check that every rank raised.
"""

from __future__ import annotations

import numpy as np

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
             "zbh1": "ScheduleZBH1", "zbv": "ScheduleZBVZeroBubble", "izb": "ScheduleInterleavedZeroBubble"}
VIRTUAL = {"interleaved": 2, "zbv": 2, "izb": 2}


def _model(widths, dtype, seed):
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed

    manual_seed(seed)
    mods = []
    for i in range(len(widths) - 1):
        mods.append(nn.Linear(widths[i], widths[i + 1], dtype=dtype))
        if i < len(widths) - 2:
            mods.append(nn.Tanh())
    return nn.Sequential(*mods)


def _loss_fn(kind: str, reduction: str):
    import neural_arch.nn.functional as F

    if kind == "ce":
        return lambda out, y: F.cross_entropy(out, y, reduction=reduction)
    return lambda out, y: F.mse_loss(out, y, reduction=reduction)


def equivalence_run(case: dict):
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import pipelining as pl

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = np.dtype(case["dtype"])
    v = VIRTUAL.get(case["schedule"], 1)
    n_stages = world * v
    widths = case["widths"]
    m, rows = case["m"], case["rows"]
    model, ref = _model(widths, dtype, case["seed"]), _model(widths, dtype, case["seed"])
    lf = _loss_fn(case["loss"], case["reduction"])
    rng = np.random.default_rng(case["seed"])
    X = rng.normal(size=(rows, widths[0])).astype(dtype)
    target_rows = case.get("target_rows") or rows   # another number: a target that does not split
    if case["loss"] == "ce":
        y = rng.integers(0, widths[-1], size=target_rows)
    else:
        y = rng.normal(size=(target_rows, widths[-1])).astype(dtype)
    try:
        pipe = pl.pipeline(model, num_stages=n_stages)
        style = "v" if case["schedule"] == "zbv" else "loop"
        # a group per case: a failed step poisons its group (the pool's world group stays usable)
        group = dist.new_group(list(range(world)), timeout=30.0)
        stages = [pipe.build_stage(i, group=group) for i in pl.stage_indices(rank, world, v, style=style)]
        cls = getattr(pl, SCHEDULES[case["schedule"]])
        sched = cls(stages if v > 1 else stages[0], m, loss_fn=lf, scale_grads=case["scale_grads"])
        has_first = any(s.is_first for s in stages)
        has_last = any(s.is_last for s in stages)
        losses = []
        sched.step(*((X,) if has_first else ()), target=y if has_last else None, losses=losses)
    except Exception as exc:  # noqa: BLE001 - every rank's error goes back to the test
        return {"error": (type(exc).__name__, str(exc) + " " + " ".join(getattr(exc, "__notes__", [])))}
    # the reference: the same micro-batches one after the other, in one process
    size = rows // m
    scale = 1.0 / m if case["scale_grads"] else 1.0
    ref_losses = []
    for i in range(m):
        loss = lf(ref(Tensor(X[i * size:(i + 1) * size])), y[i * size:(i + 1) * size])
        ref_losses.append(float(loss.item()))
        (loss * scale).backward()
    ref_named = dict(ref.named_parameters())
    out = {"error": None, "grad": 0.0, "loss": 0.0, "n_losses": len(losses), "nparams": 0}
    for st in stages:
        for name, p in st.submodule.named_parameters():
            out["nparams"] += 1
            want = ref_named[name].grad
            got = p.grad
            if got is None or want is None:
                out["grad"] = float("inf") if (got is None) != (want is None) else out["grad"]
                continue
            out["grad"] = max(out["grad"], float(np.abs(np.asarray(got.data) - np.asarray(want.data)).max()))
    if has_last:
        got_losses = [float(l.item()) for l in losses]
        out["loss"] = max(abs(a - b) for a, b in zip(got_losses, ref_losses)) if got_losses else float("inf")
    return out


def refusal_run(schedule: str, which: str):
    """The rank given a batch (``which="input"``, first stage) or target (``"target"``, last stage) of 7
    rows for 3 micro-batches calls step(); the others do not (they would wait for its messages).
    Returns that rank's error, ``"not called"`` elsewhere."""
    import neural_arch.distributed as dist
    from neural_arch.distributed import pipelining as pl

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model([3, 4, 2, 5, 3, 2, 4, 3], np.float64, 0)
    stage = pl.pipeline(model, num_stages=world).build_stage(rank)
    sched = getattr(pl, SCHEDULES[schedule])(stage, 3, loss_fn=_loss_fn("ce", "mean"))
    rows = {"input": (7, 6), "target": (6, 7)}[which]
    X = np.zeros((rows[0], 3))
    y = np.zeros(rows[1], dtype=np.int64)
    if (which == "input" and not stage.is_first) or (which == "target" and not stage.is_last):
        return "not called"
    try:
        sched.step(*((X,) if stage.is_first else ()), target=y if stage.is_last else None)
    except ValueError as exc:
        return str(exc)
    return "no error"
