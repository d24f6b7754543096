"""A child never outlives its launcher: the parent-death watch the child bootstrap installs.

Linux's ``PR_SET_PDEATHSIG`` where it exists, else a thread that polls the parent's pid; with
``kill_group`` a small reaper process takes down the child's whole process group (grandchildren
included) when the launcher is killed with SIGKILL. Standard library only: ``run/bootstrap.py``
loads this file by path before the package is importable.

Example::

    install_parent_death_watch(parent_pid=os.getppid(), poll_interval=0.2, grace=3.0)
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["install_parent_death_watch"]

_PR_SET_PDEATHSIG = 1
_watch_started = False


def _set_pdeathsig(sig: int) -> bool:
    """Ask the Linux kernel to send ``sig`` when our parent dies. False when not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_GROUP_REAPER = """
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False
try:
    os.killpg(pgid, signal.SIGTERM)
except OSError:
    sys.exit(0)
end = time.monotonic() + grace
while alive() and time.monotonic() < end:
    time.sleep(0.05)
try:
    os.killpg(pgid, signal.SIGKILL)
except OSError:
    pass
"""


def _kill_own_group(grace: float) -> None:
    """SIGTERM our whole process group, SIGKILL it after ``grace`` s, from a separate process.

    Why a separate process: our own SIGTERM may kill us at once (default action), and then nobody
    would be left to send the SIGKILL to grandchildren that ignore SIGTERM. The reaper runs in its
    own session, so the signals it sends to our group do not reach it; it exits within ``grace`` s.
    """
    import subprocess

    pgid = os.getpgrp()
    try:
        subprocess.Popen([sys.executable, "-I", "-S", "-c", _GROUP_REAPER, str(pgid), str(grace)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:  # cannot start a process (fd/pid limits): do it from here, best effort
        import time

        try:
            os.killpg(pgid, signal.SIGTERM)
            time.sleep(grace)
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def _poll_parent(parent_pid: int, sig: int, interval: float, grace: float,
                 kill_group: bool) -> None:
    import time

    while os.getppid() == parent_pid:
        time.sleep(interval)
    # The parent is gone (we were re-parented to init or a subreaper).
    if kill_group:
        # Take everything this rank started (data-loader workers, `sleep` in a shell) with us.
        _kill_own_group(grace)
    else:
        # Ask politely, then insist: a script that ignores SIGTERM must not be left as an orphan.
        try:
            os.kill(os.getpid(), sig)
        except OSError:
            pass
    time.sleep(grace + 1.0)
    os._exit(128 + int(sig))


def install_parent_death_watch(parent_pid: int | None = None, sig: int = signal.SIGTERM,
                               poll_interval: float = 0.5, grace: float = 10.0,
                               kill_group: bool = False) -> bool:
    """Make this process exit when its launcher dies, even if the launcher got SIGKILL.

    ``parent_pid`` defaults to ``NEURAL_ARCH_PARENT_PID`` (set by our launcher). A daemon thread
    polls ``os.getppid()`` every ``poll_interval`` seconds (portable). Returns True when a watch
    is active. Calling it twice is harmless.

    ``kill_group=False``: also ``prctl(PR_SET_PDEATHSIG, sig)`` on Linux (instant, kernel-side);
    the process gets ``sig`` and, ``grace`` s later, exits hard.

    ``kill_group=True`` (the launcher's ranks, each the leader of its own session): the whole
    process group gets SIGTERM and, ``grace`` s later, SIGKILL, so processes the rank started do
    not survive as orphans. No PDEATHSIG here: the kernel would kill the rank alone before the
    watch could reach its group. If this process does not lead its group, it falls back to
    ``kill_group=False`` (killing the group would hit the process that started us).

    >>> install_parent_death_watch(parent_pid=None) in (True, False)
    True
    """
    global _watch_started
    if parent_pid is None:
        from neural_arch.config import get as setting  # (bootstrap passes parent_pid: no package there)

        parent_pid = setting("NEURAL_ARCH_PARENT_PID")
    if parent_pid is None or parent_pid <= 1:
        return False
    if os.getppid() != parent_pid:
        import psutil  # (here: this rare branch must not slow every rank's start)

        if psutil.pid_exists(parent_pid):
            # We are not the launcher's direct child (a process a rank started inherited the
            # variable): the launcher is not our parent, so there is nothing to watch.
            return False
        # The launcher already died before we got here: do not start user code at all.
        if kill_group and os.getpgrp() == os.getpid():
            _kill_own_group(grace)
        os._exit(128 + int(sig))
    kill_group = kill_group and os.getpgrp() == os.getpid()
    if not kill_group:
        _set_pdeathsig(sig)
    if not _watch_started:
        _watch_started = True
        threading.Thread(target=_poll_parent,
                         args=(parent_pid, sig, poll_interval, grace, kill_group),
                         name="neural-arch-parent-watch", daemon=True).start()
    return True
