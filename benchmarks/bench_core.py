"""One training step of an MLP (784-1024-1024-10, batch 128, float32): neural_arch vs NumPy vs torch.

A step is forward + softmax cross-entropy + backward + SGD update (lr 0.01). Three versions:

* ``numpy``       -- the same step written by hand in NumPy (the floor neural_arch is measured against);
* ``neural_arch`` -- ``nn.Sequential`` + ``nn.CrossEntropyLoss`` + ``loss.backward()`` + ``optim.SGD``;
* ``torch``       -- the same model in PyTorch on the CPU (skipped when torch is not importable).

Every (implementation, thread count) pair runs in its own subprocess with the BLAS/OpenMP thread
variables set *before* NumPy is imported (``threads=1``, and ``default`` = whatever the machine
gives when nothing is set); the worker records what threadpoolctl / torch actually report, so the
table shows the thread count that was really used. All versions start from the same weights and
data, and the first-step losses are printed so you can see they compute the same thing.

Usage::

    python benchmarks/bench_core.py                       # threads 1 and default, 2 rounds
    python benchmarks/bench_core.py --threads 1 --repeat 30 --json /tmp/core.json
    python benchmarks/bench_core.py --profile             # cProfile of the neural_arch step

Goal (a target, measured honestly): neural_arch <= 1.15x the hand-written NumPy step and faster
than torch CPU at the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
if _ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, _ROOT)

from benchmarks._common import (  # noqa: E402
    blas_threads,
    format_table,
    median_time,
    run_worker,
    write_json,
)

SIZES = (784, 1024, 1024, 10)
BATCH = 128
LR = 0.01
IMPLS = ("numpy", "neural_arch", "torch")


def _initial_state(seed: int = 0):
    """Weights (torch layout, out x in) drawn like torch's Linear default, plus one batch."""
    import numpy as np

    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        params.append(rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32))
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=BATCH).astype(np.int64)
    return params, x, y


# ---------------------------------------------------------------------------- the three steps
def make_numpy_step(params, x, y):
    """Hand-written forward/backward/SGD for the same MLP; returns step() -> loss."""
    import numpy as np

    w1, b1, w2, b2, w3, b3 = [p.copy() for p in params]
    n = x.shape[0]
    rows = np.arange(n)

    def step():
        h1 = x @ w1.T
        h1 += b1
        np.maximum(h1, 0, out=h1)
        h2 = h1 @ w2.T
        h2 += b2
        np.maximum(h2, 0, out=h2)
        logits = h2 @ w3.T
        logits += b3
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)  # now softmax probabilities
        loss = -np.log(logits[rows, y]).mean()
        d3 = logits
        d3[rows, y] -= 1
        d3 /= n
        g_w3, g_b3 = d3.T @ h2, d3.sum(0)
        d2 = d3 @ w3
        d2 *= h2 > 0
        g_w2, g_b2 = d2.T @ h1, d2.sum(0)
        d1 = d2 @ w2
        d1 *= h1 > 0
        g_w1, g_b1 = d1.T @ x, d1.sum(0)
        for p, g in ((w1, g_w1), (b1, g_b1), (w2, g_w2), (b2, g_b2), (w3, g_w3), (b3, g_b3)):
            p -= LR * g
        return float(loss)

    return step


def make_neural_arch_step(params, x, y):
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    model.load_state_dict(dict(zip(model.state_dict().keys(), params)))
    opt = optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = Tensor(x), Tensor(y)

    def step():
        loss = loss_fn(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


def make_torch_step(params, x, y):
    import torch

    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.copy_(torch.from_numpy(value))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        loss = loss_fn(model(xt), yt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


FACTORIES = {"numpy": make_numpy_step, "neural_arch": make_neural_arch_step, "torch": make_torch_step}


# ---------------------------------------------------------------------------- worker (subprocess)
def worker(impl: str, threads: int | None, repeat: int, warmup: int) -> dict:
    params, x, y = _initial_state()
    torch_threads = None
    if impl == "torch":
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        torch_threads = torch.get_num_threads()
    step = FACTORIES[impl](params, x, y)
    first_loss = step()
    times, cpu_times = [], []

    def timed():
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)

    median_time(timed, repeat=repeat, warmup=warmup)
    return {"impl": impl, "threads_requested": threads, "blas_threads": blas_threads(),
            "torch_threads": torch_threads, "first_loss": first_loss, "times_s": times[warmup:],
            "cpu_times_s": cpu_times[warmup:]}


def profile_neural_arch(repeat: int) -> None:
    import cProfile
    import pstats

    params, x, y = _initial_state()
    step = make_neural_arch_step(params, x, y)
    for _ in range(3):
        step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeat):
        step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


