"""Small shared helpers for the benchmark scripts: timing, thread control, tables, JSON.

Honest-numbers rules these helpers support: time the *median* of many repetitions after a
warm-up; compare implementations at the *same* BLAS thread count; write every result with the
command line and environment that produced it.

API (all plain functions):

* ``median_time(fn, repeat=20, warmup=3, min_seconds=0.0) -> dict`` -- seconds: ``median``,
  ``min``, ``max``, ``mean``, ``stdev``, ``repeat`` (the number of timed calls).
* ``thread_env(n, base=None) -> dict`` -- a copy of the environment with every BLAS/OpenMP
  thread variable set to ``n``; give it to ``subprocess`` so the limit holds *before* NumPy loads.
* ``limit_threads(n)`` -- context manager limiting BLAS/OpenMP threads in this process via
  threadpoolctl (a no-op context when threadpoolctl is missing or ``n`` is None).
* ``blas_threads() -> int | None`` -- threads the loaded BLAS will use right now (threadpoolctl).
* ``run_worker(args, threads=None, timeout=600) -> object`` -- run ``python <args>`` in a
  subprocess (thread-pinned with ``thread_env`` when ``threads`` is given) and parse the JSON
  it prints as its last stdout line.
* ``format_table(rows, headers) -> str`` / ``print_table(rows, headers)`` -- a Markdown table.
* ``environment() -> dict`` -- python, numpy, platform, CPU count, BLAS info, time, command.
* ``write_json(path, payload) -> str`` -- write ``{"environment": ..., **payload}`` (dirs created).

Example::

    >>> from benchmarks.common import median_time, format_table
    >>> stats = median_time(lambda: sum(range(1000)), repeat=5, warmup=1)
    >>> sorted(stats)[:3]
    ['max', 'mean', 'median']
    >>> print(format_table([["a", 1.5]], ["name", "ms"]))
    | name | ms |
    | --- | --- |
    | a | 1.5 |
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Sequence

__all__ = [
    "THREAD_VARS", "blas_threads", "environment", "format_table", "limit_threads", "median_time", "print_table",
    "run_worker", "stop_session", "thread_env", "write_json",
]

# Every variable a BLAS or OpenMP runtime we may meet reads at load time.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def median_time(fn: Callable[[], Any], repeat: int = 20, warmup: int = 3, min_seconds: float = 0.0) -> dict:
    """Call ``fn`` ``warmup`` times untimed, then time it ``repeat`` times (more until ``min_seconds``)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {
        "median": statistics.median(times), "min": min(times), "max": max(times),
        "mean": statistics.fmean(times), "stdev": statistics.stdev(times) if len(times) > 1 else 0.0,
        "repeat": len(times),
    }


def thread_env(n: int | None, base: dict | None = None) -> dict:
    """Environment for a child process whose BLAS/OpenMP use ``n`` threads (``None``: unchanged)."""
    env = dict(os.environ if base is None else base)
    if n is not None:
        for var in THREAD_VARS:
            env[var] = str(int(n))
    return env


@contextlib.contextmanager
def limit_threads(n: int | None):
    """Limit BLAS/OpenMP threads inside this process (threadpoolctl); no-op if unavailable."""
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=int(n)):
        yield


def blas_threads() -> int | None:
    """Threads the loaded BLAS will use (max over BLAS libraries), or None if unknown."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    counts = [info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"]
    return max(counts) if counts else None


def run_worker(args: Sequence[str], threads: int | None = None, timeout: float = 600) -> Any:
    """Run ``python *args`` with ``threads`` BLAS threads; return the JSON of its last stdout line."""
    proc = subprocess.run([sys.executable, *args], env=thread_env(threads), capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark worker {' '.join(args)} (threads={threads}) failed with exit code "
            f"{proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(
            f"benchmark worker {' '.join(args)} printed nothing; stderr:\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def run_processes(commands: Sequence[tuple[Sequence[str], dict]], timeout: float, what: str,
                  cwd: str | None = None) -> list[tuple[str, str]]:
    """Start every ``(argv, env)`` at once, each in its own session, and return their ``(stdout,
    stderr)`` once all exited. Every process is reaped whatever happens (its session is SIGKILLed);
    a timeout or a non-zero exit is a ``RuntimeError`` naming ``what``. The ranks of one benchmark
    configuration (or one ``mpiexec``) go through here.
    """
    procs = [subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=cwd, start_new_session=True) for argv, env in commands]
    outs: list[tuple[str, str]] = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: no result within {timeout} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, (_out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{what}: a process exited with code {p.returncode}:\n{err[-3000:]}")
    return outs


def stop_session(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """End a process started with ``start_new_session=True`` and everything in its session: SIGTERM
    (a launcher stops its ranks), then SIGKILL after ``grace`` seconds; reaped either way."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` that is a JSON object (what the benchmark workers print)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    """A Markdown table; floats are shown with 3 significant digits."""
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def print_table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> None:
    print(format_table(rows, headers))


def _commit() -> str:
    """The checked-out commit (with ``+dirty`` when the work tree differs), or why it is unknown."""
    if os.environ.get("BENCH_COMMIT"):  # named by whoever copied the tree (a lent GPU machine's copy of .git can be stale)
        return os.environ["BENCH_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return head + ("+dirty" if dirty else "")


def environment() -> dict:
    """What produced the numbers: interpreter, NumPy and BLAS, machine, time, command line."""
    import numpy as np

    info: dict[str, Any] = {
        "python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "load_average": os.getloadavg(), "commit": _commit(),
    }
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: d.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                        for d in threadpool_info() if d.get("user_api") == "blas"]
    except ImportError:
        pass
    return info


def write_json(path: str, payload: dict) -> str:
    """Write ``{"environment": environment(), **payload}`` as indented JSON; returns the path."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"environment": environment(), **payload}, fh, indent=2, default=str)
        fh.write("\n")
    return path


def mlp(sizes):
    """The benchmarks' MLP: ``Linear`` layers of ``sizes`` with a ReLU between each pair.

    >>> [type(m).__name__ for m in mlp((4, 8, 2))]
    ['Linear', 'ReLU', 'Linear']
    """
    from neural_arch import nn

    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)

