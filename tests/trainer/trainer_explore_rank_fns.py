"""What ``test_trainer_explore`` runs: the trainer on a schedule of micro-batches, and the plain
single-process loops it must equal (module level: a RankPool pickles these by reference).

A *schedule* is ``(K, sizes, ends)``: micro-batch ``i`` takes the next ``sizes[i]`` rows of a fixed
array and is passed with ``end_window=ends[i]`` (None: the trainer counts). The reference applies the
trainer's documented rule with no trainer: a window ends at ``end_window=True`` or at its ``K``-th
micro-batch, and its step is on ``sum_j loss_j / K`` (one backward), then clip, step, schedule.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

D_IN, D_OUT, ROWS = 4, 3, 64


def build(seed: int = 0, dropout: float = 0.0):
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    layers = [nn.Linear(D_IN, 5, dtype=np.float64), nn.Tanh()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    model = nn.Sequential(*layers, nn.Linear(5, D_OUT, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape)
    return model


def data(rows: int = ROWS):
    rng = np.random.default_rng(7)
    return rng.normal(size=(rows, D_IN)), rng.integers(0, D_OUT, size=rows)


def _optimizer(params, adam: bool):
    from neural_arch import optim
    from neural_arch.optim.lr_scheduler import StepLR

    opt = optim.Adam(params, lr=0.05, weight_decay=0.01) if adam else optim.SGD(params, lr=0.1, momentum=0.9)
    return opt, StepLR(opt, step_size=1, gamma=0.5)


def windows(k: int, ends) -> list:
    """The trainer's documented rule: micro-batch indices grouped into optimizer steps."""
    out, open_ = [], []
    for i, end in enumerate(ends):
        open_.append(i)
        if end or (end is None and len(open_) == k):
            out.append(open_)
            open_ = []
    return out + ([open_] if open_ else [])


def _params(model) -> dict:
    return {name: np.asarray(v).copy() for name, v in model.state_dict().items()}


def _trainer_params(trainer) -> dict:
    """Whole parameters by name: FSDP's state_dict gathers them; fully_shard's DTensor pieces are
    gathered with ``full_tensor`` (collectives, the same order on every rank)."""
    if trainer.strategy.name == "fully_shard":
        from neural_arch.distributed.tensor import DTensor

        return {n: np.asarray((p.full_tensor() if isinstance(p, DTensor) else p).data).copy()
                for n, p in trainer.module.named_parameters()}
    return _params(trainer.model)


def cross_entropy(out, target):
    import neural_arch.nn.functional as F

    return F.cross_entropy(out, target)


@contextlib.contextmanager
def trainer(k: int = 1, strategy: str = "ddp"):
    """``(trainer, optimizer, one batch)`` in this process, closed afterwards."""
    from neural_arch.distributed.trainer import DistributedTrainer

    X, y = data()
    model = build(0)
    with DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k) as t:
        opt, _ = _optimizer(model.parameters(), adam=False)
        yield t, opt, (X[:2], y[:2])


def trainer_run(strategy: str, k: int, sizes, ends, clip, adam: bool) -> dict:
    """The trainer in this process (a world of one) on the schedule."""
    import neural_arch.nn.functional as F
    from neural_arch.distributed.trainer import DistributedTrainer

    X, y = data()
    model = build(0)
    out = {"accumulating": [], "steps": [], "lrs": [], "grad_norms": []}
    with DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=clip) as t:
        opt, sched = _optimizer(model.parameters(), adam)
        t.lr_scheduler = sched
        at = 0
        for size, end in zip(sizes, ends):
            m = t.train_step((X[at:at + size], y[at:at + size]), opt, F.cross_entropy, end_window=end)
            at += size
            out["accumulating"].append(m["accumulating"])
            out["steps"].append(m["step"])
            out["lrs"].append(m["lr"])
            if m["grad_norm"] is not None:
                out["grad_norms"].append(m["grad_norm"])
        out["params"] = _trainer_params(t)
    return out


