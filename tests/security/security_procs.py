"""Attacker and victim processes for the security tests: a Python snippet in a fresh interpreter,
with a hard timeout, always reaped.

The snippet prints ``READY <json>`` when it is set up (its port, ...) and ``RESULT <json>`` lines;
:func:`start` waits for READY, :func:`finish` collects the results (and kills a straggler).

(Not named conftest.py so that ``import security_procs`` cannot pick up another folder's conftest.)

Example::

    proc, ready = start("import socket; s = socket.create_server(('127.0.0.1', 0)); "
                        "ready(s.getsockname()[1]); time.sleep(30)")
    ...
    finish(proc)
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import textwrap
import time

from neural_arch.distributed.testing import script_env

PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    def ready(value=None):
        print("READY " + json.dumps(value), flush=True)
    def report(value):
        print("RESULT " + json.dumps(value), flush=True)
""")


def start(code: str, env: dict | None = None, timeout: float = 20.0, **popen) -> tuple[subprocess.Popen, object]:
    """Start ``code``; return the process and what it passed to ``ready()`` (within ``timeout``)."""
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=script_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("READY "):
                return proc, json.loads(line[6:])
    finish(proc, 0.1)
    raise AssertionError(f"the helper process never got ready:\n{proc.stderr.read() if proc.stderr else ''}")


def finish(proc: subprocess.Popen, timeout: float = 10.0) -> tuple[int, list, str]:
    """Wait up to ``timeout`` s, then kill; ``(returncode, results, stderr)``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n[killed by the test: still running at the deadline]"
    except ValueError:   # streams already closed
        out, err = "", ""
    results = [json.loads(line[7:]) for line in (out or "").splitlines() if line.startswith("RESULT ")]
    return proc.returncode, results, err


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    finish(proc, 5.0)
