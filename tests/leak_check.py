"""Tests leave nothing behind: a pytest plugin loaded by ``tests/conftest.py``.

At the end of the session it looks for what tests left running or lying around -- processes still
descended from pytest, shared-memory segments of neural_arch (``na-*``) or MPICH (``mpich_shm_*``) that
appeared during the run, files and folders left in the temporary directory -- removes them, and fails
the run naming each one, so a leak cannot land.

Temporary files: the session points ``TMPDIR`` (and :mod:`tempfile`) at a private folder, which every
process the tests start inherits; whatever is left there at the end, except pytest's own
``pytest-of-*`` (its ``tmp_path`` folders, which pytest keeps for inspection), is a leak.

MPICH leaves its segments when ``mpiexec`` kills or aborts a job (the MPI fault tests do that on
purpose); the harness layer removes those after every ``mpi`` test, once no live process maps them
(:func:`remove_unmapped_mpich_segments`, from the ``pytest_runtest_teardown`` hook), so what reaches
the session-end check is a real leak.

Example::

    python -m pytest -q tests/faults      # ... "left behind: process 4242 (python ...)" fails the run
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import psutil
import pytest

SHM = "/dev/shm"
PATTERNS = ("na-", "mpich_shm_")
#: seconds a rank that is on its way out gets before it counts as left behind
GRACE_S = 3.0
_BEFORE: set[str] = set()
_LIVE: set[str] = set()     # MPICH segments in use at the last look
_TMP: dict = {}             # the private temporary folder of this session, and what TMPDIR was


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir(SHM) if n.startswith(PATTERNS)}
    except OSError:
        return set()


def _mapped_files() -> set[str]:
    """Paths under /dev/shm mapped by any live process (a plain read of every /proc/PID/maps: cheap)."""
    mapped = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                data = f.read()
        except OSError:
            continue
        at = data.find(b" /dev/shm/")
        while at >= 0:
            end = data.find(b"\n", at)
            mapped.add(data[at + 1:end if end >= 0 else None].decode(errors="replace").removesuffix(" (deleted)"))
            at = data.find(b" /dev/shm/", at + 1)
    return mapped


def remove_unmapped_mpich_segments(candidates: set[str]) -> tuple[list[str], set[str]]:
    """Unlink the MPICH segments among ``candidates`` that no live process maps; returns their names and
    the names of the candidates still in use."""
    mapped = _mapped_files()
    removed, live = [], set()
    for name in sorted(candidates):
        path = os.path.join(SHM, name)
        if path in mapped:
            live.add(name)
        elif name.startswith("mpich_shm_"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(name)
    return removed, live


def pytest_sessionstart(session):
    _BEFORE.clear()
    _BEFORE.update(_segments())
    _LIVE.clear()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _TMP["previous"] = os.environ.get("TMPDIR")
        _TMP["dir"] = tempfile.mkdtemp(prefix="na-tests-")
        os.environ["TMPDIR"] = tempfile.tempdir = _TMP["dir"]


def _leftover_temp_files() -> list[str]:
    """What is left in the session's temporary folder (pytest's own ``pytest-of-*`` aside), removed."""
    folder = _TMP.get("dir")
    if folder is None:
        return []
    left = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.startswith("pytest-of-"):
                continue
            left.append(f"temporary {'folder' if os.path.isdir(path) else 'file'} {name}")
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return left


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After an ``mpi`` test (and its module's rank pools, when they close here): remove the MPICH
    segments that killed or aborted jobs left behind. /proc is read only when a segment appeared that
    was not in use at the last look, or at a module's end."""
    yield
    if item.get_closest_marker("mpi") is None:
        return
    candidates = {n for n in _segments() if n.startswith("mpich_shm_")} - _BEFORE
    module_end = nextitem is None or nextitem.path != item.path
    if candidates and (module_end or candidates - _LIVE):
        _, live = remove_unmapped_mpich_segments(candidates)
        _LIVE.clear()
        _LIVE.update(live)


def _creator_alive(name: str) -> bool:
    """neural_arch's segments are named ``na-<creator pid>-...``: one whose creator lives is not a leak yet.
    A process with that pid that started after the segment was made is not its creator (pids are reused)."""
    parts = name.split("-")
    if not (name.startswith("na-") and len(parts) > 2 and parts[1].isdigit()):
        return False
    try:
        born = psutil.Process(int(parts[1])).create_time()
        made = os.stat(os.path.join(SHM, name)).st_mtime
    except (psutil.Error, OSError):
        return False
    return born <= made + 1.0   # create_time is rounded: a second of slack


def _leftover_processes() -> list[psutil.Process]:
    me = psutil.Process()
    deadline = time.monotonic() + GRACE_S
    while True:
        children = [c for c in me.children(recursive=True) if _alive(c)]
        if not children or time.monotonic() > deadline:
            return children
        time.sleep(0.1)


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def _describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"process {proc.pid} ({' '.join(proc.cmdline())[:120]})"
    return f"process {proc.pid}"


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    leaks = []
    for proc in _leftover_processes():
        leaks.append(_describe(proc))
        with contextlib.suppress(psutil.Error):
            proc.kill()
    leaks += _leftover_temp_files()
    new = _segments() - _BEFORE
    mapped = _mapped_files() if new else set()
    for name in sorted(new):
        path = os.path.join(SHM, name)
        if path in mapped or _creator_alive(name):   # in use by a live process (another job, on its way)
            continue
        leaks.append(f"shared-memory segment {path}")
        with contextlib.suppress(OSError):
            os.unlink(path)
    if leaks:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = ("tests left behind (removed now; the run fails so the leak is fixed where it happens):\n  "
                + "\n  ".join(leaks))
        if reporter is not None:
            reporter.write_sep("=", "leak check", red=True)
            reporter.write_line(text)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _drop_temp_folder(keep=session.exitstatus != 0)


def _drop_temp_folder(keep: bool) -> None:
    """Restore ``TMPDIR``; remove the session's folder unless the run failed (pytest's ``tmp_path``
    folders of a failed run stay for inspection)."""
    folder = _TMP.pop("dir", None)
    if folder is None:
        return
    previous = _TMP.pop("previous", None)
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    tempfile.tempdir = None
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