def reference_run(k: int, sizes, ends, clip, adam: bool) -> dict:
    """No trainer: each window's loss ``sum_j mean_j / K`` in one graph, one backward, clip, step, schedule."""
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor
    from neural_arch.optim import clip_grad_norm_

    X, y = data()
    starts = np.concatenate([[0], np.cumsum(sizes)])
    model = build(0)
    opt, sched = _optimizer(model.parameters(), adam)
    out = {"accumulating": [], "steps": [], "lrs": [], "grad_norms": []}
    for step, window in enumerate(windows(k, ends)):
        loss = None
        for i in window:
            part = F.cross_entropy(model(Tensor(X[starts[i]:starts[i + 1]])), y[starts[i]:starts[i + 1]]) / k
            loss = part if loss is None else loss + part
        loss.backward()
        out["grad_norms"].append(float(clip_grad_norm_(model.parameters(), clip if clip is not None else math.inf)))
        opt.step()
        opt.zero_grad()
        lr_before = opt.param_groups[0]["lr"]
        sched.step()            # once per optimizer step: the micro-batches before see the LR before
        for i in window:
            last = i == window[-1]
            out["accumulating"].append(not last)
            out["steps"].append(step + last)
            out["lrs"].append(opt.param_groups[0]["lr"] if last else lr_before)
    out["params"] = _params(model)
    return out


def union_run(k: int, b: int, windows_: int, clip, adam: bool) -> dict:
    """One step per window on the union of its ``k`` micro-batches of ``b`` rows (a plain mean)."""
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor
    from neural_arch.optim import clip_grad_norm_

    X, y = data()
    model = build(0)
    opt, sched = _optimizer(model.parameters(), adam)
    rows = k * b
    for w in range(windows_):
        F.cross_entropy(model(Tensor(X[w * rows:(w + 1) * rows])), y[w * rows:(w + 1) * rows]).backward()
        clip_grad_norm_(model.parameters(), clip if clip is not None else math.inf)
        opt.step()
        opt.zero_grad()
        sched.step()
    return _params(model)


class _Crash(Exception):
    """The run "dies" here (raised by the criterion, between two checkpoints)."""


def fit_run(root: str, strategy: str, k: int, every, crash_at=None, shuffle: str = "sampler", n: int = 20,
            batch_size: int = 3, epochs: int = 2):
    """``fit`` with mid-epoch checkpoints (``every`` optimizer steps; None: per epoch), dropout, Adam,
    StepLR and clipping, on a loader that shuffles: ``shuffle="sampler"`` a DistributedSampler (each
    epoch's order from ``seed + epoch``), ``"loader"`` ``DataLoader(shuffle=True)`` (each epoch's order
    drawn from the loader's own generator: a resume must continue that generator). ``crash_at``: the
    criterion raises at that call. Returns None after a crash, else the parameters, the optimizer
    steps and the LR."""
    import neural_arch.nn.functional as F
    from neural_arch.core import rng
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.distributed import DistributedSampler
    from neural_arch.distributed.trainer import DistributedTrainer

    rng.manual_seed(11)
    model = build(0, dropout=0.3)
    X, y = data(n)
    calls = []

    def criterion(out, target):
        if crash_at is not None and len(calls) == crash_at:
            raise _Crash()
        calls.append(1)
        return F.cross_entropy(out, target)

    with DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=0.5,
                            checkpoint_dir=root, keep_last=2) as t:
        dataset = TensorDataset(X, y)
        if shuffle == "sampler":
            loader = DataLoader(dataset, batch_size=batch_size,
                                sampler=DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=4))
        else:
            loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)   # seeded from the global generator
        opt, sched = _optimizer(model.parameters(), adam=True)
        t.lr_scheduler = sched
        try:
            t.fit(loader, epochs, optimizer=opt, criterion=criterion, progress=False, checkpoint_every_n_steps=every)
        except _Crash:
            return None
        return {"params": _trainer_params(t), "global_step": t.global_step, "lr": opt.param_groups[0]["lr"]}


