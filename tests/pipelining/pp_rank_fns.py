"""Functions the pipeline tests run on every rank of a RankPool (module level: pickled by reference).

:func:`train_run` trains the same model two ways on every rank and compares:

* **pipeline** (x data parallel): the model is cut into ``pp * v`` stages; this rank runs its
  stage(s) of its pipeline replica on its dp slice of the global batch, by the named schedule;
* **reference**: a plain single-process copy trained on the whole global batch (mean loss).

It returns the largest difference of this rank's stage gradients (first step) and parameters
(after every step) from the reference's, parameters matched by name.
"""

from __future__ import annotations

import os
import time

import numpy as np


def _imports():
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, manual_seed

    return dist, F, nn, optim, Tensor, manual_seed


VOCAB, SEQ = 11, 6


def build_model(kind: str, seed: int = 0, layers: int = 8):
    _dist, _F, nn, _optim, _Tensor, manual_seed = _imports()
    manual_seed(seed)
    if kind == "mlp":
        mods = []
        width = [6] + [12] * (layers - 1) + [4]
        for i in range(layers):
            mods.append(nn.Linear(width[i], width[i + 1], dtype=np.float64))
            if i < layers - 1:
                mods.append(nn.Tanh())
        return nn.Sequential(*mods)
    return nn.GPT(vocab_size=VOCAB, block_size=SEQ, n_layer=layers, n_head=2, n_embd=8).double()


def loss_fn(kind: str):
    F = _imports()[1]
    if kind == "mlp":
        return F.cross_entropy

    def lm_loss(logits, target):
        b, t, v = logits.shape
        return F.cross_entropy(logits.reshape(b * t, v), np.asarray(target).reshape(b * t))
    return lm_loss


def make_batch(kind: str, n: int, step: int):
    rng = np.random.default_rng(1000 + step)
    if kind == "mlp":
        X = rng.normal(size=(n, 6))
        return X, (X[:, :4].argmax(axis=1) + (X[:, 4] > 0)).astype(np.int64) % 4
    X = rng.integers(0, VOCAB, size=(n, SEQ))
    return X, (X + 1) % VOCAB


def make_opt(name: str, params):
    optim = _imports()[3]
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9)
    return optim.Adam(params, lr=0.01)


SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
             "zbh1": "ScheduleZBH1", "zbv": "ScheduleZBVZeroBubble", "izb": "ScheduleInterleavedZeroBubble"}
MULTI_STAGE = {"interleaved", "zbv", "izb"}  # schedules that take a list of this rank's stages


def setup_groups(pp: int):
    """Rank = d * pp + s: pipeline groups are consecutive ranks, dp groups stride by pp."""
    dist = _imports()[0]
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % pp:
        raise ValueError(f"world {world} is not a multiple of pp={pp}")
    dp = world // pp
    pp_group = dp_group = None
    for d in range(dp):
        g = dist.new_group(list(range(d * pp, (d + 1) * pp)))
        if rank // pp == d:
            pp_group = g
    for s in range(pp):
        g = dist.new_group(list(range(s, world, pp)))
        if rank % pp == s:
            dp_group = g
    return pp_group, dp_group, rank // pp, rank % pp, dp


