#!/usr/bin/env python3
"""Mixture of experts: the token all-to-all's bus bandwidth against MPICH's ``Alltoallv``, and the
tokens per second of an MoE GPT at ep = 1, 2.

1. **all-to-all** (``--ranks`` processes under a real ``mpiexec``, backend ``mpi``): the uneven
   exchange expert parallelism uses (``expert_parallel._exchange_rows``: split sizes known on every
   rank from the count table, the backend's native ``alltoallv``: on MPI the split sizes ride in the
   call check, then the blocks go as point-to-point messages on the caller's buffers -- groups of up
   to 8 ranks, ``comm/mpi/alltoallv.py``; ``Ialltoallv`` beyond) against
   ``MPI.COMM_WORLD.Alltoallv`` with the same splits, in the same processes, interleaved; both
   produce a fresh output array per call (an MoE layer must: autograd keeps it). Rank s
   sends ``rows * (1 + (s + d) % n) / n`` rows of ``--width`` float32 to rank d (uneven). Bus
   bandwidth follows nccl-tests: ``busbw = bytes sent per rank / time * (n - 1) / n``; the ratio
   column is ours / MPICH's bandwidth (goal >= 1.0), per run the median over iterations of the
   pair measured back to back. The last column times ``backend.alltoallv`` alone into a
   reused output (no allocation, no autograd). The machine is shared: ``--repeats`` runs, each the
   median of ``--iters`` iterations, reported as median [min-max]; ``--json`` keeps the raw numbers.
   ``--backend gloo`` runs ours on a gloo world over the same mpiexec ranks (one host: the uneven
   exchange on the shared segment, ``comm/gloo/shm_direct.py``), MPICH's ``Alltoallv`` unchanged.
2. **MoE GPT** (gloo, DDP, float32): tokens per second of forward + backward + Adam of a GPT whose
   every other MLP is an MoE (``moe_num_experts`` experts, top-2), at ep = 1 (experts replicated,
   averaged over the group) and ep = 2 (experts split), on the same global batch.

Run::

    python benchmarks/bench_moe.py                      # both parts, 2 ranks
    python benchmarks/bench_moe.py --part a2a --sizes 65536 1048576
    python benchmarks/bench_moe.py --part a2a --repeats 7 --json benchmarks/results/bench_moe_a2a.json
    python benchmarks/bench_moe.py --part a2a --backend gloo --repeats 15 --iters 10
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


class _GlooGroup:
    """What ``_exchange_rows`` reads of a group (``.backend``), for a gloo world built beside MPI."""

    def __init__(self, backend):
        self.backend = backend


def _gloo_beside_mpi(comm):
    """A gloo world over the same ranks as ``comm`` (mpiexec started them; MPICH's Alltoallv keeps
    running in the same processes): rank 0 hosts a loopback store and sends its port over MPI."""
    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore

    r, n = comm.Get_rank(), comm.Get_size()
    store = TCPStore("127.0.0.1", 0, world_size=n, is_master=True, timeout=60.0) if r == 0 else None
    port = comm.bcast(store.port if r == 0 else None, root=0)
    if r:
        store = TCPStore("127.0.0.1", port, world_size=n, timeout=60.0)
    return GlooBackend.create(store, r, n, timeout=60.0), store


def _a2a_rank(sizes_bytes: list, width: int, iters: int, backend: str = "mpi"):
    """On every rank (under mpiexec): per size, the median seconds of ours, MPICH's Alltoallv and the
    backend's alltoallv alone, the three interleaved in every iteration (the slowest rank's median).
    ``backend="gloo"``: ours runs on a gloo world over the same ranks (shared memory on one host)."""
    from mpi4py import MPI

    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.expert_parallel import _exchange_rows
    from neural_arch.distributed.resolve import _resolve_group

    comm = MPI.COMM_WORLD
    gloo = store = None
    if backend == "gloo":
        gloo, store = _gloo_beside_mpi(comm)
        group = _GlooGroup(gloo)
    else:
        group = _resolve_group(None, "bench_moe")
    n, r = comm.Get_size(), comm.Get_rank()
    out = []
    for nbytes in sizes_bytes:
        rows = max(1, nbytes // (4 * width))
        split = [[rows * (1 + (s + d) % n) // n for d in range(n)] for s in range(n)]
        sends = split[r]
        receives = [split[s][r] for s in range(n)]
        x = np.random.default_rng(r).standard_normal((sum(sends), width)).astype(np.float32)
        sdispl = np.concatenate([[0], np.cumsum(sends)[:-1]]) * width
        rdispl = np.concatenate([[0], np.cumsum(receives)[:-1]]) * width
        scount, rcount = np.asarray(sends) * width, np.asarray(receives) * width
        ours, mpich, raw = [], [], []
        t = Tensor(x)
        reused = np.empty((sum(receives), width), dtype=np.float32)
        for i in range(iters + 1):
            comm.Barrier()
            t0 = time.perf_counter()
            y = _exchange_rows(t, sends, receives, group)
            t1 = time.perf_counter()
            comm.Barrier()
            t2 = time.perf_counter()
            # a fresh output, as an MoE layer needs one per call (autograd keeps it)
            recv = np.empty((sum(receives), width), dtype=np.float32)
            comm.Alltoallv([x, scount, sdispl, MPI.FLOAT], [recv, rcount, rdispl, MPI.FLOAT])
            t3 = time.perf_counter()
            comm.Barrier()
            t4 = time.perf_counter()
            group.backend.alltoallv(reused, x, receives, sends)   # the backend alone, into a reused output
            t5 = time.perf_counter()
            if i:                              # the first round warms up
                ours.append(t1 - t0)
                mpich.append(t3 - t2)
                raw.append(t5 - t4)
        if not (np.array_equal(y.data, recv) and np.array_equal(reused, recv)):
            raise AssertionError("bench_moe: our exchange and Alltoallv disagree")
        # the slowest rank decides an all-to-all's time (per iteration)
        slow = np.empty((3, iters))
        comm.Allreduce(np.array([ours, mpich, raw]), slow, op=MPI.MAX)
        out.append({"bytes": int(x.nbytes), "ours_s": slow[0].tolist(), "mpich_s": slow[1].tolist(),
                    "raw_s": slow[2].tolist()})
    if gloo is not None:
        comm.Barrier()
        gloo.shutdown()
        del store
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
    p.add_argument("--backend", choices=["mpi", "gloo"], default="mpi",
                   help="all-to-all: the backend ours runs on (the ranks run under mpiexec either way)")
    p.add_argument("--sizes", type=int, nargs="*", default=[1 << 12, 1 << 14, 1 << 16, 1 << 20, 1 << 22, 1 << 24],
                   help="bytes each rank sends (about)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5, help="all-to-all: runs of --iters iterations (median, range)")
    p.add_argument("--json", default=None, help="all-to-all: write the raw numbers here")
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
        n = args.ranks
        load_before = os.getloadavg()[0]
        runs = []
        # gloo: no MPI process group in the ranks (mpi4py's COMM_WORLD only, for MPICH's Alltoallv), so
        # nothing of our MPI backend (its watchdog thread) runs beside the gloo world being measured
        with RankPool(n, backend="mpi", timeout=600.0, init=args.backend == "mpi") as pool:
            for _ in range(args.repeats):
                runs.append(pool.run(_a2a_rank, args.sizes, args.width, args.iters, args.backend)[0])
        busbw = lambda row, key: row["bytes"] / float(np.median(row[key])) * (n - 1) / n / 1e9
        # the ratio of one run: the median over its iterations of MPICH's time / ours, each pair measured
        # back to back (on shared cores a burst of load then hits both sides of a pair, not one median)
        paired = lambda row: float(np.median(np.asarray(row["mpich_s"]) / np.asarray(row["ours_s"])))
        print(f"uneven all-to-all, {n} ranks under mpiexec (backend {args.backend}), float32 rows of {args.width}, "
              f"{os.cpu_count()} cpu(s); busbw = bytes/rank / time * (n-1)/n; median [min-max] of "
              f"{args.repeats} runs of {args.iters} interleaved iterations")
        print(f"{'bytes/rank':>11} {'ours GB/s':>20} {'MPICH Alltoallv GB/s':>22} {'ratio':>18} "
              f"{'backend alltoallv GB/s':>22}")
        table = []
        for i in range(len(args.sizes)):
            rows = [run[i] for run in runs]
            ours = [busbw(row, "ours_s") for row in rows]
            mpich = [busbw(row, "mpich_s") for row in rows]
            raw = [busbw(row, "raw_s") for row in rows]
            ratio = [paired(row) for row in rows]
            cell = lambda v: f"{np.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]"
            print(f"{rows[0]['bytes']:>11} {cell(ours):>20} {cell(mpich):>22} {cell(ratio):>18} {cell(raw):>22}")
            table.append({"bytes": rows[0]["bytes"], "ours_gbps": ours, "mpich_gbps": mpich, "ratio": ratio,
                          "backend_alltoallv_gbps": raw})
        if args.json:
            from benchmarks.common import write_json

            # (the environment block records the commit and the load average at the end; the payload the one before)
            write_json(args.json, {"loadavg_1min_before": load_before, "ranks": n, "backend": args.backend,
                                   "width": args.width,
                                   "iters": args.iters, "repeats": args.repeats, "runs": runs, "table": table})
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
