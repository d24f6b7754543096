#!/usr/bin/env python3
"""Context parallelism (ring attention): activation memory per rank, bytes moved, hidden communication.

For cp = 1, 2, 4 (gloo, real processes on one host) every rank holds ``T/cp`` positions of
``(B, H, T, D)`` float32 q/k/v (load-balanced layout, causal) and runs
``ring_attention(..., rotate="p2p")`` forward + backward (and, for comparison, ``rotate="allgather"``).
Reported from rank 0:

* **activation memory**: bytes allocated by the forward and still held for the backward (output,
  log-sum-exp, the packed K/V) and the forward's peak, measured with ``tracemalloc`` (NumPy reports
  its buffers to it), next to the same numbers for single-process blockwise attention over the
  whole sequence (cp = 1): the ring should hold about 1/cp of it; allgather holds the whole K/V.
* **bytes moved**: payload bytes this rank handed to the backend (its ``send``/``allgather``/
  ``reduce_scatter`` wrapped and counted), vs the analytic volume. Per rank, with ``kv`` = the
  local K and V (``2 * B * H * T/cp * D * 4`` bytes): p2p forward ``(cp-1) kv`` (cp-1 hops),
  backward ``(cp-1) kv`` (K/V again) ``+ cp kv`` (dK/dV accumulators, cp hops home); allgather
  forward ``(cp-1) kv`` and backward ``(cp-1) kv + (cp-1) kv`` (gather again, reduce-scatter).
* **causal balance**: the attention compute of each rank with the load-balanced and the
  contiguous layout (contiguous: rank 0 sees only its own block, the last rank all of them).
* **hidden communication**: the same ``cp-1`` K/V hops timed alone (send right, receive left,
  nothing to compute) vs the time the ring's forward actually waited for transfers after its
  compute (``ring_stats["wait_s"]``): hidden = 1 - waited / alone, floored at 0. A wait can also be
  for a peer that is behind (more work, or descheduled: with more ranks than cores it is), so
  "waited" above "alone" means skew, not unhidden transfer; run with cp <= the free cores.

Run::

    python benchmarks/bench_context_parallel.py                 # cp = 1, 2, 4; T = 2048
    python benchmarks/bench_context_parallel.py --cp 2 --seq 4096 --repeat 5

Timings depend on the machine (these share cores with whatever else runs); memory and bytes are exact.
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


def _count_bytes(backend, n: int, counted: dict) -> None:
    """Wrap the backend's data-moving calls and count what this rank sends: a p2p ``send`` its
    payload; ``allgather`` (n-1) x its input and ``reduce_scatter`` (n-1)/n x its input (what each
    rank sends in the bandwidth-optimal ring algorithms)."""
    for name, payload_arg, factor in (("send", 0, 1.0), ("allgather", 1, n - 1), ("reduce_scatter", 1, (n - 1) / n)):
        original = getattr(backend, name)

        def counting(*args, _orig=original, _arg=payload_arg, _f=factor, **kwargs):
            counted["bytes"] += round(args[_arg].nbytes * _f)
            return _orig(*args, **kwargs)

        setattr(backend, name, counting)


def _rank_fn(cfg: dict):
    import tracemalloc

    import neural_arch.distributed as dist
    from neural_arch.core import ops_attention
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor.experimental import (
        ring_attention,
        ring_stats,
        sequence_positions,
        shard_sequence,
    )

    g = dist.get_default_group()
    n, r = g.size(), g.rank()
    B, H, T, D = cfg["batch"], cfg["heads"], cfg["seq"], cfg["dim"]
    rng = np.random.default_rng(0)
    q, k, v, up = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(4))
    ql, kl, vl, ul = (shard_sequence(a, 2, g) for a in (q, k, v, up))
    counted = {"bytes": 0}
    _count_bytes(g.backend, n, counted)
    kv_bytes = 2 * ql.nbytes
    out = {"cp": n, "kv_bytes": kv_bytes, "q_bytes": ql.nbytes}

    def memory(fn):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return result, held - base, peak - base

    for rotate in ("p2p", "allgather"):
        leaves = [Tensor(a, requires_grad=True) for a in (ql, kl, vl)]
        dist.barrier()
        counted["bytes"] = 0
        y, held, peak = memory(lambda ls=leaves, rot=rotate: ring_attention(*ls, group=g, is_causal=True, rotate=rot))
        fwd_bytes = counted["bytes"]
        waited, compute = ring_stats["wait_s"], ring_stats["compute_s"]
        counted["bytes"] = 0
        y.backward(Tensor(ul))
        out[rotate] = {"held": held, "peak": peak, "fwd_bytes": fwd_bytes, "bwd_bytes": counted["bytes"]}
        times, waits, computes = [], [], []
        for _ in range(cfg["repeat"]):
            dist.barrier()
            start = time.perf_counter()
            ring_attention(*[Tensor(a) for a in (ql, kl, vl)], group=g, is_causal=True, rotate=rotate)
            times.append(time.perf_counter() - start)
            waits.append(ring_stats["wait_s"])
            computes.append(ring_stats["compute_s"])
        out[rotate].update(fwd_s=float(np.median(times)), wait_s=float(np.median(waits)),
                           compute_s=float(np.median(computes)), first_wait_s=waited, first_compute_s=compute)
    # causal work per rank in each layout: the slowest rank sets the step time. Exact: the score
    # entries of the tiles the kernel computes (the mask's own skip test); and measured: compute time
    out["balance"], out["entries"] = {}, {}
    block = ops_attention.DEFAULT_BLOCK_SIZE
    local = T // n
    for lb in (True, False):
        q_pos = sequence_positions(local, r, n, lb)
        entries = 0
        for src in range(n):
            mask = ops_attention.AttentionMask.causal(q_pos, sequence_positions(local, src, n, lb))
            if mask.hides(0, local, 0, local):
                continue
            for i0 in range(0, local, block):
                for j0 in range(0, local, block):
                    if not mask.hides(i0, min(i0 + block, local), j0, min(j0 + block, local)):
                        entries += (min(i0 + block, local) - i0) * (min(j0 + block, local) - j0)
        out["entries"]["load-balanced" if lb else "contiguous"] = entries * B * H
    for lb in (True, False):
        shards = [Tensor(shard_sequence(a, 2, g, lb)) for a in (q, k, v)]
        computes = []
        for _ in range(cfg["repeat"]):
            dist.barrier()
            ring_attention(*shards, group=g, is_causal=True, load_balance=lb)
            computes.append(ring_stats["compute_s"])
        out["balance"]["load-balanced" if lb else "contiguous"] = float(np.median(computes))
    # the same K/V hops with nothing to compute: what the ring would wait without overlap
    kv = np.ascontiguousarray(np.concatenate([kl, vl], axis=-1))
    alone = []
    for i in range(cfg["repeat"] + 1):  # the first round is a warm-up (a new tag's first use)
        dist.barrier()
        start = time.perf_counter()
        cur = kv
        for _step in range(n - 1):
            nxt = np.empty_like(kv)
            works = [g.backend.recv(nxt, (r - 1) % n, 7, async_op=True),
                     g.backend.send(cur, (r + 1) % n, 7, async_op=True)]
            for w in works:
                w.wait()
            cur = nxt
        if i:
            alone.append(time.perf_counter() - start)
    out["comm_alone_s"] = float(np.median(alone))
    if r == 0:
        # single-process blockwise attention over the whole sequence: the reference memory
        leaves = [Tensor(a, requires_grad=True) for a in (q, k, v)]
        _, held, peak = memory(lambda: ops_attention.local_attention(*leaves, is_causal=True))
        out["full"] = {"held": held, "peak": peak}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from benchmarks.common import print_table
    from neural_arch.distributed.testing import RankPool

    cfg = {"seq": args.seq, "batch": args.batch, "heads": args.heads, "dim": args.dim, "repeat": args.repeat}
    print(f"# ring attention, causal, load-balanced; B={args.batch} H={args.heads} T={args.seq} D={args.dim} "
          f"float32, gloo; command: python {' '.join(sys.argv)}")
    mem_rows, byte_rows, time_rows, balance_rows = [], [], [], []
    for cp in args.cp:
        with RankPool(cp, backend="gloo", timeout=600.0) as pool:
            every = pool.run(_rank_fn, cfg)
        res = every[0]
        for layout in ("load-balanced", "contiguous"):
            per_rank = [e["balance"][layout] for e in every]
            work = [e["entries"][layout] for e in every]
            balance_rows.append([cp, layout, " / ".join(f"{w / 1e6:.1f}" for w in work), f"{max(work) / min(work):.2f}",
                                 " / ".join(f"{t * 1e3:.0f}" for t in per_rank), f"{max(per_rank) / min(per_rank):.2f}"])
        full = res["full"]
        mib = 1 << 20
        kv = res["kv_bytes"]
        for rotate in ("p2p", "allgather"):
            m = res[rotate]
            # with the attention's own inputs (q, k, v: this rank's share vs the whole sequence)
            mine, whole = m["peak"] + 3 * res["q_bytes"], full["peak"] + 3 * res["q_bytes"] * cp
            mem_rows.append([cp, rotate, f"{m['held'] / mib:.2f}", f"{full['held'] / mib:.2f}",
                             f"{m['held'] / full['held']:.3f}", f"{m['peak'] / mib:.2f}", f"{full['peak'] / mib:.2f}",
                             f"{m['peak'] / full['peak']:.3f}", f"{mine / mib:.2f}", f"{whole / mib:.2f}",
                             f"{mine / whole:.3f}"])
            fwd_expect = (cp - 1) * kv
            bwd_expect = (cp - 1) * kv + (cp * kv if rotate == "p2p" else (cp - 1) * kv) if cp > 1 else 0
            byte_rows.append([cp, rotate, m["fwd_bytes"], fwd_expect, m["bwd_bytes"], bwd_expect,
                              "yes" if (m["fwd_bytes"], m["bwd_bytes"]) == (fwd_expect, bwd_expect) else "NO"])
        p = res["p2p"]
        alone = res["comm_alone_s"]
        # waits longer than the hops alone are a slower peer (skew, a rank descheduled), not transfer
        hidden = max(0.0, 1.0 - p["wait_s"] / alone) if alone > 0 and cp > 1 else float("nan")
        time_rows.append([cp, f"{p['fwd_s'] * 1e3:.1f}", f"{p['compute_s'] * 1e3:.1f}", f"{p['wait_s'] * 1e3:.2f}",
                          f"{alone * 1e3:.2f}", f"{100 * hidden:.0f}%" if cp > 1 else "-",
                          f"{res['allgather']['fwd_s'] * 1e3:.1f}"])
    print("\n## activation memory per rank (MiB): held for backward after forward; forward peak (transient);"
          " peak + the q/k/v inputs")
    print_table(mem_rows, ["cp", "rotate", "held", "held unsharded", "ratio", "peak", "peak unsharded", "ratio",
                           "peak+qkv", "unsharded", "ratio"])
    print("\n## bytes this rank handed to the backend vs the analytic volume")
    print_table(byte_rows, ["cp", "rotate", "forward", "analytic", "backward", "analytic", "equal"])
    print("\n## causal work balance, ring forward: score entries the kernel computes (exact), compute time")
    print_table(balance_rows, ["cp", "layout", "scores computed per rank (M)", "max / min", "compute per rank (ms)",
                               "max / min"])
    print("\n## ring forward (p2p): time, compute, exposed wait, the same hops alone, hidden share")
    print_table(time_rows, ["cp", "forward ms", "compute ms", "waited ms", "hops alone ms", "hidden",
                            "allgather forward ms"])


if __name__ == "__main__":
    main()
