#!/usr/bin/env python3
"""Profile 2-rank DDP training of the digits MLP: one merged Chrome trace, and step metrics.

    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/profile_ddp.py --trace-dir traces

Open ``traces/trace.json`` in ``chrome://tracing`` or https://ui.perfetto.dev: one process row per
rank; the "main" thread row shows forward / backward / optimizer.step (``record_function``), the
comm lane rows show every collective (op, sequence number, bytes, algorithm, transport), and the
"ddp buckets" row shows each gradient bucket from ready to done -- the buckets that start while
backward is still running are the communication DDP hides behind compute. Rank 0 also prints
``DistributedMetrics`` (step time, throughput, communication time and overhead, bytes sent),
combined over ranks with one all-reduce, and writes them to ``trace_dir/metrics.json``.

Options: ``--steps`` (profiled steps), ``--warmup``, ``--batch-size`` (per rank), ``--hidden``,
``--bucket-cap-mb`` (small: several buckets, so overlap shows), ``--tensorboard DIR`` (tensorboardX).
"""
from __future__ import annotations

import argparse
import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import neural_arch.distributed as dist
import neural_arch.nn.functional as F
from neural_arch import nn, optim, profiler
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import DataLoader, TensorDataset, load_digits
from neural_arch.distributed.metrics import DistributedMetrics


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace-dir", default="traces")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--bucket-cap-mb", type=float, default=0.1)
    p.add_argument("--tensorboard", default=None, help="also log the metrics with tensorboardX to this folder")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(args.seed)
    X, y, _, _ = load_digits()
    data = TensorDataset(X, y)
    sampler = dist.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = optim.SGD(ddp.parameters(), lr=0.05)
    metrics = DistributedMetrics()

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    def train_step(x, t):
        with profiler.record_function("forward"):
            loss = F.cross_entropy(ddp(Tensor(x)), t)
        with profiler.record_function("backward"):
            loss.backward()  # buckets are all-reduced while backward goes on
        with profiler.record_function("optimizer.step"):
            opt.step()
            opt.zero_grad()
        return float(loss.item())

    stream = batches()
    for _ in range(args.warmup):  # first steps build buckets and warm caches: not on the timeline
        train_step(*next(stream))
    with profiler.profile(trace_dir=args.trace_dir) as prof:
        for _ in range(args.steps):
            x, t = next(stream)
            with metrics.step(samples=len(t)):
                loss = train_step(x, t)
            metrics.update_metric("loss", loss)
    stats = metrics.global_summary()  # one all-reduce: every rank calls it
    writer = None
    if args.tensorboard and rank == 0:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(args.tensorboard)
    metrics.log_to_tensorboard(writer, step=args.steps)
    if writer is not None:
        writer.close()
    if rank == 0:
        metrics.write_json(os.path.join(args.trace_dir, "metrics.json"))
        print(f"trace: {prof.trace_path} ({len(prof.spans)} spans on rank 0, clock offsets "
              f"{[round(o * 1e6, 1) for o in prof.offsets]} us)")
        print(f"{world} rank(s): step {stats['step_time_s'] * 1e3:.2f} ms (slowest rank "
              f"{stats['step_time_s_max'] * 1e3:.2f} ms), {stats['samples_per_s']:.0f} samples/s, comm "
              f"{stats['comm_time_s'] * 1e3:.2f} ms/step of which exposed {stats['exposed_comm_s'] * 1e3:.2f} ms "
              f"({stats['comm_overhead_pct']:.1f}% overhead), {stats['bytes_per_step'] / 1e3:.1f} kB sent/step, "
              f"loss {stats['loss']:.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
