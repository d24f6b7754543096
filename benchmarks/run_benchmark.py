#!/usr/bin/env python3
"""Seed 003's scalability benchmark: the trainer's throughput per process count, strategy and batch size.

Seed 003 runs ``python run_benchmark.py --gpus 1 2 4 8 ... --strategies ddp fsdp --batch-sizes 32 64 128``.
Here a "GPU" is a CPU process (``--gpus`` is accepted as another name of ``--procs``): each
configuration starts ``N`` ranks under the launcher (``--standalone``, one BLAS thread per rank), each
rank trains an MLP (784-512-512-10, float32, Adam) with ``DistributedTrainer(model, strategy)`` for
``--warmup`` then ``--steps`` micro-batches of ``B`` samples **per rank** (weak scaling: the per-rank work
is fixed), and reports the trainer's own numbers (``get_performance_metrics()``, from
``DistributedMetrics``: ``samples_per_second_per_gpu`` -- per rank here -- and
``communication_overhead_percent``, the exposed communication over the step time) for the timed steps.

Columns: throughput = the sum over the ranks' samples/s; scaling efficiency = per-rank throughput at N over
per-rank throughput at 1 process (same strategy and batch; 100% is perfect weak scaling); comm overhead.
More ranks than cores share cores (the launcher says so): their efficiency measures the machine, not
the strategy. Writes a Markdown table to stdout and ``benchmarks/results/run_benchmark.{json,md}`` plus
``run_benchmark.png`` (throughput and efficiency against N; needs matplotlib)::

    python benchmarks/run_benchmark.py --procs 1 2 --strategies ddp fsdp --batch-sizes 32 128
    python benchmarks/run_benchmark.py --gpus 1 2 --strategies ddp fsdp zero2 --batch-sizes 64 --steps 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

SIZES = (784, 512, 512, 10)
RESULTS = os.path.join(HERE, "results")


# ------------------------------------------------------------------------------------------------ worker
def worker(args) -> None:
    """One rank of one configuration (started by the launcher)."""
    import numpy as np

    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.trainer import DistributedTrainer

    manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(SIZES)):
        layers.append(nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    with DistributedTrainer(model, strategy=args.strategy) as trainer:
        opt = optim.Adam(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(trainer.rank)
        x = rng.standard_normal((args.batch_size, SIZES[0])).astype(np.float32)
        y = rng.integers(0, SIZES[-1], args.batch_size)
        for step in range(args.warmup):
            trainer.train_step((x, y), opt, F.cross_entropy, step)
        trainer.metrics.reset()          # time the steady state only
        for step in range(args.warmup, args.warmup + args.steps):
            trainer.train_step((x, y), opt, F.cross_entropy, step)
        perf = trainer.get_performance_metrics()
        gathered = [perf]
        if trainer.world_size > 1:
            import neural_arch.distributed as dist

            gathered = [None] * trainer.world_size
            dist.all_gather_object(gathered, perf)
        if trainer.rank == 0:
            with open(args.out, "w") as f:
                json.dump(gathered, f)


# ------------------------------------------------------------------------------------------------ driver
def run_config(procs: int, strategy: str, batch: int, steps: int, warmup: int, timeout: float) -> list[dict]:
    from benchmarks.common import thread_env

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perf.json")
        cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node",
               str(procs), os.path.abspath(__file__), "--worker", "--strategy", strategy, "--batch-size", str(batch),
               "--steps", str(steps), "--warmup", str(warmup), "--out", out]
        env = thread_env(1)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{strategy} on {procs} process(es), batch {batch}: exit {proc.returncode}\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def table(rows: list[dict]) -> str:
    from benchmarks.common import format_table

    return format_table([[r["procs"], r["strategy"], r["batch_size"], f"{r['throughput']:.0f}",
                          f"{r['per_rank']:.0f}", f"{r['efficiency']:.0f}%", f"{r['comm_overhead']:.1f}%"]
                         for r in rows],
                        ["procs", "strategy", "batch/rank", "throughput (samples/s)", "per rank (samples/s)",
                         "scaling efficiency", "comm overhead"])


def plot(rows: list[dict], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key in sorted({(r["strategy"], r["batch_size"]) for r in rows}):
        sel = sorted((r for r in rows if (r["strategy"], r["batch_size"]) == key), key=lambda r: r["procs"])
        label = f"{key[0]}, batch {key[1]}"
        a.plot([r["procs"] for r in sel], [r["throughput"] for r in sel], marker="o", label=label)
        b.plot([r["procs"] for r in sel], [r["efficiency"] for r in sel], marker="o", label=label)
    a.set(xlabel="processes", ylabel="samples/s (all ranks)", title="throughput")
    b.set(xlabel="processes", ylabel="% of 1-process per-rank throughput", title="weak-scaling efficiency")
    for ax in (a, b):
        ax.set_xticks(sorted({r["procs"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", "--gpus", dest="procs", type=int, nargs="+", default=[1, 2],
                   help="process counts (seed 003's --gpus: processes on CPU)")
    p.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"],
                   help="trainer strategies: ddp, zero1, zero2, fsdp, fully_shard")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64, 128], help="samples per rank per step")
    p.add_argument("--steps", type=int, default=30, help="timed micro-batches per configuration")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument("--results", default=RESULTS, help="folder for run_benchmark.{json,md,png}")
    # the worker's own options (the launcher starts this script with --worker)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--strategy", help=argparse.SUPPRESS)
    p.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if min(args.procs) < 1 or min(args.batch_sizes) < 1 or args.steps < 1:
        p.error("--procs, --batch-sizes and --steps must be positive")
    from benchmarks.common import environment, write_json

    rows = []
    for batch in args.batch_sizes:
        for strategy in args.strategies:
            base = None      # per-rank throughput on one process (the efficiency's 100%)
            for procs in sorted(set(args.procs)):
                ranks = run_config(procs, strategy, batch, args.steps, args.warmup, args.timeout)
                per_rank = sum(r["samples_per_second_per_gpu"] for r in ranks) / len(ranks)
                if procs == 1:
                    base = per_rank
                row = {"procs": procs, "strategy": strategy, "batch_size": batch,
                       "throughput": sum(r["samples_per_second_per_gpu"] for r in ranks), "per_rank": per_rank,
                       "efficiency": 100.0 * per_rank / base if base else float("nan"),
                       "comm_overhead": sum(r["communication_overhead_percent"] for r in ranks) / len(ranks)}
                rows.append(row)
                print(f"  {strategy} procs={procs} batch={batch}: {row['throughput']:.0f} samples/s, "
                      f"efficiency {row['efficiency']:.0f}%, comm {row['comm_overhead']:.1f}%", file=sys.stderr)
    text = table(rows)
    print(text)
    os.makedirs(args.results, exist_ok=True)
    env = environment()
    write_json(os.path.join(args.results, "run_benchmark.json"), {"rows": rows, "model": list(SIZES),
                                                                   "steps": args.steps, "warmup": args.warmup})
    cpus = os.cpu_count()
    with open(os.path.join(args.results, "run_benchmark.md"), "w") as f:
        load = ", ".join(f"{x:.1f}" for x in env.get("load_average", ()))
        f.write(f"`{env.get('command', 'python benchmarks/run_benchmark.py')}` on {cpus} CPU core(s) "
                f"(load average {load} at the start); MLP {'-'.join(map(str, SIZES))}, float32, Adam, one BLAS "
                f"thread per rank, {args.steps} timed steps after {args.warmup}\n\n{text}\n")
    png = plot(rows, os.path.join(args.results, "run_benchmark.png"))
    print(f"wrote {args.results}/run_benchmark.json, .md" + (", .png" if png else " (no matplotlib: no plot)"),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
