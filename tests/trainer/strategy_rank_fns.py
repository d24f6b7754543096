"""Rank functions for test_trainer_strategies.py: the trainer's ``fully_shard``, ``tp`` and
``{"dp": a, "tp": b}`` strategies against one process (module level: pickled by reference).

Data as in trainer_rank_fns: window ``w`` of an accumulation of ``K`` micro-batches on ``W``
*data-parallel* ranks (``B`` samples each) covers ``K*W*B`` rows; micro-batch ``j`` of data-parallel
rank ``d`` takes rows ``(j*W + d)*B ...`` of it. Ranks of one tensor-parallel row see the same
micro-batch. The reference trains one process on each window's rows at once.
"""

from __future__ import annotations

import numpy as np

K, B, D_IN, HIDDEN, D_OUT = 4, 2, 5, 8, 3
VOCAB, T = 8, 4


def build(kind: str, dtype=np.float64):
    """``"mlp"`` (``Sequential(Linear, Tanh, Linear)``) or ``"gpt"``, the same on every rank."""
    from neural_arch import nn
    from neural_arch.core import rng

    if kind == "gpt":
        rng.manual_seed(3)
        model = nn.GPT(vocab_size=VOCAB, block_size=T, n_layer=1, n_head=2, n_embd=8)
        return model.double() if dtype == np.float64 else model
    gen = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(D_IN, HIDDEN, dtype=dtype), nn.Tanh(), nn.Linear(HIDDEN, D_OUT, dtype=dtype))
    for p in model.parameters():
        p.data[...] = gen.normal(0, 0.5, size=p.data.shape).astype(dtype)
    return model


def tp_plan():
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def criterion_for(kind: str):
    return lm_loss if kind == "gpt" else _cross_entropy


def _cross_entropy(logits, target):
    import neural_arch.nn.functional as F

    return F.cross_entropy(logits, target)


def lm_loss(logits, target):
    import neural_arch.nn.functional as F

    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), np.asarray(target).reshape(b * t))


def data(kind: str, windows: int, dp: int, k: int = K, dtype=np.float64):
    gen = np.random.default_rng(7)
    n = windows * k * dp * B
    if kind == "gpt":
        return gen.integers(0, VOCAB, size=(n, T)), gen.integers(0, VOCAB, size=(n, T))
    return gen.normal(size=(n, D_IN)).astype(dtype), gen.integers(0, D_OUT, size=n)


def micro_batch(X, y, window: int, j: int, d: int, dp: int, k: int = K):
    start = window * k * dp * B + (j * dp + d) * B
    return X[start:start + B], y[start:start + B]


def make_optimizer(params):
    from neural_arch import optim

    # eps well above float64 rounding: a gradient that is ~0 up to rounding (summed over ranks in
    # another order) must not turn into an Adam step of lr * noise / eps
    return optim.Adam(params, lr=0.05, weight_decay=0.01, eps=1e-6)


def make_scheduler(opt):
    from neural_arch.optim.lr_scheduler import StepLR

    return StepLR(opt, step_size=1, gamma=0.7)


def reference(kind: str, windows: int, dp: int, clip: float, k: int = K, dtype=np.float64) -> dict:
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor

    model = build(kind, dtype)
    opt = make_optimizer(model.parameters())
    sched = make_scheduler(opt)
    X, y = data(kind, windows, dp, k, dtype)
    rows = k * dp * B
    for w in range(windows):
        xs, ys = X[w * rows:(w + 1) * rows], y[w * rows:(w + 1) * rows]
        criterion_for(kind)(model(Tensor(xs)), ys).backward()
        optim.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        sched.step()
    return {n: np.asarray(p.data).copy() for n, p in model.named_parameters()}


def full_params(trainer) -> dict:
    """Whole parameters by name (DTensor pieces gathered: a collective, same order on every rank)."""
    from neural_arch.distributed.tensor import DTensor

    return {n: np.asarray((p.full_tensor() if isinstance(p, DTensor) else p).data).copy()
            for n, p in trainer.module.named_parameters()}


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(float(np.abs(np.asarray(a[n], dtype=np.float64) - b[n]).max()) for n in b)


def _dp(strategy, world: int) -> tuple[int, int]:
    """(data-parallel size, this rank's data-parallel index) for ``strategy`` on ``world`` ranks."""
    from neural_arch.distributed import get_rank

    if strategy == "tp":
        return 1, 0
    if isinstance(strategy, dict):
        tp = strategy.get("tp", 1)
        return world // tp, get_rank() // tp
    return world, get_rank()


