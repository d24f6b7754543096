"""Per-call overhead of small all_reduces: the Tensor API, the backend, raw MPI, a local copy.

For each backend (``gloo`` over real processes and loopback, ``mpi`` under a real ``mpiexec``)
and each size from 8 B to 16 KiB, every rank times, in interleaved rounds (so load from other
processes on a shared machine hits every contender alike):

* ``tensor``  -- ``neural_arch.distributed.all_reduce(Tensor)``: what training code calls;
* ``backend`` -- ``group.backend.allreduce(array)``: the comm layer without the Tensor API;
* ``mpi4py``  -- raw ``comm.Allreduce(MPI.IN_PLACE, array)`` (``mpi`` and ``gloo+mpi4py`` runs): the floor;
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
one does, and moves nothing), ``backend.allreduce(1 KiB float32)`` and ``dist.all_reduce(Tensor)``
over it, timed in CPU time, with and without the stall inspector that ``init_process_group`` starts;
and the real direct engine alone, its peer always arrived already. No peer process, no waiting, no
scheduler: the numbers that stay put on a loaded machine when comparing two versions of the comm
layer. ``--overhead --against DIR`` runs the same in another checkout (the version before a change:
``mkdir DIR && git archive HEAD | tar -x -C DIR``) and in this one, alternating, and prints both.
``--against DIR`` without ``--overhead`` does that for the multi-process latencies: ``--repeat`` jobs of
each tree, alternating, each job timing its own MPICH in the same rounds; it prints the median over jobs
of each tree's ratio to MPICH (the ratio, not the latency, is what stays comparable under load).

Usage::

    python benchmarks/bench_small_messages.py                       # 2 ranks, gloo and mpi
    python benchmarks/bench_small_messages.py --ranks 1 --profile   # a world of one, with a profile
    python benchmarks/bench_small_messages.py --backends mpi --rounds 15
    python benchmarks/bench_small_messages.py --backends gloo+mpi4py   # gloo vs raw MPICH, same rounds
    python benchmarks/bench_small_messages.py --overhead               # the Python path alone
    python benchmarks/bench_small_messages.py --overhead --against /tmp/before --repeat 6
    python benchmarks/bench_small_messages.py --backends gloo+mpi4py --against /tmp/before --repeat 6
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
# --against runs this very script with another checkout's neural_arch first on the path
if os.environ.get("BENCH_LIB_ROOT"):
    sys.path.insert(0, os.environ["BENCH_LIB_ROOT"])

from benchmarks.common import format_table, json_lines, run_processes, thread_env, write_json
from neural_arch.distributed.testing import free_port, mpiexec_path


def _has_mpiexec() -> bool:
    try:
        return bool(mpiexec_path())
    except Exception:  # noqa: BLE001 - no MPI here: the mpi rows are skipped
        return False

SIZES = [8, 64, 256, 1 << 10, 4 << 10, 16 << 10]
BACKENDS = ("gloo", "mpi")
#: gloo ranks started by mpiexec, timing raw mpi4py in the same interleaved rounds: the gloo/MPICH ratio
#: with both under the same load (``--backends gloo+mpi4py``)
VERSUS = "gloo+mpi4py"


def _label(nbytes: int) -> str:
    return f"{nbytes >> 10} KiB" if nbytes >= 1024 else f"{nbytes} B"


# -- the rank side -------------------------------------------------------------------------------
def worker(args) -> None:
    import numpy as np

    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.resolve import _resolve_group

    raw = None
    if args.worker in ("mpi", VERSUS):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD.Dup()
        raw = lambda x: comm.Allreduce(MPI.IN_PLACE, x)
    if args.worker == VERSUS:   # gloo ranks started by mpiexec: gloo and raw MPICH in the same rounds
        dist.init_process_group(backend="gloo", rank=comm.Get_rank(), world_size=comm.Get_size(), timeout=120)
    else:
        dist.init_process_group(backend=args.worker, timeout=120)
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = _resolve_group(None, "bench").backend
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
def _stub_backend():
    """A 2-rank GlooBackend whose direct engine reads what the real one reads per op and moves nothing."""
    import numpy as np

    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.comm.work import ReduceOp

    # the engine's one table lookup per op, built here so that --against runs trees where the table
    # lives elsewhere
    ufuncs = {op: np.add for op in ReduceOp}

    class Segment:
        def poison(self, why):
            pass

    class StubEngine:            # what DirectCollectives.all_reduce reads per op, and nothing else
        seg = Segment()

        def all_reduce(self, array, op, info, root=-1):
            info.wire, ufuncs[op]

        def close(self):
            pass

    class StubTransport:
        _abort = None

        def peer_kind(self, peer):
            return "shm"

        def close(self):
            pass

    return GlooBackend(StubTransport(), 0, 2, timeout=30.0, direct=StubEngine())


def _tensor_api(backend):
    """``dist.all_reduce(Tensor)`` over ``backend`` as the default group (state restored by the caller)."""
    import numpy as np

    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.process_group import FLAT_ALWAYS, ProcessGroup
    from neural_arch.distributed.state import STATE

    pg = ProcessGroup(backend, [0, 1], "gloo", "bench", 0)
    pg._hierarchical_min_bytes = FLAT_ALWAYS        # one host: what a group decides on its first call
    STATE.world = pg
    t = Tensor(np.zeros(256, np.float32))
    return lambda: dist.all_reduce(t)


def _engine_call():
    """The real direct engine's small all_reduce (1 KiB, 2 ranks) with the peer already arrived: rank 1's
    arrival epoch is set far ahead and its op words mirror rank 0's, so every barrier completes at once
    and the check passes -- the engine's own CPU per op, no waiting. None if the segment's layout moved."""
    import mmap

    import numpy as np

    from neural_arch.distributed.comm.gloo.shm_direct import DirectCollectives
    from neural_arch.distributed.comm.gloo.transport import shm_segment as S
    from neural_arch.distributed.comm.work import OpInfo, ReduceOp

    try:
        chunk = 64 << 10
        nbytes = S.ShmSegment.nbytes_for(2, chunk, S.SMALL_BYTES)
        mm = mmap.mmap(-1, nbytes)
        hdr = memoryview(mm).cast("q")
        hdr[0], hdr[1], hdr[2], hdr[3] = S._MAGIC, 2, chunk, S.SMALL_BYTES
        hdr.release()
        seg, peer = S.ShmSegment(mm, 0, 2, [0, 1]), S.ShmSegment(mm, 1, 2, [0, 1])
        x = np.zeros(256, np.float32)
        info = OpInfo("all_reduce", 5, [0, 1], 0, x.shape, "float32", None, "sum", time.monotonic() + 1e9)
        info.wire = info.wire                       # the same op every call: the peer's words stay valid
        for parity in (0, 1):
            peer.announce(parity, info.wire, x.nbytes, -1)
        seg._q[seg._arrive[1]] = 1 << 60
        engine = DirectCollectives(seg)
        engine.all_reduce(x, ReduceOp.SUM, info)   # raises here if the set-up no longer fits the segment
    except Exception as exc:  # noqa: BLE001 - a benchmark row, not a test: say why it is missing
        print(f"(engine row skipped: {type(exc).__name__}: {exc})")
        return None
    op = ReduceOp.SUM
    return lambda: engine.all_reduce(x, op, info)


def overhead(args) -> dict:
    """CPU microseconds per 1 KiB all_reduce on gloo's direct path: the Python around the engine (engine
    stubbed out), through the backend and through the Tensor API, without and with the stall inspector;
    and the real engine alone with a peer that has always arrived already."""
    import numpy as np

    from neural_arch.distributed.stall import StallInspector
    from neural_arch.distributed.state import STATE

    backend = _stub_backend()
    x = np.zeros(256, np.float32)
    saved = STATE.world
    rows = {"no observer": lambda: backend.allreduce(x)}
    try:
        tensor = _tensor_api(backend)
    except Exception as exc:  # noqa: BLE001 - an older tree without one of the names above
        print(f"(Tensor API rows skipped: {type(exc).__name__}: {exc})")
        tensor = None
    engine = _engine_call()
    calls = max(args.calls, 2000) * 10

    def per_call(fn) -> float:
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        return (time.thread_time() - t0) / calls

    out = {}
    try:
        for watched in (False, True):
            inspector = StallInspector(warning_s=60.0, store=None, rank=0).start() if watched else None
            fns = {"stall inspector" if watched else "no observer": rows["no observer"]}
            if tensor is not None:
                fns["Tensor API, stall inspector" if watched else "Tensor API, no observer"] = tensor
            if engine is not None and not watched:
                fns["engine alone (peer pre-arrived)"] = engine
            runs: dict = {label: [] for label in fns}
            for fn in fns.values():
                per_call(fn)                                 # warm-up
            for _ in range(args.rounds):                     # interleaved rounds
                for label, fn in fns.items():
                    runs[label].append(per_call(fn))
            if inspector is not None:
                inspector.stop()
            out.update({label: {"min": min(v), "median": statistics.median(v)} for label, v in runs.items()})
    finally:
        STATE.world = saved
    return out


def against(args) -> dict:
    """``--overhead`` with this tree's library and with ``--against DIR``'s (another checkout: the version
    before a change), in alternating subprocesses of this script, ``--repeat`` times each:
    {tree: {label: [median per run]}}."""
    import subprocess
    import tempfile

    trees = {"before": os.path.abspath(args.against), "after": ROOT}
    runs: dict = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
                out = os.path.join(tmp, f"{name}{i}", "bench_small_messages.json")
                # this script, the other tree's library: the same harness measures both
                env = dict(thread_env(1), BENCH_LIB_ROOT=tree)
                subprocess.run([sys.executable, os.path.abspath(__file__), "--overhead", "--rounds", str(args.rounds),
                                "--out", out], cwd=tree, env=env, check=True, capture_output=True, timeout=args.timeout)
                with open(out.replace("bench_small_messages.json", "bench_small_messages_overhead.json")) as f:
                    for label, v in json.load(f)["overhead_s"].items():
                        runs[name].setdefault(label, []).append(v["median"])
    return {"trees": trees, "runs": runs}


def against_latency(args) -> dict:
    """The multi-process benchmark with this tree's library and with ``--against DIR``'s, ``--repeat`` jobs of
    each, alternating: {tree: {kind: [merged results per job]}} (the worker puts ``BENCH_LIB_ROOT`` first)."""
    trees = {"before": os.path.abspath(args.against), "after": ROOT}
    runs: dict = {name: {} for name in trees}
    saved = os.environ.get("BENCH_LIB_ROOT")
    try:
        for i in range(args.repeat):
            for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
                os.environ["BENCH_LIB_ROOT"] = tree
                for kind in args.backends.split(","):
                    reports = run_backend(kind, args)
                    merged = {key: max(r["results"][key] for r in reports) for key in reports[0]["results"]}
                    runs[name].setdefault(kind, []).append(merged)
            print(f"job pair {i + 1}/{args.repeat} done", flush=True)
    finally:
        if saved is None:
            os.environ.pop("BENCH_LIB_ROOT", None)
        else:
            os.environ["BENCH_LIB_ROOT"] = saved
    return {"trees": trees, "runs": runs}


def _print_against_latency(result, args) -> None:
    med = statistics.median
    for kind in args.backends.split(","):
        before, after = result["runs"]["before"].get(kind), result["runs"]["after"].get(kind)
        if not before or not after:
            continue
        raw = all(f"mpi4py:{s}" in m for s in args.sizes for m in before + after)
        rows = []
        for s in args.sizes:
            row = [_label(s)]
            for runs in (before, after):
                for path in ("tensor", "backend"):
                    key = f"{path}:{s}"
                    if raw:    # the median over jobs of each job's ratio to its own MPICH
                        row.append(f"{med([m[key] / m[f'mpi4py:{s}'] for m in runs]):.2f}")
                    else:
                        row.append(f"{med([m[key] for m in runs]) * 1e6:.2f}")
            rows.append(row)
        unit = "ratio to MPICH (same job)" if raw else f"{args.stat} latency us"
        print(f"\nall_reduce on {kind}, {args.ranks} rank(s), float32, {unit}: median over {args.repeat} "
              f"alternating jobs per tree (before: {result['trees']['before']})")
        print(format_table(rows, ["size", "tensor before", "backend before", "tensor after", "backend after"]))


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
    elif kind == VERSUS:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
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
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="compare with another checkout (e.g. `git archive HEAD` unpacked in DIR), alternating "
                         "runs of the two: the --overhead rows, or (without it) the multi-process latencies")
    ap.add_argument("--repeat", type=int, default=6, help="with --against: runs of each tree")
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in args.size_list.split(",")]
    if args.worker:
        return worker(args)
    if args.overhead and args.against:
        result = against(args)
        runs = result["runs"]
        labels = list(dict.fromkeys([*runs["after"], *runs["before"]]))
        rows = []
        for label in labels:
            b, a = runs["before"].get(label), runs["after"].get(label)
            mb = statistics.median(b) if b else None
            ma = statistics.median(a) if a else None
            # the least disturbed run too: on a shared machine runs are bimodal (a core of its own or not)
            lb, la = (min(b) if b else None), (min(a) if a else None)
            rows.append([label, f"{mb * 1e6:.2f}" if mb else "-", f"{ma * 1e6:.2f}" if ma else "-",
                         f"{ma / mb:.2f}" if ma and mb else "-", f"{lb * 1e6:.2f}" if lb else "-",
                         f"{la * 1e6:.2f}" if la else "-", f"{la / lb:.2f}" if la and lb else "-"])
        print(f"1 KiB float32 all_reduce, CPU us per call: median (and min) over {args.repeat} alternating runs of "
              f"the median of {args.rounds} rounds (before: {result['trees']['before']})")
        print(format_table(rows, ["path", "before", "after", "after/before", "min before", "min after",
                                  "min after/before"]))
        out = args.out.replace("bench_small_messages.json", "bench_small_messages_overhead_ab.json")
        print(f"\nwrote {write_json(out, dict(result, rounds=args.rounds, repeat=args.repeat))}")
        return None
    if args.against:
        result = against_latency(args)
        _print_against_latency(result, args)
        out = args.out.replace("bench_small_messages.json", "bench_small_messages_ab.json")
        payload = dict(result, rounds=args.rounds, repeat=args.repeat, ranks=args.ranks, sizes=args.sizes,
                       command="python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:])))
        print(f"\nwrote {write_json(out, payload)}")
        return None
    if args.overhead:
        result = overhead(args)
        rows = [[label, f"{v['min'] * 1e6:.2f}", f"{v['median'] * 1e6:.2f}"] for label, v in result.items()]
        print("1 KiB float32 all_reduce on gloo's direct path, CPU us per call (the Python rows: engine stubbed)")
        print(format_table(rows, ["path, observers", "min", "median"]))
        out = args.out.replace("bench_small_messages.json", "bench_small_messages_overhead.json")
        print(f"\nwrote {write_json(out, {'rounds': args.rounds, 'overhead_s': result})}")
        return None

    payload = {"ranks": args.ranks, "sizes": args.sizes, "rounds": args.rounds, "calls": args.calls, "stat": args.stat,
               "clock": args.clock,
               "results": {}, "skipped": {}, "profiles": {},
               "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:]))}
    for kind in args.backends.split(","):
        if kind in ("mpi", VERSUS) and (not _has_mpiexec() or __import__("importlib").util.find_spec("mpi4py") is None):
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
