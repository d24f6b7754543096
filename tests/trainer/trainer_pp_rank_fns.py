"""Rank functions for the trainer's ``'pp'`` strategy (module level: pickled by reference).

A tiny float64 ``nn.GPT``. Window ``w`` of ``K`` micro-batches on ``dp`` data-parallel rows (``B``
sequences each) covers ``K*dp*B`` rows; micro-batch ``j`` of row ``d`` takes rows ``(j*dp + d)*B ...``
of it; the ranks of one pipeline take the same micro-batches. The reference trains one process
on each window's rows at once (Adam, clipping, StepLR).
"""

from __future__ import annotations

import numpy as np

K, B, VOCAB, T, LAYERS, CLIP = 4, 2, 8, 4, 4, 0.3


def build():
    from neural_arch import nn
    from neural_arch.core import rng

    rng.manual_seed(3)
    return nn.GPT(vocab_size=VOCAB, block_size=T, n_layer=LAYERS, n_head=2, n_embd=8).double()


def lm_loss(logits, target):
    import neural_arch.nn.functional as F

    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), np.asarray(target).reshape(b * t))


def data(windows: int, dp: int, k: int = K):
    gen = np.random.default_rng(7)
    n = windows * k * dp * B
    return gen.integers(0, VOCAB, size=(n, T)), gen.integers(0, VOCAB, size=(n, T))


def micro_batch(X, y, window: int, j: int, d: int, dp: int, k: int = K):
    start = window * k * dp * B + (j * dp + d) * B
    return X[start:start + B], y[start:start + B]


def make_optimizer(params):
    from neural_arch import optim

    return optim.Adam(params, lr=0.05, weight_decay=0.01, eps=1e-6)


def make_scheduler(opt):
    from neural_arch.optim.lr_scheduler import StepLR

    return StepLR(opt, step_size=1, gamma=0.7)


def reference(windows: int, dp: int, k: int = K) -> tuple[dict, list]:
    """(parameters after ``windows`` steps, each window's micro-batch losses ``[w][j][d]``)."""
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor

    model = build()
    opt = make_optimizer(model.parameters())
    sched = make_scheduler(opt)
    X, y = data(windows, dp, k)
    rows = k * dp * B
    losses = []
    for w in range(windows):
        losses.append([[float(lm_loss(model(Tensor(micro_batch(X, y, w, j, d, dp, k)[0])),
                                      micro_batch(X, y, w, j, d, dp, k)[1]).item()) for d in range(dp)]
                       for j in range(k)])
        lm_loss(model(Tensor(X[w * rows:(w + 1) * rows])), y[w * rows:(w + 1) * rows]).backward()
        optim.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
    return {n: p.data.copy() for n, p in model.named_parameters()}, losses


def _trainer(strategy, schedule="1f1b", k=K, **kwargs):
    from neural_arch.distributed.trainer import DistributedTrainer

    model = build()
    trainer = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=k, gradient_clip_val=CLIP,
                                 pp_schedule=schedule, **kwargs)
    opt = make_optimizer(model.parameters())    # the whole model's: the trainer re-points it at the stage
    trainer.lr_scheduler = make_scheduler(opt)
    return trainer, opt


def _train(trainer, opt, X, y, first: int, last: int, k: int = K):
    out = []
    for w in range(first, last):
        for j in range(k):
            batch = micro_batch(X, y, w, j, trainer.dp_rank, trainer.dp_size, k)
            out.append(trainer.train_step(batch, opt, lm_loss, w * k + j))
    return out


def stage_params(trainer) -> dict:
    return {n: p.data.copy() for n, p in trainer.model.named_parameters()}


def _max_diff(got: dict, want: dict) -> float:
    assert got and set(got) <= set(want), (sorted(got), sorted(want))
    return max(float(np.abs(got[n] - want[n]).max()) for n in got)


