"""``bench_collectives.py --hierarchical``: flat all_reduce vs the hierarchical forms on simulated hosts.

Run through ``benchmarks/bench_collectives.py --hierarchical`` (see its docstring for the options,
``--link-gbit`` included); this module holds that mode's rank side, orchestration and report, so
each file keeps one purpose. Example::

    python benchmarks/bench_collectives.py --hierarchical --link-gbit 4
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: the entry point every rank and the network-namespace re-run start (it dispatches back here)
BENCH = os.path.join(HERE, "bench_collectives.py")
sys.path.insert(0, ROOT)

from benchmarks.common import format_table, json_lines, run_processes, thread_env, write_json
from benchmarks.bench_collectives import _label, _parse_size, _plan, busbw
from neural_arch.distributed.testing import free_port

# -- --hierarchical: flat vs the hierarchical forms on simulated hosts ------------------------------------
HIER_CONTENDERS = ("flat", "leader", "2d", "auto")
#: the references: the forms with the host group's steps on the ring plans (shm rings: as before
#: sub-groups mapped the direct segment), and the forms unpipelined (their three steps in turn)
HIER_REFERENCES = ("leader-rings", "2d-rings", "leader-serial", "2d-serial")


def hierarchical_worker(args) -> None:
    """One rank of ``--hierarchical``: host ``rank // per_host``; every contender on the same buffer,
    interleaved per repetition; prints {contender: {size: median seconds}}."""
    import numpy as np

    per_host = args.ranks // args.hosts
    os.environ.update(RANK=str(args.rank), WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ["BENCH_PORT"], NEURAL_ARCH_HOST_ID=f"host{args.rank // per_host}")
    import neural_arch.distributed as dist
    from neural_arch.distributed.algorithms import hierarchical_pipeline
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce, host_groups
    from neural_arch.distributed.algorithms.hierarchical_auto import all_reduce_algorithm

    chunk = os.environ.get("BENCH_PIPELINE_CHUNK")          # --pipeline-chunk: the pipelined forms' piece
    hierarchical_pipeline.PIPELINE_CHUNK_BYTES = int(chunk) if chunk else hierarchical_pipeline.PIPELINE_CHUNK_BYTES
    dist.init_process_group("gloo", timeout=300)
    world = dist.get_default_group().backend
    intra = host_groups().intra.backend                     # collective: build the groups before timing

    def on_rings(algorithm):
        def run(x):
            with intra.forced_algorithm("ring"):
                hierarchical_all_reduce(x, algorithm=algorithm)
        return run

    fns = {"flat": lambda x: world.allreduce(x),
           "leader": lambda x: hierarchical_all_reduce(x, algorithm="leader"),
           "2d": lambda x: hierarchical_all_reduce(x, algorithm="2d"),
           "auto": lambda x: dist.all_reduce(x),
           "leader-rings": on_rings("leader"), "2d-rings": on_rings("2d"),
           **{f"{a}-serial": lambda x, a=a: hierarchical_all_reduce(x, algorithm=a, pipeline_chunk_bytes=0)
              for a in ("leader", "2d")}}
    results = {k: {} for k in fns}
    chosen = {}
    for nbytes in [int(s) for s in args.size_list.split(",")]:
        x = np.zeros(max(1, nbytes // 4), np.float32)       # zeros: repeated sums never overflow
        chosen[str(nbytes)] = all_reduce_algorithm(x)
        inner, reps = _plan(nbytes, args.quick)
        for fn in fns.values():
            for _ in range(min(inner, 10) + 2):            # warm-up: plans, scratch, page faults
                fn(x)
        times = {k: [] for k in fns}
        for _ in range(reps):
            for kind, fn in fns.items():
                world.barrier()
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn(x)
                times[kind].append((time.perf_counter() - t0) / inner)
        for kind in fns:
            results[kind][str(nbytes)] = statistics.median(times[kind])
    world.barrier()
    print(json.dumps({"rank": args.rank, "results": results, "auto_chose": chosen}), flush=True)
    dist.destroy_process_group()


def _rerun_behind_link(args, argv) -> None:
    """Run this very command again inside a new network namespace whose loopback is limited to
    ``--link-gbit`` (see the module docstring), then exit with its status."""
    import subprocess

    missing = [tool for tool in ("unshare", "ip", "tc") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        raise SystemExit(f"--link-gbit needs root and the tools unshare, ip and tc (util-linux, iproute2); "
                         f"missing: {missing or 'root'}. Run without --link-gbit to measure plain loopback.")
    # burst: a few MTU-sized (64 KiB) loopback packets; latency: a queue deep enough that TCP is
    # shaped, not dropped (a drop on loopback costs a 200 ms retransmission timeout). No slow start
    # after idle (this namespace only): a collective's sends follow pauses, and clusters tune it off.
    shape = (f"ip link set lo up && tc qdisc add dev lo root tbf rate {args.link_gbit:g}gbit burst 256kb "
             "latency 100ms && echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle && exec \"$@\"")
    cmd = ["unshare", "--net", "sh", "-c", shape, "sh", sys.executable, BENCH]
    cmd += list(argv if argv is not None else sys.argv[1:])
    env = dict(os.environ, BENCH_BEHIND_LINK=f"{args.link_gbit:g}")
    raise SystemExit(subprocess.call(cmd, env=env))


def run_hierarchical(args, sizes) -> dict:
    me = BENCH
    env = thread_env(1)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["BENCH_PORT"] = str(free_port())
    env.pop("NEURAL_ARCH_HIERARCHICAL", None)              # "auto" means the default selection
    env["BENCH_PIPELINE_CHUNK"] = str(_parse_size(args.pipeline_chunk)) if args.pipeline_chunk else ""
    common = ["--worker", "hierarchical", "--ranks", str(args.ranks), "--hosts", str(args.hosts),
              "--size-list", ",".join(map(str, sizes))] + (["--quick"] if args.quick else [])
    commands = [([sys.executable, me, "--rank", str(r)] + common, env) for r in range(args.ranks)]
    outs = run_processes(commands, args.timeout, "hierarchical")
    reports = [r for out, _ in outs for r in json_lines(out)]
    if len(reports) != args.ranks:
        raise RuntimeError(f"hierarchical: {len(reports)} of {args.ranks} ranks reported; stderr:\n{outs[0][1][-2000:]}")
    merged = {k: {b: max(r["results"][k][b] for r in reports) for b in reports[0]["results"][k]}
              for k in reports[0]["results"]}
    return {"results": merged, "auto_chose": reports[0]["auto_chose"]}


def render_hierarchical(payload) -> str:
    n, rows = payload["ranks"], []
    res = payload["results"]
    for nbytes in payload["sizes"]:
        b = str(nbytes)
        flat = res["flat"][b]
        row = [_label(nbytes)] + [f"{res[k][b] * 1e6:.0f} us / {busbw('all_reduce', nbytes, res[k][b], n):.2f}"
                                  for k in HIER_CONTENDERS]
        refs = [k for k in HIER_REFERENCES if k in res]     # (older result files lack them)
        row += [f"{flat / res[k][b]:.2f}x" for k in ("leader", "2d", "auto") + tuple(refs)]
        rows.append(row + [payload["auto_chose"][b]])
    head = (["size"] + list(HIER_CONTENDERS) + ["flat/leader", "flat/2d", "flat/auto"]
            + [f"flat/{k}" for k in HIER_REFERENCES if k in res] + ["auto chose"])
    link = payload.get("link_gbit") or 0
    across = f"TCP across a {link:g} Gbit/s emulated link" if link else "loopback TCP across"
    return (f"all_reduce, {payload['hosts']} simulated hosts x {n // payload['hosts']} ranks (shm inside a host, "
            f"{across}), float32: slowest rank's median latency / bus bandwidth (GB/s); >1x: faster than flat; "
            "x-rings: form x with the host group on the ring plans; x-serial: form x unpipelined\n"
            + format_table(rows, head))


def _plot_hierarchical(payload, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = payload["sizes"]
    for i, kind in enumerate(HIER_CONTENDERS):
        ts = [payload["results"][kind][str(b)] for b in sizes]
        ax1.plot(sizes, [t * 1e3 for t in ts], marker="o", label=kind, color=f"C{i}")
        if kind != "flat":
            ax2.plot(sizes, [payload["results"]["flat"][str(b)] / t for b, t in zip(sizes, ts)], marker="o", label=kind,
                     color=f"C{i}")
    ax2.axhline(1.5, color="grey", linestyle="--", linewidth=1, label="goal 1.5x")
    ax2.axhline(1.0, color="black", linewidth=0.5)
    for ax, ylabel in ((ax1, "median latency (ms)"), (ax2, "speed-up over flat")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_yscale("log")
    link = f", {payload['link_gbit']:g} Gbit/s link" if payload.get("link_gbit") else ""
    ax1.set_title(f"all_reduce, {payload['hosts']} hosts x {payload['ranks'] // payload['hosts']} ranks{link}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def hierarchical_main(args, argv, sizes) -> None:
    import platform

    if args.ranks % args.hosts or args.ranks // args.hosts < 2:
        raise SystemExit(f"--hierarchical: --ranks {args.ranks} must be a multiple of --hosts {args.hosts}, "
                         "with at least 2 ranks per host")
    if args.link_gbit and not os.environ.get("BENCH_BEHIND_LINK"):
        _rerun_behind_link(args, argv)
    payload = {"ranks": args.ranks, "hosts": args.hosts, "sizes": sizes, "link_gbit": args.link_gbit,
               "pipeline_chunk": args.pipeline_chunk or "default",
               "command": "python " + " ".join([os.path.relpath(BENCH, ROOT)] + (argv or sys.argv[1:]))}
    t0 = time.monotonic()
    payload.update(run_hierarchical(args, sizes))
    cores = os.cpu_count() or 1
    payload["machine"] = (f"{args.ranks} ranks on {cores} cores"
                          + (" (oversubscribed)" if args.ranks > cores else "")
                          + f", {platform.machine()}; load average at the end {os.getloadavg()[0]:.1f}; "
                          f"{time.monotonic() - t0:.0f} s")
    table = render_hierarchical(payload)
    print(table)
    # 2 hosts x 2 ranks keeps the plain name; any other layout names itself (e.g. _2x4)
    suffix = "" if (args.hosts, args.ranks) == (2, 4) else f"_{args.hosts}x{args.ranks // args.hosts}"
    suffix += f"_link{args.link_gbit:g}gbit" if args.link_gbit else ""
    suffix += f"_chunk{args.pipeline_chunk}" if args.pipeline_chunk else ""
    out = args.out or os.path.join(HERE, "results", f"bench_collectives_hierarchical{suffix}.json")
    print(f"\nwrote {write_json(out, payload)}")
    md = os.path.splitext(out)[0] + ".md"
    with open(md, "w") as f:
        f.write(f"# bench_collectives --hierarchical\n\nCommand: `{payload['command']}`\n\n"
                f"Machine: {payload['machine']}.\n\n{table}\n")
    print(f"wrote {md}")
    if not args.no_plot:
        png = os.path.splitext(out)[0] + ".png"
        _plot_hierarchical(payload, png)
        print(f"wrote {png}")
