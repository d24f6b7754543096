"""Per-step fault tolerance (``neural_arch.distributed.ft``): what a failure costs the survivors.

Every replica is a real process (``python benchmarks/bench_ft.py --worker ...``) with an
``ft.Manager`` over gloo (TCP on loopback); the driver hosts the ``ft.Lighthouse`` in a thread.
The "model" is ``--params`` float64 numbers with two more arrays of optimizer state (Adam's
moments): a step emulates ``--compute-ms`` of compute (sleep), averages a gradient of the model's
size across the quorum and, when the quorum commits, updates the state.

Three measurements:

* ``recovery``: 3 replicas; one SIGKILLs itself mid-step (after joining the quorum, before its
  all-reduce). Time from the kill to the survivors' next committed step, for each heartbeat
  timeout in ``--heartbeat-timeouts`` (the lighthouse declares the dead replica dead after it;
  the survivors' own all-reduce fails at once when the victim's socket closes).
* ``heal``: one replica trains alone; a second starts and heals from it (weights + optimizer
  state + step, peer to peer, no file). Heal time per model size, next to the time the same bytes
  take in an all-reduce between the two (the goal: heal within 2x of bytes / all-reduce bandwidth).
  ``--arrays K`` cuts the model and each optimizer state into K arrays (a real model's many
  tensors: the per-message cost shows), ``--repeat R`` reports the median and range of R heals,
  ``--heal-fresh`` receives into new memory instead of the live state (``Manager(heal_into=)``).
  The joiner asks for a head sized by its own state (``transfer.head_bytes_for``), so a state of
  small arrays crosses in one message; ``pack_s`` is the sender's part spent reading and packing it.
  The heal is the first message on the group its quorum just formed; the all-reduce above is
  measured after many steps on a warm group. Each run also times the same bytes all-reduced as
  the first op of a fresh group of the two replicas (and once more on it): the like-for-like
  figure, first-use costs included.
* ``efficiency``: 3 replicas, ``--steps`` committed steps; the driver SIGKILLs a random non-first
  replica every K quorum rounds (``--every``) and starts a replacement process at once (it heals
  when it is up). Step efficiency = undisturbed wall time / disturbed wall time for the same
  number of committed steps.
* ``overlap``: 3 replicas, ``--steps`` committed steps, no failure, once with the quorum awaited
  in ``start_quorum`` and once with ``Manager(use_async_quorum=True)`` (the lighthouse's answer
  awaited on a background thread while the step computes). Time per committed step for each.

``--quorum async`` runs ``recovery`` and ``efficiency`` with the asynchronous quorum (default sync).

Usage::

    python benchmarks/bench_ft.py                                   # all three, small config
    python benchmarks/bench_ft.py --only heal --params 10000 1000000 --json benchmarks/results/bench_ft.json
    python benchmarks/bench_ft.py --only heal --params 10000 100000 1000000 --arrays 300 --repeat 3 \
        --json benchmarks/results/bench_ft_heal.json
    python benchmarks/bench_ft.py --only overlap --params 100000 --compute-ms 5 20 --steps 100 \
        --json benchmarks/results/bench_ft_overlap.json

Prints tables and writes raw JSON (default ``benchmarks/results/bench_ft.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import environment, print_table, write_json

KILLED_AT = "bench/killed_at"
JOINED = "bench/joiner_registered"
STARTED = "bench/started"
FIRST_WAITING = "bench/first_waits_for_the_joiner"


# ------------------------------------------------------------------------------------------ worker
def worker(cfg: dict) -> dict:
    """One replica: train until ``steps`` committed steps; report commit times and heal figures."""
    import numpy as np

    from neural_arch.distributed import ft
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore

    host, _, port = cfg["addr"].rpartition(":")
    n = int(cfg["params"])
    rng = np.random.default_rng(cfg.get("seed", 0))
    flat = {"w": rng.normal(size=n), "m": np.zeros(n), "v": np.zeros(n)}
    # the state a heal moves: each flat array as ``arrays`` pieces (a model's many tensors), live views
    bounds = np.linspace(0, n, int(cfg.get("arrays", 1)) + 1).astype(int)
    state = {k: [a[lo:hi] for lo, hi in itertools.pairwise(bounds)] for k, a in flat.items()}

    def load(s):
        for k, pieces in state.items():
            for piece, got in zip(pieces, s[k]):
                if piece is not got:        # healed in place (heal_into): already there
                    piece[...] = got

    if cfg.get("announce"):                     # the joiner: start once the first replica trained alone a while
        TCPStore(host, int(port), timeout=60.0, auth_token=cfg["token"]).wait([FIRST_WAITING], timeout=60.0)
    manager = ft.Manager(pg=ft.ProcessGroupGloo(timeout=cfg["timeout"], transport="tcp"), load_state_dict=load,
                         state_dict=lambda: state, min_replica_size=cfg.get("min_replicas", 1),
                         heal_into=None if cfg.get("heal_fresh") else (lambda: state),
                         replica_id=cfg["name"], lighthouse_addr=cfg["addr"], timeout=cfg["timeout"],
                         heartbeat_interval=cfg["heartbeat_interval"], auth_token=cfg["token"],
                         use_async_quorum=bool(cfg.get("async_quorum")))
    store = TCPStore(host, int(port), timeout=60.0, auth_token=cfg["token"])
    if cfg.get("announce"):
        store.set(JOINED, b"1")
    if cfg.get("start_together"):               # the first replicas register before anyone steps
        store.add(STARTED, 1)
        while int(store.add(STARTED, 0)) < cfg["start_together"]:
            time.sleep(0.005)
    commits, bandwidth = [], []
    while manager.current_step() < cfg["steps"]:
        if cfg.get("wait_for_joiner_at") == manager.current_step():
            store.set(FIRST_WAITING, b"1")
            store.wait([JOINED], timeout=60.0)      # trained alone so far; let the joiner catch this run
        manager.start_quorum()
        if cfg.get("kill_at") is not None and manager.current_step() == cfg["kill_at"]:
            manager.wait_quorum()       # in the quorum (async quorum: its answer is in) before dying
            store.set(KILLED_AT, repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(cfg["compute_ms"] / 1000.0)
        grad = np.full(n, 1e-3)
        manager.allreduce(grad)
        if cfg.get("measure_allreduce") and manager.num_participants() == 2 and manager.errored() is None:
            payload = np.ones(3 * n)                    # the bytes a heal moves (w, m, v)
            start = time.perf_counter()
            manager.allreduce(payload)
            bandwidth.append(time.perf_counter() - start)
        if manager.should_commit():
            flat["w"] -= grad
            flat["m"] += grad
            flat["v"] += grad * grad
            commits.append((time.time(), manager.current_step(), manager.num_participants()))
    out = {"name": cfg["name"], "commits": commits, "heals": manager.heals,
           "timings": manager.timings,
           "heal_bytes": manager.heal_bytes_received,
           "allreduce_seconds": bandwidth}
    if cfg.get("measure_allreduce"):               # the heal's run: the first replica is rank 0, the joiner 1
        first = cfg.get("wait_for_joiner_at") is not None
        out["fresh_allreduce"] = fresh_group_allreduce(ft, store, cfg, 3 * n, rank=0 if first else 1)
    manager.shutdown()
    store.close()
    return out


def fresh_group_allreduce(ft, store, cfg: dict, count: int, rank: int) -> list[list[float]]:
    """The heal's bytes (``count`` float64) all-reduced as the first op of a fresh two-rank group,
    then again on the same group: ``[[start, end], [start, end]]`` (``time.time()``). The heal is
    the first message on the group its quorum just formed, the measured all-reduce is not: this is
    the like-for-like all-reduce (the kernel's and the interpreter's first-use costs included)."""
    import numpy as np

    pg = ft.ProcessGroupGloo(timeout=cfg["timeout"], transport="tcp")
    pg.configure(store, "bench/fresh_allreduce/", rank, 2, auth_token=cfg["token"])
    payload, times = np.ones(count), []
    try:
        for _ in range(2):
            start = time.time()
            pg.allreduce(payload)
            times.append([start, time.time()])
    finally:
        pg.shutdown()
    return times


# ------------------------------------------------------------------------------------------ driver
class Replicas:
    """Worker processes of one run; their JSON reports; every process reaped on exit."""

    def __init__(self, base: dict):
        self.base, self.procs, self.folder = base, {}, tempfile.mkdtemp(prefix="bench_ft_")

    def start(self, name: str, **cfg) -> None:
        cfg = dict(self.base, name=name, **cfg)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        out = open(os.path.join(self.folder, f"{name}.out"), "w")  # noqa: SIM115 - closed in finish()
        self.procs[name] = (subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(cfg)], env=env,
                                             stdout=out, stderr=subprocess.STDOUT), out)

    def kill(self, name: str) -> None:
        self.procs[name][0].send_signal(signal.SIGKILL)

    def stop_stragglers(self, grace: float) -> None:
        """SIGKILL the replicas still running ``grace`` seconds from now (the job itself is done)."""
        deadline = time.monotonic() + grace
        for proc, _out in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()

    def finish(self, timeout: float = 300.0) -> dict:
        deadline, reports = time.monotonic() + timeout, {}
        try:
            for name, (proc, out) in self.procs.items():
                proc.wait(max(1.0, deadline - time.monotonic()))
                out.close()
                with open(out.name) as fh:
                    text = fh.read()
                if proc.returncode == 0:
                    reports[name] = json.loads(text.strip().splitlines()[-1])
                elif proc.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"replica {name} exited with {proc.returncode}:\n{text[-3000:]}")
        finally:
            for proc, _out in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            shutil.rmtree(self.folder, ignore_errors=True)   # the replicas' output files
        return reports


def base_config(args, lighthouse, token, **over) -> dict:
    cfg = {"addr": lighthouse.address, "token": token, "params": args.params[0], "steps": 20,
           "compute_ms": args.compute_ms[0], "timeout": 10.0, "heartbeat_interval": 0.05,
           "async_quorum": args.quorum == "async"}
    cfg.update(over)
    return cfg


def run_recovery(args) -> list[dict]:
    from neural_arch.distributed.ft import Lighthouse

    rows = []
    for hb in args.heartbeat_timeouts:
        for trial in range(args.trials):
            token = secrets.token_hex(16)
            with Lighthouse(min_replicas=2, heartbeat_timeout=hb, join_timeout=5.0, auth_token=token) as lh:
                reps = Replicas(base_config(args, lh, token, steps=12))
                for i in range(3):
                    reps.start(f"r{i}", kill_at=5 if i == 1 else None, start_together=3)
                reports = reps.finish()
                killed = float(lh.store.get(KILLED_AT).decode())
            survivors = [reports[f"r{i}"] for i in (0, 2)]
            after = min(t for rep in survivors for t, step, _size in rep["commits"] if t > killed)
            rows.append({"heartbeat_timeout_s": hb, "trial": trial, "failure_to_commit_s": after - killed})
    return rows


def run_heal(args) -> list[dict]:
    """One row per model size: the median and range of ``--repeat`` heals (each in fresh processes)."""
    rows = []
    for n in args.params:
        runs = [heal_once(args, n) for _ in range(args.repeat)]
        row = {"params": n, "state_bytes": runs[0]["state_bytes"], "arrays": 3 * args.arrays,
               "heal_into": not args.heal_fresh, "runs": runs}
        for key in ("heal_s", "allreduce_same_bytes_s", "ratio", "fresh_group_allreduce_s", "ratio_fresh"):
            values = [r[key] for r in runs]
            row[key] = statistics.median(values)
            row[key + "_range"] = [min(values), max(values)]
        rows.append(row)
    return rows


def heal_once(args, n: int) -> dict:
    from neural_arch.distributed.ft import Lighthouse

    token = secrets.token_hex(16)
    with Lighthouse(min_replicas=1, heartbeat_timeout=2.0, join_timeout=5.0, auth_token=token) as lh:
        reps = Replicas(base_config(args, lh, token, params=n, steps=12, compute_ms=20.0, measure_allreduce=True,
                                    arrays=args.arrays, heal_fresh=args.heal_fresh))
        reps.start("first", wait_for_joiner_at=4)
        reps.start("joiner", seed=1, announce=True)
        reports = reps.finish()
    healed = [r for r in reports.values() if r["heals"] == 1]
    if len(healed) != 1:
        raise RuntimeError(f"expected exactly one replica to heal: {reports}")
    joiner = healed[0]
    sender = next(r for r in reports.values() if r is not joiner)
    nbytes = 3 * n * 8
    allreduce = statistics.median(joiner["allreduce_seconds"]) if joiner["allreduce_seconds"] else float("nan")
    got, sent = joiner["timings"], sender["timings"]
    transfer = got["loaded_at"] - max(got["recv_started_at"], sent["send_started_at"])

    def fresh_group(i: int) -> float:   # all-reduce i on the fresh group, timed as the heal: later start -> end
        spans = (joiner["fresh_allreduce"][i], sender["fresh_allreduce"][i])
        return max(end for _start, end in spans) - max(start for start, _end in spans)
    return {"params": n, "state_bytes": nbytes, "heal_s": transfer,
            "fresh_group_allreduce_s": fresh_group(0), "fresh_group_second_allreduce_s": fresh_group(1),
            "ratio_fresh": transfer / fresh_group(0),
            "receiver_waited_s": got["loaded_at"] - got["recv_started_at"], "send_s": sent["send_s"],
            "pack_s": sent.get("pack_s"),
            "configure_s": [got["configure_s"], sent["configure_s"]],
            "allreduce_same_bytes_s": allreduce, "ratio": transfer / allreduce}


def run_efficiency(args) -> list[dict]:
    import random

    from neural_arch.distributed.ft import Lighthouse

    rows, rng = [], random.Random(0)
    baseline = None
    for every in [0] + list(args.every):
        token = secrets.token_hex(16)
        with Lighthouse(min_replicas=2, heartbeat_timeout=args.heartbeat_timeouts[0], join_timeout=5.0,
                        auth_token=token) as lh:
            reps = Replicas(base_config(args, lh, token, steps=args.steps))
            live = ["r0", "r1", "r2"]
            for name in live:
                reps.start(name, start_together=3)
            start, kills, next_kill = time.monotonic(), 0, every
            while reps.procs["r0"][0].poll() is None:
                if every and len(lh.quorums) >= next_kill and len(lh.quorums) < args.steps - 2:
                    victim = rng.choice(live[1:])
                    reps.kill(victim)
                    replacement = f"x{kills}"
                    reps.start(replacement, seed=kills + 10)
                    live[live.index(victim)] = replacement
                    kills, next_kill = kills + 1, next_kill + every
                time.sleep(0.002)
            # a replacement started near the end may still wait for a quorum that will never come
            reps.stop_stragglers(grace=2.0)
            reports = reps.finish()
        first = reports["r0"]["commits"]
        wall = first[-1][0] - first[0][0]
        if baseline is None:
            baseline = wall
        rows.append({"kill_every_rounds": every or None, "kills": kills, "committed": len(first),
                     "rounds": len(lh.quorums), "wall_s": wall, "efficiency": baseline / wall if wall else 1.0,
                     "elapsed_s": time.monotonic() - start})
    return rows


def run_overlap(args) -> list[dict]:
    """Time per committed step, undisturbed, with the quorum awaited before or during the compute."""
    from neural_arch.distributed.ft import Lighthouse

    rows = []
    for compute_ms in args.compute_ms:
        for mode in ("sync", "async"):
            token = secrets.token_hex(16)
            with Lighthouse(min_replicas=3, heartbeat_timeout=2.0, join_timeout=5.0, auth_token=token) as lh:
                reps = Replicas(base_config(args, lh, token, steps=args.steps, compute_ms=compute_ms,
                                            async_quorum=mode == "async"))
                for name in ("r0", "r1", "r2"):
                    reps.start(name, start_together=3)
                reports = reps.finish()
            times = [t for t, _step, _size in reports["r0"]["commits"]][2:]   # past the first quorum's setup
            gaps = [b - a for a, b in itertools.pairwise(times)]
            rows.append({"quorum": mode, "compute_ms": compute_ms, "params": args.params[0],
                         "committed": len(times), "ms_per_step_mean": 1e3 * (times[-1] - times[0]) / len(gaps),
                         "ms_per_step_median": 1e3 * statistics.median(gaps)})
    for row in rows:     # against the sync run of the same compute time
        sync = next(r for r in rows if r["quorum"] == "sync" and r["compute_ms"] == row["compute_ms"])
        row["speedup_vs_sync"] = sync["ms_per_step_mean"] / row["ms_per_step_mean"]
    return rows


def _median_range(row: dict, key: str, scale: float) -> str:
    lo, hi = row[key + "_range"]
    return f"{row[key] * scale:.2f} ({lo * scale:.2f}-{hi * scale:.2f})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["recovery", "heal", "efficiency", "overlap"], action="append")
    parser.add_argument("--params", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--arrays", type=int, default=1,
                        help="heal: the model (and each optimizer state) as this many arrays (a model's tensors)")
    parser.add_argument("--repeat", type=int, default=1, help="heal: runs per size (median and range)")
    parser.add_argument("--heal-fresh", action="store_true",
                        help="heal: receive into new memory (Manager(heal_into=None)) instead of the live state")
    parser.add_argument("--compute-ms", type=float, nargs="+", default=[20.0],
                        help="emulated compute per step (overlap: one pair of runs per value; else the first)")
    parser.add_argument("--quorum", choices=["sync", "async"], default="sync",
                        help="recovery and efficiency: Manager(use_async_quorum=) off (sync) or on (async)")
    parser.add_argument("--heartbeat-timeouts", type=float, nargs="+", default=[0.3, 1.0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, nargs="+", default=[30, 15])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "bench_ft.json"))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    parts = args.only or ["recovery", "heal", "efficiency", "overlap"]
    out = {"command": " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:]), "args": vars(args),
           "load_average": os.getloadavg()}
    if "recovery" in parts:
        out["recovery"] = rows = run_recovery(args)
        print("\nfailure -> next committed step (3 replicas, one SIGKILLed mid-step)")
        print_table([[r["heartbeat_timeout_s"], r["trial"], f"{r['failure_to_commit_s']:.3f}"] for r in rows],
                    ["heartbeat timeout (s)", "trial", "failure -> commit (s)"])
    if "heal" in parts:
        out["heal"] = rows = run_heal(args)
        print("\nheal from a live peer (weights + 2 optimizer arrays, float64)")
        print_table([[r["params"], r["arrays"], f"{r['state_bytes'] / 1e6:.2f}", _median_range(r, "heal_s", 1e3),
                      _median_range(r, "allreduce_same_bytes_s", 1e3), _median_range(r, "ratio", 1.0),
                      _median_range(r, "fresh_group_allreduce_s", 1e3), _median_range(r, "ratio_fresh", 1.0),
                      f"{r['state_bytes'] / r['heal_s'] / 1e6:.0f}"] for r in rows],
                    ["params", "arrays", "state MB", "heal ms (both sides ready -> loaded)",
                     "all-reduce same bytes ms", "heal / all-reduce", "first all-reduce on a fresh group ms",
                     "heal / fresh-group all-reduce", "heal MB/s (median)"])
    if "efficiency" in parts:
        out["efficiency"] = rows = run_efficiency(args)
        print(f"\nstep efficiency ({args.steps} committed steps, {args.compute_ms[0]:g} ms compute per step, "
              f"heartbeat timeout {args.heartbeat_timeouts[0]:g} s, {args.quorum} quorum)")
        print_table([[r["kill_every_rounds"] or "never", r["kills"], r["committed"], r["rounds"], f"{r['wall_s']:.2f}",
                      f"{r['efficiency']:.2f}"] for r in rows],
                    ["kill every K rounds", "kills", "committed", "rounds", "wall (s)", "efficiency"])
    if "overlap" in parts:
        out["overlap"] = rows = run_overlap(args)
        print(f"\nquorum awaited before (sync) or during (async) the step's compute (3 replicas, "
              f"{args.params[0]} params, no failure)")
        print_table([[r["compute_ms"], r["quorum"], r["committed"], f"{r['ms_per_step_mean']:.2f}",
                      f"{r['ms_per_step_median']:.2f}", f"{r['speedup_vs_sync']:.2f}"] for r in rows],
                    ["compute ms", "quorum", "steps timed", "ms/step (mean)", "ms/step (median)", "vs sync"])
    out["environment"] = environment()
    print("\nraw JSON:", write_json(args.json, out))


if __name__ == "__main__":
    main()
