#!/usr/bin/env python3
"""Pipeline schedules measured: bubble fraction from the executor's own event times vs theory, and
peak activation memory per stage, GPipe vs 1F1B vs interleaved 1F1B vs zero-bubble ZB-H1, ZB-V and
interleaved zero bubble (izb, v=2, loop placement like interleaved 1F1B).

Model: a Sequential of ``4 p`` ``Linear(W, W)`` + ``Tanh`` pairs, float64, split evenly into
``p`` stages (``2 p`` chunks for interleaved v=2: the same model and work per rank); a fixed micro-batch of ``--mb`` rows, so per-micro-batch compute is constant
and the theory applies: bubble = (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m+p-1) interleaved,
(p-1)/(3m+p-1) for ZB-H1, (p-1)/(3vm+p-1) for izb and (p-1)/(6m+p-1) for ZB-V (unit F, B, W; m >= p; ZB-V cuts the model
into ``2 p`` stages placed in a V, rank r holding stages r and 2p-1-r). "simulated" runs the very plan in the schedule
simulator with this run's measured mean F, B and W durations (for fused schedules B = B + W).
Ranks are real processes on one machine (gloo, shared memory / loopback); the executor records
``time.perf_counter()`` around every F, B and W (after the receive it waits for: waiting is idle;
a system-wide monotonic clock), and the measured
bubble is ``1 - busy / (p * span)`` with span from the first compute start to the last end over
all ranks, median over ``--steps`` steps after one warm-up. Peak memory is tracemalloc's peak
during one step minus the usage before it (NumPy reports its buffers to tracemalloc).

Oversubscription warning: with more ranks than cores, ranks steal each other's CPU, which
*inflates* measured bubbles (a waiting rank is not idle for the machine). The JSON records the
core count and load average. Run::

    python benchmarks/bench_pipeline.py                       # table + benchmarks/results/bench_pipeline.json
    python benchmarks/bench_pipeline.py --quick --out /tmp/b.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)


# -- worker (runs on every rank of a RankPool) ------------------------------------------------------
def worker(p: int, m: int, schedule: str, v: int, width: int, mb: int, steps: int, costs=(1, 1, 1)):
    import tracemalloc

    import numpy as np

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed import pipelining as pl

    rank = dist.get_rank()
    manual_seed(0)
    layers = []
    for _ in range(4 * p):  # the same model for every schedule: 4 layer pairs per rank
        layers += [nn.Linear(width, width, dtype=np.float64), nn.Tanh()]
    pipe = pl.pipeline(nn.Sequential(*layers), num_stages=p * v, balance="layers")
    style = "v" if schedule.startswith("zbv") else "loop"  # ZB-V: rank r holds stages r and 2p-1-r
    stages = [pipe.build_stage(i) for i in pl.stage_indices(rank, p, v, style=style)]
    cls = {"gpipe": pl.ScheduleGPipe, "1f1b": pl.Schedule1F1B, "interleaved": pl.ScheduleInterleaved1F1B,
           "zbh1": pl.ScheduleZBH1, "zbv": pl.ScheduleZBVZeroBubble, "zbv_costs": pl.ScheduleZBVZeroBubble,
           "izb": pl.ScheduleInterleavedZeroBubble}[schedule]
    extra = {"costs": tuple(costs)} if schedule.startswith("zbv") else {}
    sched = cls(stages if schedule in ("interleaved", "zbv", "zbv_costs", "izb") else stages[0], m,
                loss_fn=lambda out, y: F.mse_loss(out, y), **extra)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(m * mb, width))
    y = rng.normal(size=(m * mb, width))
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

    def one_step():
        sched.step(*((x,) if first else ()), target=y if last else None)
        for s in stages:
            s.submodule.zero_grad()

    one_step()  # warm-up: lanes, buffers, first-touch
    bubbles, peaks, durations = [], [], {"F": [], "B": [], "W": []}
    for _ in range(steps):
        dist.barrier()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        one_step()
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
        events = dist.all_gather_object([None] * p, [(e.action.kind, e.start, e.end) for e in sched.last_events])
        flat = [ev for rank_events in events for ev in rank_events]
        span = max(e for _, _, e in flat) - min(s for _, s, _ in flat)
        busy = sum(e - s for _, s, e in flat)
        bubbles.append(1.0 - busy / (p * span))
        for kind, s, e in flat:
            durations[kind].append(e - s)
    mean = {k: (statistics.fmean(v) if v else 0.0) for k, v in durations.items()}
    return {"bubble": statistics.median(bubbles), "peak_bytes": max(peaks), "mean_s": mean}


def simulated_bubble(p: int, m: int, schedule: str, v: int, mean: dict, costs=(1, 1, 1)) -> float:
    """The plan's bubble in the schedule simulator with measured mean action durations."""
    from neural_arch.distributed import pipelining as pl

    plan = {"gpipe": lambda: pl.gpipe_plan(p, m), "1f1b": lambda: pl.one_f_one_b_plan(p, m),
            "interleaved": lambda: pl.interleaved_1f1b_plan(p, m, v),
            "zbh1": lambda: pl.zero_bubble_plan(p, m), "zbv": lambda: pl.zero_bubble_v_plan(p, m), "zbv_costs": lambda: pl.zero_bubble_v_plan(p, m, costs),
            "izb": lambda: pl.interleaved_zero_bubble_plan(p, m, v)}[schedule]()
    # simulate() takes a rank's whole F (B, W) time and divides by v for each chunk
    return pl.simulate(plan, mean["F"] * v, mean["B"] * v, w_time=mean["W"] * v).bubble_fraction


