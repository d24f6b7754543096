"""GPU training-step benchmark: neural_arch on CuPy vs PyTorch on the same GPU.

Two MLPs (784-1024-1024-10 and a wider 784-4096-4096-10), batch 1024, float32, SGD; one step is
zero_grad + forward + cross-entropy + backward + optimizer step. Each framework is timed with a
device synchronisation around a block of steps (after warm-up), and the median over repeats is
reported. TF32 is off in both (their defaults), so both do the same float32 arithmetic.

Usage (on a GPU machine)::

    pip install -e '.[gpu]' torch       # torch is only the baseline; it is optional
    python benchmarks/bench_gpu.py --steps 50 --repeats 5 --out benchmarks/results/bench_gpu.json

Without a GPU it prints ``no GPU: skipped (<reason>)``, writes ``{"skipped": true, "reason": ...}``
to ``--out`` and exits 0, so it can sit in a benchmark script that also runs on CPU machines.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = {"mlp": [784, 1024, 1024, 10], "wide": [784, 4096, 4096, 10]}


def gpu_skip_reason():
    """None when CuPy imports and sees a GPU; otherwise why not (never raises)."""
    from neural_arch.backend import gpu_unavailable_reason

    return gpu_unavailable_reason()


def _time_steps(step, sync, steps: int, warmup: int, repeats: int) -> list:
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        times.append((time.perf_counter() - start) / steps)
    return times


def bench_neural_arch(sizes, batch, steps, warmup, repeats):
    import cupy as cp

    from neural_arch import nn, optim
    from neural_arch.core import rng as na_rng
    from neural_arch.core.tensor import Tensor
    na_rng.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, sizes[0])).astype(np.float32)).to("cuda")
    y = Tensor(rng.integers(0, sizes[-1], batch)).to("cuda")

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return _time_steps(step, lambda: cp.cuda.Device().synchronize(), steps, warmup, repeats)


def bench_torch(sizes, batch, steps, warmup, repeats):
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch is installed without CUDA support (or sees no GPU)")
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, sizes[0], device="cuda")
    y = torch.randint(0, sizes[-1], (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return _time_steps(step, torch.cuda.synchronize, steps, warmup, repeats)


def _summary(times, batch):
    med = statistics.median(times)
    return {"ms_per_step_median": med * 1e3, "ms_per_step_all": [t * 1e3 for t in times],
            "samples_per_s": batch / med}


def _environment():
    env = {"python": platform.python_version(), "numpy": np.__version__, "host": platform.node()}
    try:
        import cupy as cp
        env["cupy"] = cp.__version__
        props = cp.cuda.runtime.getDeviceProperties(0)
        env["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        env["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    except Exception as exc:  # noqa: BLE001 - informational only
        env["cupy_error"] = str(exc)[:200]
    try:
        import torch
        env["torch"] = torch.__version__
        env["torch_tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # noqa: BLE001
        env["torch"] = None
    env["CUPY_TF32"] = os.environ.get("CUPY_TF32", "0")
    return env


def _holds_real_results(path: str) -> bool:
    try:
        with open(path) as fh:
            return json.load(fh).get("skipped") is False
    except (OSError, ValueError, AttributeError):
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks; the median is reported")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--models", default="mlp,wide", help=f"comma-separated subset of {sorted(MODELS)}")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_gpu.json"))
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    record = {"benchmark": "bench_gpu", "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats}

    reason = gpu_skip_reason()
    if reason:
        record.update(skipped=True, reason=reason)
        if _holds_real_results(args.out):   # a CPU-only run must not erase numbers measured on a GPU
            print(f"no GPU: skipped ({reason}); kept the GPU results already in {args.out}")
            return 0
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=2)
        print(f"no GPU: skipped ({reason}); wrote {args.out}")
        return 0

    record.update(skipped=False, environment=_environment(), results={})
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        sizes = MODELS[name]
        row = {"sizes": sizes}
        for fw, fn in (("neural_arch", bench_neural_arch), ("torch", bench_torch)):
            try:
                row[fw] = _summary(fn(sizes, args.batch, args.steps, args.warmup, args.repeats), args.batch)
            except ImportError as exc:
                row[fw] = {"skipped": f"not installed: {exc}"}
            except Exception as exc:  # noqa: BLE001 - one framework failing must not lose the other's numbers
                row[fw] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if "ms_per_step_median" in row.get("neural_arch", {}) and "ms_per_step_median" in row.get("torch", {}):
            row["neural_arch_over_torch"] = row["neural_arch"]["ms_per_step_median"] / row["torch"]["ms_per_step_median"]
        record["results"][name] = row
        na, th = row.get("neural_arch", {}), row.get("torch", {})
        print(f"{name:5s} {'-'.join(map(str, sizes)):>20s}  neural_arch "
              f"{na.get('ms_per_step_median', float('nan')):8.3f} ms/step   torch "
              f"{th.get('ms_per_step_median', float('nan')):8.3f} ms/step   "
              f"{na.get('error') or na.get('skipped') or ''}{th.get('error') or th.get('skipped') or ''}")
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
