"""The recovery part of ``bench_checkpoint.py``: a DDP job saving DCP checkpoints, SIGKILLed.

``recovery(directory, from_n, to_n, warm_steps)`` starts ``from_n`` ranks under the launcher
(each runs :func:`worker`, through ``bench_checkpoint.py --worker``), kills rank 1 once a
checkpoint is committed, and times kill -> detection -> the first training step at ``to_n``
ranks (see ``bench_checkpoint``'s docstring, measurement 4). Not a benchmark by itself.

Example::

    python benchmarks/bench_checkpoint.py --ranks 1 --model-mb 8 --repeat 1   # includes recovery
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench_checkpoint.py")


def worker(argv) -> int:
    """A DDP training job saving a DCP checkpoint every ``--save-every`` steps (run by the launcher)."""
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steplog", required=True)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--save-every", type=int, default=5)
    args = p.parse_args(argv)
    import neural_arch.distributed as dist
    import neural_arch.distributed.checkpoint as dcp
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.elastic.checkpoint_restart import restart_count

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    ddp = dist.DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
    start = 0
    if os.path.exists(os.path.join(args.ckpt, ".metadata")):
        dcp.load(state, args.ckpt)                 # saved by any world size: a replicated state loads anywhere
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["step"])
    rng = np.random.default_rng(rank)
    attempt = restart_count()
    for step in range(start + 1, args.steps + 1):
        x = rng.standard_normal((32, 64)).astype(np.float32)
        F.mse_loss(ddp(Tensor(x)), Tensor(x)).backward()
        opt.step()
        opt.zero_grad()
        with open(args.steplog, "a") as f:        # one short line: appends of < PIPE_BUF do not interleave
            f.write(f"{rank} {step} {world} {attempt} {time.time():.6f}\n")
        if step % args.save_every == 0:
            dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, args.ckpt)
    dist.destroy_process_group()
    return 0


def _steps(path: str) -> list[tuple]:
    try:
        with open(path) as f:
            return [(int(a), int(b), int(c), int(d), float(e)) for a, b, c, d, e in
                    (line.split() for line in f if len(line.split()) == 5)]
    except FileNotFoundError:
        return []


def _launch(nproc: int, max_restarts: int, ckpt: str, steplog: str, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", str(nproc),
           "--max_restarts", str(max_restarts), BENCH, "--worker", "--ckpt", ckpt,
           "--steplog", steplog]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.005)
    raise TimeoutError(f"recovery benchmark: {what} did not happen within {timeout:.0f} s")


def recovery(directory: str, from_n: int, to_n: int, warm_steps: int, timeout: float = 120.0) -> dict:
    """SIGKILL rank 1 of a ``from_n``-rank job; time until a step at ``to_n`` ranks after the kill."""
    from benchmarks.bench_recovery import _rank_pid
    from benchmarks.common import stop_session

    tag = f"rec_{from_n}to{to_n}"
    ckpt, steplog = os.path.join(directory, tag + "_ckpt"), os.path.join(directory, tag + "_steps.txt")
    logpath = os.path.join(directory, tag + "_launcher.log")
    same = from_n == to_n
    with open(logpath, "wb") as log:
        proc = _launch(from_n, 1 if same else 0, ckpt, steplog, log)
        second = None
        try:
            # past a committed checkpoint, every rank training
            _wait_for(lambda: os.path.exists(os.path.join(ckpt, ".metadata"))
                      and sum(1 for r in _steps(steplog) if r[1] >= warm_steps) >= from_n, timeout, "warm-up")
            pid = _wait_for(lambda: _rank_pid(proc.pid, 1), 10, "finding rank 1")
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            if same:
                def restarted():
                    with open(logpath, "rb") as f:
                        return b"restart" in f.read().lower() and time.time()
                t_detect = _wait_for(restarted, timeout, "the launcher's restart")
                first = _wait_for(lambda: [r for r in _steps(steplog) if r[3] >= 1], timeout, "a step after restart")
            else:
                proc.wait(timeout=timeout)          # the launcher tears the job down and exits
                t_detect = time.time()
                second = _launch(to_n, 0, ckpt, steplog, log)
                first = _wait_for(lambda: [r for r in _steps(steplog) if r[2] == to_n], timeout,
                                  f"a step at world size {to_n}")
            t_first = min(r[4] for r in first)
            resumed_at = min(r[1] for r in first)
        except TimeoutError as exc:
            log.flush()
            with open(logpath, "rb") as f:
                tail = f.read()[-1500:].decode(errors="replace")
            raise TimeoutError(f"{exc}; the launcher's output ends with:\n{tail}") from None
        finally:
            stop_session(proc, 20)
            if second is not None:
                stop_session(second, 20)
    shutil.rmtree(ckpt, ignore_errors=True)
    return {"from": from_n, "to": to_n, "automatic": same, "detect_s": t_detect - t_kill,
            "restart_s": t_first - t_detect, "total_s": t_first - t_kill, "resumed_at_step": resumed_at}
