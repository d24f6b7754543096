"""Per-call overhead of small all_reduces: the Tensor API, the backend, raw MPI, a local copy.

For each backend (``gloo`` over real processes and loopback, ``mpi`` under a real ``mpiexec``)
and each size from 8 B to 16 KiB, every rank times, in interleaved rounds (so load from other
processes on a shared machine hits every contender alike):

* ``tensor``  -- ``neural_arch.distributed.all_reduce(Tensor)``: what training code calls;
* ``backend`` -- ``group.backend.allreduce(array)``: the comm layer without the Tensor API;
* ``mpi4py``  -- raw ``comm.Allreduce(MPI.IN_PLACE, array)`` (``mpi`` runs only): the floor;
* ``copy``    -- ``np.copyto`` of the same bytes on one rank: what moving them locally costs.

A collective is done when its slowest rank is: each cell is the max over ranks of that rank's
median over rounds. ``tensor/raw`` and ``backend/raw`` are the ratios to raw mpi4py in the same
run. ``--profile`` adds a cProfile of 2000 Tensor-API calls of 1 KiB on rank 0 (top functions by
own time). ``--clock cpu`` times each rank's own CPU time per call (``time.thread_time``) instead of
wall time: on an oversubscribed machine (more runnable processes than cores) a wall-clock latency
is mostly the scheduler, while the CPU time of a rank whose waits sleep is what the code itself
costs -- compare versions with it, not contenders (MPICH busy-polls, so its CPU time includes its
waiting). Results go to ``benchmarks/results/bench_small_messages.json``.

``--overhead`` measures only the Python around the shared-memory engine, in one process: a 2-rank
``GlooBackend`` whose direct engine is a stub (it reads the op's check word and reduction, as the real
one does, and moves nothing), ``backend.allreduce(1 KiB float32)`` timed in CPU time, with and
without the stall inspector that ``init_process_group`` starts. No peer, no barrier, no scheduler:
the number that stays put on a loaded machine when comparing two versions of the comm layer.

Usage::

    python benchmarks/bench_small_messages.py                       # 2 ranks, gloo and mpi
    python benchmarks/bench_small_messages.py --ranks 1 --profile   # a world of one, with a profile
    python benchmarks/bench_small_messages.py --backends mpi --rounds 15
    python benchmarks/bench_small_messages.py --overhead               # the Python path alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks._common import format_table, json_lines, run_processes, thread_env, write_json
from neural_arch.distributed.testing import free_port, mpiexec_path


def _has_mpiexec() -> bool:
    try:
        return bool(mpiexec_path())
    except Exception:  # noqa: BLE001 - no MPI here: the mpi rows are skipped
        return False

SIZES = [8, 64, 256, 1 << 10, 4 << 10, 16 << 10]
BACKENDS = ("gloo", "mpi")


def _label(nbytes: int) -> str:
    return f"{nbytes >> 10} KiB" if nbytes >= 1024 else f"{nbytes} B"


# -- the rank side -------------------------------------------------------------------------------
def worker(args) -> None:
    import numpy as np

    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.groups import _resolve_group

    dist.init_process_group(backend=args.worker, timeout=120)
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = _resolve_group(None, "bench").backend
    raw = None
    if args.worker == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD.Dup()
        raw = lambda x: comm.Allreduce(MPI.IN_PLACE, x)
    sync = backend.barrier

    def make(kind, nbytes):
        n = max(1, nbytes // 4)
        x = np.zeros(n, np.float32)          # zeros: repeated sums never overflow
        if kind == "tensor":
            t = Tensor(x)
            return lambda: dist.all_reduce(t)
        if kind == "backend":
            return lambda: backend.allreduce(x)
        if kind == "mpi4py":
            return lambda: raw(x)
        src = np.ones(n, np.float32)
        return lambda: np.copyto(x, src)

    kinds = ["tensor", "backend"] + (["mpi4py"] if raw is not None else []) + ["copy"]
    fns = {(k, s): make(k, s) for k in kinds for s in args.sizes}
    for fn in fns.values():                 # warm-up: first-call costs, page faults
        for _ in range(50):
            fn()
    times: dict = {key: [] for key in fns}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    for _ in range(args.rounds):
        for key, fn in fns.items():
            sync()
            t0 = clock()
            for _ in range(args.calls):
                fn()
            times[key].append((clock() - t0) / args.calls)
    pick = min if args.stat == "min" else statistics.median
    results = {f"{k}:{s}": pick(v) for (k, s), v in times.items()}
    profile = None
    if args.profile:
        import cProfile
        import io
        import pstats

        t = Tensor(np.zeros(256, np.float32))
        sync()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            dist.all_reduce(t)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        profile = out.getvalue()
    sync()
    report = {"rank": rank, "world": world, "results": results, "profile": profile if rank == 0 else None}
    lines = dist.all_gather_object([None] * world, json.dumps(report)) if world > 1 else [json.dumps(report)]
    dist.destroy_process_group()
    if rank == 0:  # one writer: mpiexec can interleave two ranks' lines mid-line
        for line in lines:
            print(line, flush=True)


# -- the Python path alone -----------------------------------------------------------------------------
def overhead(args) -> dict:
    """CPU microseconds per ``backend.allreduce`` of 1 KiB on gloo's direct path, engine stubbed out."""
    import numpy as np

    from neural_arch.distributed.comm.algorithms.executor import _UFUNCS
    from neural_arch.distributed.comm.gloo import GlooBackend
    from neural_arch.distributed.stall import StallInspector

    class Segment:
        def poison(self, why):
            pass

    class StubEngine:            # what DirectCollectives.all_reduce reads per op, and nothing else
        seg = Segment()

        def all_reduce(self, array, op, info, root=-1):
            info.wire, _UFUNCS[op]

        def close(self):
            pass

    class StubTransport:
        _abort = None

        def peer_kind(self, peer):
            return "shm"

        def close(self):
            pass

    backend = GlooBackend(StubTransport(), 0, 2, timeout=30.0, direct=StubEngine())
    x = np.zeros(256, np.float32)
    calls = max(args.calls, 2000) * 10

    def per_call() -> float:
        f = backend.allreduce
        t0 = time.thread_time()
        for _ in range(calls):
            f(x)
        return (time.thread_time() - t0) / calls

    out = {}
    for label in ("no observer", "stall inspector"):
        inspector = StallInspector(warning_s=60.0, store=None, rank=0).start() if label != "no observer" else None
        per_call()                                   # warm-up
        runs = [per_call() for _ in range(args.rounds)]
        if inspector is not None:
            inspector.stop()
        out[label] = {"min": min(runs), "median": statistics.median(runs)}
    return out


