"""The GPT step op by op against PyTorch CPU: where the core's time goes relative to torch's (issue 37).

``bench_core.py --gpt`` times the whole step and profiles ours alone; this benchmark puts each op of
that step beside torch's same op at the same shapes (gpt128: batch 16 x block 64 tokens, width 128,
4 heads, MLP 512, vocab 256), forward alone and forward + backward, float32, both in one process at
the same thread count, interleaved call by call in every round. Each op's row also says what it
weighs in one step (its forward + backward time times the number of calls the step makes), so the
gap column adds up to the part of the step's difference that these ops explain.

Usage::

    PYTHONPATH=/path/to/torch python benchmarks/bench_core_ops.py                # 1 and 2 threads
    PYTHONPATH=/path/to/torch python benchmarks/bench_core_ops.py --threads 1 --rounds 5

Every (thread count) runs in its own process with the BLAS/OpenMP thread variables set before NumPy
and torch are imported; torch's intra-op threads are set to the same count. Raw result:
``benchmarks/results/bench_core_ops.json`` (per round medians of every op and contender).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
if _ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, _ROOT)

from benchmarks.common import blas_threads, format_table, run_worker, write_json  # noqa: E402

#: gpt128 of bench_core.py: tokens = batch x block
BATCH, BLOCK, WIDTH, HEADS, VOCAB, LAYERS = 16, 64, 128, 4, 256, 4
TOKENS = BATCH * BLOCK


def _ops():
    """``(name, calls per step, input shapes, ours(tensors), torch's(tensors))`` for every op of the step
    whose time is not one GEMM call on each side (the linear layers are listed too, as the control:
    both sides call a BLAS GEMM there)."""
    import numpy as np
    import torch
    import torch.nn.functional as TF

    import neural_arch.nn.functional as F

    target = np.random.default_rng(1).integers(0, VOCAB, TOKENS)
    target_t = torch.from_numpy(target)
    head = WIDTH // HEADS
    return [
        ("gelu", LAYERS, [(TOKENS, 4 * WIDTH)], lambda x: F.gelu(x), lambda x: TF.gelu(x)),
        ("layer_norm", 2 * LAYERS + 1, [(BATCH, BLOCK, WIDTH), (WIDTH,), (WIDTH,)],
         lambda x, w, b: F.layer_norm(x, (WIDTH,), w, b), lambda x, w, b: TF.layer_norm(x, (WIDTH,), w, b)),
        ("attention (causal)", LAYERS, [(BATCH, HEADS, BLOCK, head)] * 3,
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("cross_entropy", 1, [(TOKENS, VOCAB)],
         lambda x: F.cross_entropy(x, target), lambda x: TF.cross_entropy(x, target_t)),
        ("linear 128->384 (control)", LAYERS, [(TOKENS, WIDTH), (3 * WIDTH, WIDTH), (3 * WIDTH,)],
         lambda x, w, b: F.linear(x, w, b), lambda x, w, b: TF.linear(x, w, b)),
        ("linear 128->512 (control)", LAYERS, [(TOKENS, WIDTH), (4 * WIDTH, WIDTH), (4 * WIDTH,)],
         lambda x, w, b: F.linear(x, w, b), lambda x, w, b: TF.linear(x, w, b)),
    ]


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def worker(threads: int, rounds: int, repeat: int) -> dict:
    """Every op's forward and forward + backward, ours and torch's, interleaved in every round."""
    import numpy as np
    import torch

    import neural_arch as na

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    rng = np.random.default_rng(0)
    results = []
    ops = _ops()
    inputs = {name: [rng.standard_normal(s).astype(np.float32) for s in shapes] for name, _, shapes, _, _ in ops}

    def ours(name, fn, backward):
        def call():
            # from_numpy on both sides: no copy of the inputs inside the timing
            args = [na.from_numpy(a).requires_grad_() for a in inputs[name]]
            y = fn(*args)
            if backward:
                y.backward(na.from_numpy(np.ones(y.shape, dtype=np.float32)))
        return call

    def theirs(name, fn, backward):
        def call():
            args = [torch.from_numpy(a).requires_grad_() for a in inputs[name]]
            y = fn(*args)
            if backward:
                y.backward(torch.ones_like(y))
        return call

    contenders = [(name, calls, [("ours", False, ours(name, f, False)), ("torch", False, theirs(name, t, False)),
                                 ("ours", True, ours(name, f, True)), ("torch", True, theirs(name, t, True))])
                  for name, calls, _, f, t in ops]
    for _, _, fns in contenders:           # warm-up: first calls allocate and fill caches
        for _, _, fn in fns:
            for _ in range(3):
                fn()
    samples = {(name, who, bwd): [] for name, _, fns in contenders for who, bwd, _ in fns}
    for _ in range(rounds):
        for name, _, fns in contenders:
            for who, bwd, fn in fns:
                samples[(name, who, bwd)].append(_median_ms(fn, repeat))
    for name, calls, _ in contenders:
        row = {"op": name, "calls_per_step": calls}
        for who in ("ours", "torch"):
            for bwd, key in ((False, "fwd"), (True, "fwd_bwd")):
                per_round = samples[(name, who, bwd)]
                row[f"{who}_{key}_ms"] = statistics.median(per_round)
                row[f"{who}_{key}_rounds_ms"] = per_round
        row["step_gap_ms"] = calls * (row["ours_fwd_bwd_ms"] - row["torch_fwd_bwd_ms"])
        results.append(row)
    return {"threads": threads, "blas_threads": blas_threads(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "rounds": rounds, "repeat": repeat, "ops": results}


def _chart(path: str, workers: list) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(workers), figsize=(6.5 * len(workers), 4), squeeze=False)
    for ax, w in zip(axes[0], workers):
        names = [r["op"] for r in w["ops"]]
        ours = [r["calls_per_step"] * r["ours_fwd_bwd_ms"] for r in w["ops"]]
        theirs = [r["calls_per_step"] * r["torch_fwd_bwd_ms"] for r in w["ops"]]
        ys = range(len(names))
        ax.barh([y + 0.2 for y in ys], ours, height=0.4, label="neural_arch")
        ax.barh([y - 0.2 for y in ys], theirs, height=0.4, label="torch")
        ax.set_yticks(list(ys), names)
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (forward + backward x calls)")
        ax.set_title(f"gpt128 ops, {w['threads']} thread(s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="the GPT step's ops against torch's, op by op")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts, one process each")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the range is over them)")
    parser.add_argument("--repeat", type=int, default=30, help="calls per contender per round (their median)")
    parser.add_argument("--json", default=os.path.join(_HERE, "results", "bench_core_ops.json"))
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.rounds, args.repeat)))
        return {}
    script = os.path.abspath(__file__)
    workers = [run_worker([script, "--worker", str(n), "--rounds", str(args.rounds), "--repeat", str(args.repeat)],
                          threads=n) for n in (int(t) for t in args.threads.split(","))]
    rows = []
    for w in workers:
        for r in w["ops"]:
            lo = min(r["ours_fwd_bwd_rounds_ms"]) / max(r["torch_fwd_bwd_rounds_ms"])
            hi = max(r["ours_fwd_bwd_rounds_ms"]) / min(r["torch_fwd_bwd_rounds_ms"])
            rows.append([w["threads"], r["op"], r["calls_per_step"],
                         f"{r['ours_fwd_ms']:.3f} / {r['torch_fwd_ms']:.3f}",
                         f"{r['ours_fwd_bwd_ms']:.3f} / {r['torch_fwd_bwd_ms']:.3f}",
                         f"{r['ours_fwd_bwd_ms'] / r['torch_fwd_bwd_ms']:.2f}x ({lo:.2f}-{hi:.2f})",
                         f"{r['step_gap_ms']:+.2f}"])
    print(f"gpt128's ops, float32, ms per call (median of {args.rounds} interleaved rounds, each the median of "
          f"{args.repeat} calls); {workers[0]['torch']}")
    print(format_table(rows, ["threads", "op", "calls / step", "forward: ours / torch",
                              "forward + backward: ours / torch", "ours / torch (range)", "gap per step ms"]))
    payload = {"benchmark": "core_gpt_ops_vs_torch", "shapes": {"batch": BATCH, "block": BLOCK, "width": WIDTH,
                                                                 "heads": HEADS, "vocab": VOCAB, "layers": LAYERS},
               "rounds": args.rounds, "repeat": args.repeat, "results": workers}
    if args.json:
        print(f"wrote {write_json(args.json, payload)}")
        chart = _chart(os.path.splitext(args.json)[0] + ".png", workers)
        if chart:
            print(f"wrote {chart}")
    return payload


if __name__ == "__main__":
    main()
