#!/usr/bin/env python3
"""Tensor-parallel GPT: per-rank parameter memory, step time, and communication volume per step.

For tp = 1, 2, 4 (gloo, one host) it trains a GPT for a few steps with the Megatron plan
(``parallelize_gpt``, vocabulary-parallel loss) and reports, from rank 0:

* parameter bytes held by one rank (vs the whole model);
* median step time (forward + backward + Adam);
* payload bytes this rank handed to collectives in one step, counted by wrapping the tp group's
  backend, vs the analytical count: per step ``B*T*C`` elements are all-reduced
  ``2 + 6 * n_layer`` times (embedding "g"; per block "g" after attention and MLP forward, and "f"
  in backward for q, k, v and fc1; "f" for the LM head), plus ``3*B*T`` for the loss
  (max, then sum-exp and target logit).

Run::

    python benchmarks/bench_tp.py                 # tp = 1, 2, 4
    python benchmarks/bench_tp.py --tp 2 --n-embd 256 --steps 5

Numbers depend on the machine; the comm-volume column is exact and should match the analysis.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np


def _rank_fn(cfg: dict):
    """Runs on every rank of a RankPool: returns rank 0's measurements."""
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy

    manual_seed(0)
    model = nn.GPT(vocab_size=cfg["vocab"], block_size=cfg["seq"], n_layer=cfg["n_layer"], n_head=cfg["n_head"],
                   n_embd=cfg["n_embd"])
    full_bytes = sum(p.data.nbytes for p in model.parameters())
    group = dist.get_default_group()
    parallelize_gpt(model, group, loss_parallel=True)
    local_bytes = sum(p.data.nbytes for p in model.parameters())
    opt = optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    B, T = cfg["batch"], cfg["seq"]
    counted = [0]
    backend = group.backend
    for name in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
        original = getattr(backend, name)

        def counting(array, *args, _orig=original, _name=name, **kwargs):
            # allgather(output, input): the payload is the input (second argument)
            payload = args[0] if _name == "allgather" else array
            counted[0] += int(payload.nbytes)
            return _orig(array, *args, **kwargs)
        setattr(backend, name, counting)
    times, volume = [], 0
    for step in range(cfg["steps"] + 1):
        idx = rng.integers(0, cfg["vocab"], size=(B, T))
        tgt = rng.integers(0, cfg["vocab"], size=(B, T))
        counted[0] = 0
        dist.barrier()
        t0 = time.perf_counter()
        loss = vocab_parallel_cross_entropy(model(idx), tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step:                      # step 0 warms up
            times.append(time.perf_counter() - t0)
            volume = counted[0]
    itemsize = np.dtype(np.float32).itemsize
    n = group.size()
    analytic = 0 if n == 1 else (B * T * cfg["n_embd"] * (2 + 6 * cfg["n_layer"]) + 3 * B * T) * itemsize
    return {"tp": n, "full_mb": full_bytes / 2**20, "local_mb": local_bytes / 2**20,
            "step_ms": 1e3 * float(np.median(times)), "comm_kb": volume / 1024, "analytic_kb": analytic / 1024}


def main(argv=None) -> int:
    from neural_arch.distributed.testing import RankPool

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    cfg = {k: getattr(args, k) for k in ("vocab", "seq", "n_layer", "n_head", "n_embd", "batch", "steps")}
    print(f"GPT vocab={args.vocab} seq={args.seq} n_layer={args.n_layer} n_head={args.n_head} "
          f"n_embd={args.n_embd} batch={args.batch}, float32, gloo, {os.cpu_count()} cpu(s)")
    print(f"{'tp':>3} {'params/rank MiB':>16} {'(whole MiB)':>12} {'step ms':>9} {'comm KiB/step':>14} "
          f"{'analytic KiB':>13}")
    for tp in args.tp:
        with RankPool(tp, backend="gloo", timeout=600.0) as pool:
            r = pool.run(_rank_fn, cfg)[0]
        print(f"{r['tp']:>3} {r['local_mb']:>16.3f} {r['full_mb']:>12.3f} {r['step_ms']:>9.1f} "
              f"{r['comm_kb']:>14.1f} {r['analytic_kb']:>13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
