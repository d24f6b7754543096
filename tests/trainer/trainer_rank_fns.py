"""Functions the trainer tests run on every rank of a RankPool (module level: pickled by reference).

The data: a fixed global array; optimizer step ``w`` (an accumulation window of ``K`` micro-batches
on ``W`` ranks, ``B`` samples each) uses the ``K*W*B`` rows of window ``w``; micro-batch ``j`` of
rank ``r`` takes rows ``(j*W + r)*B ...`` of it. The single-process reference trains on the whole
window at once (its mean loss equals the mean of the ``K*W`` equal-sized micro-batch means).
"""

from __future__ import annotations

import numpy as np

D_IN, D_OUT, K, B = 5, 3, 4, 2


def build(seed: int = 0, dtype=np.float64):
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    # 5*7+7 = 42 and 7*3+3 = 24 elements: the flat shards need padding on 2 ranks
    model = nn.Sequential(nn.Linear(D_IN, 7, dtype=dtype), nn.Tanh(), nn.Linear(7, D_OUT, dtype=dtype))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    return model


def data(windows: int, world: int, k: int = K, b: int = B, dtype=np.float64):
    rng = np.random.default_rng(7)
    n = windows * k * world * b
    return rng.normal(size=(n, D_IN)).astype(dtype), rng.integers(0, D_OUT, size=n)


def micro_batch(X, y, window: int, j: int, rank: int, world: int, k: int = K, b: int = B):
    start = window * k * world * b + (j * world + rank) * b
    return X[start:start + b], y[start:start + b]


def make_optimizer(params, lr: float = 0.05, sgd: bool = False):
    from neural_arch import optim

    # SGD's update is proportional to the gradient (amp_run compares rounding); Adam's is normalised
    return optim.SGD(params, lr=lr) if sgd else optim.Adam(params, lr=lr, weight_decay=0.01)


def make_scheduler(opt):
    from neural_arch.optim.lr_scheduler import StepLR

    return StepLR(opt, step_size=1, gamma=0.7)


def reference(windows: int, world: int, clip=None, k: int = K, amp=None, dtype=np.float64, sgd=False) -> dict:
    """One process, one step per window on the window's ``k*world*B`` rows."""
    import neural_arch as na
    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.amp import autocast
    from neural_arch.core.tensor import Tensor

    model = build(0, dtype)
    opt = make_optimizer(model.parameters(), sgd=sgd)
    sched = make_scheduler(opt)
    X, y = data(windows, world, k, dtype=dtype)
    rows = k * world * B
    for w in range(windows):
        xs, ys = X[w * rows:(w + 1) * rows], y[w * rows:(w + 1) * rows]
        if amp:
            with autocast("cpu", dtype=getattr(na, amp)):
                loss = F.cross_entropy(model(Tensor(xs)), ys)
        else:
            loss = F.cross_entropy(model(Tensor(xs)), ys)
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), clip if clip is not None else float("inf"))
        opt.step()
        opt.zero_grad()
        sched.step()
    return {k_: np.asarray(v).copy() for k_, v in model.state_dict().items()}


def full_params(trainer) -> dict:
    # FSDP's state_dict is a collective (full values on every rank); the others are local
    return {k: np.asarray(v).copy() for k, v in trainer.model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.abs(np.asarray(a[n], dtype=np.float64) - b[n]).max()) for n in b)


def train_windows(trainer, opt, X, y, first: int, last: int, k: int = K):
    import neural_arch.nn.functional as F

    out = []
    for w in range(first, last):
        for j in range(k):
            batch = micro_batch(X, y, w, j, trainer.rank, trainer.world_size, k)
            out.append(trainer.train_step(batch, opt, F.cross_entropy, w * k + j))
    return out


def equivalence(cfg):
    """Every strategy of ``cfg["strategies"]``: K=4 micro-batches per step on this world, against
    one process on the union of each window's micro-batches. Returns per strategy the largest
    parameter difference and what the metrics said."""
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.trainer import DistributedTrainer

    windows, clip = cfg.get("windows", 2), cfg.get("clip", 0.3)
    results = {}
    for strategy in cfg["strategies"]:
        import neural_arch.distributed as dist

        model = build(0)
        trainer = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=K, gradient_clip_val=clip)
        opt = make_optimizer(model.parameters())      # built on the bare model: re-pointed / sharded
        trainer.lr_scheduler = make_scheduler(opt)
        X, y = data(windows, trainer.world_size)
        x0, y0 = micro_batch(X, y, 0, 0, trainer.rank, trainer.world_size)
        loss0 = float(F.cross_entropy(build(0)(Tensor(x0)), y0).item())
        metrics = train_windows(trainer, opt, X, y, 0, windows)
        want = reference(windows, trainer.world_size, clip)
        results[strategy] = {
            "diff": _max_diff(full_params(trainer), want),
            "loss0_diff": abs(metrics[0]["loss"] - loss0),
            "accumulating": [m["accumulating"] for m in metrics],
            "steps": [m["step"] for m in metrics],
            "comm_while_accumulating": max(m["communication_time"] for m in metrics if m["accumulating"]),
            "comm_at_window_end": min(m["communication_time"] for m in metrics if not m["accumulating"]),
            "grad_norms": [m["grad_norm"] for m in metrics if not m["accumulating"]],
            "lr": metrics[-1]["lr"],
            "perf": trainer.get_performance_metrics(),
        }
        dist.barrier()
    return results


