"""Collective benchmark: neural_arch gloo vs MPI vs PyTorch gloo, side by side in one run.

For every contender the script starts real rank processes (``python`` ranks over a TCPStore
for gloo and torch, ``mpiexec -n N`` for MPI), sweeps message sizes for all_reduce,
reduce_scatter, all_gather and broadcast on float32 buffers, and prints the median latency and bus
bandwidth:

* all_reduce:     busbw = 2(n-1)/n * bytes / t    (bytes = the buffer on each rank)
* reduce_scatter: busbw = (n-1)/n * bytes / t     (bytes = the input on each rank; output = bytes/n)
* all_gather:     busbw = (n-1)/n * bytes / t     (bytes = the gathered output; input = bytes/n)
* broadcast:      busbw = bytes / t

Contenders: ``gloo`` (neural_arch, transport auto: on one host the direct shared-memory
collectives of ``comm/gloo/shm_direct.py``), ``gloo-rings`` (the ring/tree plans over the
shared-memory rings: direct collectives off), ``gloo-tcp`` (TCP forced), ``mpi`` (neural_arch's mpi backend), ``mpi4py`` (raw ``Allreduce(IN_PLACE)`` etc.
on NumPy buffers), ``torch`` (torch.distributed gloo on CPU, when torch is installed);
``gloo-ring`` / ``gloo-rd`` force one all_reduce algorithm, ``gloo-chain`` / ``gloo-tree`` one
broadcast algorithm (threshold measurements).
Every rank runs with one BLAS thread. Each rank times repetitions of a fixed number of calls
(after a barrier) and takes the median; the table shows the slowest rank's median.

Usage::

    python benchmarks/bench_collectives.py --quick                 # short sweep, ~1-2 minutes
    python benchmarks/bench_collectives.py                         # 1 KiB - 64 MiB
    python benchmarks/bench_collectives.py --contenders gloo-ring,gloo-rd --ops all_reduce \\
        --sizes 1K,16K,64K,256K,1M --ranks 3                      # algorithm crossover
    python benchmarks/bench_collectives.py --hierarchical          # 2 simulated hosts x 2 ranks

``--hierarchical``: all_reduce over 2 "hosts" on this machine (``NEURAL_ARCH_HOST_ID``: shm inside a host,
TCP across): flat (the world's gloo all_reduce) vs the leader and 2-D forms (``algorithms/hierarchical.py``,
pipelined from 2 pieces up; ``--pipeline-chunk`` sets the piece) vs ``dist.all_reduce`` (auto) vs
``x-serial`` (form x unpipelined) and ``x-rings`` (host group on ring plans), interleaved in one launch,
1 KiB - 64 MiB; writes ``bench_collectives_hierarchical.{json,md,png}``. ``--link-gbit R``: the run moves
into a private network namespace (``unshare --net``, root) whose loopback a token bucket (``tc ... tbf``)
limits to R Gbit/s, both directions of both cross-host flows in one queue: a full-duplex NIC of R/2 Gbit/s
per host. A hierarchical form moves 2(H-1)/H of the buffer across each host's link, the flat ring
2(HP-1)/(HP) (H hosts x P ranks): link-bound, the speed-up is at most (HP-1)/(P(H-1)), 1.5x at 2 x 2.

Writes ``benchmarks/results/bench_collectives[_<N>ranks].json``, ``.md`` (the tables in markdown,
with the command and the machine) and ``.png`` (bus bandwidth vs size per contender); 2 ranks keep the
historical name without a suffix. The summary line under each table is each contender's busbw
relative to raw ``mpi4py`` in the same run.
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

from benchmarks.common import format_table, json_lines, run_processes, thread_env, write_json
from neural_arch.distributed.testing import free_port, mpiexec_path

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
CONTENDERS = ("gloo", "gloo-rings", "gloo-tcp", "mpi", "mpi4py", "torch")
_FORCED = ("gloo-ring", "gloo-rd", "gloo-chain", "gloo-tree")
FULL_SIZES = [1 << k for k in range(10, 27, 2)]          # 1 KiB .. 64 MiB, x4
QUICK_SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22]


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def _label(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _plan(nbytes: int, quick: bool):
    """(calls per repetition, repetitions) for a size: ~ the same wall time per size, deterministic
    so every rank makes the same number of calls."""
    inner = max(1, min(200, (1 << 22) // max(nbytes, 1)))
    reps = 7 if quick else 15
    if nbytes >= 1 << 24:
        reps = 3 if quick else 5
    return inner, reps


# -- the rank side -------------------------------------------------------------------------------
def _make_ops(kind: str, rank: int, world: int):
    """Return {op: make(nbytes) -> zero-arg callable running one collective}, and a cleanup."""
    import numpy as np

    if kind.startswith("gloo"):
        from neural_arch.distributed.comm.gloo.backend import GlooBackend
        from neural_arch.distributed.rendezvous.store import TCPStore

        store = TCPStore("127.0.0.1", int(os.environ["BENCH_PORT"]), world_size=world, is_master=rank == 0,
                         timeout=60)
        b = GlooBackend.create(store, rank, world, timeout=120, transport="tcp" if kind == "gloo-tcp" else None)
        ar = lambda x: b.allreduce(x)
        ag = lambda out, x: b.allgather(out, x)
        rs = lambda out, x: b.reduce_scatter(out, x)
        bc = lambda x: b.broadcast(x, 0)
        barrier, close = b.barrier, b.shutdown
    elif kind == "mpi":
        from neural_arch.distributed.comm.mpi.backend import MPIBackend

        b = MPIBackend.create(None, timeout=120)
        ar = lambda x: b.allreduce(x)
        ag = lambda out, x: b.allgather(out, x)
        rs = lambda out, x: b.reduce_scatter(out, x)
        bc = lambda x: b.broadcast(x, 0)
        barrier, close = b.barrier, b.shutdown
    elif kind == "mpi4py":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        ar = lambda x: comm.Allreduce(MPI.IN_PLACE, x)
        ag = lambda out, x: comm.Allgather(x, out)
        rs = lambda out, x: comm.Reduce_scatter_block(x, out)
        bc = lambda x: comm.Bcast(x, root=0)
        barrier, close = comm.Barrier, (lambda: None)
    elif kind == "torch":
        import torch
        import torch.distributed as tdist

        torch.set_num_threads(1)
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['BENCH_PORT']}",
                                 rank=rank, world_size=world)
        ar = lambda x: tdist.all_reduce(torch.from_numpy(x))

        def ag(out, x):
            tdist.all_gather(list(torch.from_numpy(out)), torch.from_numpy(x))

        def rs(out, x):
            tdist.reduce_scatter_tensor(torch.from_numpy(out), torch.from_numpy(x))
        bc = lambda x: tdist.broadcast(torch.from_numpy(x), 0)
        barrier, close = tdist.barrier, tdist.destroy_process_group
    else:
        raise SystemExit(f"unknown contender {kind!r}; choose from "
                         f"{CONTENDERS + _FORCED}")

    def make(op, nbytes):
        n = max(1, nbytes // 4)
        if op == "all_reduce":
            x = np.zeros(n, np.float32)          # zeros: repeated sums never overflow
            return lambda: ar(x)
        if op == "broadcast":
            x = np.zeros(n, np.float32)
            return lambda: bc(x)
        if op == "reduce_scatter":
            per = max(1, n // world)
            x, out = np.zeros(per * world, np.float32), np.zeros(per, np.float32)
            return lambda: rs(out, x)
        per = max(1, n // world)
        out, x = np.zeros((world, per), np.float32), np.zeros(per, np.float32)
        return lambda: ag(out, x)
    return make, barrier, close


def worker(args) -> None:
    if args.worker in ("mpi", "mpi4py"):
        from mpi4py import MPI

        rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    else:
        rank, world = args.rank, args.ranks
    make, barrier, close = _make_ops(args.worker, rank, world)
    results = {}
    for op in args.ops.split(","):
        results[op] = {}
        for nbytes in [int(s) for s in args.size_list.split(",")]:
            fn = make(op, nbytes)
            inner, reps = _plan(nbytes, args.quick)
            for _ in range(min(inner, 20) + 2):        # warm-up: plans, scratch buffers, page faults
                fn()
            times = []
            for _ in range(reps):
                barrier()
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times.append((time.perf_counter() - t0) / inner)
            results[op][str(nbytes)] = statistics.median(times)
    barrier()
    close()
    report = {"contender": args.worker, "ranks": world, "rank": rank, "results": results}
    if args.worker in ("mpi", "mpi4py"):
        # mpiexec merges every rank's stdout into one stream where lines from two ranks can
        # interleave mid-line: rank 0 gathers the reports and prints them all, one per line.
        from mpi4py import MPI

        reports = MPI.COMM_WORLD.gather(report, root=0)
        for r in reports or ():
            print(json.dumps(r), flush=True)
    else:
        print(json.dumps(report), flush=True)


# -- the orchestrator --------------------------------------------------------------------------------
def _available(kind: str) -> str:
    """'' when the contender can run here, else why not."""
    try:
        if kind in ("mpi", "mpi4py"):
            import mpi4py  # noqa: F401

            from neural_arch.distributed.testing import mpiexec_path

            if not mpiexec_path():
                return "mpiexec not found"
        if kind == "torch":
            import torch  # noqa: F401
    except ImportError as exc:
        return f"not installed ({exc.name})"
    return ""


def run_contender(kind: str, args, sizes) -> dict:
    me = os.path.abspath(__file__)
    common = ["--worker", kind, "--ranks", str(args.ranks), "--ops", args.ops,
              "--size-list", ",".join(map(str, sizes))] + (["--quick"] if args.quick else [])
    env = thread_env(1)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if kind in _FORCED:
        env["NEURAL_ARCH_GLOO_ALGO"] = kind.split("-")[1]
    if kind == "gloo-rings":
        env["NEURAL_ARCH_GLOO_DIRECT"] = "0"
    if kind in ("mpi", "mpi4py"):
        commands = [([mpiexec_path(), "-n", str(args.ranks), sys.executable, me] + common, env)]
    else:
        env["BENCH_PORT"] = str(free_port())
        commands = [([sys.executable, me, "--rank", str(r)] + common, env) for r in range(args.ranks)]
    outs = run_processes(commands, args.timeout, kind)
    reports = [r for out, _ in outs for r in json_lines(out)]
    if len(reports) != args.ranks:
        raise RuntimeError(f"{kind}: {len(reports)} of {args.ranks} ranks reported; stderr:\n{outs[0][1][-2000:]}")
    # A collective is done when its slowest rank is: report the max over ranks (a broadcast
    # root, say, may return as soon as its data sits in a socket buffer).
    merged = {op: {size: max(r["results"][op][size] for r in reports) for size in reports[0]["results"][op]}
              for op in reports[0]["results"]}
    return {"contender": kind, "ranks": args.ranks, "results": merged}


def busbw(op: str, nbytes: int, seconds: float, n: int) -> float:
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
              "broadcast": 1.0}[op]
    return factor * nbytes / seconds / 1e9


def _plot(payload, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = payload["ops"]
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for kind, res in payload["results"].items():
            pts = sorted((int(b), busbw(op, int(b), t, payload["ranks"])) for b, t in res.get(op, {}).items())
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{op}, {payload['ranks']} ranks, float32")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short sweep (5 sizes, fewer repetitions)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--sizes", default=None, help="comma list like 1K,64K,1M (default: the sweep)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per contender run")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repetitions per size and contender "
                    "(the median is reported, every repetition kept in the JSON)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/"
                    "bench_collectives[_<N>ranks].json; the .md and .png go next to it)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--hierarchical", action="store_true", help="all_reduce on simulated hosts: flat vs the "
                    "hierarchical forms (default 4 ranks on --hosts 2)")
    ap.add_argument("--hosts", type=int, default=2, help="simulated hosts of --hierarchical")
    ap.add_argument("--link-gbit", type=float, default=0.0, help="--hierarchical across an emulated link of "
                    "this many Gbit/s (a rate-limited loopback in a private network namespace; root)")
    ap.add_argument("--pipeline-chunk", default="", help="--hierarchical: piece size of the pipelined forms "
                    "(e.g. 512K; default hierarchical_pipeline.PIPELINE_CHUNK_BYTES)")
    # worker mode (internal)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--size-list", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker == "hierarchical":
        from benchmarks.collectives_hierarchical import hierarchical_worker

        return hierarchical_worker(args)
    if args.worker:
        return worker(args)

    sizes = [_parse_size(s) for s in args.sizes.split(",")] if args.sizes else (
        QUICK_SIZES if args.quick else FULL_SIZES)
    if args.hierarchical:
        if "--ranks" not in (argv if argv is not None else sys.argv[1:]):
            args.ranks = 4
        from benchmarks.collectives_hierarchical import hierarchical_main

        return hierarchical_main(args, argv, sizes)
    ops = args.ops.split(",")
    payload = {"ranks": args.ranks, "ops": ops, "sizes": sizes, "results": {}, "skipped": {}, "samples": {},
               "repeat": args.repeat,
               "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:]))}
    kinds = []
    for kind in args.contenders.split(","):
        why = _available(kind)
        if why:
            print(f"skip {kind}: {why}", flush=True)
            payload["skipped"][kind] = why
        else:
            kinds.append(kind)
    # Interleaved, as bench_small_messages does: per repetition and size, every contender runs once,
    # the order rotating each repetition, so a slow phase of the machine hits them all alike. Every
    # repetition is kept (``samples``); ``results`` holds their median.
    samples = payload["samples"]
    for rep in range(args.repeat):
        for size in sizes:
            for kind in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)] if kinds else []:
                if kind in payload["skipped"]:
                    continue
                try:
                    got = run_contender(kind, args, [size])["results"]
                except RuntimeError as exc:
                    print(f"FAILED {kind}: {exc}", flush=True)
                    payload["skipped"][kind] = str(exc)[:500]
                    continue
                for op, by_size in got.items():
                    for nbytes, seconds in by_size.items():
                        samples.setdefault(kind, {}).setdefault(op, {}).setdefault(nbytes, []).append(seconds)
        print(f"repetition {rep + 1} of {args.repeat} done", flush=True)
    for kind, by_op in samples.items():
        if kind not in payload["skipped"]:
            payload["results"][kind] = {op: {n: statistics.median(v) for n, v in by_size.items()}
                                        for op, by_size in by_op.items()}

    if args.out is None:
        suffix = "" if args.ranks == 2 else f"_{args.ranks}ranks"
        args.out = os.path.join(HERE, "results", f"bench_collectives{suffix}.json")
    tables = render_tables(payload)
    print(tables)
    path = write_json(args.out, payload)
    print(f"\nwrote {path}")
    md = os.path.splitext(args.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(render_markdown(payload, tables))
    print(f"wrote {md}")
    if not args.no_plot:
        try:
            png = os.path.splitext(args.out)[0] + ".png"
            _plot(payload, png)
            print(f"wrote {png}")
        except ImportError:
            print("matplotlib missing: no plot")


def _cells(payload, op):
    """Rows of (size label, per contender "latency / busbw") and the per-contender busbw ratio to mpi4py."""
    ranks, sizes, kinds = payload["ranks"], payload["sizes"], list(payload["results"])
    rows, ratios = [], {k: [] for k in kinds}
    for nbytes in sizes:
        row = [_label(nbytes)]
        ref = payload["results"].get("mpi4py", {}).get(op, {}).get(str(nbytes))
        for kind in kinds:
            t = payload["results"][kind].get(op, {}).get(str(nbytes))
            if t is None:
                row.append("-")
                continue
            cell = f"{t * 1e6:.1f} us / {busbw(op, nbytes, t, ranks):.2f}"
            if ref:
                ratios[kind].append((nbytes, ref / t))
            row.append(cell)
        rows.append(row)
    return kinds, rows, ratios


def _ratio_line(ratios) -> str:
    parts = []
    for kind, pts in ratios.items():
        if kind == "mpi4py" or not pts:
            continue
        parts.append(f"{kind} " + " ".join(f"{_label(b)}: {r:.2f}x" for b, r in pts))
    return "busbw / raw mpi4py (>1: faster): " + "; ".join(parts) if parts else ""


def render_tables(payload) -> str:
    out = []
    for op in payload["ops"]:
        kinds, rows, ratios = _cells(payload, op)
        out.append(f"\n{op}, {payload['ranks']} ranks, float32: median latency / bus bandwidth (GB/s)")
        out.append(format_table(rows, ["size"] + kinds))
        line = _ratio_line(ratios)
        if line:
            out.append(line)
    return "\n".join(out)


def render_markdown(payload, _tables=None) -> str:
    import platform

    cores = os.cpu_count() or 1
    ranks = payload["ranks"]
    note = (f"{ranks} ranks on {cores} cores" + (" (oversubscribed: more ranks than cores)" if ranks > cores else "")
            + f", {platform.machine()}, Python {platform.python_version()}; load average at the end "
            f"{os.getloadavg()[0]:.1f}")
    lines = [f"# bench_collectives, {ranks} ranks", "", f"Command: `{payload['command']}`", "", f"Machine: {note}.",
             "", "Cells: slowest rank's median latency / bus bandwidth in GB/s (float32).", ""]
    for op in payload["ops"]:
        kinds, rows, ratios = _cells(payload, op)
        lines += [f"## {op}", "", "| size | " + " | ".join(kinds) + " |", "|" + " --- |" * (len(kinds) + 1)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        line = _ratio_line(ratios)
        lines += ["", line, ""] if line else [""]
    if payload.get("skipped"):
        lines += ["Skipped: " + "; ".join(f"{k} ({v[:80]})" for k, v in payload["skipped"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
