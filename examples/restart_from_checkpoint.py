"""Survive a crash: a DDP job checkpoints every step, the launcher restarts it, it resumes, it finishes.

Run it (the first attempt crashes on purpose at step 7; the restart resumes from the newest
checkpoint - step 7, or step 6 if the launcher stopped rank 0 before it had saved step 7)::

    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 --max_restarts 1 \\
        examples/restart_from_checkpoint.py --ckpt-dir /tmp/ckpts --out /tmp/final.npz

    # the same training without the crash, for comparison: bit-identical final parameters
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 \\
        examples/restart_from_checkpoint.py --ckpt-dir /tmp/ckpts2 --out /tmp/final2.npz --no-crash

The job: an ``nn`` MLP on a small synthetic classification set, ``DistributedDataParallel`` (gradients
averaged over the gloo group), ``optim.SGD`` with momentum, and a ``DistributedSampler`` giving each
rank its share of every epoch. The pattern:

1. at start, ``find_latest_checkpoint(dir)`` -> load model *and optimizer* state (the momentum
   buffers are part of the training state: without them the resumed run diverges), or start fresh;
2. train from the saved step; the data order depends only on (epoch, step), so it replays exactly;
3. after each step rank 0 saves ``step_{k}.npz`` *atomically* (temp file + ``os.replace``), so a
   crash mid-write never leaves a half checkpoint;
4. ``restart_count()`` (``NEURAL_ARCH_RESTART_COUNT``) tells an attempt that it is a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# One BLAS thread per rank: ranks share the cores; more threads per rank only fight each other.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np

import neural_arch.distributed as dist
import neural_arch.nn.functional as F
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import make_classification_data
from neural_arch.distributed import find_latest_checkpoint
from neural_arch.distributed.elastic.checkpoint_restart import (
    remove_interrupted_writes,
    restart_count,
    save_npz_atomic,
)

N_SAMPLES, N_FEATURES, N_CLASSES = 256, 16, 4


def build(lr: float):
    manual_seed(0)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Linear(32, N_CLASSES))
    return model, optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def save_checkpoint(path: str, model, opt, step: int) -> None:
    """Model + optimizer state + step in one .npz, written atomically."""
    arrays = {f"model/{k}": np.asarray(v) for k, v in model.state_dict().items()}
    state = opt.state_dict()
    for idx, values in state["state"].items():
        for key, value in values.items():
            arrays[f"optim/{idx}/{key}"] = np.asarray(value)
    arrays["optim_groups"] = np.array(json.dumps(state["param_groups"], default=float))
    arrays["step"] = np.array(step)
    save_npz_atomic(path, **arrays)


def load_checkpoint(path: str, model, opt) -> int:
    with np.load(path) as data:
        model.load_state_dict({k[6:]: data[k].copy() for k in data.files if k.startswith("model/")})
        state: dict = {}
        for k in data.files:
            if k.startswith("optim/"):
                _, idx, key = k.split("/", 2)
                state.setdefault(int(idx), {})[key] = data[k].copy()
        opt.load_state_dict({"state": state, "param_groups": json.loads(str(data["optim_groups"]))})
        return int(data["step"])


def resume(ckpt_dir: str, model, opt) -> int:
    """Load the newest checkpoint (retrying if it is replaced while we read); the step to start at."""
    for _ in range(5):
        path = find_latest_checkpoint(ckpt_dir, "step_*.npz")
        if path is None:
            return 0
        try:
            return load_checkpoint(path, model, opt)
        except FileNotFoundError:
            time.sleep(0.05)
    raise RuntimeError(f"could not read a checkpoint from {ckpt_dir}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--crash-at", type=int, default=7, help="step at which attempt 0 crashes")
    parser.add_argument("--crash-rank", type=int, default=None, help="default: the last rank")
    parser.add_argument("--no-crash", action="store_true", help="run straight through")
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out", help="rank 0 writes the final parameters here (.npz)")
    parser.add_argument("--step-log", help="append 'rank step restart time' lines here (benchmarks)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend a step takes longer")
    args = parser.parse_args(argv)

    dist.init_process_group()  # launcher -> gloo; a world of one under plain python
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_classification_data(N_SAMPLES, N_FEATURES, N_CLASSES, seed=0)
    model, opt = build(args.lr)
    # Every rank loads (its optimizer state is its own), before DDP's first collective: so no
    # rank can save a newer checkpoint while another is still choosing one.
    if rank == 0:  # the only writer: clear what a write killed by the crash left behind
        remove_interrupted_writes(args.ckpt_dir)
    start = resume(args.ckpt_dir, model, opt)
    ddp = dist.DistributedDataParallel(model)
    sampler = dist.DistributedSampler(dataset_size=N_SAMPLES, shuffle=True, seed=0)
    per_epoch = len(sampler) // args.batch_size
    attempt = restart_count()
    print(f"rank {rank}/{world} attempt {attempt}: "
          + (f"resuming from step {start}" if start else "starting fresh"), flush=True)

    crash_rank = world - 1 if args.crash_rank is None else args.crash_rank
    order, order_epoch = None, None
    for step in range(start, args.steps):
        if not args.no_crash and attempt == 0 and step == args.crash_at and rank == crash_rank:
            print(f"rank {rank}: crashing on purpose at step {step}", flush=True)
            os._exit(13)  # a hard crash: no cleanup, no exception handler
        epoch, batch = divmod(step, per_epoch)
        if epoch != order_epoch:  # the order depends only on the epoch: a resumed run replays it
            sampler.set_epoch(epoch)
            order, order_epoch = list(sampler), epoch
        idx = order[batch * args.batch_size:(batch + 1) * args.batch_size]
        loss = F.cross_entropy(ddp(Tensor(x[idx])), y[idx])
        loss.backward()  # DDP averages the gradients over the ranks here
        opt.step()
        opt.zero_grad()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0:
            save_checkpoint(os.path.join(args.ckpt_dir, f"step_{step + 1:06d}.npz"), model, opt, step + 1)
        if args.step_log:
            with open(args.step_log, "a") as f:
                f.write(f"{rank} {step + 1} {attempt} {time.time():.6f}\n")

    if rank == 0:
        print(f"final loss {float(loss.item()):.6f} after {args.steps} steps", flush=True)
        if args.out:
            save_npz_atomic(args.out, **{k: np.asarray(v) for k, v in model.state_dict().items()})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
