#!/usr/bin/env python3
"""Mixture of experts: the token all-to-all's bus bandwidth against MPICH's ``Alltoallv``, and the
tokens per second of an MoE GPT at ep = 1, 2.

1. **all-to-all** (``--ranks`` processes under a real ``mpiexec``, backend ``mpi``): the uneven
   exchange expert parallelism uses (``expert_parallel._exchange_rows``: split sizes known on every
   rank from the count table, chunks padded to the largest, one equal-split all-to-all) against
   ``MPI.COMM_WORLD.Alltoallv`` with the same splits, in the same processes, alternating; both
   produce a fresh output array per call (an MoE layer must: autograd keeps it). Rank s
   sends ``rows * (1 + (s + d) % n) / n`` rows of ``--width`` float32 to rank d (uneven). Bus
   bandwidth follows nccl-tests: ``busbw = bytes sent per rank / time * (n - 1) / n``; the ratio
   column is ours / MPICH's (goal >= 1.0). The padding costs bandwidth when splits are uneven:
   the busbw counts only the useful bytes. The last column times the backend's equal-split
   ``alltoall`` alone on the padded chunks (same useful bytes): the gap between it and MPICH is the
   backend's (its per-op agreement round and progress wait), the gap between ours and it is ours.
2. **MoE GPT** (gloo, DDP, float32): tokens per second of forward + backward + Adam of a GPT whose
   every other MLP is an MoE (``moe_num_experts`` experts, top-2), at ep = 1 (experts replicated,
   averaged over the group) and ep = 2 (experts split), on the same global batch.

Run::

    python benchmarks/bench_moe.py                      # both parts, 2 ranks
    python benchmarks/bench_moe.py --part a2a --sizes 65536 1048576
    python benchmarks/bench_moe.py --part gpt --n-embd 128 --steps 5

Numbers depend on the machine (here: 2 shared cores); each is a median over ``--iters`` runs.
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


def _a2a_rank(sizes_bytes: list, width: int, iters: int):
    """On every rank (under mpiexec): median seconds of ours and of MPICH's Alltoallv per size."""
    from mpi4py import MPI

    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.expert_parallel import _exchange_rows
    from neural_arch.distributed.resolve import _resolve_group

    group = _resolve_group(None, "bench_moe")
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    out = []
    for nbytes in sizes_bytes:
        rows = max(1, nbytes // (4 * width))
        split = [[rows * (1 + (s + d) % n) // n for d in range(n)] for s in range(n)]
        sends = split[r]
        receives = [split[s][r] for s in range(n)]
        chunk = max(max(row) for row in split)
        x = np.random.default_rng(r).standard_normal((sum(sends), width)).astype(np.float32)
        recv = np.empty((sum(receives), width), dtype=np.float32)
        sdispl = np.concatenate([[0], np.cumsum(sends)[:-1]]) * width
        rdispl = np.concatenate([[0], np.cumsum(receives)[:-1]]) * width
        scount, rcount = np.asarray(sends) * width, np.asarray(receives) * width
        ours, mpich, raw = [], [], []
        t = Tensor(x)
        staging: dict = {}
        padded = np.zeros((n, chunk, width), dtype=np.float32)
        padded_out = np.empty_like(padded)
        for i in range(iters + 1):
            comm.Barrier()
            t0 = time.perf_counter()
            y = _exchange_rows(t, sends, receives, chunk, group, staging)
            t1 = time.perf_counter()
            comm.Barrier()
            t2 = time.perf_counter()
            # a fresh output, as an MoE layer needs one per call (autograd keeps it)
            recv = np.empty((sum(receives), width), dtype=np.float32)
            comm.Alltoallv([x, scount, sdispl, MPI.FLOAT], [recv, rcount, rdispl, MPI.FLOAT])
            t3 = time.perf_counter()
            comm.Barrier()
            t4 = time.perf_counter()
            group.backend.alltoall(padded_out, padded)     # the backend alone, on the padded chunks
            t5 = time.perf_counter()
            if i:                              # the first round warms up
                ours.append(t1 - t0)
                mpich.append(t3 - t2)
                raw.append(t5 - t4)
        if not np.array_equal(y.data, recv):
            raise AssertionError("bench_moe: our exchange and Alltoallv disagree")
        # the slowest rank decides an all-to-all's time
        slow = np.empty(3)
        comm.Allreduce(np.array([np.median(ours), np.median(mpich), np.median(raw)]), slow, op=MPI.MAX)
        out.append({"bytes": int(x.nbytes), "ours_s": float(slow[0]), "mpich_s": float(slow[1]),
                    "raw_s": float(slow[2])})
    return out


def _gpt_rank(cfg: dict, ep: int):
    """On every rank (gloo): tokens/s of the MoE GPT under DDP with experts split ``ep`` ways."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.expert_parallel import expert_parallel_mesh, parallelize_moe

    world, rank = dist.get_world_size(), dist.get_rank()
    manual_seed(0)
    model = nn.GPT(cfg["vocab"], cfg["seq"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"],
                   moe_num_experts=cfg["experts"], moe_every=2, moe_kwargs={"top_k": 2})
    parallelize_moe(model, device_mesh=expert_parallel_mesh(ep))
    ddp = dist.DistributedDataParallel(model)
    opt = optim.Adam(ddp.parameters(), lr=1e-3)
    rng = np.random.default_rng(rank)
    B, T = cfg["batch"] // world, cfg["seq"]
    times = []
    for step in range(cfg["steps"] + 1):
        idx = rng.integers(0, cfg["vocab"], size=(B, T))
        dist.barrier()
        t0 = time.perf_counter()
        loss = F.cross_entropy(ddp(idx).reshape(-1, cfg["vocab"]), np.roll(idx, -1, 1).reshape(-1)) + model.aux_loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step:
            times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    return {"ep": ep, "step_ms": 1e3 * step_s, "tokens_per_s": cfg["batch"] * T / step_s}


def main(argv=None) -> int:
    from neural_arch.distributed.testing import RankPool

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["a2a", "gpt", "both"], default="both")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="*", default=[1 << 16, 1 << 20, 1 << 22, 1 << 24],
                   help="bytes each rank sends (about)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    if args.part in ("a2a", "both"):
        with RankPool(args.ranks, backend="mpi", timeout=600.0) as pool:
            rows = pool.run(_a2a_rank, args.sizes, args.width, args.iters)[0]
        n = args.ranks
        print(f"uneven all-to-all, {n} ranks under mpiexec (backend mpi), float32 rows of {args.width}, "
              f"{os.cpu_count()} cpu(s); busbw = bytes/rank / time * (n-1)/n")
        print(f"{'bytes/rank':>11} {'ours GB/s':>10} {'MPICH Alltoallv GB/s':>21} {'ratio':>6} "
              f"{'backend alltoall (padded) GB/s':>31}")
        for row in rows:
            bw = [row["bytes"] / row[k] * (n - 1) / n / 1e9 for k in ("ours_s", "mpich_s", "raw_s")]
            print(f"{row['bytes']:>11} {bw[0]:>10.3f} {bw[1]:>21.3f} {bw[0] / bw[1]:>6.2f} {bw[2]:>31.3f}")
    if args.part in ("gpt", "both"):
        cfg = {k: getattr(args, k) for k in ("vocab", "seq", "n_layer", "n_head", "n_embd", "experts", "batch",
                                             "steps")}
        print(f"MoE GPT vocab={args.vocab} seq={args.seq} n_layer={args.n_layer} n_embd={args.n_embd} "
              f"experts={args.experts} (every other block, top-2), global batch {args.batch}, float32, gloo, "
              f"{args.ranks} ranks, DDP")
        print(f"{'ep':>3} {'step ms':>9} {'tokens/s':>10}")
        with RankPool(args.ranks, backend="gloo", timeout=600.0) as pool:
            for ep in (1, 2):
                r = pool.run(_gpt_rank, cfg, ep)[0]
                print(f"{r['ep']:>3} {r['step_ms']:>9.1f} {r['tokens_per_s']:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
