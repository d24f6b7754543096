#!/usr/bin/env python3
"""Seed 003's production training script on the project's trainer (``EnhancedDistributedTrainer``).

A small MLP classifies Gaussian blobs (``make_classification_data``; ``--dataset digits`` for
scikit-learn's digits). Each rank reads its share through a ``DistributedSampler``; the trainer
wraps the model for ``--strategy``, accumulates micro-batches, clips, checkpoints every epoch
(keep-last-3 plus the best by evaluation loss) and resumes from the latest checkpoint. Start it
any way::

    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 examples/production_train.py \\
        --strategy fsdp --gradient-accumulation-steps 4 --gradient-clip-val 1.0 --checkpoint-dir ./checkpoints
    mpiexec -n 2 python examples/production_train.py --strategy ddp --mixed-precision
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 4 examples/production_train.py \
        --strategy dp=2,tp=2          # DDP over 2 rows of a 2-way tensor-parallel MLP ('{"dp": 2, "tp": 2}' too)
    mpiexec -n 2 python examples/production_train.py --strategy pp --gradient-accumulation-steps 4  # 2 stages, 1F1B
    python examples/production_train.py --resume latest --checkpoint-dir ./checkpoints   # any world size

Options (seed 003's): ``--strategy ddp|zero1|zero2|fsdp|fully_shard|tp|pp`` or a mesh ``dp=A,tp=B`` /
``dp=A,pp=B`` (``tp``: the hidden layers split column- then row-wise, the output layer replicated;
``pp``: the Sequential cut into one stage per pipeline rank, the accumulation window's micro-batches
run by a 1F1B schedule; ``--pp-schedule gpipe|1f1b|interleaved|zbh1``), ``--batch-size`` (per rank and
micro-batch), ``--epochs``, ``--mixed-precision`` (bfloat16 autocast on CPU, float16 + loss scaling
on GPU), ``--gradient-accumulation-steps``, ``--gradient-clip-val`` (``--gradient-clip``, the seed's
spelling), ``--activation-checkpointing``, ``--cpu-offload`` (FSDP), ``--checkpoint-dir``,
``--log-dir`` (CSV + TensorBoard on rank 0), ``--resume [latest|PATH]``, ``--auto-batch-size``
(the largest micro-batch per rank that fits ``--memory-budget``, by default the available memory
divided by the node's ranks, from the memory model: see :func:`choose_batch_size`; it says what it
chose). Throughput is per rank (a CPU process, not a GPU)::

    python examples/production_train.py --auto-batch-size --memory-budget 64MiB --strategy fsdp
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank (set before numpy loads)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import neural_arch.nn.functional as F
from neural_arch import nn, optim
from neural_arch.core.tensor import manual_seed
from neural_arch.data import DataLoader, TensorDataset, make_classification_data
from neural_arch.distributed import DistributedSampler
from neural_arch.distributed.trainer import EnhancedDistributedTrainer


def parse_strategy(text: str):
    """A strategy name, or a device-mesh spec written ``dp=2,tp=2`` or as JSON."""
    text = text.strip()
    if text.startswith("{"):
        return json.loads(text)
    if "=" in text:
        try:
            return {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}
        except ValueError:
            raise argparse.ArgumentTypeError(f"--strategy {text!r}: a mesh is written dp=2,tp=2") from None
    return text


def pp_options(args) -> dict:
    """The trainer's pipeline keywords when ``--strategy`` is ``pp`` or a mesh with a ``pp`` dimension."""
    pp = args.strategy == "pp" or (isinstance(args.strategy, dict) and args.strategy.get("pp", 1) > 1)
    return {"pp_schedule": args.pp_schedule} if pp else {}


