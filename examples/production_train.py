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
    python examples/production_train.py --resume latest --checkpoint-dir ./checkpoints   # any world size

Options (seed 003's): ``--strategy ddp|zero1|zero2|fsdp|fully_shard|tp`` or a mesh ``dp=A,tp=B``
(``tp``: the hidden layers split column- then row-wise, the output layer replicated; ``pp`` is
refused with what to use instead), ``--batch-size`` (per rank and
micro-batch), ``--epochs``, ``--mixed-precision`` (bfloat16 autocast on CPU, float16 + loss scaling
on GPU), ``--gradient-accumulation-steps``, ``--gradient-clip-val`` (``--gradient-clip``, the seed's
spelling), ``--activation-checkpointing``, ``--cpu-offload`` (FSDP), ``--checkpoint-dir``,
``--log-dir`` (CSV + TensorBoard on rank 0), ``--resume [latest|PATH]``. ``--auto-batch-size`` is
not implemented (it tunes against GPU memory; give ``--batch-size``). Throughput is per rank
(a CPU process, not a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
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


def tp_plan(strategy):
    """The MLP's tensor-parallel plan (hidden layers column- then row-parallel) when ``strategy``
    splits tensors; None otherwise."""
    if strategy != "tp" and not (isinstance(strategy, dict) and strategy.get("tp", 1) > 1):
        return None
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", default="ddp", type=parse_strategy,
                   help="ddp, zero1, zero2, fsdp, fully_shard, tp, or a mesh: dp=2,tp=2 or '{\"dp\": 2, \"tp\": 2}'")
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
    p.add_argument("--auto-batch-size", action="store_true", help="not implemented: give --batch-size")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.auto_batch_size:
        raise SystemExit("--auto-batch-size is not implemented (it tunes against GPU memory); give --batch-size")
    manual_seed(args.seed)  # the same initial weights on every rank (DDP/FSDP also broadcast rank 0's)
    X_train, y_train, X_test, y_test, classes = load_data(args)
    model = nn.Sequential(nn.Linear(X_train.shape[1], args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, classes))
    with EnhancedDistributedTrainer(model, strategy=args.strategy, mixed_precision=args.mixed_precision,
                                    gradient_accumulation_steps=args.gradient_accumulation_steps,
                                    gradient_clip_val=args.gradient_clip_val,
                                    enable_activation_checkpointing=args.activation_checkpointing,
                                    cpu_offload=args.cpu_offload, checkpoint_dir=args.checkpoint_dir,
                                    log_dir=args.log_dir, tp_plan=tp_plan(args.strategy)) as trainer:
        # the data-parallel share: the ranks of one tensor-parallel row read the same batches
        sampler = DistributedSampler(TensorDataset(X_train, y_train), num_replicas=trainer.dp_size,
                                     rank=trainer.dp_rank, shuffle=True, seed=args.seed)
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