# ---------------------------------------------------------------------------- driver
def _torch_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="neural_arch MLP training-step benchmark")
    parser.add_argument("--threads", default="1,default",
                        help="comma-separated BLAS thread counts; 'default' leaves the environment alone")
    parser.add_argument("--repeat", type=int, default=20, help="timed steps per worker")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2,
                        help="run every worker this many times, interleaved; times are pooled")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--json", default=os.path.join(_HERE, "results", "bench_core.json"))
    parser.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile the neural_arch step and exit")
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.worker_threads, args.repeat, args.warmup)))
        return {}
    if args.profile:
        profile_neural_arch(args.repeat)
        return {}

    impls = [i for i in args.impls.split(",") if i]
    if "torch" in impls and not _torch_available():
        print("torch is not importable: skipping the torch column", file=sys.stderr)
        impls.remove("torch")
    thread_counts = [None if t == "default" else int(t) for t in args.threads.split(",")]
    script = os.path.abspath(__file__)
    results: dict = {}
    for _ in range(args.rounds):
        for threads in thread_counts:
            for impl in impls:
                cmd = [script, "--worker", impl, "--repeat", str(args.repeat), "--warmup", str(args.warmup)]
                if threads is not None:
                    cmd += ["--worker-threads", str(threads)]
                out = run_worker(cmd, threads=threads)
                entry = results.setdefault((threads, impl), {**out, "times_s": [], "cpu_times_s": []})
                entry["times_s"] += out["times_s"]
                entry["cpu_times_s"] += out["cpu_times_s"]

    import statistics

    def med(threads, impl, key="times_s"):
        return statistics.median(results[(threads, impl)][key]) if impl in impls else None

    rows, records = [], []
    for threads in thread_counts:
        base, base_cpu, torch_med = med(threads, "numpy"), med(threads, "numpy", "cpu_times_s"), \
            med(threads, "torch")
        for impl in impls:
            r = results[(threads, impl)]
            wall, cpu = med(threads, impl), med(threads, impl, "cpu_times_s")
            used = r["torch_threads"] if impl == "torch" else r["blas_threads"]
            rec = {"impl": impl, "threads": "default" if threads is None else threads, "threads_used": used,
                   "median_ms": wall * 1e3, "min_ms": min(r["times_s"]) * 1e3, "cpu_median_ms": cpu * 1e3,
                   "steps": len(r["times_s"]), "vs_numpy": wall / base if base else None,
                   "vs_numpy_cpu": cpu / base_cpu if base_cpu else None,
                   "vs_torch": wall / torch_med if torch_med else None, "first_loss": r["first_loss"]}
            records.append(rec)

            def ratio(v):
                return "-" if v is None else f"{v:.2f}x"

            rows.append([impl, rec["threads"], used, rec["median_ms"], rec["min_ms"], rec["cpu_median_ms"],
                         ratio(rec["vs_numpy"]), ratio(rec["vs_numpy_cpu"]), ratio(rec["vs_torch"]),
                         f"{r['first_loss']:.6f}"])
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32: one training step (fwd + bwd + SGD)")
    print(format_table(rows, ["impl", "threads", "threads used", "median ms", "min ms", "cpu ms",
                              "vs numpy", "vs numpy (cpu)", "vs torch", "first loss"]))
    print("median/min ms: wall clock per step; cpu ms: median process CPU time per step (all threads), "
          "less sensitive to other jobs on a shared machine")
    payload = {"benchmark": "core_mlp_step", "sizes": SIZES, "batch": BATCH, "dtype": "float32",
               "repeat": args.repeat, "rounds": args.rounds, "results": records}
    if args.json:
        print(f"wrote {write_json(args.json, payload)}")
    return payload


if __name__ == "__main__":
    main()