def tp_plan(strategy):
    """The MLP's tensor-parallel plan (hidden layers column- then row-parallel) when ``strategy``
    splits tensors; None otherwise."""
    if strategy != "tp" and not (isinstance(strategy, dict) and strategy.get("tp", 1) > 1):
        return None
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"512MiB"``, ``"2GB"``, ``"1e9"`` -> bytes (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024).

    >>> parse_bytes("64MiB"), parse_bytes("2 GB"), parse_bytes("1e3")
    (67108864, 2000000000, 1000)
    """
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"--memory-budget {text!r}: write a size such as 512MiB, 2GB or 1e9")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def activation_bytes_per_sample(model, in_features: int, itemsize: int) -> int:
    """What one sample adds to a training step of this script's MLP (``nn.Sequential`` of Linear and
    activation layers): the input row, every layer's output kept for the backward (a Linear's output
    is the next activation's input, an activation's output the next Linear's saved input), the loss's
    class probabilities, and in the backward two gradient rows of the widest layer in flight (the one
    arriving and the one being made). ``memory.estimate`` models activations for ``nn.GPT`` only, so
    the script counts its own model's here (tracemalloc measures a little less at the backward's peak:
    the count errs large, the batch small)."""
    widths, width = [in_features], in_features
    for layer in model:
        width = getattr(layer, "out_features", width)
        widths.append(width)
    widths.append(width)    # cross-entropy's probabilities
    return (int(sum(widths)) + 2 * max(widths)) * int(itemsize)


def choose_batch_size(model, strategy, world_size: int, in_features: int, budget: int, optimizer: str = "adam",
                      cap: int | None = None):
    """The largest micro-batch per rank whose step fits ``budget`` bytes per rank, and why.

    The batch-independent part (parameters, gradients, optimizer state, communication buffers and
    scratch of ``strategy`` on ``world_size`` ranks) is ``neural_arch.memory.estimate``'s peak; each
    sample adds :func:`activation_bytes_per_sample`. The step's peak is at most their sum, so the
    choice errs small. ``tp`` and dp x tp meshes are estimated as unsharded DDP (the memory model's
    ``tp`` is Megatron's GPT plan, not this MLP's): an upper bound again. ``cap`` (the samples a rank
    reads per epoch) bounds the result: a larger batch would be the same one batch.

    Returns ``(batch, message)``; raises ``SystemExit`` when not even one sample fits.

    >>> from neural_arch import nn
    >>> mlp = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    >>> batch, why = choose_batch_size(mlp, "fsdp", 2, in_features=20, budget=2**20)
    >>> batch, why.split(":")[0]
    (899, 'auto batch size')
    """
    from neural_arch import memory

    sharded = isinstance(strategy, str) and strategy in ("ddp", "zero1", "zero2", "fsdp", "fully_shard")
    est = memory.estimate(model, strategy=strategy if sharded else "ddp", world_size=world_size if sharded else 1,
                          optimizer=optimizer)
    itemsize = next(iter(model.parameters())).data.dtype.itemsize
    per_sample = activation_bytes_per_sample(model, in_features, itemsize)
    fixed = est.total
    if budget < fixed + per_sample:
        raise SystemExit(f"--auto-batch-size: the budget of {_mib(budget)} per rank does not hold one sample: "
                         f"the model's step alone needs {_mib(fixed)} ({est.strategy}, {est.world_size} rank(s)) "
                         f"and a sample {per_sample} bytes; raise --memory-budget or use a sharding strategy")
    batch = (budget - fixed) // per_sample
    capped = cap is not None and batch > cap
    batch = int(min(batch, cap)) if capped else int(batch)
    why = (f"auto batch size: {batch} samples per rank per micro-batch fit the budget of {_mib(budget)} per rank "
           f"(model, gradients, optimizer state and buffers {_mib(fixed)} from memory.estimate for "
           f"{est.strategy} on {est.world_size} rank(s), plus {per_sample} bytes of activations per sample)")
    if capped:
        why += f"; capped at the {cap} samples each rank reads per epoch"
    return batch, why


def default_budget(local_ranks: int) -> tuple[int, str]:
    """The memory available now divided among this node's ranks, and where it came from."""
    import psutil

    available = psutil.virtual_memory().available
    return available // max(1, local_ranks), f"available memory {_mib(available)} / {local_ranks} local rank(s)"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", default="ddp", type=parse_strategy,
                   help="ddp, zero1, zero2, fsdp, fully_shard, tp, pp, or a mesh: dp=2,tp=2, dp=2,pp=2 or "
                        "'{\"dp\": 2, \"tp\": 2}'")
    p.add_argument("--pp-schedule", default="1f1b", choices=["1f1b", "gpipe", "interleaved", "zbh1"],
                   help="the pipeline schedule with --strategy pp or a pp mesh dimension")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per micro-batch")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--gradient-clip-val", "--gradient-clip", dest="gradient_clip_val", type=float, default=None)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--cpu-offload", action="store_true")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="resume from 'latest' in --checkpoint-dir (the default when a checkpoint exists) or a path")
    p.add_argument("--auto-batch-size", action="store_true",
                   help="the largest micro-batch per rank that fits --memory-budget (replaces --batch-size)")
    p.add_argument("--memory-budget", type=parse_bytes, default=None,
                   help="bytes per rank for --auto-batch-size, e.g. 512MiB (default: available memory / local ranks)")
    p.add_argument("--dataset", default="blobs", choices=["blobs", "digits"])
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def load_data(args):
    if args.dataset == "digits":
        from neural_arch.data import load_digits

        X_train, X_test, y_train, y_test = load_digits(seed=args.seed)
        return X_train, y_train, X_test, y_test, 10
    X, y = make_classification_data(n_samples=args.samples, n_features=20, n_classes=4, seed=args.seed)
    X = X.astype(np.float32)
    cut = int(len(X) * 0.8)
    return X[:cut], y[:cut], X[cut:], y[cut:], 4


