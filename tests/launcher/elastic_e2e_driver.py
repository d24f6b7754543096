"""Drive the issue-15 elastic end-to-end run: two launchers ("nodes") of 2 ranks each on this host
with ``--nnodes 1:2``; node 1's launcher is SIGKILLed mid-training; node 0 goes on alone.

Used by ``test_elastic_launch_e2e.py`` (correctness) and runnable by hand to measure the time from
the kill to the first training step at the new world size, split into phases (a measurement, not
a test); ``--grow`` instead starts node 0 alone and node 1 mid-training (the job restarts with it)::

    python tests/launcher/elastic_e2e_driver.py --trials 5 [--rdzv_last_call 1.0]
    python tests/launcher/elastic_e2e_driver.py --grow --trials 3
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # run as a script too: launcher_helpers imports tests/polling.py
from launcher_helpers import ROOT, free_port, reap, start_launcher, wait_for

EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")
TOKEN = {"NEURAL_ARCH_AUTH_TOKEN": "e1a571c0" * 4}


def read_logs(log_dir: str) -> dict[int, list[dict]]:
    """restart count -> every step record the ranks of that attempt wrote."""
    out: dict[int, list[dict]] = {}
    for path in glob.glob(os.path.join(log_dir, "restart*_rank*.jsonl")):
        restart = int(os.path.basename(path)[len("restart"):].split("_")[0])
        with open(path) as f:
            out.setdefault(restart, []).extend(json.loads(line) for line in f if line.endswith("\n"))
    return out


class _Lines:
    """Read a launcher's stdout/stderr in threads, each line stamped with its arrival time."""

    def __init__(self, proc) -> None:
        self.proc, self.lines = proc, {"out": [], "err": []}
        self.threads = [threading.Thread(target=self._pump, args=(stream, self.lines[name]), daemon=True)
                        for name, stream in (("out", proc.stdout), ("err", proc.stderr))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _pump(stream, sink) -> None:
        for line in iter(stream.readline, ""):
            sink.append((time.time(), line))

    def wait(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(5)
        return tuple("".join(line for _, line in self.lines[name]) for name in ("out", "err"))

    def first(self, text: str, after: float = 0.0) -> float | None:
        """Arrival time of the first line containing ``text`` (after ``after``)."""
        return next((t for name in ("err", "out") for t, line in self.lines[name] if text in line and t >= after),
                    None)


def attempts(records: dict[int, list[dict]]) -> list[list[dict]]:
    """The step records split by attempt ((restart count, world size): a membership change keeps
    the restart count), in the order the attempts ran."""
    groups: dict[tuple, list[dict]] = {}
    for restart, recs in records.items():
        for r in recs:
            groups.setdefault((restart, r["world"]), []).append(r)
    return sorted(groups.values(), key=lambda recs: min(r["t"] for r in recs))


def _steps_at(logs: str, world: int, step: int) -> bool:
    return any(r["world"] == world and r["step"] >= step for recs in read_logs(logs).values() for r in recs)


def run_elastic_job(workdir: str, join_at_step: int | None = None, kill_at_step: int | None = 40,
                    step_delay: float = 0.03, last_call: float = 1.0, epochs: int = 3,
                    timeout: float = 90.0) -> dict:
    """Run the job; returns logs, exit codes, outputs and timings.

    ``join_at_step`` None: both nodes start together (round 0 at world size 4). Otherwise node 0
    starts alone (world size 2) and node 1's launcher starts once step ``join_at_step`` ran: the
    job restarts with it (``join_to_first_step_s``). ``kill_at_step``: SIGKILL node 1's launcher
    once a step >= it ran at world size 4 (``kill_to_first_step_s`` to the next step at 2, and
    ``phases_s``: when node 0's launcher said the failure was detected, the round formed, and
    rank 0 resumed).
    """
    ckpt, logs, out = (os.path.join(workdir, name) for name in ("ckpt", "samples", "final.npz"))
    port, agent = free_port(), free_port()
    common = ["--nnodes=1:2", "--nproc_per_node=2", "--max_restarts=2", "--master_addr=127.0.0.1",
              f"--master_port={port}", f"--agent_port={agent}", "--start_timeout=30",
              f"--rdzv_last_call={last_call}", "--term_timeout=2"]
    script = [EXAMPLE, "--ckpt", ckpt, "--log-samples", logs, "--out", out, "--epochs", str(epochs),
              "--step-delay", str(step_delay), "--commit-every", "2", "--save-every", "1"]
    launchers: dict[int, tuple] = {}

    def start(node: int) -> None:
        proc = start_launcher([*common, f"--node_rank={node}", *script], workdir, env=TOKEN)
        launchers[node] = (proc, _Lines(proc))

    result = {"kill_time": None, "join_time": None}
    try:
        if join_at_step is None:
            start(1)  # node 1 first: it retries until node 0 listens, so both are in round 0
            start(0)
        else:
            start(0)
            if not wait_for(lambda: _steps_at(logs, 2, join_at_step), timeout=timeout / 2, interval=0.01):
                raise AssertionError(f"training never reached step {join_at_step} before node 1 joined")
            result["join_time"] = time.time()
            start(1)
        if kill_at_step is not None:
            if not wait_for(lambda: _steps_at(logs, 4, kill_at_step), timeout=timeout / 2, interval=0.01):
                raise AssertionError(f"training never reached step {kill_at_step} at world size 4 before the kill")
            os.kill(launchers[1][0].pid, signal.SIGKILL)  # the launcher only: its ranks must notice and die
            result["kill_time"] = time.time()
        texts = {node: launchers[node][1].wait(timeout if node == 0 else 30) for node in (0, 1)}
    finally:
        for proc, _ in launchers.values():
            reap(proc)
    records = read_logs(logs)
    result.update(codes=tuple(launchers[n][0].returncode for n in (0, 1)),
                  out=texts[0][0] + texts[1][0], err=texts[0][1] + texts[1][1], records=records, final=out)
    runs = attempts(records)
    if result["join_time"] is not None:
        grown = [r for recs in runs for r in recs if r["world"] == 4]
        if grown:
            result["join_to_first_step_s"] = min(r["t"] for r in grown) - result["join_time"]
    kill = result["kill_time"]
    if kill is not None:
        after = [r["t"] for recs in runs for r in recs if r["world"] == 2 and min(x["t"] for x in recs) > kill]
        if after:
            result["kill_to_first_step_s"] = min(after) - kill
            lines0 = launchers[0][1]
            rnd = "round 2:" if join_at_step is not None else "round 1:"
            marks = {"detected": lines0.first("re-forming the job", kill), "formed": lines0.first(rnd, kill),
                     "resumed": lines0.first("resumed at step", kill)}
            result["phases_s"] = {k: (None if t is None else t - kill) for k, t in marks.items()}
    return result


def run_shrink_job(workdir: str, **kw) -> dict:
    """Both nodes from the start; node 1's launcher SIGKILLed at ``kill_at_step`` (default 40)."""
    return run_elastic_job(workdir, join_at_step=None, **kw)


def _measure(trials: int, last_call: float) -> None:
    import statistics

    times = []
    for trial in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            res = run_shrink_job(tmp, last_call=last_call)
            if res["codes"][0] != 0 or "kill_to_first_step_s" not in res:
                print(f"trial {trial}: failed: {res['codes']}\n{res['err'][-3000:]}")
                continue
            times.append(res["kill_to_first_step_s"])
            phases = ", ".join(f"{k} {v:.2f}" for k, v in res["phases_s"].items() if v is not None)
            print(f"trial {trial}: kill -> first step at world size 2: {times[-1]:.2f} s (after the kill: {phases})")
    if times:
        print(f"median over {len(times)} trials: {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rdzv_last_call", type=float, default=1.0)
    ap.add_argument("--grow", action="store_true", help="measure a node joining mid-training instead")
    opts = ap.parse_args()
    print(f"--rdzv_last_call {opts.rdzv_last_call:g} s")
    if opts.grow:
        for trial in range(opts.trials):
            with tempfile.TemporaryDirectory() as tmp:
                res = run_elastic_job(tmp, join_at_step=24, kill_at_step=None, last_call=opts.rdzv_last_call)
                print(f"trial {trial}: exit codes {res['codes']}, node 1 started -> first step at world size 4: "
                      f"{res.get('join_to_first_step_s', float('nan')):.2f} s")
    else:
        _measure(opts.trials, opts.rdzv_last_call)
