"""run_mpiexec, the one way tests start a script under a real ``mpiexec``: a clean environment,
and a job past its timeout is killed whole (mpiexec, hydra proxy, every rank), never left running."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import psutil
import pytest

from neural_arch.distributed.testing import LAUNCHER_VARS, MpiexecTimeout, run_mpiexec, script_env

pytestmark = pytest.mark.timeout(60)


def test_script_env_drops_every_launcher_variable_and_applies_overrides_last():
    base = {**dict.fromkeys(LAUNCHER_VARS, "x"), "PMI_RANK": "1", "OMPI_COMM_WORLD_RANK": "1",
            "PMIX_NAMESPACE": "ns", "KEEP": "me", "GONE": "soon", "OMP_NUM_THREADS": "4", "PYTHONPATH": "/extra"}
    env = script_env({"MASTER_PORT": "4321", "GONE": None}, base=base)
    assert {k for k in env if k in LAUNCHER_VARS} == {"MASTER_PORT"} and env["MASTER_PORT"] == "4321"
    assert not [k for k in env if k.startswith(("PMI_", "PMIX_", "OMPI_"))]
    assert env["KEEP"] == "me" and "GONE" not in env
    assert env["OMP_NUM_THREADS"] == "4" and env["OPENBLAS_NUM_THREADS"] == "1"  # a setting is kept
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[-1] == "/extra" and os.path.isdir(os.path.join(paths[0], "neural_arch"))


RANK_ENV = """
import json, os
import neural_arch  # importable from tmp_path only through the PYTHONPATH run_mpiexec sets
names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NEURAL_ARCH_BACKEND", "NEURAL_ARCH_TIMEOUT", "KEEP_ME")
with open(f"env_{os.environ['PMI_RANK']}.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in names}, f)
"""


@pytest.mark.mpi
def test_launcher_variables_of_the_parent_do_not_reach_the_ranks(tmp_path, monkeypatch):
    for var, value in {"RANK": "7", "WORLD_SIZE": "9", "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "1",
                       "NEURAL_ARCH_BACKEND": "gloo", "NEURAL_ARCH_TIMEOUT": "0.1"}.items():
        monkeypatch.setenv(var, value)
    done = run_mpiexec(["-c", RANK_ENV], 2, env={"KEEP_ME": "yes", "MASTER_PORT": "4321"}, cwd=tmp_path, timeout=50)
    assert done.returncode == 0, done.output
    want = {"RANK": None, "WORLD_SIZE": None, "MASTER_ADDR": None, "MASTER_PORT": "4321",
            "NEURAL_ARCH_BACKEND": None, "NEURAL_ARCH_TIMEOUT": None, "KEEP_ME": "yes"}
    for rank in (0, 1):
        assert json.loads((tmp_path / f"env_{rank}.json").read_text()) == want


# Rank 0 dies on SIGTERM; rank 1 ignores it, so only the SIGKILL that follows can end it, and it
# starts a helper process in a session of its own, which hydra's proxy knows nothing about (the
# proxy ends the ranks it started when mpiexec dies; a rank's own children outlive it).
HANG = """
import os, signal, subprocess, sys, time
pids = [os.getpid(), os.getppid()]  # the rank and its hydra proxy
if os.environ["PMI_RANK"] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids.append(helper.pid)
with open(f"pids_{os.environ['PMI_RANK']}", "w") as f:
    f.write(" ".join(map(str, pids)))
print("up", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.mpi
def test_a_job_past_its_timeout_is_killed_whole_and_raises_with_its_output(tmp_path):
    marker = f"run-mpiexec-test-{uuid.uuid4().hex}"  # in the argv of mpiexec, both ranks and the helper
    with pytest.raises(MpiexecTimeout) as info:
        run_mpiexec(["-c", HANG, marker], 2, timeout=5.0, cwd=tmp_path)  # time for 2 ranks to start under load
    exc = info.value
    assert isinstance(exc, subprocess.TimeoutExpired) and exc.timeout == 5.0
    assert 5.0 <= exc.elapsed < 5.0 + 8, exc.elapsed  # SIGTERM, 1 s grace, SIGKILL, reaped
    assert exc.output.count("up") == 2, str(exc)  # the output so far comes with the error
    assert "did not finish within 5 s" in str(exc)
    pids = [int(p) for rank in (0, 1) for p in (tmp_path / f"pids_{rank}").read_text().split()]
    assert len(pids) == 5, pids  # 2 ranks, their proxy (twice), the helper: all started in time
    assert not [p for p in pids if _alive(p)], "a rank, the hydra proxy or a rank's child outlived the timeout"
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
            and _alive(p.pid)]
    assert not left, f"processes of the job still running: {left}"