# -- orchestrator -------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="pipeline bubble and memory benchmark (see module docstring)")
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--microbatches", default="1,2,4,8,16")
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--mb", type=int, default=64, help="rows per micro-batch")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--schedules", default="", help="comma list (gpipe,1f1b,interleaved,zbh1,zbv,zbv_costs,izb; "
                    "zbv_costs takes F:B:W from the zbh1 run); default all")
    ap.add_argument("--quick", action="store_true", help="tiny sweep (smoke test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_pipeline.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.stages, args.microbatches, args.width, args.mb, args.steps = "2", "1,2,4", 64, 8, 1

    from benchmarks.common import format_table, write_json
    from benchmarks.bench_pipeline import worker as importable_worker  # pickled by reference in the ranks
    from neural_arch.distributed.pipelining.schedules import theoretical_bubble
    from neural_arch.distributed.pipelining.zero_bubble import zero_bubble_theory
    from neural_arch.distributed.pipelining.zero_bubble_interleaved import (
        interleaved_zero_bubble_theory,
    )
    from neural_arch.distributed.pipelining.zero_bubble_v import zero_bubble_v_theory
    from neural_arch.distributed.testing import RankPool

    env = {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rows, records = [], []
    for p in [int(s) for s in args.stages.split(",")]:
        with RankPool(p, timeout=300.0, env=env) as pool:
            for m in [int(s) for s in args.microbatches.split(",")]:
                costs = (1, 1, 1)
                for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2),
                                    ("zbv_costs", 2), ("izb", 2)):
                    if args.schedules and schedule not in args.schedules.split(","):
                        continue
                    if schedule == "interleaved" and m % p:
                        continue
                    t0 = time.perf_counter()
                    res = pool.run(importable_worker, p, m, schedule, v, args.width, args.mb, args.steps, costs)
                    theory = (zero_bubble_theory(p, m) if schedule == "zbh1" else zero_bubble_v_theory(p, m)
                              if schedule.startswith("zbv") else interleaved_zero_bubble_theory(p, m, v)
                              if schedule == "izb" else theoretical_bubble(p, m, v))
                    sim = simulated_bubble(p, m, schedule, v, res[0]["mean_s"], costs)
                    if schedule == "zbh1":  # ZB-V with costs=: F:B:W measured here, in steps of half the smallest
                        unit = min(res[0]["mean_s"].values()) / 2
                        costs = tuple(max(1, round(res[0]["mean_s"][k] / unit)) for k in "FBW")
                    peaks = [r["peak_bytes"] for r in res]
                    rec = {"p": p, "m": m, "schedule": schedule, "v": v, "costs": costs if schedule == "zbv_costs" else None, "bubble_measured": res[0]["bubble"],
                           "bubble_theory": theory, "bubble_simulated": sim, "mean_action_s": res[0]["mean_s"],
                           "peak_activation_bytes_per_stage": peaks, "seconds": time.perf_counter() - t0}
                    records.append(rec)
                    rows.append([p, m, f"{schedule}" + (f" v={v}" if v > 1 else "") + (f" {costs}" if schedule == "zbv_costs" else ""), f"{theory:.3f}", f"{sim:.3f}",
                                 f"{res[0]['bubble']:.3f}", " / ".join(f"{b / 2**20:.2f}" for b in peaks)])
                    print(f"p={p} m={m:2d} {schedule:11s} bubble theory {theory:.3f} simulated {sim:.3f} measured "
                          f"{res[0]['bubble']:.3f}; peak MiB per stage {[round(b / 2**20, 2) for b in peaks]}",
                          flush=True)
    headers = ["p", "m", "schedule", "bubble (theory)", "bubble (simulated)", "bubble (measured)",
               "peak activation MiB per stage"]
    table = format_table(rows, headers)
    print(table)
    cores = os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    path = write_json(args.out, {"benchmark": "bench_pipeline", "width": args.width, "rows_per_microbatch": args.mb,
                                 "steps": args.steps, "cpu_count": cores, "loadavg": load, "results": records,
                                 "table": table})
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
