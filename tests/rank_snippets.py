"""Start real rank processes for the store/transport tests, with a hard timeout, and always reap them.

Each rank runs ``python -c PRELUDE + code`` with ``RANK``/``WORLD_SIZE`` (and whatever ``env`` adds) in
its environment and reports by printing lines ``RESULT <json>``; :func:`run_ranks` returns, per rank,
``(returncode, results, stderr)``. A rank still alive at the deadline is killed (SIGKILL) and the test
fails with every rank's stderr, so a hang is a readable failure, never a stuck suite.

Example::

    out = run_ranks("report(rank * 2)", n=2, timeout=30)
    assert [r[1] for r in out] == [[0], [2]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))   # tests/
REPO = os.path.dirname(HERE)


def _test_dirs() -> list[str]:
    """The test folders pytest put on ``sys.path`` (so a rank's code imports the helpers next to its test)."""
    return [p for p in sys.path if os.path.abspath(p or ".").startswith(HERE)]

PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
    def report(value):
        print("RESULT " + json.dumps(value), flush=True)
""")


def start_ranks(code: str, n: int, env: dict[str, str] | None = None, ranks=None) -> list[subprocess.Popen]:
    procs = []
    for rank in (range(n) if ranks is None else ranks):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), PYTHONPATH=os.pathsep.join([REPO, *_test_dirs()]),
                 PYTHONUNBUFFERED="1")
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def reap(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, list, str]]:
    """Wait for every process until ``timeout`` (seconds from now); kill the stragglers; collect output."""
    deadline = time.monotonic() + timeout
    out = []
    try:
        for p in procs:
            try:
                stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
                stderr += "\n[killed by the test: still running at the deadline]"
            results = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
            out.append((p.returncode, results, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def run_ranks(code: str, n: int, timeout: float = 60.0, env: dict[str, str] | None = None,
              check: bool = True) -> list[tuple[int, list, str]]:
    out = reap(start_ranks(code, n, env), timeout)
    if check:
        bad = [(i, rc, err[-3000:]) for i, (rc, _, err) in enumerate(out) if rc != 0]
        assert not bad, "ranks failed:\n" + "\n".join(f"--- rank {i} rc={rc}\n{err}" for i, rc, err in bad)
    return out
