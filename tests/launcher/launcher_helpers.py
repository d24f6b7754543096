"""Helpers for launcher tests: run the launcher CLI with a hard timeout and always reap it.

(Not named conftest.py so that ``import launcher_helpers`` cannot pick up another folder's conftest.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from polling import pid_alive, wait_for  # noqa: F401 - the launcher tests import them from here too

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "NEURAL_ARCH_AUTH_TOKEN", "PMI_RANK", "PMI_SIZE")}
    extra = dict(extra or {})
    paths = [ROOT, extra.pop("PYTHONPATH", ""), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_launcher(args: list[str], cwd, env: dict | None = None) -> subprocess.Popen:
    # The launcher's temporary files (its ready folder) go to the test's working folder: a test that
    # SIGKILLs the launcher leaves them there, not in the session's temporary directory.
    env = {"TMPDIR": str(cwd), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "neural_arch.distributed.launcher", *map(str, args)],
                            cwd=str(cwd), env=child_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def reap(proc: subprocess.Popen) -> None:
    """Kill the launcher's whole session if it is still there (children die with it)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        pass


def run_launcher(args: list[str], cwd, timeout: float = 30, env: dict | None = None):
    """Run the launcher to completion; returns CompletedProcess-like (returncode, stdout, stderr)."""
    proc = start_launcher(args, cwd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        reap(proc)


def kill_pids(pids) -> None:
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
