"""How long does a DDP job take to recover when a rank is SIGKILLed mid-training?

Runs ``examples/restart_from_checkpoint.py`` (an ``nn`` MLP under ``DistributedDataParallel`` over
gloo, ``SGD`` with momentum, ``DistributedSampler``; model + optimizer checkpointed atomically
every step) under::

    python -m neural_arch.distributed.launcher --standalone --nproc_per_node N --max_restarts 1 ...

waits until training is under way, SIGKILLs rank 1, and measures from the kill to

* ``detect``:   the launcher announcing the restart (its stderr line),
* ``started``:  the first restarted rank printing "attempt 1" (process up, process group
  initialised, checkpoint loaded),
* ``first_step``: the first training step completed after the restart (any rank; children append
  ``rank step attempt unix_time`` to a step log), and ``all_ranks_step``: every rank past one step.

Usage::

    python benchmarks/bench_recovery.py                 # 3 trials, 2 ranks
    python benchmarks/bench_recovery.py --trials 5 --nproc 3 --json benchmarks/results/bench_recovery.json

``detect`` and ``started`` are taken when the benchmark *reads* the line through the launcher's
output pipe, ``first_step`` from the rank's own clock, so ``started`` can exceed ``first_step`` by
a few milliseconds. The machine's load average is recorded because these numbers depend on it.

Prints a table and writes JSON (with the command, machine and every trial). Goal: < 5 s here.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, ROOT)

from benchmarks.common import format_table, write_json

EXAMPLE = os.path.join(ROOT, "examples", "restart_from_checkpoint.py")


def _children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def _rank_pid(launcher_pid: int, rank: int) -> int | None:
    """Find the launcher child whose environment says RANK=rank (Linux /proc)."""
    for pid in _children_of(launcher_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if env.get(b"RANK") == str(rank).encode():
            return pid
    return None


def _read_steps(path: str) -> list[tuple[int, int, int, float]]:
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [(int(r), int(s), int(a), float(t)) for r, s, a, t in rows if len(rows[0]) == 4]


def trial(nproc: int, kill_after_step: int, timeout: float) -> dict:
    work = tempfile.mkdtemp(prefix="bench_recovery_")
    step_log = os.path.join(work, "steps.txt")
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
           f"--nproc_per_node={nproc}", "--max_restarts=1", "--monitor_interval=1.0", EXAMPLE,
           "--ckpt-dir", os.path.join(work, "ckpt"), "--steps", str(kill_after_step + 30),
           "--no-crash", "--step-sleep", "0.05", "--step-log", step_log]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    events: list[tuple[float, str, str]] = []

    def pump(stream, name):
        for line in iter(stream.readline, ""):
            events.append((time.time(), name, line.rstrip("\n")))

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    threads = [threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + timeout
        while not any(r == 1 and s >= kill_after_step for r, s, _, _ in _read_steps(step_log)):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("training did not reach the kill step:\n"
                                   + "\n".join(e[2] for e in events[-20:]))
            time.sleep(0.01)
        victim = _rank_pid(proc.pid, 1)
        if victim is None:
            raise RuntimeError("could not find rank 1's pid")
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        code = proc.wait(timeout=timeout)
        for t in threads:
            t.join(5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    after = [row for row in _read_steps(step_log) if row[2] == 1]
    first_per_rank = {}
    for r, s, a, t in after:
        first_per_rank.setdefault(r, t)

    def first_event(name, text):
        times = [t for t, n, line in events if n == name and text in line and t >= t_kill]
        return min(times) - t_kill if times else None

    return {
        "exit_code": code,
        "detect_s": first_event("err", "restarting the group"),
        "started_s": first_event("out", "attempt 1"),
        "first_step_s": (min(first_per_rank.values()) - t_kill) if first_per_rank else None,
        "all_ranks_step_s": (max(first_per_rank.values()) - t_kill)
        if len(first_per_rank) == nproc else None,
        "resumed_from_step": min((s for _, s, _, _ in after), default=None),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="time from SIGKILL of a rank to recovered training")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--kill-after-step", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=90)
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "bench_recovery.json"))
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    trials = [trial(args.nproc, args.kill_after_step, args.timeout)
              for _ in range(args.trials)]
    keys = ["detect_s", "started_s", "first_step_s", "all_ranks_step_s"]
    summary = {}
    for k in keys:
        values = [t[k] for t in trials if t[k] is not None]
        summary[k] = {"median": statistics.median(values) if values else None,
                      "max": max(values) if values else None}
    print(f"recovery after SIGKILL of rank 1 ({args.nproc} ranks, "
          f"DDP MLP over gloo, {args.trials} trials; "
          f"seconds after the kill)")
    rows = [[str(i), *(t[k] if t[k] is not None else "-" for k in keys), t["exit_code"]]
            for i, t in enumerate(trials)]
    rows.append(["median", *(summary[k]["median"] if summary[k]["median"] is not None else "-"
                             for k in keys), ""])
    print(format_table(rows, ["trial", *keys, "exit"]))
    goal = summary["first_step_s"]["median"]
    print(f"goal: first step after restart < 5 s -> {'met' if goal is not None and goal < 5 else 'NOT met'}")
    if args.json:
        path = write_json(args.json, {
            "benchmark": "bench_recovery", "nproc": args.nproc, "job": "DDP MLP + SGD(momentum), gloo",
            "command": " ".join([sys.executable, *sys.argv]),
            "load_average_1_5_15_before": [round(x, 2) for x in load_before],
            "trials": trials, "summary": summary, "goal_first_step_s": 5.0,
        })
        print(f"wrote {path}")
    return 0 if all(t["exit_code"] == 0 for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
