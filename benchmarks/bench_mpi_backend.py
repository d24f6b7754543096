"""neural_arch's MPI backend against raw mpi4py, interleaved in one ``mpiexec`` job.

``bench_collectives.py --contenders mpi,mpi4py`` runs the two contenders one after the other,
in separate jobs: on a shared machine a burst of load during one of them skews the ratio. Here
the same ranks alternate the two every round (backend, raw, raw, backend, ...: the order flips every
round) at every size, so both see the same load; the ratio is taken per size from the medians over
rounds.

Every cell also has its CPU time (``time.process_time`` over the same calls: every thread of the rank,
MPICH's and the backend's watchdog included) beside its wall time. CPU close to wall means the
contender computes or spins (MPICH's shared-memory progress spins while it waits); CPU far below wall
means it sleeps, and then the figure measures the machine's wake-ups more than either library. The JSON
keeps every round of every rank (``rounds_per_rank``), the commit and the load average before and after.

Contenders: ``mpi`` = ``MPIBackend.allreduce(x)`` (also ``broadcast``/``allgather`` with
``--ops``), ``mpi4py`` = ``comm.Allreduce(MPI.IN_PLACE, x)`` on a duplicate of COMM_WORLD.
float32, zeros (repeated sums never overflow). Each cell: the slowest rank's median.

``--probes`` adds all_reduce contenders that split the backend's cost into its parts (where the
time goes): ``nb-wait`` = raw ``Iallreduce(...).Wait()`` (MPICH's nonblocking collective alone),
``nb-waitany`` = raw ``Iallreduce`` + ``MPI.Request.Waitany([req, wake-up Irecv])`` (what the
backend's watchdog wait does, without any Python around it), ``persistent`` = a persistent
``Allreduce_init`` request on a staging buffer, ``Start`` + the same ``Waitany`` + two copies (what
the backend did up to ``PERSISTENT_MAX_BYTES`` before the call check carried small all_reduces),
``blocking`` = the backend created with ``blocking_collectives=True`` (all_reduces above 2 KiB call the blocking
``MPI_Allreduce``; a deadline aborts the job), ``pairwise`` (2 ranks) = ``Irecv`` + ``Isend`` of the whole
buffer on a duplicate communicator, two ``Waitany`` and one ``np.add`` (the algorithm the backend runs
for 2-rank all_reduces of ``PAIRWISE_MIN_BYTES`` .. ``PAIRWISE_MAX_BYTES``), ``unpaired`` (2 ranks) = the
backend created with ``pairwise_max_bytes=0`` (MPICH's Iallreduce at every size), ``check`` = the call
check alone (``comm/mpi/check.py``: header into this rank's slot, ``Start`` of the persistent allgather of
the fixed-size slots, the same ``Waitany``, the header comparison): what the always-on mismatch guard adds
to every collective above the inline size (all_reduces up to 2 KiB ride inside it instead).

The guard against today's code: run this file once from the tree with the guard and once from a tree
without it (e.g. ``git archive`` of the commit before), alternating, and compare the ``mpi`` column.

Usage::

    python benchmarks/bench_mpi_backend.py                     # 2 ranks, all_reduce, 1 KiB..4 MiB
    python benchmarks/bench_mpi_backend.py --ops all_reduce,broadcast,all_gather --rounds 21
    python benchmarks/bench_mpi_backend.py --windows 0,32768 --size-list 16384,65536,262144   # window A/B
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

from benchmarks.common import format_table, thread_env, write_json
from neural_arch.distributed.testing import run_mpiexec

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22]


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    from neural_arch.distributed.comm.mpi.backend import MPIBackend

    backend = MPIBackend.create(None, timeout=120)
    comm = MPI.COMM_WORLD.Dup()
    world = comm.Get_size()
    ours = {"all_reduce": lambda x, out: backend.allreduce(x),
            "broadcast": lambda x, out: backend.broadcast(x, 0),
            "all_gather": lambda x, out: backend.allgather(out, x)}
    raw = {"all_reduce": lambda x, out: comm.Allreduce(MPI.IN_PLACE, x),
           "broadcast": lambda x, out: comm.Bcast(x, root=0),
           "all_gather": lambda x, out: comm.Allgather(x, out)}
    if args.probes:
        private = MPI.COMM_WORLD.Dup()
        wake = private.Irecv(np.zeros(1, np.int64), private.Get_rank(), 100)
        pair = [None, wake]

        def nb_waitany(x, out):
            pair[0] = comm.Iallreduce(MPI.IN_PLACE, x)
            while MPI.Request.Waitany(pair) != 0:
                pass
        persistent: dict = {}
        from neural_arch.distributed.comm.mpi.check import CallCheck
        from neural_arch.distributed.comm.work import OpInfo

        check = CallCheck(MPI, comm, persistent=True)
        check_info = OpInfo("all_reduce", 1, list(range(world)), comm.Get_rank(), (1,), "float32", None, "sum")

        def check_only(x, out):
            # the guard every collective above the inline size starts with
            pair[0] = check.stamp(check_info, x.nbytes)
            while MPI.Request.Waitany(pair) != 0:
                pass
            if not check.agreed():
                raise RuntimeError("the ranks disagree")

        def persistent_waitany(x, out):
            # what the backend did for the smallest all_reduces before the call check: a persistent request
            if x.nbytes not in persistent:
                stage = np.zeros_like(x)
                persistent[x.nbytes] = (comm.Allreduce_init(MPI.IN_PLACE, stage, MPI.SUM), stage)
            req, stage = persistent[x.nbytes]
            stage[...] = x
            req.Start()
            pair[0] = req
            while MPI.Request.Waitany(pair) != 0:
                pass
            x[...] = stage
        pair_comm, peer, scratch = comm.Dup(), comm.Get_rank() ^ 1, {}
        trio = [None, None, wake]

        def pairwise(x, out):
            # what the backend does for 2-rank all_reduces in its pairwise window: one whole-buffer exchange + one add
            other = scratch.get(x.nbytes)
            if other is None:
                other = scratch[x.nbytes] = np.empty_like(x)
            trio[0], trio[1] = pair_comm.Irecv(other, peer, 0), pair_comm.Isend(x, peer, 0)
            MPI.Request.Waitany(trio)
            MPI.Request.Waitany(trio)
            np.add(x, other, out=x)
        blocking = MPIBackend.create(None, timeout=120, blocking_collectives=True)
        probes = {"nb-wait": lambda x, out: comm.Iallreduce(MPI.IN_PLACE, x).Wait(), "nb-waitany": nb_waitany,
                  "persistent": persistent_waitany, "blocking": lambda x, out: blocking.allreduce(x),
                  "check": check_only}
        if world == 2:
            probes["pairwise"] = pairwise
            unpaired = MPIBackend.create(None, timeout=120, pairwise_max_bytes=0)
            probes["unpaired"] = lambda x, out: unpaired.allreduce(x)
    else:
        probes = {}
    windows = {}
    for limit in args.windows:
        # the same backend with another two-rank pairwise window: an A/B of the window's end, interleaved
        windows[limit] = MPIBackend.create(None, timeout=120, pairwise_max_bytes=limit)
        probes[f"window-{limit}"] = lambda x, out, b=windows[limit]: b.allreduce(x)
    times: dict = {}
    cpu_times: dict = {}
    for op in args.ops.split(","):
        for nbytes in args.sizes:
            n = max(1, nbytes // 4)
            if op == "all_gather":
                n = max(1, n // world)
            x, out = np.zeros(n, np.float32), np.zeros((world, n), np.float32)
            inner = max(1, min(200, (1 << 22) // nbytes))
            contenders = [("mpi", ours[op]), ("mpi4py", raw[op])]
            if op == "all_reduce":
                contenders += list(probes.items())
            for name, fn in contenders:
                for _ in range(min(inner, 20) + 2):
                    fn(x, out)
            for rnd in range(args.rounds):
                # the order alternates every round, so that no contender always runs first after the
                # barrier (a guard: identical contenders showed no order effect on MPICH)
                for name, fn in (contenders if rnd % 2 == 0 else contenders[::-1]):
                    comm.Barrier()
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        fn(x, out)
                    t1 = time.perf_counter()
                    key = f"{op}:{nbytes}:{name}"
                    times.setdefault(key, []).append((t1 - t0) / inner)
                    cpu_times.setdefault(key, []).append((time.process_time() - c0) / inner)
    pick = min if args.stat == "min" else statistics.median
    reports = comm.gather({"wall": times, "cpu": cpu_times}, root=0)
    backend.shutdown()
    for other in windows.values():
        other.shutdown()
    if args.probes:
        blocking.shutdown()
        if world == 2:
            unpaired.shutdown()
        wake.Cancel()
        wake.Wait()
        pair_comm.Free()
        for req, _stage in persistent.values():
            req.Free()
        check.free()
    if comm.Get_rank() == 0:
        # each cell: the slowest rank's statistic (wall), and the busiest rank's CPU time
        merged = {k: max(pick(r["wall"][k]) for r in reports) for k in times}
        cpu = {k: max(pick(r["cpu"][k]) for r in reports) for k in times}
        print(json.dumps({"ranks": world, "results": merged, "cpu_results": cpu, "rounds_per_rank": reports}),
              flush=True)


def _commit() -> dict:
    """The commit this tree is at and the files that differ from it (what a reader checks out)."""
    import subprocess

    def git(*cmd):
        try:
            return subprocess.run(["git", "-C", ROOT, *cmd], check=False, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD").strip() or None,
            "modified": [ln[3:] for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="per rank, over rounds: median (default), or min (the best round: on a loaded, "
                         "shared machine the least disturbed measure of what the code itself costs)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_mpi_backend.json"))
    ap.add_argument("--probes", action="store_true", help="also time raw Iallreduce+Wait / +Waitany (see above)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--windows", default="",
                    help="pairwise_max_bytes values, comma separated: all_reduce contenders window-<N> (the "
                         "backend with that two-rank pairwise window; 0: MPICH's Iallreduce at every size)")
    ap.add_argument("--size-list", default=",".join(map(str, SIZES)), help="bytes, comma separated")
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in args.size_list.split(",")]
    args.windows = [int(s) for s in args.windows.split(",") if s]
    if args.worker:
        return worker(args)
    # run_mpiexec: a clean environment (one BLAS thread per rank) and, past --timeout, the whole job
    # reaped (mpiexec, its proxy and every rank), not only mpiexec
    worker_args = ["--worker", "--ops", args.ops, "--rounds", args.rounds, "--size-list", args.size_list,
                   "--stat", args.stat, "--windows", ",".join(map(str, args.windows))] + (["--probes"] if args.probes else [])
    load_before = os.getloadavg()[0]
    proc = run_mpiexec(os.path.abspath(__file__), args.ranks, args=worker_args, env=thread_env(1, base={}),
                       timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"mpiexec failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1])
    payload = {"ranks": args.ranks, **_commit(), "loadavg_1min_before": load_before,
               "loadavg_1min": os.getloadavg()[0], "ops": args.ops.split(","), "sizes": args.sizes, "rounds": args.rounds,
               "stat": args.stat,
               "results": result["results"], "cpu_results": result["cpu_results"],
               "rounds_per_rank": result["rounds_per_rank"],
               "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:]))}
    for op in args.ops.split(","):
        rows = []
        for nbytes in args.sizes:
            ours, raw = (result["results"][f"{op}:{nbytes}:{k}"] for k in ("mpi", "mpi4py"))
            ours_cpu, raw_cpu = (result["cpu_results"][f"{op}:{nbytes}:{k}"] for k in ("mpi", "mpi4py"))
            rows.append([_label(nbytes), f"{ours * 1e6:.1f}", f"{raw * 1e6:.1f}", f"{raw / ours:.2f}x",
                         f"{ours / raw:.2f}x", f"{ours_cpu * 1e6:.1f}", f"{raw_cpu * 1e6:.1f}"])
        print(f"\n{op}, {args.ranks} ranks, float32, interleaved rounds: slowest rank's {args.stat}")
        print(format_table(rows, ["size", "mpi backend us", "raw mpi4py us", "speed vs raw", "latency vs raw",
                                  "mpi backend CPU us", "raw mpi4py CPU us"]))
        if args.windows and op == "all_reduce":
            names = [f"window-{w}" for w in args.windows]
            rows = [[_label(n), f"{result['results'][f'{op}:{n}:mpi'] * 1e6:.1f}"]
                    + [f"{result['results'][f'{op}:{n}:{k}'] * 1e6:.1f}" for k in names]
                    + [f"{result['results'][f'{op}:{n}:mpi4py'] * 1e6:.1f}"] for n in args.sizes]
            print("\ntwo-rank pairwise window A/B (us): the default backend, the backend with each window, raw")
            print(format_table(rows, ["size", "mpi backend"] + [f"window {w}" for w in args.windows] + ["raw mpi4py"]))
        if args.probes and op == "all_reduce":
            probe_names = ["mpi", "blocking", "check", "persistent", "nb-waitany", "nb-wait", "mpi4py"]
            headers = ["size", "mpi backend", "blocking backend", "call check alone", "persistent+copies",
                       "Iallreduce+Waitany", "Iallreduce+Wait", "Allreduce"]
            if args.ranks == 2:
                probe_names[1:1] = ["unpaired"]
                headers[2:2] = ["backend, pairwise off"]
                probe_names.insert(5, "pairwise")
                headers.insert(6, "exchange+add")
            rows = [[_label(n)] + [f"{result['results'][f'{op}:{n}:{k}'] * 1e6:.1f}" for k in probe_names]
                    + [f"{result['results'][f'{op}:{n}:mpi4py'] / result['results'][f'{op}:{n}:nb-wait']:.2f}x"]
                    for n in args.sizes]
            print("\nwhere the time goes (us): the backend, (2 ranks) the backend without the pairwise exchange, "
                  "the backend with blocking_collectives=True, a persistent request, (2 ranks) the pairwise "
                  "exchange + add alone, MPICH's nonblocking collective with the backend's wait and with Wait, "
                  "the blocking one")
            print(format_table(rows, headers + ["nonblocking speed vs blocking"]))
    print(f"\nload average (1 min) before: {load_before:.1f}, at the end: {payload['loadavg_1min']:.1f}")
    print(f"\nwrote {write_json(args.out, payload)}")


if __name__ == "__main__":
    main()
