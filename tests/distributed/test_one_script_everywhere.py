"""DESIGN habit 5: one script runs under plain ``python``, under our launcher and under ``mpiexec``,
and ``init_process_group()`` picks the backend from the environment each time."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from neural_arch.distributed.testing import free_port, run_mpiexec, script_env

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

def _found(tmp_path):
    records = "\n".join(p.read_text() for p in sorted(tmp_path.glob("result_*.txt")))
    return sorted(re.findall(r"RESULT (\w+) (\d) (\d) ([\d.]+)", records))


def _run(cmd, tmp_path):
    # script_env: no job variables from whatever started pytest, so the script sees only its launcher.
    out = subprocess.run(cmd, env=script_env(), cwd=tmp_path, timeout=80, capture_output=True, text=True, check=False)
    return _found(tmp_path), out


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
    out = run_mpiexec(script, 2, cwd=tmp_path, timeout=80)
    assert _found(tmp_path) == [("mpi", "0", "2", "3.0"), ("mpi", "1", "2", "3.0")], out.output