def auto_batch_size(args, model, trainer, in_features: int, per_rank_samples: int) -> int:
    """Rank 0 chooses (the available memory differs from one moment to the next) and tells the others."""
    box = [0, ""]     # (batch, or 0 with the reason nothing fits)
    if trainer.rank == 0:
        if args.memory_budget is not None:
            budget, source = args.memory_budget, "--memory-budget"
        else:
            local = int(os.environ.get("LOCAL_WORLD_SIZE") or trainer.world_size)
            budget, source = default_budget(local)
        try:
            batch, why = choose_batch_size(model, args.strategy, trainer.world_size, in_features, budget,
                                           cap=per_rank_samples)
            print(f"{why}; budget from {source}", flush=True)
            box = [batch, ""]
        except SystemExit as exc:
            box = [0, f"{exc} (budget from {source})"]
    if trainer.world_size > 1:
        import neural_arch.distributed as dist

        dist.broadcast_object_list(box, src=0)   # every rank stops, or runs with the same batch
    if not box[0]:
        raise SystemExit(box[1])
    return int(box[0])


def main(argv=None) -> int:
    args = parse_args(argv)
    manual_seed(args.seed)  # the same initial weights on every rank (DDP/FSDP also broadcast rank 0's)
    X_train, y_train, X_test, y_test, classes = load_data(args)
    model = nn.Sequential(nn.Linear(X_train.shape[1], args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, classes))
    unwrapped = copy.deepcopy(model) if args.auto_batch_size else None   # the memory model reads the model before wrapping
    with EnhancedDistributedTrainer(model, strategy=args.strategy, mixed_precision=args.mixed_precision,
                                    gradient_accumulation_steps=args.gradient_accumulation_steps,
                                    gradient_clip_val=args.gradient_clip_val,
                                    enable_activation_checkpointing=args.activation_checkpointing,
                                    cpu_offload=args.cpu_offload, checkpoint_dir=args.checkpoint_dir,
                                    log_dir=args.log_dir, tp_plan=tp_plan(args.strategy),
                                    **pp_options(args)) as trainer:
        # the data-parallel share: the ranks of one tensor-parallel row read the same batches
        sampler = DistributedSampler(TensorDataset(X_train, y_train), num_replicas=trainer.dp_size,
                                     rank=trainer.dp_rank, shuffle=True, seed=args.seed)
        if args.auto_batch_size:
            args.batch_size = auto_batch_size(args, unwrapped, trainer, X_train.shape[1], len(sampler))
        loader = DataLoader(TensorDataset(X_train, y_train), batch_size=args.batch_size, sampler=sampler)
        optimizer = optim.Adam(model.parameters(), lr=args.lr)
        resume = True if args.resume in (None, "latest") else args.resume
        out = trainer.fit(loader, args.epochs, eval_loader=(X_test, y_test), optimizer=optimizer,
                          criterion=F.cross_entropy, eval_metric=["loss", "accuracy"], resume=resume,
                          progress=not args.no_progress)
        if trainer.rank == 0 and out["history"]:
            last = out["history"][-1]
            perf = out["performance"]
            print(f"final: epoch={last['epoch']} eval_accuracy={last['eval_accuracy']:.4f} "
                  f"eval_loss={last['eval_loss']:.4f} steps={trainer.global_step} world={trainer.world_size} "
                  f"samples_per_second_per_rank={perf['samples_per_second_per_gpu']:.1f} "
                  f"communication_overhead_percent={perf['communication_overhead_percent']:.1f}")
        elif trainer.rank == 0:
            print(f"final: nothing to do (already trained {args.epochs} epochs; steps={trainer.global_step})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