def train_run(cfg: dict):
    _dist, _F, _nn, _optim, Tensor, _seed = _imports()
    from neural_arch.distributed import pipelining as pl

    kind, pp, v, m = cfg["kind"], cfg["pp"], cfg.get("v", 1), cfg["m"]
    steps, mb_size = cfg.get("steps", 3), cfg.get("mb", 2)
    pp_group, dp_group, d, s, dp = setup_groups(pp)
    model = build_model(kind, layers=cfg.get("layers", 8))
    ref = build_model(kind, layers=cfg.get("layers", 8))
    if d > 0:  # replicas start different: the stage must broadcast from its dp group's first rank
        for p in model.parameters():
            p.data += 0.1
    pipe = pl.pipeline(model, num_stages=pp * v, balance=cfg.get("balance", "params"))
    style = "v" if cfg["schedule"] == "zbv" else "loop"
    stages = [pipe.build_stage(i, group=pp_group, dp_group=dp_group if dp > 1 else None)
              for i in pl.stage_indices(s, pp, v, style=style)]
    cls = getattr(pl, SCHEDULES[cfg["schedule"]])
    lf = loss_fn(kind)
    schedule = cls(stages if cfg["schedule"] in MULTI_STAGE else stages[0], m, loss_fn=lf)
    params = [p for st in stages for p in st.submodule.parameters()]
    named = {n: p for st in stages for n, p in st.submodule.named_parameters()}
    ref_named = dict(ref.named_parameters())
    opt, ref_opt = make_opt(cfg.get("opt", "sgd"), params), make_opt(cfg.get("opt", "sgd"), ref.parameters())
    has_first = any(st.is_first for st in stages)
    has_last = any(st.is_last for st in stages)
    n_global = dp * m * mb_size
    grad_diff = param_diff = loss_diff = 0.0
    for step in range(steps):
        X, y = make_batch(kind, n_global, step)
        rows = slice(d * n_global // dp, (d + 1) * n_global // dp)
        args = (X[rows],) if has_first else ()
        losses = []
        schedule.step(*args, target=y[rows] if has_last else None, losses=losses)
        # reference: the whole global batch, mean loss
        ref_loss = lf(ref(Tensor(X)), y)
        ref_loss.backward()
        if has_last:
            local = lf(ref(Tensor(X[rows])), y[rows])  # same weights: the dp slice's mean loss
            loss_diff = max(loss_diff, abs(float(np.mean([float(l.item()) for l in losses])) - float(local.item())))
        if step == 0:
            grad_diff = max(float(np.abs(p.grad.data - ref_named[n].grad.data).max()) for n, p in named.items())
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        param_diff = max(param_diff, max(float(np.abs(p.data - ref_named[n].data).max()) for n, p in named.items()))
    moved = max(float(np.abs(p.data - q.data).max()) for p, q in zip(ref.parameters(), build_model(
        kind, layers=cfg.get("layers", 8)).parameters()))
    return {"grad": grad_diff, "param": param_diff, "loss": loss_diff, "moved": moved, "nparams": len(named),
            "stages": [st.stage_index for st in stages],
            # final parameters by name, to compare two schedules bitwise across placements
            "final": {n: p.data.tobytes() for n, p in named.items()} if cfg.get("final") else None}


def _hang_until_others_report(seconds: float, done_dir, others) -> None:
    """A hung stage: touch no group for up to ``seconds``, ending early once every other rank has
    reported its error (a file per rank in ``done_dir``) -- they must still detect the hang by
    their own timeout, but the test need not wait out the whole sleep."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if done_dir is not None and all(os.path.exists(os.path.join(done_dir, f"done-{r}")) for r in others):
            return
        time.sleep(0.05)


def _report_done(done_dir, rank: int) -> None:
    if done_dir is not None:
        open(os.path.join(done_dir, f"done-{rank}"), "w").close()


def fault_run(mode: str, victim: int = 1, timeout: float = 4.0, done_dir: str | None = None):
    """A 3-stage 1F1B pipeline whose stage ``victim`` dies (``"die"``) or hangs (``"hang"``) in step 2.
    Returns the error text seen on this rank (``done_dir``: see :func:`_hang_until_others_report`)."""
    dist, *_ = _imports()
    from neural_arch.distributed import pipelining as pl

    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(list(range(world)), timeout=timeout)
    model = build_model("mlp", layers=world * 2)
    stage = pl.pipeline(model, num_stages=world).build_stage(rank, group=group)
    schedule = pl.Schedule1F1B(stage, 4, loss_fn=loss_fn("mlp"))
    t0 = time.monotonic()
    for step in range(2):
        X, y = make_batch("mlp", 8, step)
        if step == 1 and rank == victim:
            if mode == "die":
                os._exit(3)
            _hang_until_others_report(timeout + 6, done_dir, [r for r in range(world) if r != rank])
            return "slept"
        try:
            schedule.step(*((X,) if rank == 0 else ()), target=y if rank == world - 1 else None)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            text = f"{type(exc).__name__}: {exc} [after {time.monotonic() - t0:.1f}s]"
            _report_done(done_dir, rank)
            return text
    _report_done(done_dir, rank)
    return "no error"


def plan_shapes_run(kind: str = "gpt"):
    """Shape handshake: a second step with a different batch size still works (new header per step)."""
    dist, *_ = _imports()
    from neural_arch.distributed import pipelining as pl

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(kind, layers=world)
    stage = pl.pipeline(model, num_stages=world).build_stage(rank)
    schedule = pl.ScheduleGPipe(stage, 2, loss_fn=loss_fn(kind))
    out = []
    for n in (4, 6):
        X, y = make_batch(kind, n, 0)
        res = schedule.step(*((X,) if rank == 0 else ()), target=y if rank == world - 1 else None)
        out.append(None if res is None else len(res))
    return out


def bad_batch_run():
    """A batch of 4 rows with 3 micro-batches: a clear ValueError on the first stage, before any I/O,
    and every other stage, already waiting for the first stage's activations, told at once (its
    error names the first stage) instead of waiting out the group's timeout. Returns the error
    text and the seconds the step took on this rank."""
    import time
    dist, *_ = _imports()
    from neural_arch.distributed import pipelining as pl

    rank, world = dist.get_rank(), dist.get_world_size()
    stage = pl.pipeline(build_model("mlp", layers=world), num_stages=world).build_stage(rank)
    schedule = pl.Schedule1F1B(stage, 3, loss_fn=loss_fn("mlp"))
    X, y = make_batch("mlp", 4, 0)
    start = time.monotonic()
    try:
        if rank == 0:
            schedule.step(X)
        elif rank == world - 1:
            schedule.step(target=y[:3])
        else:
            schedule.step()
    except Exception as exc:  # noqa: BLE001 -- the test reads the text
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start}
    return {"error": "no error", "seconds": time.monotonic() - start}


def zb_vs_1f1b_run(kind: str, m: int, steps: int = 2):
    """The same pipeline trained by 1F1B and by ZB-H1 from the same start: True when every
    gradient and parameter of this rank's stage is bitwise equal after every step; also whether
    the ZB-H1 step really deferred weight gradients (Linear weights had no gradient after B)."""
    dist, _F, _nn, _optim, _Tensor, _seed = _imports()
    from neural_arch.distributed import pipelining as pl

    rank, world = dist.get_rank(), dist.get_world_size()
    runs = {}
    deferred = None
    for name in ("1f1b", "zbh1"):
        model = build_model(kind, layers=world * 2)
        stage = pl.pipeline(model, num_stages=world).build_stage(rank)
        schedule = getattr(pl, SCHEDULES[name])(stage, m, loss_fn=loss_fn(kind))
        opt = make_opt("adam", stage.submodule.parameters())
        grads, params = [], []
        for step in range(steps):
            X, y = make_batch(kind, 2 * m, step)
            if name == "zbh1" and step == 0:
                # watch the first W: when it runs, its micro-batch's B has already run without
                # touching the Linear weights' .grad (the weight gradient really is deferred)
                orig = stage.backward_weight_one_chunk
                seen = {}

                def spy(mb, orig=orig, seen=seen, stage=stage):
                    if not seen:
                        from neural_arch.nn.linear import Linear
                        seen["before"] = [m_.weight.grad is None for m_ in stage.submodule.modules()
                                          if isinstance(m_, Linear)]
                    return orig(mb)
                stage.backward_weight_one_chunk = spy
            schedule.step(*((X,) if rank == 0 else ()), target=y if rank == world - 1 else None)
            if name == "zbh1" and step == 0:
                del stage.backward_weight_one_chunk
                deferred = bool(seen.get("before")) and all(seen["before"])
            grads.append([p.grad.data.copy() for p in stage.submodule.parameters()])
            opt.step()
            opt.zero_grad()
            params.append([p.data.copy() for p in stage.submodule.parameters()])
        runs[name] = (grads, params)
    (g1, p1), (g2, p2) = runs["1f1b"], runs["zbh1"]
    same = all(np.array_equal(a, b) for s1, s2 in zip(g1 + p1, g2 + p2) for a, b in zip(s1, s2))
    return {"bitwise": same, "deferred": deferred}


def culprit_run(mode: str, victim: int, timeout: float = 4.0, schedule: str = "1f1b",
                done_dir: str | None = None):
    """``world`` stages; in step 2 stage ``victim`` raises in the forward of micro-batch 2
    (``"raise"``), exits (``"die"``) or sleeps past the timeout (``"hang"``). Returns the error
    text this rank saw (with its notes) and how long its failing step took (``done_dir``: see
    :func:`_hang_until_others_report`)."""
    dist, *_ = _imports()
    from neural_arch.distributed import pipelining as pl

    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(list(range(world)), timeout=timeout)
    model = build_model("mlp", layers=world * 2)
    stage = pl.pipeline(model, num_stages=world).build_stage(rank, group=group)
    sched = getattr(pl, SCHEDULES[schedule])(stage, 4, loss_fn=loss_fn("mlp"))
    for step in range(2):
        X, y = make_batch("mlp", 8, step)
        if step == 1 and rank == victim:
            if mode == "die":
                os._exit(3)
            if mode == "hang":
                _hang_until_others_report(timeout + 8, done_dir, [r for r in range(world) if r != rank])
                return "slept"
            calls = []

            def boom(module, args, output):
                calls.append(1)
                if len(calls) == 3:
                    raise RuntimeError("injected failure in the forward of micro-batch 2")
            stage.submodule.register_forward_hook(boom)
        t0 = time.monotonic()
        try:
            sched.step(*((X,) if rank == 0 else ()), target=y if rank == world - 1 else None)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            notes = " ".join(getattr(exc, "__notes__", []))
            text = f"{type(exc).__name__}: {exc} {notes} [after {time.monotonic() - t0:.1f}s]"
            _report_done(done_dir, rank)
            return text
    _report_done(done_dir, rank)
    return "no error"


def zbv_errors_run():
    """The errors ZB-V raises before any I/O: stages not in a V, one stage, V stages given to
    interleaved 1F1B. Returns ``{case: error text}`` on this rank."""
    dist, *_ = _imports()
    from neural_arch.distributed import pipelining as pl

    rank, world = dist.get_rank(), dist.get_world_size()
    pipe = pl.pipeline(build_model("mlp", layers=2 * world), num_stages=2 * world)
    loop = [pipe.build_stage(i) for i in pl.stage_indices(rank, world, 2)]
    v = [pipe.build_stage(i) for i in pl.stage_indices(rank, world, 2, style="v")]
    cases = {"loop stages to ZB-V": lambda: pl.ScheduleZBVZeroBubble(loop, 4, loss_fn=loss_fn("mlp")),
             "one stage to ZB-V": lambda: pl.ScheduleZBVZeroBubble(v[0], 4, loss_fn=loss_fn("mlp")),
             "three stages to ZB-V": lambda: pl.ScheduleZBVZeroBubble(v + v[:1], 4, loss_fn=loss_fn("mlp")),
             "V stages to interleaved": lambda: pl.ScheduleInterleaved1F1B(v, 4, loss_fn=loss_fn("mlp"))}
    out = {}
    for name, make in cases.items():
        try:
            make()
            out[name] = "no error"
        except ValueError as exc:
            out[name] = str(exc)
    return out
