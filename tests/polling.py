"""Wait for a state, not for a time: the one polling helper of the test suite.

A test that sleeps a fixed time "so that the other side is ready" is slow where the machine is fast
and flaky where it is loaded. Poll the state itself instead, with a deadline that only a broken run
reaches. Importable from every test folder and from ranks started by the test harnesses (both put
``tests/`` on ``sys.path``).

Example::

    from polling import pid_alive, wait_for

    assert wait_for(lambda: not pid_alive(pid), 5), "the rank outlived its parent"
"""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Call ``predicate`` every ``interval`` s until it is true (True) or ``timeout`` s passed (its
    last answer). ``interval`` is only the poll's spin: it bounds how late the state is noticed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def pid_alive(pid: int) -> bool:
    """True for a running process; zombies (exited, not yet reaped by their parent) count as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
