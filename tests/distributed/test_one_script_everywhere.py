"""DESIGN habit 5: one script runs under plain ``python``, under our launcher and under ``mpiexec``,
and ``init_process_group()`` picks the backend from the environment each time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from neural_arch.distributed.testing import free_port, mpiexec_path

pytestmark = pytest.mark.timeout(90)

SCRIPT = """
import numpy as np, neural_arch.distributed as dist
dist.init_process_group()
a = np.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(a)
# One file per rank: ranks that share a stdout (mpiexec forwards pipes in chunks) can split a line.
with open(f"result_{dist.get_rank()}.txt", "w") as f:
    f.write(f"RESULT {dist.get_backend()} {dist.get_rank()} {dist.get_world_size()} {a[0]:.1f}")
dist.destroy_process_group()
"""

_JOB_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "NEURAL_ARCH_BACKEND", "NEURAL_ARCH_AUTH_TOKEN", "NEURAL_ARCH_TIMEOUT")


def _run(cmd, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=80, capture_output=True, text=True, check=False)
    records = "\n".join(p.read_text() for p in sorted(tmp_path.glob("result_*.txt")))
    return sorted(re.findall(r"RESULT (\w+) (\d) (\d) ([\d.]+)", records)), out


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


def test_plain_python_is_a_world_of_one(script, tmp_path):
    found, out = _run([sys.executable, script], tmp_path)
    assert found == [("local", "0", "1", "1.0")], out.stdout + out.stderr


def test_under_the_launcher_it_is_gloo(script, tmp_path):
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node=2",
           f"--master_port={free_port()}", script]
    found, out = _run(cmd, tmp_path)
    assert found == [("gloo", "0", "2", "3.0"), ("gloo", "1", "2", "3.0")], out.stdout + out.stderr


@pytest.mark.mpi
def test_under_mpiexec_it_is_mpi(script, tmp_path):
    found, out = _run([mpiexec_path(), "-n", "2", sys.executable, script], tmp_path)
    assert found == [("mpi", "0", "2", "3.0"), ("mpi", "1", "2", "3.0")], out.stdout + out.stderr
