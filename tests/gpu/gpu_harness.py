"""Helpers of the GPU tests: why there is no GPU, and a multi-process launcher that never hangs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_worker.py")


def gpu_skip_reason():
    """None when CuPy imports and sees a GPU; otherwise why not (never raises)."""
    from neural_arch.backend import gpu_unavailable_reason

    return gpu_unavailable_reason()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(scenario: str, world: int, ranks=None, device=None, timeout: float = 240.0, env=None):
    """Run ``nccl_worker.py scenario`` as ``ranks`` (default: all) of a world; return their JSON results.

    Every process is killed at ``timeout``; a rank without a result gets ``{"ok": False, "error":
    <the tail of its output>}``, so a hang or a crash is a test failure with a reason, never a hang.
    """
    ranks = list(range(world)) if ranks is None else list(ranks)
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="na-nccl-")
    try:
        return _run_ranks(scenario, world, ranks, device, timeout, env, port, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the leak check fails a run that leaves it behind


def _run_ranks(scenario, world, ranks, device, timeout, env, port, tmp):
    procs = {}
    for r in ranks:
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), NA_RESULT=os.path.join(tmp, f"{r}.json"), **(env or {}))
        if device is not None:
            e["NA_DEVICE"] = device
        log = open(os.path.join(tmp, f"{r}.log"), "w")  # noqa: SIM115 - open while the process runs
        procs[r] = (subprocess.Popen([sys.executable, WORKER, scenario], env=e, stdout=log, stderr=subprocess.STDOUT),
                    log)
    deadline = time.monotonic() + timeout
    try:
        for p, _ in procs.values():
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                break
    finally:  # a timeout or an error here: no rank outlives the call
        for p, log in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
            log.close()
    results = []
    for r in ranks:
        path = os.path.join(tmp, f"{r}.json")
        if os.path.exists(path):
            with open(path) as fh:
                results.append(json.load(fh))
        else:
            with open(os.path.join(tmp, f"{r}.log")) as fh:
                tail = fh.read()[-2000:]
            results.append({"ok": False, "error": f"rank {r} wrote no result (killed or crashed): {tail}"})
    return results


def duplicate_gpu_refusal(results):
    """NCCL's message when several ranks share one GPU (it refuses: 'Duplicate GPU detected')."""
    for res in results:
        err = str(res.get("error", ""))
        # NCCL's own words, or ours: the NCCL backend refuses a shared GPU before NCCL is asked
        if not res.get("ok") and ("Duplicate GPU" in err or "invalid usage" in err.lower()
                                  or "NCCL needs one GPU per process" in err):
            return err[:300]
    return None