def equivalence(cfg):
    """Each ``(strategy, schedule)``: K=4 micro-batches per step against one process."""
    import neural_arch.distributed as dist

    windows = 2
    out = []
    for strategy, schedule in cfg["cases"]:
        trainer, opt = _trainer(strategy, schedule)
        X, y = data(windows, trainer.dp_size)
        metrics = _train(trainer, opt, X, y, 0, windows)
        want, ref_losses = reference(windows, trainer.dp_size)
        got = stage_params(trainer)
        ends = [m for m in metrics if not m["accumulating"]]
        want_losses = [[ref_losses[w][j][trainer.dp_rank] for j in range(K)] for w in range(windows)]
        out.append({"case": f"{strategy} {schedule}", "diff": _max_diff(got, want), "names": sorted(got),
                    "loss_diff": float(np.abs(np.array([m["losses"] for m in ends]) - want_losses).max()),
                    "buffered": [(m["loss"], m["losses"]) for m in metrics if m["accumulating"]],
                    "last_loss": [m["loss"] for m in ends], "steps": [m["step"] for m in metrics],
                    "grad_norms": [m["grad_norm"] for m in ends], "lr": metrics[-1]["lr"],
                    "model": type(trainer.model).__name__, "dp": (trainer.dp_rank, trainer.dp_size)})
        trainer.close()
        dist.barrier()
    return out


def resume(cfg):
    """Uninterrupted vs. saved after 2 of 4 windows (K=2), resumed into a fresh trainer whose weights
    and RNG state differ."""
    from neural_arch.core import rng

    directory, k, windows, save_at = cfg["dir"], 2, 4, 2
    rng.manual_seed(11)
    a, opt = _trainer("pp", k=k)
    X, y = data(windows, a.dp_size, k)
    _train(a, opt, X, y, 0, windows, k)
    uninterrupted = stage_params(a)
    a.close()

    rng.manual_seed(11)
    b, opt = _trainer("pp", k=k, checkpoint_dir=directory, keep_last=1)
    _train(b, opt, X, y, 0, save_at, k)
    b.save_checkpoint(epoch=0, optimizer=opt, loss=1.0)
    b.close()

    rng.manual_seed(99)
    c, opt = _trainer("pp", k=k, checkpoint_dir=directory)
    for p in c.model.parameters():   # other weights: the checkpoint must restore them
        p.data[...] = 0.25
    meta = c.resume(opt)
    _train(c, opt, X, y, save_at, windows, k)
    got = stage_params(c)
    c.close()
    return {"bitwise": all(np.array_equal(got[n], v) for n, v in uninterrupted.items()),
            "diff": _max_diff(got, uninterrupted), "step": meta["global_step"], "uninterrupted": uninterrupted,
            "lr": opt.param_groups[0]["lr"]}


def fit_with_short_last_batch(cfg):
    """``fit`` under 'pp' on an MLP: 22 samples in batches of 4 (the last one 2: a second schedule
    run in the epoch's last window), K=4, evaluated through the whole model; against a plain
    one-process loop with the same windows (each micro-batch's loss / K)."""
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.distributed.trainer import DistributedTrainer

    def mlp():
        gen = np.random.default_rng(0)
        model = nn.Sequential(nn.Linear(5, 6, dtype=np.float64), nn.Tanh(), nn.Linear(6, 6, dtype=np.float64),
                              nn.Tanh(), nn.Linear(6, 3, dtype=np.float64))
        for p in model.parameters():
            p.data[...] = gen.normal(0, 0.5, size=p.data.shape)
        return model

    gen = np.random.default_rng(5)
    X, y = gen.normal(size=(22, 5)), gen.integers(0, 3, size=22)
    batches = [(X[i:i + 4], y[i:i + 4]) for i in range(0, 22, 4)]
    ref = mlp()
    opt = optim.Adam(ref.parameters(), lr=0.05, eps=1e-6)
    for window in (batches[:4], batches[4:]):
        for xb, yb in window:
            (F.cross_entropy(ref(Tensor(xb)), yb) / K).backward()
        optim.clip_grad_norm_(ref.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    want_eval = float(F.cross_entropy(ref(Tensor(X)), y).item())

    model = mlp()
    trainer = DistributedTrainer(model, strategy="pp", gradient_accumulation_steps=K, gradient_clip_val=CLIP,
                                 pp_schedule=cfg["schedule"])
    opt = optim.Adam(model.parameters(), lr=0.05, eps=1e-6)
    loader = DataLoader(TensorDataset(X, y), batch_size=4, shuffle=False)
    out = trainer.fit(loader, 1, eval_loader=(X, y), optimizer=opt, criterion=F.cross_entropy, progress=False)
    trainer.close()
    record = out["history"][0]
    return {"eval_diff": abs(record["eval_loss"] - want_eval), "steps": record["optimizer_steps"],
            "param_diff": max(float(np.abs(p.data - q.data).max())
                              for p, q in zip(model.parameters(), ref.parameters())),
            "train_loss": record["train_loss"]}
