#!/usr/bin/env python3
"""Data-parallel training of a small CNN with BatchNorm on the digits data set (8x8 images, 10 classes).

One script, every way of starting it::

    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/train_digits_cnn_ddp.py
    mpiexec -n 2 python examples/train_digits_cnn_ddp.py
    python examples/train_digits_cnn_ddp.py                  # a world of one

What it shows, beyond examples/train_digits_ddp.py: a torch-style CNN (``Conv2d``, ``BatchNorm2d``,
``MaxPool2d``) turned into a synchronised one with ``SyncBatchNorm.convert_sync_batchnorm`` before
wrapping it in DDP, so every rank normalises with the statistics of the *global* batch (the same
model a single process would train on the concatenated batch). ``DistributedSampler`` gives each rank its share of every epoch,
``DistributedDataParallel`` averages gradients during backward (nothing to call before
``optimizer.step()``), ``distributed_evaluate`` measures held-out accuracy over exactly the test
samples (split across ranks, no padding duplicates), and rank 0 shows a tqdm bar, prints accuracy and
throughput, and writes a checkpoint atomically (temp file + ``os.replace``).

Options: ``--epochs``, ``--batch-size`` (per rank), ``--lr``, ``--hidden``, ``--checkpoint PATH``,
``--bucket-cap-mb``, ``--seed``, ``--no-progress``, ``--no-sync-bn`` (plain per-rank BatchNorm).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

# One BLAS thread per rank: ranks share the cores; more threads per rank only fight each other.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np

import neural_arch.distributed as dist
import neural_arch.nn.functional as F
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import DataLoader, TensorDataset, load_digits


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--checkpoint", default=os.path.join("checkpoints", "digits_cnn_ddp.npz"))
    p.add_argument("--no-sync-bn", action="store_true", help="keep per-rank BatchNorm statistics")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (e.g. in logs)")
    return p.parse_args(argv)


def save_checkpoint(path: str, model, optimizer, meta: dict) -> None:
    """Model state dict + optimizer state in one .npz, written atomically (rank 0 only)."""
    from neural_arch.distributed.elastic.checkpoint_restart import save_npz_atomic

    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    opt_state = optimizer.state_dict()
    for idx, values in opt_state["state"].items():
        for key, value in values.items():
            arrays[f"optim/state/{idx}/{key}"] = np.asarray(value)
    arrays["optim/param_groups"] = np.array(json.dumps(opt_state["param_groups"], default=float))
    arrays["meta"] = np.array(json.dumps(meta))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_npz_atomic(path, **arrays)


def build_cnn(channels: int):
    """conv-BN-ReLU-pool twice, then a linear classifier: 8x8 -> 4x4 -> 2x2."""
    c = channels
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * c * 2 * 2, 10))


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group()  # backend from the environment: launcher -> gloo, mpiexec -> mpi, else one rank
    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)

    X_train, y_train, X_test, y_test = load_digits()
    X_train, X_test = X_train.reshape(-1, 1, 8, 8), X_test.reshape(-1, 1, 8, 8)  # (N, C, H, W)
    train_set = TensorDataset(X_train, y_train)
    sampler = dist.DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = build_cnn(args.channels)
    if not args.no_sync_bn:
        model = dist.SyncBatchNorm.convert_sync_batchnorm(model)  # torch: nn.SyncBatchNorm.convert_sync_batchnorm
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = optim.Adam(ddp.parameters(), lr=args.lr)

    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.epochs * len(loader), desc=f"digits CNN x{world} ranks", unit="step", mininterval=0.5)
    t0 = time.perf_counter()
    samples = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for group in opt.param_groups:  # cosine decay to 0: the last epochs settle the BN statistics
            group["lr"] = 0.5 * args.lr * (1 + math.cos(math.pi * epoch / args.epochs))
        running = 0.0
        for x, y in loader:
            loss = F.cross_entropy(ddp(Tensor(x)), y)
            loss.backward()          # gradients are averaged across ranks here
            opt.step()
            opt.zero_grad()
            running += float(loss.item())
            samples += len(y) * world
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{float(loss.item()):.4f}", refresh=False)
        if bar is None and rank == 0 and (epoch + 1) % 2 == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {running / len(loader):.4f}", flush=True)
    train_s = time.perf_counter() - t0
    if bar is not None:
        bar.close()

    stats = dist.distributed_evaluate(ddp, (X_test, y_test), metric=["accuracy", "loss"], batch_size=256)
    if rank == 0:
        print(f"final: held-out accuracy {stats['accuracy']:.4f} on {stats['num_samples']} samples, "
              f"loss {stats['loss']:.4f}; {world} rank(s), {args.epochs} epochs in {train_s:.1f} s, "
              f"throughput {samples / train_s:.0f} samples/s", flush=True)
        save_checkpoint(args.checkpoint, ddp, opt,
                        {"epochs": args.epochs, "world_size": world, "accuracy": stats["accuracy"]})
        print(f"checkpoint written to {args.checkpoint}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