# -- the orchestrator --------------------------------------------------------------------------------
def run_backend(kind: str, args) -> list[dict]:
    me = os.path.abspath(__file__)
    common = ["--worker", kind, "--rounds", str(args.rounds), "--calls", str(args.calls), "--stat", args.stat,
              "--clock", args.clock,
              "--size-list", ",".join(map(str, args.sizes))] + (["--profile"] if args.profile else [])
    env = thread_env(1)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("NEURAL_ARCH_BACKEND", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if kind == "mpi":
        commands = [([mpiexec_path(), "-n", str(args.ranks), sys.executable, me] + common, env)]
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.ranks))
        commands = [([sys.executable, me] + common, dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                    for r in range(args.ranks)]
    outs = run_processes(commands, args.timeout, kind)
    reports = [r for out, _ in outs for r in json_lines(out)]
    if len(reports) != args.ranks:
        raise RuntimeError(f"{kind}: {len(reports)} of {args.ranks} ranks reported:\n{outs[0][1][-3000:]}")
    return reports


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--rounds", type=int, default=11, help="interleaved timing rounds (median taken)")
    ap.add_argument("--calls", type=int, default=200, help="calls per round")
    ap.add_argument("--profile", action="store_true", help="cProfile 2000 Tensor-API calls of 1 KiB")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="per rank, over rounds: median (default), or min (the best round: on a loaded, "
                         "shared machine the least disturbed measure of what the code itself costs)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: latency per call (default); cpu: each rank's own CPU time per call (see above)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_small_messages.json"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size-list", default=",".join(map(str, SIZES)), help=argparse.SUPPRESS)
    ap.add_argument("--overhead", action="store_true",
                    help="time only the Python around the shm engine, in one process (see above)")
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in args.size_list.split(",")]
    if args.worker:
        return worker(args)
    if args.overhead:
        result = overhead(args)
        rows = [[label, f"{v['min'] * 1e6:.2f}", f"{v['median'] * 1e6:.2f}"] for label, v in result.items()]
        print("gloo backend.allreduce(1 KiB float32), direct engine stubbed: CPU us per call")
        print(format_table(rows, ["observers", "min", "median"]))
        out = args.out.replace("bench_small_messages.json", "bench_small_messages_overhead.json")
        print(f"\nwrote {write_json(out, {'rounds': args.rounds, 'overhead_s': result})}")
        return None

    payload = {"ranks": args.ranks, "sizes": args.sizes, "rounds": args.rounds, "calls": args.calls, "stat": args.stat,
               "clock": args.clock,
               "results": {}, "skipped": {}, "profiles": {},
               "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:]))}
    for kind in args.backends.split(","):
        if kind == "mpi" and (not _has_mpiexec() or __import__("importlib").util.find_spec("mpi4py") is None):
            payload["skipped"][kind] = "mpi4py or mpiexec missing"
            print(f"skip {kind}: mpi4py or mpiexec missing")
            continue
        t0 = time.monotonic()
        reports = run_backend(kind, args)
        merged = {key: max(r["results"][key] for r in reports) for key in reports[0]["results"]}
        payload["results"][kind] = merged
        prof = next((r["profile"] for r in reports if r.get("profile")), None)
        if prof:
            payload["profiles"][kind] = prof
        print(f"{kind}: done in {time.monotonic() - t0:.0f} s", flush=True)

    for kind, merged in payload["results"].items():
        raw = "mpi4py" in {k.split(":")[0] for k in merged}
        headers = ["size", "tensor us", "backend us"] + (["mpi4py us", "tensor/raw", "backend/raw"] if raw else []) + [
            "np.copyto us"]
        rows = []
        for s in args.sizes:
            t, b, c = merged[f"tensor:{s}"], merged[f"backend:{s}"], merged[f"copy:{s}"]
            row = [_label(s), f"{t * 1e6:.2f}", f"{b * 1e6:.2f}"]
            if raw:
                m = merged[f"mpi4py:{s}"]
                row += [f"{m * 1e6:.2f}", f"{t / m:.2f}", f"{b / m:.2f}"]
            rows.append(row + [f"{c * 1e6:.2f}"])
        what = "CPU time" if args.clock == "cpu" else "latency"
        print(f"\nall_reduce on {kind}, {args.ranks} rank(s), float32: slowest rank's {args.stat} {what} per call")
        print(format_table(rows, headers))
        if kind in payload["profiles"]:
            print(f"\ncProfile of 2000 Tensor-API all_reduce(1 KiB) calls on rank 0 ({kind}):")
            print(payload["profiles"][kind])
    path = write_json(args.out, payload)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
