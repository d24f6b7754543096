"""Survive a crash: checkpoint every step, let the launcher restart the group, resume, finish.

Run it (the first attempt crashes on purpose at step 7; the restart resumes from the newest
checkpoint - step 7, or step 6 if the launcher stopped rank 0 before it had saved step 7)::

    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 --max_restarts 1 \\
        examples/restart_from_checkpoint.py --ckpt-dir /tmp/ckpts --out /tmp/final.json

    # the same training without the crash, for comparison: identical final parameters
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 \\
        examples/restart_from_checkpoint.py --ckpt-dir /tmp/ckpts2 --out /tmp/final2.json --no-crash

The model is plain NumPy linear regression with a hand-written gradient (no ``nn``/DDP needed).
Each rank computes the gradient on its shard of the data and ``all_reduce`` averages them, when the
process group's backend is available; otherwise (or with ``--no-collectives``) every rank computes
the full-batch gradient itself, which gives the same numbers without communication.

The pattern, in four lines:

1. at start, ``find_latest_checkpoint(dir)`` -> load it, or start fresh;
2. train from the saved step;
3. after each step rank 0 saves ``step_{k}.npz`` *atomically* (temp file + ``os.replace``), so a
   crash mid-write never leaves a half checkpoint;
4. ``NEURAL_ARCH_RESTART_COUNT`` (``restart_count()``) tells an attempt that it is a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from neural_arch.distributed.elastic import find_latest_checkpoint, restart_count, save_npz_atomic

N_SAMPLES, N_FEATURES = 64, 4


def make_data(seed: int = 0):
    """The same data on every rank (a fixed seed), so sharding needs no communication."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N_SAMPLES, N_FEATURES))
    true_w = np.arange(1, N_FEATURES + 1, dtype=np.float64)
    y = x @ true_w + 0.5 + 0.01 * rng.standard_normal(N_SAMPLES)
    return x, y


def gradient(w, b, x, y):
    """Mean-squared-error gradient for ``y ~ x @ w + b``."""
    err = x @ w + b - y
    return 2.0 * x.T @ err / len(y), 2.0 * err.mean()


def load_latest(ckpt_dir: str):
    """Newest checkpoint -> (w, b, step), retrying if rank 0 replaces it while we read."""
    for _ in range(5):
        path = find_latest_checkpoint(ckpt_dir, "step_*.npz")
        if path is None:
            return np.zeros(N_FEATURES), 0.0, 0
        try:
            with np.load(path) as data:
                return data["w"].copy(), float(data["b"]), int(data["step"])
        except FileNotFoundError:
            time.sleep(0.05)
    raise RuntimeError(f"could not read a checkpoint from {ckpt_dir}")


def setup_group(use_collectives: bool):
    """(rank, world_size, all_reduce-or-None): use the process group if its backend is available."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if not use_collectives or world == 1:
        return rank, world, None
    try:
        from neural_arch.distributed import init_process_group, is_backend_available

        if not is_backend_available(os.environ.get("NEURAL_ARCH_BACKEND", "gloo")):
            raise ImportError("backend not available")
    except ImportError:
        print("process group not available: every rank computes the full-batch gradient", flush=True)
        return rank, world, None
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import ReduceOp, all_reduce, get_rank, get_world_size

    init_process_group()

    def average(array: np.ndarray) -> np.ndarray:
        out = all_reduce(Tensor(array.copy()), ReduceOp.SUM)
        return np.asarray(getattr(out, "data", out)) / get_world_size()

    return get_rank(), get_world_size(), average


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--crash-at", type=int, default=7, help="step at which attempt 0 crashes")
    parser.add_argument("--crash-rank", type=int, default=None,
                        help="rank that crashes (default: the last rank with all_reduce, else rank 0 "
                             "- without collectives the ranks are not in lockstep, and rank 0 "
                             "is the one whose progress the checkpoints record)")
    parser.add_argument("--no-crash", action="store_true", help="run straight through")
    parser.add_argument("--no-collectives", action="store_true", help="never use all_reduce")
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out", help="rank 0 writes the final parameters here (JSON)")
    parser.add_argument("--step-log", help="append 'rank step restart time' lines here (benchmarks)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend a step takes longer")
    args = parser.parse_args(argv)

    rank, world, average = setup_group(not args.no_collectives)
    x, y = make_data()
    w, b, start = load_latest(args.ckpt_dir)
    attempt = restart_count()
    print(f"rank {rank}/{world} attempt {attempt}: "
          + (f"resuming from step {start}" if start else "starting fresh"), flush=True)

    crash_rank = args.crash_rank if args.crash_rank is not None else (world - 1 if average else 0)
    for step in range(start, args.steps):
        if not args.no_crash and attempt == 0 and step == args.crash_at and rank == crash_rank:
            print(f"rank {rank}: crashing on purpose at step {step}", flush=True)
            os._exit(13)  # a hard crash: no cleanup, no exception handler
        if average is not None:
            shard = slice(rank * N_SAMPLES // world, (rank + 1) * N_SAMPLES // world)
            gw, gb = gradient(w, b, x[shard], y[shard])
            flat = average(np.concatenate([gw, [gb]]))
            gw, gb = flat[:-1], float(flat[-1])
        else:
            gw, gb = gradient(w, b, x, y)
        w, b = w - args.lr * gw, b - args.lr * gb
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0:
            save_npz_atomic(os.path.join(args.ckpt_dir, f"step_{step + 1:06d}.npz"),
                            w=w, b=np.array(b), step=np.array(step + 1))
        if args.step_log:
            with open(args.step_log, "a") as f:
                f.write(f"{rank} {step + 1} {attempt} {time.time():.6f}\n")

    if rank == 0:
        print(f"final w={np.round(w, 6).tolist()} b={b:.6f}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"w": w.tolist(), "b": b, "steps": args.steps, "world_size": world,
                           "used_all_reduce": average is not None}, f)
    if average is not None:
        from neural_arch.distributed import destroy_process_group

        destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
