#!/usr/bin/env python3
"""Weak scaling of data-parallel training: 1 rank vs 2 ranks, neural_arch DDP vs PyTorch DDP.

Model: MLP 784-1024-1024-10 (float32, 1.86 M parameters, 7.4 MB of gradients), batch 128 **per
rank**, SGD with momentum; one BLAS thread per process (set in the children's environment before
NumPy or torch load). Weak scaling: the per-rank work is fixed, so ideal 2-rank step time equals
the 1-rank step time and

    efficiency = step_time(1 rank, no DDP) / step_time(2 ranks, DDP)

A second column divides instead by the step time of two *independent* single-process trainings
running side by side (the slower of the two): same sharing of cores and memory bandwidth, no
communication. On a busy machine this isolates what DDP itself costs from what running two
processes at once costs.

The baselines are plain single-process training (no DDP wrapper) of the same framework.
For neural_arch the report also gives the fraction of communication hidden behind backward
(``DistributedDataParallel.comm_stats()``: time the bucket reductions ran vs. the part of it
after backward's end), overall and **per bucket** (launch order; ``bucket_stats()``), each
bucket's reduction time, and the share of gradient bytes handed to communication before the last
bucket was ready ("bytes sent before the last bucket": what could be hidden at all, independent of
the machine's load).

**Paired efficiency** (the least noisy number on a shared machine): the DDP processes alternate
synchronised steps with ``no_sync`` steps (same processes, same moment, no communication), and

    paired efficiency = median(no_sync step) / median(synchronised step)

so load from other processes hits both halves alike. It is what DDP costs on top of running two
processes side by side (like "eff. vs independent pair", measured in separate runs).

Every configuration is measured ``--rounds`` times, interleaved (so load from other processes
hits them alike); each keeps its best median. Run (a few minutes; torch rows when torch is installed)::

    python benchmarks/bench_ddp.py                    # table + benchmarks/results/bench_ddp.json
    python benchmarks/bench_ddp.py --steps 20 --rounds 3 --bucket-caps 25,1
    python benchmarks/bench_ddp.py --torch-path /tmp/torchlib   # torch installed with pip --target

Numbers depend on the machine and on what else runs on it: the JSON records the load average.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

SIZES = (784, 1024, 1024, 10)
BATCH = 128


# ------------------------------------------------------------------------------------------------
# workers (one per rank)
# ------------------------------------------------------------------------------------------------

def _time_steps(step, warmup: int, steps: int, before_timing=None) -> dict:
    """Run ``step`` ``warmup`` times, then ``before_timing()`` (ranks line up), then time ``steps`` calls."""
    for _ in range(warmup):
        step()
    if before_timing is not None:
        before_timing()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return _stats(times)


def _stats(times):
    import statistics

    return {"median_s": statistics.median(times), "mean_s": statistics.fmean(times), "min_s": min(times),
            "steps": len(times)}


def _time_paired(step, set_sync, warmup: int, steps: int, before_timing=None) -> tuple[dict, dict]:
    """Alternate synchronised and no-sync steps (``set_sync(bool)``); time both kinds."""
    for i in range(warmup):
        set_sync(i % 2 == 0)
        step()
    if before_timing is not None:
        before_timing()
    synced, local = [], []
    for i in range(2 * steps):
        sync = i % 2 == 0
        set_sync(sync)
        t0 = time.perf_counter()
        step()
        (synced if sync else local).append(time.perf_counter() - t0)
    set_sync(True)
    return _stats(synced), _stats(local)


def worker_neural_arch(args) -> dict:
    import numpy as np

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from benchmarks.common import mlp
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor, manual_seed

    distributed = args.backend != "none"
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)  # experiment: how long a GIL holder may run
    if distributed:
        dist.init_process_group(backend=args.backend)
    rank = dist.get_rank() if distributed else 0
    manual_seed(0)
    model = mlp(SIZES)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                       gradient_as_bucket_view=True) if distributed else model
    opt = optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(rank)
    X = rng.normal(size=(BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=BATCH)

    def step():
        loss = F.cross_entropy(ddp(Tensor(X)), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    def before_timing():
        if distributed:
            dist.barrier()
            ddp.reset_comm_stats()

    out = _time_steps(step, args.warmup, args.steps, before_timing)
    if distributed:
        out.update({k: v for k, v in ddp.comm_stats().items()})
        out["buckets"] = len(ddp.bucket_plan)
        if hasattr(ddp, "bucket_stats"):  # (absent in older checkouts measured for comparison)
            stats = ddp.bucket_stats()
            out["bucket_bytes"] = [r["bytes"] for r in stats]
            # the share of gradient bytes handed to communication before the last bucket was
            # ready (latest step): what had the rest of backward to hide behind, whatever the load
            last = max(r["ready"] for r in stats)
            out["bytes_launched_in_backward"] = (sum(r["bytes"] for r in stats if r["launched"] < last)
                                                 / sum(r["bytes"] for r in stats))

        def set_sync(on):
            ddp.require_backward_grad_sync = on
        synced, local = _time_paired(step, set_sync, args.warmup, args.steps, before_timing)
        out["paired"] = {"sync_median_s": synced["median_s"], "no_sync_median_s": local["median_s"],
                         "efficiency": local["median_s"] / synced["median_s"],
                         "hidden_fraction": ddp.comm_stats()["hidden_fraction"]}
        dist.destroy_process_group()
    return out if rank == 0 else {}


def worker_torch(args) -> dict:
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    distributed = args.backend != "none"
    if distributed:
        tdist.init_process_group("gloo")
    rank = tdist.get_rank() if distributed else 0
    torch.manual_seed(0)
    layers = []
    for i in range(len(SIZES) - 1):
        layers.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    X = torch.randn(BATCH, SIZES[0], generator=g)
    y = torch.randint(0, SIZES[-1], (BATCH,), generator=g)

    def step():
        loss = torch.nn.functional.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    out = _time_steps(step, args.warmup, args.steps, tdist.barrier if distributed else None)
    if distributed:
        import contextlib

        sync = [True]

        def paired_step():
            with contextlib.nullcontext() if sync[0] else model.no_sync():
                step()

        def set_sync(on):
            sync[0] = on
        synced, local = _time_paired(paired_step, set_sync, args.warmup, args.steps, tdist.barrier)
        out["paired"] = {"sync_median_s": synced["median_s"], "no_sync_median_s": local["median_s"],
                         "efficiency": local["median_s"] / synced["median_s"]}
        tdist.destroy_process_group()
    return out if rank == 0 else {}


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------

def _child_env(extra=None, torch_path=None) -> dict:
    from benchmarks.common import thread_env

    env = thread_env(1)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, torch_path, env.get("PYTHONPATH")) if p)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env.update(extra or {})
    return env


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no result in worker output:\n{stdout[-2000:]}")


def run_config(framework: str, backend: str, world: int, args) -> dict:
    """Start ``world`` workers (directly, or under mpiexec) and return rank 0's measurements."""
    from benchmarks.common import run_processes
    from neural_arch.distributed.testing import free_port

    me = os.path.abspath(__file__)
    common = ["--worker", framework, "--backend", backend, "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--bucket-cap-mb", str(args.bucket_cap_mb),
              "--switch-interval", str(args.switch_interval or 0)]
    tp = args.torch_path if framework == "torch" else None
    if backend == "mpi":
        from neural_arch.distributed.testing import mpiexec_path

        cmds = [([mpiexec_path(), "-n", str(world), sys.executable, me, *common], _child_env(torch_path=tp))]
    elif backend == "none":
        # world > 1 without a backend: independent single-process trainings running side by side.
        cmds = [([sys.executable, me, *common], _child_env(torch_path=tp)) for _ in range(world)]
    else:
        port = str(free_port())
        cmds = [([sys.executable, me, *common],
                 _child_env({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}, torch_path=tp))
                for r in range(world)]
    outs = [out for out, _ in run_processes(cmds, args.timeout, f"{framework}/{backend}/{world} worker", cwd=REPO)]
    if backend == "none" and world > 1:
        results = [_last_json(o) for o in outs]
        merged = dict(results[0])
        merged["median_s"] = max(r["median_s"] for r in results)  # the pair is as slow as its slower half
        return merged
    return _last_json(outs[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="weak-scaling benchmark of DDP (see module docstring)")
    ap.add_argument("--worker", choices=["neural_arch", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help=argparse.SUPPRESS)
    ap.add_argument("--bucket-caps", default="25,1", help="neural_arch bucket caps (MB) to measure")
    ap.add_argument("--backends", default="gloo,mpi", help="neural_arch backends for the 2-rank runs")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    ap.add_argument("--torch-path", default=os.environ.get("BENCH_TORCH_PATH"),
                    help="a directory holding torch (pip install --target DIR torch), put on the workers' path")
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="sys.setswitchinterval for neural_arch workers (0: Python's default, 5 ms)")
    ap.add_argument("--rounds", type=int, default=2, help="measure every configuration this many times")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_ddp.json"))
    args = ap.parse_args(argv)

    if args.worker:
        fn = worker_neural_arch if args.worker == "neural_arch" else worker_torch
        result = fn(args)
        if result:  # rank 0 only: under mpiexec all ranks share one stdout
            print(json.dumps(result), flush=True)
        return 0

    from benchmarks.common import format_table, write_json

    configs = [("neural_arch", "none", 1, None), ("neural_arch", "none", 2, None)]
    configs += [("neural_arch", b, 2, float(c)) for b in args.backends.split(",") if b
                for c in args.bucket_caps.split(",") if c]
    have_torch = importlib.util.find_spec("torch") is not None or (
        args.torch_path and os.path.isdir(os.path.join(args.torch_path, "torch")))
    if not args.no_torch and have_torch:
        configs += [("torch", "none", 1, None), ("torch", "none", 2, None), ("torch", "gloo", 2, 25.0)]
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}/rank, 1 BLAS thread/process, median of "
          f"{args.steps} steps, best of {args.rounds} rounds; load average {os.getloadavg()}", flush=True)
    # Rounds interleave the configurations, so a burst of load from other processes hits them
    # alike; each configuration keeps its best (lowest) median step time.
    runs: dict = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for c in configs:
            args.bucket_cap_mb = c[3] or 25.0
            r = run_config(c[0], c[1], c[2], args)
            runs[c].append(r)
            print(f"round {rnd + 1}: {c[0]:11s} {c[1]:5s} x{c[2]} cap={c[3]}: {r['median_s'] * 1e3:.1f} ms/step",
                  flush=True)
    best = {c: min(rs, key=lambda r: r["median_s"]) for c, rs in runs.items()}
    rows, records = [], []
    for c in configs:
        framework, backend, world, cap = c
        r = best[c]
        step = r["median_s"]
        base = best.get((framework, "none", 1, None))
        pair = best.get((framework, "none", 2, None))
        ddp_row = world > 1 and backend != "none"
        eff = base["median_s"] / step if ddp_row and base else None
        # vs. two independent trainings side by side: same core sharing, no communication
        eff_pair = pair["median_s"] / step if ddp_row and pair else None
        # paired: each round is its own ratio (both halves measured together); the median over rounds
        paired = [x["paired"] for x in runs[c] if x.get("paired")]
        eff_paired = statistics.median(p["efficiency"] for p in paired) if paired else None
        hidden = [p["hidden_fraction"] for p in paired if p.get("hidden_fraction") is not None]
        per_bucket = r.get("bucket_hidden_fraction")
        comm_ms = ([1e3 * c_s / r["backwards"] for c_s in r["bucket_comm_s"]]
                   if r.get("bucket_comm_s") and r.get("backwards") else None)
        rec = {"framework": framework, "backend": backend, "world_size": world, "bucket_cap_mb": cap,
               "step_ms": step * 1e3, "samples_per_s": world * BATCH / step, "efficiency": eff,
               "efficiency_vs_independent_pair": eff_pair, "efficiency_paired": eff_paired,
               "hidden_fraction": statistics.median(hidden) if hidden else r.get("hidden_fraction"),
               "bytes_launched_in_backward": r.get("bytes_launched_in_backward"),
               "bucket_hidden_fraction": per_bucket, "bucket_comm_ms": comm_ms, "bucket_bytes": r.get("bucket_bytes"),
               "buckets": r.get("buckets"), "switch_interval": args.switch_interval or None,
               "all_rounds_step_ms": [x["median_s"] * 1e3 for x in runs[c]], "all_rounds_paired": paired,
               "best_round": r}
        records.append(rec)
        what = backend if ddp_row else ("(no DDP)" if world == 1 else "(2 independent, no comm)")
        rows.append([framework, what, world, "-" if cap is None else cap,
                     round(rec["step_ms"], 1), round(rec["samples_per_s"]), "-" if eff is None else round(eff, 2),
                     "-" if eff_pair is None else round(eff_pair, 2),
                     "-" if eff_paired is None else round(eff_paired, 2),
                     "-" if rec["hidden_fraction"] is None else round(rec["hidden_fraction"], 2),
                     "-" if rec["bytes_launched_in_backward"] is None else round(rec["bytes_launched_in_backward"], 2),
                     "-" if not per_bucket else " ".join(f"{h:.2f}" for h in per_bucket),
                     "-" if not comm_ms else " ".join(f"{m:.2f}" for m in comm_ms)])
    headers = ["framework", "backend", "ranks", "bucket MB", "step ms", "samples/s", "efficiency",
               "eff. vs independent pair", "eff. paired (no_sync/sync)", "comm hidden",
               "bytes sent before the last bucket", "hidden per bucket", "comm ms per bucket"]
    table = format_table(rows, headers)
    print("\n" + table)
    path = write_json(args.out, {"benchmark": "bench_ddp", "model": list(SIZES), "batch_per_rank": BATCH,
                                 "steps": args.steps, "rounds": args.rounds, "command": " ".join(sys.argv), "load_average_end": list(os.getloadavg()),
                                 "results": records, "table": table})
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
