"""Importing neural_arch makes OpenBLAS's idle threads sleep after a GEMM (neural_arch/blas_idle.py).

Each case runs in a fresh interpreter with two BLAS threads, because OpenBLAS reads the setting when its
threads start: NumPy imported before neural_arch (the threads are restarted) and after it (the variable
is read at load), the opt-out, and a user's own OPENBLAS_THREAD_TIMEOUT left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = """
import json, os, sys, time
first = sys.argv[1]
if first == "numpy":
    import numpy as np
    a = np.random.default_rng(0).random((384, 384))
    a @ a                              # OpenBLAS's threads are up before neural_arch is imported
import neural_arch
import numpy as np
from neural_arch.blas_idle import openblas_library
a = np.random.default_rng(1).random((384, 384))
b = a @ a                              # a threaded GEMM, then an idle pause: a spinning worker burns CPU in it
t0 = time.process_time(); time.sleep(0.1); idle = time.process_time() - t0
exact = float(abs(b - np.einsum("ij,jk->ik", a, a)).max())
print(json.dumps({"timeout": openblas_library().openblas_thread_timeout(), "env": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                  "idle_cpu": idle, "error": exact}))
"""


def _probe(first: str, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "NEURAL_ARCH_BLAS_IDLE_SLEEP")}
    full.update(OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2", **env)
    out = subprocess.run([sys.executable, "-c", _PROBE, first], env=full, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("first", ["numpy", "neural_arch"])
def test_idle_blas_threads_sleep_whichever_is_imported_first(first):
    got = _probe(first)
    assert got["timeout"] == 4 and got["env"] == "4", got
    assert got["idle_cpu"] < 0.05, got     # a spinning worker would burn most of the 0.1 s pause
    assert got["error"] < 1e-9, got        # the restarted threads compute the same products


def test_opt_out_and_the_users_setting_are_left_alone():
    off = _probe("numpy", NEURAL_ARCH_BLAS_IDLE_SLEEP="0")
    assert off["env"] is None and off["timeout"] == 0, off     # OpenBLAS's built-in default
    mine = _probe("numpy", OPENBLAS_THREAD_TIMEOUT="12")
    assert mine["env"] == "12" and mine["timeout"] == 12, mine