# -- two ranks -----------------------------------------------------------------------------------------
TWO_RANK_B = 2
TWO_RANK_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "fully_shard")


def two_rank_windows(cfg) -> dict:
    """Every rank: each strategy on ``cfg["ends"]`` with ``step=None``; micro-batch ``i`` of rank ``r``
    takes rows ``(i * W + r) * B ...``."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch.distributed.trainer import DistributedTrainer

    X, y = data()
    out = {}
    for strategy in TWO_RANK_STRATEGIES:
        model = build(0)
        t = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=cfg["k"],
                               gradient_clip_val=cfg["clip"])
        opt, sched = _optimizer(model.parameters(), adam=True)
        t.lr_scheduler = sched
        w, r, b = t.world_size, t.rank, TWO_RANK_B
        acc, lrs = [], []
        for i, end in enumerate(cfg["ends"]):
            start = (i * w + r) * b
            m = t.train_step((X[start:start + b], y[start:start + b]), opt, F.cross_entropy, end_window=end)
            acc.append(m["accumulating"])
            lrs.append(m["lr"])
        out[strategy] = {"accumulating": acc, "lrs": lrs, "params": _trainer_params(t)}
        dist.barrier()
    return out


def two_rank_reference(cfg, world: int = 2) -> dict:
    """One process: each window's step on ``(n / K) * mean`` over its micro-batches of every rank (DDP
    averages the ranks; a window of ``n < K`` micro-batches keeps their ``1/K`` weights)."""
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor
    from neural_arch.optim import clip_grad_norm_

    X, y = data()
    k, b = cfg["k"], TWO_RANK_B
    model = build(0)
    opt, _ = _optimizer(model.parameters(), adam=True)
    from neural_arch.optim.lr_scheduler import StepLR

    sched = StepLR(opt, step_size=1, gamma=0.5)
    acc, lrs = [], []
    for window in windows(k, cfg["ends"]):
        rows = np.concatenate([np.arange((i * world) * b, (i * world + world) * b) for i in window])
        loss = F.cross_entropy(model(Tensor(X[rows])), y[rows]) * (len(window) / k)
        loss.backward()
        clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        opt.zero_grad()
        lr_before = opt.param_groups[0]["lr"]
        sched.step()
        acc += [i != window[-1] for i in window]
        lrs += [lr_before] * (len(window) - 1) + [opt.param_groups[0]["lr"]]
    return {"accumulating": acc, "lrs": lrs, "params": _params(model)}


# -- weighting by items (count_items): a window of unequal micro-batches as one mean ------------------

IGNORE = -100


def masked_targets(y, mask_seed: int | None, starts, windows_):
    """``y`` with some targets set to ``IGNORE`` (padding; None: no mask); every window keeps at least
    one target (a window of none is the criterion's 0/0), a micro-batch may keep none."""
    y = y.copy()
    if mask_seed is None:
        return y
    if isinstance(mask_seed, (list, tuple)):      # the rows to pad, given
        y[np.asarray(mask_seed, dtype=int)] = IGNORE
    else:
        y[np.random.default_rng(mask_seed).random(len(y)) < 0.5] = IGNORE
    for window in windows_:
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in window])
        if not (y[rows] != IGNORE).any():
            y[rows[-1]] = data()[1][rows[-1]]
    return y


def _masked_ce(out, target):
    import neural_arch.nn.functional as F

    return F.cross_entropy(out, target, ignore_index=IGNORE)


def _targets_kept(batch) -> int:
    return int((np.asarray(batch[1]) != IGNORE).sum())