def _trainer(kind, strategy, clip, dtype=np.float64, **kwargs):
    from neural_arch.distributed.trainer import DistributedTrainer

    model = build(kind, dtype)
    plan = tp_plan() if kind == "mlp" and (strategy == "tp" or isinstance(strategy, dict)) else None
    trainer = DistributedTrainer(model, strategy=strategy, gradient_accumulation_steps=kwargs.pop("k", K),
                                 gradient_clip_val=clip, tp_plan=plan, **kwargs)
    opt = make_optimizer(model.parameters())    # built before sharding: the trainer re-points it
    trainer.lr_scheduler = make_scheduler(opt)
    return trainer, opt


def _train(trainer, opt, kind, strategy, X, y, first: int, last: int, k: int = K):
    dp, d = _dp(strategy, trainer.world_size)
    out = []
    for w in range(first, last):
        for j in range(k):
            out.append(trainer.train_step(micro_batch(X, y, w, j, d, dp, k), opt, criterion_for(kind), w * k + j))
    return out


def equivalence(cfg):
    """Each ``(kind, strategy)`` of ``cfg["cases"]``: K=4 micro-batches per step against one process."""
    import neural_arch.distributed as dist

    windows, clip = 2, 0.3
    out = []
    for kind, strategy in cfg["cases"]:
        trainer, opt = _trainer(kind, strategy, clip)
        dp, _ = _dp(strategy, trainer.world_size)
        X, y = data(kind, windows, dp)
        metrics = _train(trainer, opt, kind, strategy, X, y, 0, windows)
        got = full_params(trainer)
        out.append({"case": f"{kind} {strategy}", "diff": _max_diff(got, reference(kind, windows, dp, clip)),
                    "steps": [m["step"] for m in metrics], "model": type(trainer.model).__name__,
                    "grad_norms": [m["grad_norm"] for m in metrics if not m["accumulating"]],
                    "lr": metrics[-1]["lr"]})
        trainer.close()
        dist.barrier()
    return out


def mixed_precision(cfg):
    """fully_shard with ``mixed_precision=True``: a bfloat16 MixedPrecisionPolicy, float32 master
    shards; returns how far its parameters end from float32 training."""
    trainer, opt = _trainer("mlp", "fully_shard", 0.3, np.float32, mixed_precision=True)
    dp, _ = _dp("fully_shard", trainer.world_size)
    X, y = data("mlp", 2, dp, dtype=np.float32)
    metrics = _train(trainer, opt, "mlp", "fully_shard", X, y, 0, 2)
    got = full_params(trainer)
    want = reference("mlp", 2, dp, 0.3, dtype=np.float32)
    policy = trainer.mp_policy
    trainer.close()
    return {"param_dtype": str(policy.param_dtype), "dtypes": sorted({str(v.dtype) for v in got.values()}),
            "loss": metrics[-1]["loss"], "diff": _max_diff(got, want)}


def resume(cfg):
    """Uninterrupted vs. saved after 2 of 4 windows, dropped, resumed into a fresh trainer built
    from other weights and another RNG state."""
    from neural_arch.core import rng

    kind, strategy, directory, k, windows, save_at = cfg["kind"], cfg["strategy"], cfg["dir"], 2, 4, 2
    rng.manual_seed(11)
    a, opt = _trainer(kind, strategy, 0.3, k=k)
    dp, _ = _dp(strategy, a.world_size)
    X, y = data(kind, windows, dp, k)
    _train(a, opt, kind, strategy, X, y, 0, windows, k)
    uninterrupted = full_params(a)
    a.close()

    rng.manual_seed(11)
    b, opt = _trainer(kind, strategy, 0.3, k=k, checkpoint_dir=directory, keep_last=1)
    _train(b, opt, kind, strategy, X, y, 0, save_at, k)
    b.save_checkpoint(epoch=0, optimizer=opt, loss=1.0)
    b.close()

    rng.manual_seed(99)
    c, opt = _trainer(kind, strategy, 0.3, k=k, checkpoint_dir=directory)
    for p in c.model.parameters():   # other weights: the checkpoint must restore them
        p.data[...] = 0.25
    meta = c.resume(opt)
    _train(c, opt, kind, strategy, X, y, save_at, windows, k)
    got = full_params(c)
    c.close()
    return {"bitwise": all(np.array_equal(got[n], v) for n, v in uninterrupted.items()),
            "diff": _max_diff(got, uninterrupted), "step": meta["global_step"], "uninterrupted": uninterrupted,
            "lr": opt.param_groups[0]["lr"]}
