"""What the always-on flight recorder costs: a small all_reduce and a training step, recorder off
(size 0), on, and on without the caller's file:line, interleaved in one run.

The recorder's cost is CPU work on the thread that issues the op (the record, and the walk up the
stack for the caller's file:line), so the training step is judged by that thread's CPU time, paired at
a fine grain; the process's CPU time and the wall time are measured beside it (both also count the
waits for the peer: on the 2-core machine they vary several times more from step to step). Four
measurements:

* **CPU per call** (one process): the Python path of a 1 KiB float32 all_reduce on gloo's direct
  path with the engine stubbed out (``bench_small_messages.py --overhead``'s set-up), through the
  backend and through the Tensor API -- the recorder's own cost, without the noise of a peer; the
  three modes in interleaved rounds in a rotating order, the median of the rounds reported;
* **1 KiB all_reduce latency**, 2 ranks on gloo over shared memory, Tensor API, interleaved rounds;
* **a DDP training step** of an MLP (512-1024-1024-10, batch 64), 2 ranks on gloo, **paired**: the
  ranks switch the mode together every ``--steps`` steps, in cycles of every mode in a rotating
  order, so each cycle's "on" block has an "off" block next to it in time. Per step, the wall time
  (``perf_counter``), the process's CPU time (``process_time``: every thread, the progress thread
  included) and the issuing thread's (``thread_time``). Per cycle the difference on - off; reported:
  the median of the paired differences over the median "off" step, in percent, with a percentile
  bootstrap 95% confidence interval (resampling the cycles), per rank and clock, and the worst rank.
  A fourth block per cycle, "off, again", is an A/A control: its paired difference from "off" shows
  what the method reads where the recorder costs nothing;
* **an independent estimate**: ops recorded per step (counted in the ring) x the recorder's CPU per
  op / the "off" step's median wall time. CPU per op: the record (CPU per call, backend path, "on,
  no caller" minus "off") plus, for "on", the caller's file:line timed (``thread_time``) inside
  ``--probe-steps`` real steps after the cycles -- the walk up a training step's deep stack turns
  each frame into an object, which the stub's shallow stack does not show.

The mode is switched on every backend of the process at once (``spans.RUNNERS``: ``_fr``, the
ring or None, and ``_fr_caller``): each backend reads those two attributes per op, and they are
what ``NEURAL_ARCH_FLIGHT_RECORDER_SIZE=0`` ("off") and ``NEURAL_ARCH_FLIGHT_RECORDER_CALLER=1``
("on": with the caller's file:line) give at start-up; "on, no caller" is the default. A goal judges
``JUDGED``: the upper bound of the paired overhead in the issuing thread's CPU time, in the default mode
(the recorder on, the caller's file:line off: it is opt-in).

Run::

    python benchmarks/bench_flight_recorder.py      # tables + benchmarks/results/bench_flight_recorder.json
    python benchmarks/bench_flight_recorder.py --rounds 3 --calls 500 --cycles 40    # quicker
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import mlp, print_table, write_json

MODES = ("off", "on", "on, no caller")
# the paired step cycles add a second "off" block: its paired difference from "off" (an A/A control)
# shows what the method reads where the recorder costs nothing
CONTROL = "off, again"
STEP_MODES = MODES + (CONTROL,)
SIZES = (512, 1024, 1024, 10)     # the MLP of the training step
BATCH = 64
CLOCKS = ("wall", "CPU", "thread CPU")      # perf_counter, process_time, thread_time
# what a goal judges: the dearer mode, by the CPU time of the thread that issues the ops -- where
# the recorder works (the record and the caller's walk); the process's CPU time also counts the
# progress thread's waits for the peer, which make it several times noisier
JUDGED = "thread CPU | on, no caller"   # the recorder as shipped: always on, the caller's file:line opt-in
CONFIDENCE = 0.95
WARMUP_CYCLES = 2


def _saved_modes():
    """A function that puts back every backend's recorder attributes and the process's ring as they
    are now (a benchmark run inside a test process leaves it as it found it)."""
    from neural_arch.distributed.comm import spans
    from neural_arch.distributed.flight_recorder import buffer

    ring = buffer.RECORDER.ring
    saved = [(runner, runner._fr, runner._fr_caller) for runner in list(spans.RUNNERS)]

    def restore() -> None:
        buffer.RECORDER.ring = ring
        for runner, fr, fr_caller in saved:
            runner._fr, runner._fr_caller = fr, fr_caller
    return restore


def _set_mode(mode: str) -> None:
    from neural_arch.distributed.comm import spans
    from neural_arch.distributed.flight_recorder import buffer

    ring = buffer.RECORDER.ring
    if ring is None:                       # started with size 0: give the "on" modes a ring
        ring = buffer.RECORDER.ring = buffer.FlightRecorder(size=2000).ring
    for runner in list(spans.RUNNERS):
        runner._fr = None if mode.startswith("off") else ring
        runner._fr_caller = buffer.caller if mode == "on" else buffer._no_caller


def paired_overhead(off: list, on: list, resamples: int = 2000, seed: int = 0) -> dict:
    """The median of the paired differences ``on[i] - off[i]`` over the median of ``off``, percent,
    with a percentile bootstrap confidence interval (the pairs resampled with replacement).

    >>> r = paired_overhead([10.0, 11.0, 10.0, 12.0], [10.1, 11.1, 10.1, 12.1])
    >>> round(r["median_pct"], 6), r["pairs"], r["ci_pct"][0] <= r["median_pct"] <= r["ci_pct"][1]
    (0.952381, 4, True)
    """
    import numpy as np

    off_a, on_a = np.asarray(off, float), np.asarray(on, float)
    if off_a.shape != on_a.shape or off_a.size == 0:
        raise ValueError("paired_overhead needs two equally long, non-empty lists")
    diffs = on_a - off_a
    base = float(np.median(off_a))
    rng = np.random.default_rng(seed)
    boot = np.median(diffs[rng.integers(0, diffs.size, size=(resamples, diffs.size))], axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(boot, [tail, 100 - tail])
    return {"median_pct": 100 * float(np.median(diffs)) / base,
            "ci_pct": [100 * float(lo) / base, 100 * float(hi) / base],
            "confidence": CONFIDENCE, "pairs": int(diffs.size), "off_median_s": base}


def cpu_per_call(rounds: int, calls: int) -> dict:
    """Median CPU seconds per 1 KiB all_reduce (engine stubbed), per path and mode."""
    import numpy as np
    from bench_small_messages import _stub_backend, _tensor_api

    from neural_arch.distributed.state import STATE

    restore = _saved_modes()
    backend = _stub_backend()
    x = np.zeros(256, np.float32)
    saved = STATE.world
    try:
        paths = {"backend": lambda: backend.allreduce(x), "Tensor API": _tensor_api(backend)}
        runs = {(p, m): [] for p in paths for m in MODES}
        for r in range(rounds + 1):              # the first round warms up and is dropped
            for mode in MODES[r % 3:] + MODES[:r % 3]:
                _set_mode(mode)
                for p, fn in paths.items():
                    t0 = time.thread_time()
                    for _ in range(calls):
                        fn()
                    runs[(p, mode)].append((time.thread_time() - t0) / calls)
    finally:
        STATE.world = saved
        restore()
    return {f"{p} | {m}": statistics.median(v[1:]) for (p, m), v in runs.items()}


def _ring_ops() -> int:
    """How many records the ring has taken so far (the highest op index + 1)."""
    from neural_arch.distributed.flight_recorder import buffer

    ring = buffer.RECORDER.ring
    return 1 + max(slot[buffer.INDEX] for slot in ring.slots)


def _timed_caller(spent: list):
    """``buffer.caller`` that adds the calling thread's CPU seconds it took, less the clock's own
    cost, to ``spent[0]`` and counts the calls in ``spent[1]``: the caller's file:line where the
    training step really issues its ops (a deep stack, whose frames the walk turns into objects)."""
    from neural_arch.distributed.flight_recorder import buffer

    clock, caller = time.thread_time, buffer.caller
    t = clock()
    for _ in range(1000):
        clock()
    reading = (clock() - t) / 1000          # one reading of the clock, as counted below

    def timed(depth: int = 2) -> tuple:
        t0 = clock()
        found = caller(depth + 1)           # + 1: this frame is not the user's
        spent[0] += clock() - t0 - reading
        spent[1] += 1
        return found
    return timed


def ranks_fn(rounds: int, calls: int, cycles: int, steps: int, probe_steps: int = 20) -> dict:
    """On each of 2 ranks: 1 KiB all_reduce latency per mode (interleaved rounds), then the DDP step's
    wall and CPU times per mode in paired cycles (each cycle: ``steps`` steps of every mode)."""
    import numpy as np

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor, manual_seed

    manual_seed(0)
    ddp = dist.DistributedDataParallel(mlp(SIZES), bucket_cap_mb=1)
    opt = optim.SGD(ddp.parameters(), lr=0.01)
    rng = np.random.default_rng(dist.get_rank())
    X = Tensor(rng.normal(size=(BATCH, SIZES[0])).astype(np.float32))
    y = rng.integers(0, SIZES[-1], size=BATCH)
    small = Tensor(np.zeros(256, np.float32))

    def step():
        loss = F.cross_entropy(ddp(X), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    restore = _saved_modes()
    latency = {m: [] for m in MODES}
    for r in range(rounds + 1):
        for mode in MODES[r % 3:] + MODES[:r % 3]:      # a rotating order: no mode always runs first
            _set_mode(mode)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(small)
            if r:                                  # round 0 warms up
                latency[mode].append((time.perf_counter() - t0) / calls)

    # Both ranks follow the same schedule, and every step all-reduces, so they switch together.
    clocks = (time.perf_counter, time.process_time, time.thread_time)
    per_cycle = {c: {m: [] for m in STEP_MODES} for c in CLOCKS}
    ops = {m: [] for m in STEP_MODES}
    dist.barrier()
    n = len(STEP_MODES)
    for c in range(cycles + WARMUP_CYCLES):
        for mode in STEP_MODES[c % n:] + STEP_MODES[:c % n]:
            _set_mode(mode)
            ops_before = _ring_ops()
            t0 = [clock() for clock in clocks]
            for _ in range(steps):
                step()
            t1 = [clock() for clock in clocks]
            if c >= WARMUP_CYCLES:
                for name, a, b in zip(CLOCKS, t0, t1):
                    per_cycle[name][mode].append((b - a) / steps)
                ops[mode].append((_ring_ops() - ops_before) / steps)

    # the independent estimate's part the stubbed per-call measure cannot see: the caller's file:line
    # walks this step's stack, not the stub's shallow one (after the cycles, so it cannot disturb them)
    from neural_arch.distributed.comm import spans

    _set_mode("on")
    spent = [0.0, 0]
    timed = _timed_caller(spent)
    for runner in list(spans.RUNNERS):
        runner._fr_caller = timed
    for _ in range(probe_steps):
        step()
    restore()
    return {"all_reduce 1 KiB": {m: statistics.median(v) for m, v in latency.items()},
            "training step": per_cycle,
            "ops_per_step": {m: statistics.median(ops[m]) for m in MODES[1:]},
            "caller_cpu_per_op_s": spent[0] / max(spent[1], 1)}


def summarize(cpu: dict, per_rank: list) -> dict:
    """The paired overheads per rank, clock and mode; the job's worst rank; the per-op estimate."""
    paired = []
    for rank in per_rank:
        cycles = rank["training step"]
        paired.append({f"{clock} | {mode}": paired_overhead(cycles[clock]["off"], cycles[clock][mode])
                       for clock in CLOCKS for mode in STEP_MODES[1:]})
    # a collective job goes at its slowest rank's pace: the upper bound that counts is the worst rank's
    worst_rank = {key: max((p[key] for p in paired), key=lambda r: r["ci_pct"][1]) for key in paired[0]}
    step_s = max(statistics.median(r["training step"]["wall"]["off"]) for r in per_rank)
    # per op: the record (stubbed per-call measure, without the caller), plus for "on" the caller's
    # file:line as measured inside the step
    record = cpu["backend | on, no caller"] - cpu["backend | off"]
    caller = max(r["caller_cpu_per_op_s"] for r in per_rank)
    estimate = {}
    for mode in MODES[1:]:
        per_op = record + (caller if mode == "on" else 0.0)
        ops = max(r["ops_per_step"][mode] for r in per_rank)
        estimate[mode] = {"ops_per_step": ops, "cpu_per_op_s": per_op, "record_cpu_s": record,
                          "caller_cpu_s": per_op - record, "pct_of_step": 100 * ops * per_op / step_s}
    return {"paired_per_rank": paired, "paired": worst_rank, "step_off_s": step_s,
            "per_op_estimate": estimate}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11,
                    help="interleaved rounds of the per-call measures (median)")
    ap.add_argument("--calls", type=int, default=2000, help="all_reduces per round and mode")
    ap.add_argument("--cycles", type=int, default=800,
                    help="paired cycles of the training step (each: every mode)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per mode in a cycle")
    ap.add_argument("--probe-steps", type=int, default=20,
                    help="steps timing the caller's file:line inside the step")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_flight_recorder.json"))
    args = ap.parse_args(argv)

    from neural_arch.distributed.testing import RankPool

    cpu = cpu_per_call(args.rounds, max(args.calls, 2000) * 5)
    with RankPool(2, backend="gloo", timeout=1800, env={"NEURAL_ARCH_GLOO_TRANSPORT": "shm"}) as pool:
        per_rank = pool.run(ranks_fn, args.rounds, args.calls, args.cycles, args.steps, args.probe_steps)
    summary = summarize(cpu, per_rank)
    # the slower rank sets the pace of a collective job
    multi = {f"all_reduce 1 KiB | {m}": max(r["all_reduce 1 KiB"][m] for r in per_rank) for m in MODES}
    for m in MODES:
        walls = (statistics.median(r["training step"]["wall"][m]) for r in per_rank)
        multi[f"training step | {m}"] = max(walls)

    rows = []
    for what, table, unit in (("backend", cpu, "CPU"), ("Tensor API", cpu, "CPU"),
                              ("all_reduce 1 KiB", multi, "latency"), ("training step", multi, "step, wall")):
        off = table[f"{what} | off"]
        for mode in MODES:
            v = table[f"{what} | {mode}"]
            rows.append((f"{what} ({unit})", mode, round(v * 1e6, 3), f"{100 * (v / off - 1):+.1f}%"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"\nflight recorder overhead, median of {args.rounds} interleaved rounds (us; vs off); "
          f"load average {load} on {os.cpu_count()} CPUs")
    print_table(rows, ("measure", "recorder", "us", "vs off"))

    pct = int(100 * CONFIDENCE)
    rows = []
    for key, r in summary["paired"].items():
        clock, mode = key.split(" | ")
        lo, hi = r["ci_pct"]
        judged = " (judged)" if key == JUDGED else ""
        rows.append((clock + judged, mode, f"{r['median_pct']:+.2f}%", f"[{lo:+.2f}%, {hi:+.2f}%]"))
    for mode, e in summary["per_op_estimate"].items():
        rows.append((f"estimate: {e['ops_per_step']:g} ops x {1e6 * e['cpu_per_op_s']:.2f} us CPU", mode,
                     f"{e['pct_of_step']:+.2f}%", ""))
    print(f"\ntraining step ({1e3 * summary['step_off_s']:.1f} ms off), {args.cycles} paired cycles of "
          f"{args.steps} steps per mode: median of the paired differences vs off, worst rank by its "
          f"upper bound; estimate: ops per step x CPU per op / step")
    print_table(rows, ("clock", "recorder", "median", f"{pct}% interval"))
    path = write_json(args.out, {"load_average": load, "rounds": args.rounds, "calls": args.calls,
                                 "cycles": args.cycles, "steps": args.steps, "probe_steps": args.probe_steps,
                                 "judged": JUDGED, "cpu_per_call_s": cpu, "two_ranks_s": multi, **summary,
                                 "per_rank_s": per_rank})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