def item_trainer_run(strategy: str, k: int, sizes, ends, clip, adam: bool, mask_seed, use_fit: bool) -> dict:
    """The trainer with ``count_items`` (in this process): a hand-written loop over the schedule's
    windows (``window_items`` per window), or ``fit`` over a loader yielding the micro-batches (its
    last one closes the epoch's window; ``ends`` then only has the last True)."""
    from neural_arch.distributed.trainer import DistributedTrainer

    X, y = data()
    starts = np.concatenate([[0], np.cumsum(sizes)])
    y = masked_targets(y, mask_seed, starts, windows(k, ends))
    batches = [(X[starts[i]:starts[i + 1]], y[starts[i]:starts[i + 1]]) for i in range(len(sizes))]
    model = build(0)
    count = "samples" if mask_seed is None else _targets_kept
    with DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=clip,
                            count_items=count) as t:
        opt, sched = _optimizer(model.parameters(), adam)
        t.lr_scheduler = sched
        if use_fit:
            t.fit(batches, epochs=1, optimizer=opt, criterion=_masked_ce, progress=False, resume=False)
        else:
            for window in windows(k, ends):
                n = t.window_items([batches[i] for i in window])
                for i in window:
                    t.train_step(batches[i], opt, _masked_ce, end_window=ends[i], window_items=n)
        return {"params": _trainer_params(t), "steps": t.global_step}


def item_reference_run(k: int, sizes, ends, clip, adam: bool, mask_seed) -> dict:
    """No trainer: one step per window on the mean loss over every kept target of the window's rows."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.optim import clip_grad_norm_

    X, y = data()
    starts = np.concatenate([[0], np.cumsum(sizes)])
    y = masked_targets(y, mask_seed, starts, windows(k, ends))
    model = build(0)
    opt, sched = _optimizer(model.parameters(), adam)
    for window in windows(k, ends):
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in window])
        _masked_ce(model(Tensor(X[rows])), y[rows]).backward()
        clip_grad_norm_(model.parameters(), clip if clip is not None else math.inf)
        opt.step()
        opt.zero_grad()
        sched.step()
    return {"params": _params(model), "steps": len(windows(k, ends))}


def two_rank_items(cfg) -> dict:
    """Every rank: DDP and fully_shard with ``count_items`` over per-rank micro-batches of unequal sizes
    and padding (``cfg["sizes"][r]``: rank r's micro-batch sizes, ``cfg["k"]`` per window)."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.trainer import DistributedTrainer

    X, y = data()
    y = two_rank_targets(y, cfg)
    out = {}
    for strategy in ("ddp", "fully_shard"):
        model = build(0)
        t = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=cfg["k"],
                               count_items=_targets_kept)
        opt, sched = _optimizer(model.parameters(), adam=True)
        t.lr_scheduler = sched
        batches = [(X[a:b], y[a:b]) for a, b in two_rank_rows(cfg)[t.rank]]
        for w in range(0, len(batches), cfg["k"]):
            window = batches[w:w + cfg["k"]]
            n = t.window_items(window)
            for batch in window:
                t.train_step(batch, opt, _masked_ce, window_items=n)
        out[strategy] = _trainer_params(t)
        dist.barrier()
    return out


def two_rank_rows(cfg) -> list:
    """Per rank, its micro-batches' ``(start, stop)`` rows: rank 0's from row 0 up, rank 1's after them."""
    out, at = [], 0
    for sizes in cfg["sizes"]:
        rows = []
        for s in sizes:
            rows.append((at, at + s))
            at += s
        out.append(rows)
    return out


def two_rank_targets(y, cfg):
    """The targets with ``cfg["mask"]`` rows padded (IGNORE), keeping one per window over both ranks."""
    y = y.copy()
    y[np.asarray(cfg["mask"], dtype=int)] = IGNORE
    return y


def two_rank_items_reference(cfg) -> dict:
    """One process: window ``w``'s step on the mean over every kept target of both ranks' micro-batches."""
    from neural_arch.core.tensor import Tensor

    X, y = data()
    y = two_rank_targets(y, cfg)
    per_rank = two_rank_rows(cfg)
    model = build(0)
    opt, sched = _optimizer(model.parameters(), adam=True)
    k = cfg["k"]
    for w in range(0, len(per_rank[0]), k):
        rows = np.concatenate([np.arange(a, b) for rank_rows in per_rank for a, b in rank_rows[w:w + k]])
        _masked_ce(model(Tensor(X[rows])), y[rows]).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return _params(model)