def resume(cfg):
    """Uninterrupted run of ``windows`` steps vs. a run saved after ``save_at`` steps, dropped, and
    resumed into a fresh trainer (other initial weights, other RNG state) for the rest."""
    from neural_arch.core import rng
    from neural_arch.distributed.trainer import DistributedTrainer

    windows, save_at, k = cfg.get("windows", 4), cfg.get("save_at", 2), cfg.get("k", 2)
    out = {}
    for strategy in cfg["strategies"]:
        directory = f"{cfg['root']}/{strategy}"
        rng.manual_seed(11)
        model = build(0)
        a = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=0.3)
        opt = make_optimizer(model.parameters())
        a.lr_scheduler = make_scheduler(opt)
        X, y = data(windows, a.world_size, k)
        train_windows(a, opt, X, y, 0, windows, k)
        uninterrupted = full_params(a)

        rng.manual_seed(11)
        model = build(0)
        b = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=0.3,
                               checkpoint_dir=directory, keep_last=1)
        opt = make_optimizer(model.parameters())
        b.lr_scheduler = make_scheduler(opt)
        train_windows(b, opt, X, y, 0, save_at, k)
        b.save_checkpoint(epoch=0, optimizer=opt, loss=1.0, is_best=True)
        saved_rng = rng.get_generator().bit_generator.state
        del b, opt, model                                  # the run "dies" here

        rng.manual_seed(99)
        model = build(5)                                   # other weights: the checkpoint must restore them
        c = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=0.3,
                               checkpoint_dir=directory)
        opt = make_optimizer(model.parameters())
        c.lr_scheduler = make_scheduler(opt)
        meta = c.resume(opt)
        restored_rng = rng.get_generator().bit_generator.state == saved_rng
        train_windows(c, opt, X, y, save_at, windows, k)
        got = full_params(c)
        out[strategy] = {"bitwise": all(np.array_equal(got[n], v) for n, v in uninterrupted.items()),
                         "diff": _max_diff(got, uninterrupted), "rng": restored_rng, "step": meta["global_step"],
                         "uninterrupted": uninterrupted, "lr": opt.param_groups[0]["lr"],
                         "path": meta["path"]}
    return out


def amp_run(cfg):
    """DDP with bfloat16 autocast (float32 model), K=2, against one process under autocast."""
    import neural_arch as na
    import neural_arch.nn.functional as F
    from neural_arch.amp import autocast
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.trainer import DistributedTrainer

    k, windows = 2, 2
    model = build(0, np.float32)
    trainer = DistributedTrainer(model, strategy="ddp", mixed_precision=True, gradient_accumulation_steps=k)
    opt = make_optimizer(model.parameters(), sgd=True)
    trainer.lr_scheduler = make_scheduler(opt)
    X, y = data(windows, trainer.world_size, k, dtype=np.float32)
    metrics = train_windows(trainer, opt, X, y, 0, windows, k)
    got = full_params(trainer)
    w = trainer.world_size
    # the first micro-batch's loss, from the initial weights, with and without autocast
    x0, y0 = micro_batch(X, y, 0, 0, trainer.rank, w, k)
    with autocast("cpu", dtype=na.bfloat16):
        loss_bf16 = float(F.cross_entropy(build(0, np.float32)(Tensor(x0)), y0).item())
    loss_f32 = float(F.cross_entropy(build(0, np.float32)(Tensor(x0)), y0).item())
    return {"amp": trainer.amp_dtype, "loss0": metrics[0]["loss"], "loss_bf16": loss_bf16, "loss_f32": loss_f32,
            "diff": _max_diff(got, reference(windows, w, None, k, "bfloat16", np.float32, sgd=True))}


class _Crash(Exception):
    """The run "dies" here (raised inside fit, between two checkpoints)."""


def fit_counting_samples(cfg, world_of_one: bool = False):
    """``fit`` on a DataLoader with a DistributedSampler over sample ids 0..n-1, recording which ids
    each micro-batch trains on; ``crash_at`` raises inside the criterion of that batch (before its
    step), after the mid-epoch checkpoints of the batches before it (``checkpoint_every_n_steps=1``).
    Returns the ids trained on in steps that completed, in order."""
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.distributed import DistributedSampler
    from neural_arch.distributed.trainer import DistributedTrainer

    n, crash_at = cfg["n"], cfg.get("crash_at")
    manual_seed(3)
    model = build(0)
    X = np.random.default_rng(5).normal(size=(n, D_IN))
    targets = np.random.default_rng(6).normal(size=(n, D_OUT))
    ids = np.arange(n, dtype=np.int64)
    seen, calls = [], []

    def criterion(out, batch_ids):
        batch_ids = np.asarray(getattr(batch_ids, "data", batch_ids))
        if crash_at is not None and len(calls) == crash_at:
            raise _Crash()
        calls.append(1)
        seen.append(batch_ids.tolist())
        return F.mse_loss(out, Tensor(targets[batch_ids]))

    kwargs = {"num_replicas": 1, "rank": 0} if world_of_one else {}
    with DistributedTrainer(model, strategy="ddp", checkpoint_dir=cfg["root"], keep_last=2) as trainer:
        dataset = TensorDataset(X, ids)
        sampler = DistributedSampler(dataset, shuffle=True, seed=4, **kwargs)
        loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=sampler)
        opt = make_optimizer(model.parameters())
        try:
            trainer.fit(loader, 1, optimizer=opt, criterion=criterion, progress=False, checkpoint_every_n_steps=1)
        except _Crash:
            pass
        return {"seen": [i for batch in seen for i in batch], "world": trainer.world_size}
