"""What the always-on flight recorder costs: a small all_reduce and a training step, recorder off
(size 0), on, and on without the caller's file:line, interleaved in one run.

Three measurements, each with the three modes in interleaved rounds, in a rotating order (the
machine's slow phases hit every mode alike; the median of the rounds is reported; the load average
is printed, since on a busy machine the two-rank figures move by more than the recorder costs):

* **CPU per call** (one process): the Python path of a 1 KiB float32 all_reduce on gloo's direct
  path with the engine stubbed out (``bench_small_messages.py --overhead``'s set-up), through the
  backend and through the Tensor API -- the recorder's own cost, without the noise of a peer;
* **1 KiB all_reduce latency**, 2 ranks on gloo over shared memory, Tensor API;
* **a DDP training step** of an MLP (512-1024-1024-10, batch 64: 10-25 ms per step on 2 ranks of
  the 2-core development machine, depending on its load), 2 ranks on gloo.

The mode is switched on every backend of the process at once (``spans.RUNNERS``: ``_fr``, the
ring or None, and ``_fr_caller``), which is what ``NEURAL_ARCH_FLIGHT_RECORDER_SIZE=0`` ("off") and
``NEURAL_ARCH_FLIGHT_RECORDER_CALLER=1`` ("on": with the caller's file:line) give at start-up; "on, no
caller" is the default.

Run::

    python benchmarks/bench_flight_recorder.py                  # table + benchmarks/results/bench_flight_recorder.json
    python benchmarks/bench_flight_recorder.py --rounds 5 --steps 20 --calls 1000    # quicker
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
SIZES = (512, 1024, 1024, 10)     # the MLP of the training step
BATCH = 64


def _set_mode(mode: str) -> None:
    from neural_arch.distributed.comm import spans
    from neural_arch.distributed.flight_recorder import buffer

    ring = buffer.RECORDER.ring
    if ring is None:                       # started with size 0: give the "on" modes a ring
        ring = buffer.RECORDER.ring = buffer.FlightRecorder(size=2000).ring
    for runner in list(spans.RUNNERS):
        runner._fr = None if mode == "off" else ring
        runner._fr_caller = buffer.caller if mode == "on" else buffer._no_caller


def cpu_per_call(rounds: int, calls: int) -> dict:
    """Median CPU microseconds per 1 KiB all_reduce (engine stubbed), per path and mode."""
    import numpy as np
    from bench_small_messages import _stub_backend, _tensor_api

    from neural_arch.distributed.state import STATE

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
        _set_mode("on")
    return {f"{p} | {m}": statistics.median(v[1:]) for (p, m), v in runs.items()}


def ranks_fn(rounds: int, calls: int, steps: int) -> dict:
    """On each of 2 ranks: 1 KiB all_reduce latency and DDP step time per mode, interleaved rounds."""
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

    out = {f"{what} | {m}": [] for what in ("all_reduce 1 KiB", "training step") for m in MODES}
    for r in range(rounds + 1):
        for mode in MODES[r % 3:] + MODES[:r % 3]:      # a rotating order: no mode always runs first
            _set_mode(mode)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(small)
            lat = (time.perf_counter() - t0) / calls
            dist.barrier()
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            if r:                                  # round 0 warms up
                out[f"all_reduce 1 KiB | {mode}"].append(lat)
                out[f"training step | {mode}"].append(statistics.median(times))
    _set_mode("on")
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds (median taken)")
    ap.add_argument("--calls", type=int, default=2000, help="all_reduces per round and mode")
    ap.add_argument("--steps", type=int, default=30, help="training steps per round and mode")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_flight_recorder.json"))
    args = ap.parse_args(argv)

    from neural_arch.distributed.testing import RankPool

    cpu = cpu_per_call(args.rounds, max(args.calls, 2000) * 5)
    with RankPool(2, backend="gloo", timeout=1800, env={"NEURAL_ARCH_GLOO_TRANSPORT": "shm"}) as pool:
        per_rank = pool.run(ranks_fn, args.rounds, args.calls, args.steps)
    # the slower rank sets the pace of a collective job
    multi = {k: max(r[k] for r in per_rank) for k in per_rank[0]}

    rows = []
    for what, table, unit in (("backend", cpu, "CPU"), ("Tensor API", cpu, "CPU"),
                              ("all_reduce 1 KiB", multi, "latency"), ("training step", multi, "step")):
        off = table[f"{what} | off"]
        for mode in MODES:
            v = table[f"{what} | {mode}"]
            rows.append((f"{what} ({unit})", mode, round(v * 1e6, 3), f"{100 * (v / off - 1):+.1f}%"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"\nflight recorder overhead, median of {args.rounds} interleaved rounds (us; vs off); "
          f"load average {load} on {os.cpu_count()} CPUs")
    print_table(rows, ("measure", "recorder", "us", "vs off"))
    path = write_json(args.out, {"load_average": load, "rounds": args.rounds, "calls": args.calls, "steps": args.steps,
                                 "cpu_per_call_s": cpu, "two_ranks_s": multi, "per_rank_s": per_rank})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
