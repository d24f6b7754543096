"""GPU training-step benchmark: neural_arch on CuPy vs PyTorch on the same GPU.

Two MLPs (784-1024-1024-10 and a wider 784-4096-4096-10), float32, over a sweep of batch sizes
(``--batches``); one step is zero_grad + forward + cross-entropy + backward (+ optional
``clip_grad_norm_``) + optimizer step (SGD or Adam). Each framework is timed with a device
synchronisation around a block of steps (after warm-up), and the median over repeats is reported.
TF32 is off in both (their defaults), so both do the same float32 arithmetic. PyTorch runs side
by side when it is importable with CUDA; otherwise its column says why it is missing.

Two times per step:

* **wall** -- block time / steps, with the device synchronised at the end of the block;
* **host** -- the time the Python thread spends inside ``step()`` (no synchronisation around it).

A step that never makes the host wait for the GPU has host < wall once the GPU is the bottleneck
(large batches): the host runs ahead and queues the next step's kernels. host ~ wall at every
batch size means the step synchronises somewhere (or that launch overhead dominates: small batches).

Usage (on a GPU machine)::

    pip install -e '.[gpu]' torch       # torch is only the baseline; it is optional
    python benchmarks/bench_gpu.py --batches 256,1024,8192 --steps 50 --repeats 5
    python benchmarks/bench_gpu.py --batches 1024 --optimizer adam --clip-grad-norm 1.0

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


def _time_steps(step, sync, steps: int, warmup: int, repeats: int) -> tuple[list, list]:
    """Per repeat: (wall seconds per step, host seconds per step) -- see the module docstring."""
    for _ in range(warmup):
        step()
    sync()
    wall, host = [], []
    clock = time.perf_counter
    for _ in range(repeats):
        in_step = 0.0
        start = clock()
        for _ in range(steps):
            t0 = clock()
            step()
            in_step += clock() - t0
        sync()
        wall.append((clock() - start) / steps)
        host.append(in_step / steps)
    return wall, host


def bench_neural_arch(sizes, batch, steps, warmup, repeats, optimizer="sgd", clip=0.0):
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
    params = list(model.parameters())
    opt = optim.SGD(params, lr=0.01) if optimizer == "sgd" else optim.Adam(params, lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, sizes[0])).astype(np.float32)).to("cuda")
    y = Tensor(rng.integers(0, sizes[-1], batch)).to("cuda")

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if clip:
            optim.clip_grad_norm_(params, clip)
        opt.step()
    return _time_steps(step, lambda: cp.cuda.Device().synchronize(), steps, warmup, repeats)


def bench_torch(sizes, batch, steps, warmup, repeats, optimizer="sgd", clip=0.0):
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
    params = list(model.parameters())
    # torch's defaults (what its users get; on CUDA that is the fused multi-tensor update)
    opt = torch.optim.SGD(params, lr=0.01) if optimizer == "sgd" else torch.optim.Adam(params, lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, sizes[0], device="cuda")
    y = torch.randint(0, sizes[-1], (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    return _time_steps(step, torch.cuda.synchronize, steps, warmup, repeats)


def _summary(times, batch):
    wall, host = times
    med = statistics.median(wall)
    return {"ms_per_step_median": med * 1e3, "ms_per_step_all": [t * 1e3 for t in wall],
            "host_ms_per_step_median": statistics.median(host) * 1e3,
            "host_ms_per_step_all": [t * 1e3 for t in host], "samples_per_s": batch / med}


def _parse_batches(text: str) -> list:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise SystemExit(f"--batches must be comma-separated integers, got {text!r}") from None
    if not batches or min(batches) <= 0:
        raise SystemExit(f"--batches needs positive batch sizes, got {text!r}")
    return batches


def _environment():
    from common import _commit

    env = {"python": platform.python_version(), "numpy": np.__version__, "host": platform.node(),
           "commit": _commit(), "load_average": os.getloadavg()}
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
    parser.add_argument("--batches", default="1024", help="comma-separated batch sizes, e.g. 256,1024,8192")
    parser.add_argument("--batch", type=int, default=None, help="a single batch size (same as --batches N)")
    parser.add_argument("--models", default="mlp,wide", help=f"comma-separated subset of {sorted(MODELS)}")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--clip-grad-norm", type=float, default=0.0,
                        help="add clip_grad_norm_(params, this) to every step (0: off)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_gpu.json"))
    args = parser.parse_args(argv)
    batches = [args.batch] if args.batch is not None else _parse_batches(args.batches)
    unknown = [m for m in args.models.split(",") if m.strip() and m.strip() not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    record = {"benchmark": "bench_gpu", "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "batches": batches, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "optimizer": args.optimizer, "clip_grad_norm": args.clip_grad_norm}

    reason = gpu_skip_reason()
    if reason:
        record.update(skipped=True, reason=reason)
        what = (f"would time {args.models} x batches {','.join(map(str, batches))} ({args.optimizer}"
                f"{', clip' if args.clip_grad_norm else ''}) on CuPy and, if importable, PyTorch")
        if _holds_real_results(args.out):   # a CPU-only run must not erase numbers measured on a GPU
            print(f"no GPU: skipped ({reason}); {what}; kept the GPU results already in {args.out}")
            return 0
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=2)
        print(f"no GPU: skipped ({reason}); {what}; wrote {args.out}")
        return 0

    record.update(skipped=False, environment=_environment(), results={})
    print(f"{'model':5s} {'batch':>6s}  {'neural_arch wall / host ms':>28s}  {'torch wall / host ms':>22s}  na/torch")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        sizes = MODELS[name]
        record["results"][name] = {"sizes": sizes, "by_batch": {}}
        for batch in batches:
            row = {}
            for fw, fn in (("neural_arch", bench_neural_arch), ("torch", bench_torch)):
                try:
                    times = fn(sizes, batch, args.steps, args.warmup, args.repeats, args.optimizer,
                               args.clip_grad_norm)
                    row[fw] = _summary(times, batch)
                except ImportError as exc:
                    row[fw] = {"skipped": f"not installed: {exc}"}
                except Exception as exc:  # noqa: BLE001 - one framework failing must not lose the other's numbers
                    row[fw] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            na, th = row.get("neural_arch", {}), row.get("torch", {})
            if "ms_per_step_median" in na and "ms_per_step_median" in th:
                row["neural_arch_over_torch"] = na["ms_per_step_median"] / th["ms_per_step_median"]
            record["results"][name]["by_batch"][str(batch)] = row

            def cell(r):
                if "ms_per_step_median" not in r:
                    return (r.get("error") or r.get("skipped") or "?")[:40]
                return f"{r['ms_per_step_median']:8.3f} / {r['host_ms_per_step_median']:8.3f}"
            ratio = row.get("neural_arch_over_torch")
            print(f"{name:5s} {batch:6d}  {cell(na):>28s}  {cell(th):>22s}  "
                  f"{'' if ratio is None else f'{ratio:.2f}x'}")
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
