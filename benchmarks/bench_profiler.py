#!/usr/bin/env python3
"""What observability costs: DDP step time with the profiler off and on, and the seam's per-call cost.

Two ranks (gloo, real processes on this host, one BLAS thread each) train the digits MLP
(64-256-256-10 by default, ``--hidden`` sets the width; batch 64 per rank, SGD,
``bucket_cap_mb=0.1``) with
``record_function`` around forward / backward / optimizer step. Modes, run in the **same
processes**, interleaved in blocks of ``--steps`` steps for ``--rounds`` rounds (load from other
processes hits every mode alike):

* ``off``: nobody subscribed (producers pay one list test per span site);
* ``noop``: one subscriber that does nothing: what the *producers* pay to build spans (the
  backend's span arguments, the reducer's bucket records), apart from any recording;
* ``stall``: the stall inspector alone (a watcher thread that reads each backend's in-flight op
  slot; collectives pay only the slot writes, which they make in every mode);
* ``profile``: ``profiler.profile()`` recording every span (collectives, buckets, record_function);
* ``all``: profile + ``DistributedMetrics.step()`` + stall inspector.

Overhead = median over rounds of (this mode's block median / the same round's ``off`` block median)
- 1 (paired per round; the goal: < 5 %). On a machine shared with other jobs wall time mostly
measures their load; the CPU time the two ranks spent per step (``time.process_time``, every
thread) is the steadier measure of what the profiler itself costs, and is reported beside it. A
second table gives the seam's cost per span in one process (``events.begin``+``end`` with nobody
listening, with a recorder; the stall inspector no longer listens to spans, so it has no seam cost).

    python benchmarks/bench_profiler.py                 # table + benchmarks/results/bench_profiler.json
    python benchmarks/bench_profiler.py --steps 20 --rounds 8
    python benchmarks/bench_profiler.py --hidden 1024      # a longer step (~10x)
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

from benchmarks.common import print_table, thread_env, write_json

MODES = ("off", "noop", "stall", "profile", "all")


def _noop(span) -> None:
    """A subscriber that records nothing."""


def rank_main(steps: int, rounds: int, seed: int = 0, hidden: int = 256):
    """On every rank: interleaved blocks of each mode; returns {mode: [step seconds]}."""
    import numpy as np

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim, profiler
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.data import load_digits
    from neural_arch.distributed.metrics import DistributedMetrics
    from neural_arch.distributed.stall import StallInspector
    from neural_arch.profiler import events

    manual_seed(seed)
    X, y, _, _ = load_digits()
    rng = np.random.default_rng(seed + dist.get_rank())
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.1)
    opt = optim.SGD(ddp.parameters(), lr=0.01)

    def step():
        idx = rng.integers(0, len(X), 64)
        with profiler.record_function("forward"):
            loss = F.cross_entropy(ddp(Tensor(X[idx])), y[idx])
        with profiler.record_function("backward"):
            loss.backward()
        with profiler.record_function("optimizer.step"):
            opt.step()
            opt.zero_grad()

    for _ in range(5):
        step()
    times = {m: [] for m in MODES}  # per mode: one list of step seconds per round
    cpu = {m: [] for m in MODES}    # the same in CPU seconds of this process (all its threads)
    spans = {m: 0 for m in MODES}
    for r in range(rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            prof = profiler.profile(merge=False) if mode in ("profile", "all") else None
            stall = StallInspector(warning_s=60.0) if mode in ("stall", "all") else None
            metrics = DistributedMetrics() if mode == "all" else None
            if mode == "noop":
                events.subscribe(_noop)
            if prof:
                prof.start()
            if stall:
                stall.start()
            dist.barrier()
            times[mode].append([])
            c0 = time.process_time()
            for _ in range(steps):
                t0 = time.perf_counter()
                if metrics is not None:
                    with metrics.step(samples=64):
                        step()
                else:
                    step()
                times[mode][-1].append(time.perf_counter() - t0)
            cpu[mode].append((time.process_time() - c0) / steps)
            events.unsubscribe(_noop)
            if stall:
                stall.stop()
            if prof:
                prof.stop()
                spans[mode] += len(prof.spans)
    return {"times": times, "cpu": cpu, "spans": spans}


def seam_costs(n: int = 200_000) -> dict:
    """Nanoseconds per begin+end pair in this process, per listener setup."""
    from neural_arch.profiler import Recorder, events

    def loop():
        t0 = time.perf_counter()
        for _ in range(n):
            events.end(events.begin("all_reduce", "collective", "comm", {"seq": 1}))
        return (time.perf_counter() - t0) / n * 1e9

    def guarded():  # what producers write: build nothing unless someone listens
        t0 = time.perf_counter()
        for _ in range(n):
            if events.OBSERVERS or events.BEGIN_OBSERVERS or events.END_OBSERVERS:
                events.end(events.begin("all_reduce", "collective", "comm", {"seq": 1}))
        return (time.perf_counter() - t0) / n * 1e9

    out = {"off (guarded, as producers call it)": min(guarded() for _ in range(3)),
           "off (begin/end called)": min(loop() for _ in range(3))}
    with Recorder() as rec:
        out["recorder"] = min((rec.clear(), loop())[1] for _ in range(3))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--hidden", type=int, default=256, help="hidden width of the MLP (default 256: a ~2 ms step, "
                   "where per-span costs weigh most; 1024 gives a ~10x longer step)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "bench_profiler.json"))
    args = p.parse_args(argv)
    os.environ.update({k: v for k, v in thread_env(1).items() if k.endswith("THREADS")})
    from neural_arch.distributed.testing import RankPool

    with RankPool(2, backend="gloo", timeout=900.0) as pool:
        results = pool.run(rank_main, args.steps, args.rounds, 0, args.hidden, timeout=900)
    rows, data = [], {}

    def block_medians(mode):  # per round: the median step of this mode's block, both ranks pooled
        return [statistics.median(results[0]["times"][mode][r] + results[1]["times"][mode][r])
                for r in range(args.rounds)]
    def block_cpu(mode):  # per round: mean CPU seconds per step, both ranks summed
        return [results[0]["cpu"][mode][r] + results[1]["cpu"][mode][r] for r in range(args.rounds)]
    off, off_cpu = block_medians("off"), block_cpu("off")
    for mode in MODES:
        med, cpu = block_medians(mode), block_cpu(mode)
        # paired: each round's block against the "off" block of the same round, then the median
        ratio = statistics.median(m / o for m, o in zip(med, off))
        cpu_ratio = statistics.median(m / o for m, o in zip(cpu, off_cpu))
        data[mode] = {"median_step_s": statistics.median(med), "paired_overhead_pct": 100.0 * (ratio - 1.0),
                      "cpu_s_per_step": statistics.median(cpu), "paired_cpu_overhead_pct": 100.0 * (cpu_ratio - 1.0),
                      "block_medians_s": med, "spans_rank0": results[0]["spans"][mode]}
        rows.append([mode, f"{statistics.median(med) * 1e3:.2f}", f"{100.0 * (ratio - 1.0):+.1f}%",
                     f"{statistics.median(cpu) * 1e3:.2f}", f"{100.0 * (cpu_ratio - 1.0):+.1f}%",
                     results[0]["spans"][mode] // max(1, args.steps * args.rounds)])
    print(f"\nDDP step time, 2 ranks (gloo), digits MLP 64-{args.hidden}-{args.hidden}-10, batch 64/rank; "
          "median over both ranks")
    print_table(rows, ["mode", "step ms (median of blocks)", "overhead vs off (paired per round)",
                       "CPU ms/step (2 ranks)", "CPU overhead (paired)", "spans/step (rank 0)"])
    seam = seam_costs()
    print("\nevents.begin + events.end, per pair, one process")
    print_table([[k, f"{v:.0f}"] for k, v in seam.items()], ["listening", "ns"])
    path = write_json(args.out, {"modes": data, "seam_ns_per_span": seam, "steps": args.steps,
                                 "rounds": args.rounds, "hidden": args.hidden, "load_average": os.getloadavg()})
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
