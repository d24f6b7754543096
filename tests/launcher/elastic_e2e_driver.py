"""Drive the issue-15 elastic end-to-end run: two launchers ("nodes") of 2 ranks each on this host
with ``--nnodes 1:2``; node 1's launcher is SIGKILLed mid-training; node 0 goes on alone.

Used by ``test_elastic_launch_e2e.py`` (correctness) and runnable by hand to measure the time from
the kill to the first training step at the new world size (a measurement, not a test)::

    python tests/launcher/elastic_e2e_driver.py --trials 5 [--rdzv_last_call 1.0]
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


def run_shrink_job(workdir: str, kill_at_step: int | None = 40, step_delay: float = 0.03,
                   last_call: float = 1.0, epochs: int = 3, timeout: float = 90.0) -> dict:
    """Run the job; returns logs, exit codes, outputs and timings (``kill_to_first_step_s``)."""
    ckpt, logs, out = (os.path.join(workdir, name) for name in ("ckpt", "samples", "final.npz"))
    port, agent = free_port(), free_port()
    common = ["--nnodes=1:2", "--nproc_per_node=2", "--max_restarts=2", "--master_addr=127.0.0.1",
              f"--master_port={port}", f"--agent_port={agent}", "--start_timeout=30",
              f"--rdzv_last_call={last_call}", "--term_timeout=2"]
    script = [EXAMPLE, "--ckpt", ckpt, "--log-samples", logs, "--out", out, "--epochs", str(epochs),
              "--step-delay", str(step_delay), "--commit-every", "2", "--save-every", "1"]
    # Node 1 first: it retries until node 0 listens, so both are in round 0 (MAX reached at once).
    node1 = start_launcher([*common, "--node_rank=1", *script], workdir, env=TOKEN)
    node0 = start_launcher([*common, "--node_rank=0", *script], workdir, env=TOKEN)
    result = {"kill_time": None}
    try:
        if kill_at_step is not None:
            reached = wait_for(lambda: any(r["step"] >= kill_at_step for r in read_logs(logs).get(0, [])),
                               timeout=timeout / 2, interval=0.01)
            if not reached:
                raise AssertionError(f"training never reached step {kill_at_step} before the kill")
            os.kill(node1.pid, signal.SIGKILL)  # the launcher only: its ranks must notice and die
            result["kill_time"] = time.time()
        out0, err0 = node0.communicate(timeout=timeout)
        out1, err1 = node1.communicate(timeout=30)
    finally:
        reap(node0)
        reap(node1)
    records = read_logs(logs)
    result.update(codes=(node0.returncode, node1.returncode), out=out0 + out1, err=err0 + err1,
                  records=records, final=out)
    if result["kill_time"] is not None and records.get(1):
        first = min(r["t"] for r in records[1])
        result["kill_to_first_step_s"] = first - result["kill_time"]
    return result


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
            print(f"trial {trial}: kill -> first step at world size 2: {times[-1]:.2f} s")
    if times:
        print(f"median over {len(times)} trials: {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rdzv_last_call", type=float, default=1.0)
    opts = ap.parse_args()
    print(f"--rdzv_last_call {opts.rdzv_last_call:g} s")
    _measure(opts.trials, opts.rdzv_last_call)
