"""The GPU check: everything that needs a GPU, in one run, with one JSON summary.

CI never has a GPU, so the GPU path is proven only where someone runs this on one. On one GPU it runs,
each step under its own time limit (the whole check fits in 8 minutes):

1. ``env``        -- the GPU, the driver, CuPy and NCCL as the backend sees them (``missing_requirement``);
2. ``pytest-gpu`` -- ``pytest -m gpu`` (CuPy ops, the NCCL backend, device dispatch, and the NCCL
   backend's native uneven all-to-all, ``tests/gpu/test_nccl_alltoallv_gpu.py``: the hook for one rank on
   the device; with 2+ GPUs, 2-4 ranks against NumPy, counting that NCCL moved only the real rows; and the
   strict-device parallelism cases -- ZeRO, FSDP, TP, 1F1B -- on two gloo ranks with real CuPy arrays,
   ``tests/gpu/test_parallel_on_gpu.py``); ``nccl-fake-peers`` -- the NCCL backend's tests against fake peers
   (``tests/gpu/test_nccl_nogpu.py``) with the real CuPy and libnccl;
   ``device-kernels`` -- every kernel of ``neural_arch.core.device_kernels`` compiled by CuPy and checked,
   float32 and float64, against its unfused NumPy formula and against its own source evaluated on the
   host (``--check-kernels``: a table of the largest differences);
3. ``bench-gpu``  -- ``benchmarks/bench_gpu.py`` against PyTorch on the same GPU (when torch imports);
4. ``digits-nccl-1`` / ``gpt-nccl-1`` -- both DDP examples with ``--device cuda`` on NCCL in a world of one;
5. ``digits-gloo-2`` / ``gpt-gloo-2`` -- the same examples on two ranks over gloo with CuPy arrays (one GPU:
   NCCL refuses two ranks on one device, so the multi-rank run stages through host memory);
   ``digits-mpi-2`` -- the digits example under ``mpiexec -n 2`` (the mpi backend, CuPy staged likewise).

Each step records its command, exit code, wall time and the tail of its output; the summary is
``benchmarks/results/gpu_check.json`` (``--out``). On a machine without a GPU every step reports
``skipped`` with the reason and the script exits 0, so it is safe anywhere; ``--require-gpu`` makes a
missing GPU exit 1.

Usage (on the GPU machine)::

    pip install -e '.[dev,examples,gpu]' && python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --only pytest-gpu,digits-nccl-1     # a subset
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from common import _commit  # benchmarks/common.py: the run's commit (BENCH_COMMIT first)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone"]
DIGITS = ["examples/train_digits_ddp.py", "--epochs", "3", "--no-progress", "--device", "cuda",
          "--checkpoint", "/tmp/neural_arch_gpu_check/digits.npz"]
GPT = ["examples/train_gpt_ddp.py", "--steps", "30", "--device", "cuda"]


def _mpiexec(n: int) -> list[str]:
    """``mpiexec -n N python``: the MPICH wheel's next to this interpreter, else the host's (a GPU image
    may ship Open MPI's, which wants ``--allow-run-as-root`` as root and ``-x`` to pass PYTHONPATH on)."""
    from neural_arch.distributed.run.pool import mpiexec_path

    path = mpiexec_path() or "mpiexec"
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    extra = []
    if "Open MPI" in version or "OpenRTE" in version:
        extra += ["-x", "PYTHONPATH"] if "PYTHONPATH" in os.environ else []
        extra += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [path, *extra, "-n", str(n), sys.executable]


#: name -> (command, time limit in seconds): the plan, printable with --plan
STEPS: dict[str, tuple[list[str], int]] = {
    "pytest-gpu": ([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"], 130),
    # the NCCL backend's peer logic against fake peers, here with the real CuPy and libnccl it imports
    "nccl-fake-peers": ([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "tests/gpu/test_nccl_nogpu.py"], 60),
    "device-kernels": ([sys.executable, "benchmarks/gpu_check.py", "--check-kernels"], 30),
    "bench-gpu": ([sys.executable, "benchmarks/bench_gpu.py", "--batches", "256,4096", "--steps", "20",
                   "--repeats", "3", "--out", "benchmarks/results/bench_gpu.json"], 60),
    "digits-nccl-1": ([*LAUNCH, "--nproc_per_node", "1", "--backend", "nccl", *DIGITS], 40),
    "gpt-nccl-1": ([*LAUNCH, "--nproc_per_node", "1", "--backend", "nccl", *GPT], 40),
    "digits-gloo-2": ([*LAUNCH, "--nproc_per_node", "2", "--backend", "gloo", *DIGITS], 40),
    "gpt-gloo-2": ([*LAUNCH, "--nproc_per_node", "2", "--backend", "gloo", *GPT], 40),
    # under mpiexec the examples take the mpi backend (two ranks share the GPU, so not NCCL)
    "digits-mpi-2": ([*_mpiexec(2), *DIGITS], 30),
}


def environment() -> dict:
    """What the GPU path sees here; never raises."""
    from neural_arch.backend import gpu_unavailable_reason
    from neural_arch.distributed.comm.nccl.support import missing_requirement

    info = {"python": sys.version.split()[0], "machine": platform.node(), "gpu_missing": gpu_unavailable_reason(),
            "nccl_missing": missing_requirement()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except Exception as exc:  # noqa: BLE001 -- any import failure is the answer
        info["cupy"] = f"not importable: {exc}"
    return info


#: per dtype: the largest difference allowed, relative to 1 + |value| (the GPU's exp/tanh round differently)
KERNEL_TOLERANCE = {"float32": 2e-5, "float64": 1e-11}


def check_device_kernels() -> int:
    """Compile every device kernel with CuPy and compare it, float32 and float64, with its unfused NumPy
    formula (``reference``) and with its source evaluated on the host; print a table, 1 on a mismatch."""
    import copy

    import numpy as np

    from neural_arch.backend import gpu_unavailable_reason
    from neural_arch.core.device_kernels import KERNELS

    missing = gpu_unavailable_reason()
    if missing:
        print(f"device-kernels: skipped (no GPU: {missing})")
        return 0
    import cupy

    def as_tuple(r):
        return r if isinstance(r, tuple) else (r,)

    def err(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b) / (1 + np.abs(b)))) if a.size else 0.0

    failed = []
    print(f"{'kernel':<24} {'dtype':<8} {'vs formula':>11} {'vs source':>11}")
    for name, kernel in sorted(KERNELS.items()):
        for dtype in (np.float32, np.float64):
            args, kwargs = kernel.example(np.random.default_rng(0), dtype)
            on_gpu = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in copy.deepcopy(args)]
            try:
                compiled = kernel(cupy, *on_gpu, **kwargs)
            except Exception as exc:  # noqa: BLE001 -- a compile error is this check's answer
                print(f"{name:<24} {np.dtype(dtype).name:<8} failed: {type(exc).__name__}: {str(exc)[:300]}")
                failed.append(name)
                continue
            unfused = kernel.reference(np, *copy.deepcopy(args), **kwargs)
            evaluated = kernel(np, *copy.deepcopy(args), **kwargs)
            got = [cupy.asnumpy(g) for g in as_tuple(compiled)]
            e_formula = max(err(g, u) for g, u in zip(got, as_tuple(unfused)))
            e_source = max(err(g, v) for g, v in zip(got, as_tuple(evaluated)))
            wrong_dtype = any(g.dtype != dtype for g in got)
            ok = not wrong_dtype and max(e_formula, e_source) <= KERNEL_TOLERANCE[np.dtype(dtype).name]
            print(f"{name:<24} {np.dtype(dtype).name:<8} {e_formula:11.2e} {e_source:11.2e}"
                  f"{'' if ok else '   MISMATCH' + (' (dtype)' if wrong_dtype else '')}")
            if not ok:
                failed.append(name)
    print(f"device-kernels: {len(KERNELS)} kernels x 2 dtypes, "
          f"{'all equal' if not failed else 'failed: ' + ', '.join(sorted(set(failed)))}")
    return 1 if failed else 0


def run_step(name: str, command: list[str], limit: int, log_dir: str = "") -> dict:
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        out = f"{(exc.stdout or b'').decode(errors='replace') if isinstance(exc.stdout, bytes) else exc.stdout or ''}"
        out += f"\n[gpu_check] {name} passed its {limit} s limit"
    wall = time.monotonic() - start
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, f"{name}.log"), "w") as f:
            f.write(out)
    status = "passed" if code == 0 else "failed"
    print(f"{name:<15} {status:<7} {wall:7.1f} s   exit {code}", flush=True)
    return {"step": name, "command": command, "status": status, "exit": code, "wall_s": round(wall, 2),
            "output_tail": out[-6000:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu_check.json"))
    parser.add_argument("--only", default="", help=f"comma-separated subset of {sorted(STEPS)}")
    parser.add_argument("--plan", action="store_true", help="print the steps and their limits, run nothing")
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 when there is no usable GPU")
    parser.add_argument("--log-dir", default="", help="also write each step's whole output to DIR/<step>.log")
    parser.add_argument("--check-kernels", action="store_true",
                        help="only compile and check the device kernels (the device-kernels step)")
    args = parser.parse_args(argv)
    if args.check_kernels:
        return check_device_kernels()

    chosen = [s for s in args.only.split(",") if s] or list(STEPS)
    unknown = sorted(set(chosen) - set(STEPS))
    if unknown:
        parser.error(f"--only: unknown step(s) {unknown}; choose from {sorted(STEPS)}")
    if args.plan:
        for name in chosen:
            command, limit = STEPS[name]
            print(f"{name:<15} {limit:4d} s   {' '.join(command)}")
        print(f"total limit {sum(STEPS[n][1] for n in chosen)} s")
        return 0

    summary = {"env": environment(), "commit": _commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "steps": []}
    missing = summary["env"]["gpu_missing"]
    for name in chosen:
        if missing:
            summary["steps"].append({"step": name, "status": "skipped", "reason": f"no GPU: {missing}"})
            print(f"{name:<15} skipped (no GPU: {missing})")
            continue
        summary["steps"].append(run_step(name, *STEPS[name], log_dir=args.log_dir))
        _write(summary, args.out)  # after every step: a check cut off by its caller still leaves its record
    failed = [s["step"] for s in summary["steps"] if s["status"] == "failed"]
    summary["result"] = "no GPU" if missing else ("failed: " + ", ".join(failed) if failed else "passed")
    _write(summary, args.out)
    print(f"gpu_check: {summary['result']}  ->  {args.out}")
    return 1 if failed or (missing and args.require_gpu) else 0


def _write(summary: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
