"""The launch/spawn pool's port is reachable by anyone on the host: strangers must not stall it.

``launch()``, ``spawn()`` and the test pool start their ranks, which connect back to a loopback
port and prove they know a per-pool key. A local client that connects and says nothing (or has
the wrong key) used to hold the pool's accept loop in a blocking read with no deadline: the
launch hung past its timeout, then failed with a bare ``ConnectionResetError``. Here the
strangers find the port as an attacker would (a listening socket that appears), connect before
the rank does, and must be dropped while the real rank starts.
"""

from __future__ import annotations

import operator
import os
import socket
import sys
import threading
import time
from multiprocessing.connection import Client

import psutil
import pytest

from neural_arch.distributed.run.spawn import launch
from neural_arch.distributed.testing import mpiexec_path, run_mpiexec

_RELEASE_S = 12.0  # the strangers hang up after this: bounds the test on a pool that waits for them


def _listening() -> set:
    return {c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


class _Strangers:
    """Connects to every loopback port this process starts listening on: one silent client, one
    that sends garbage, one with the wrong key. All are released (closed) after ``_RELEASE_S``."""

    def __init__(self) -> None:
        self.before = _listening()
        self.socks: list[socket.socket] = []
        self.found = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(_RELEASE_S + 5)

    def _run(self) -> None:
        deadline = time.monotonic() + 30
        while not self.done.is_set() and time.monotonic() < deadline:
            new = _listening() - self.before
            if new:
                for addr in new:
                    self.socks.append(socket.create_connection(addr[:2], timeout=5))  # silent
                    junk = socket.create_connection(addr[:2], timeout=5)
                    junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    self.socks.append(junk)
                    threading.Thread(target=self._wrong_key, args=(addr[:2],), daemon=True).start()
                self.found.set()
                break
            time.sleep(0.002)
        self.done.wait(_RELEASE_S)
        for s in self.socks:
            s.close()

    @staticmethod
    def _wrong_key(addr) -> None:
        try:
            Client(addr, authkey=b"not the pool's key").close()
        except Exception:  # noqa: BLE001, S110 - the pool refuses it, one way or another
            pass


@pytest.mark.timeout(60)
def test_silent_and_wrong_key_clients_do_not_stall_launch():
    start = time.monotonic()
    with _Strangers() as strangers:
        out = launch(operator.add, nprocs=1, args=(2, 3), init_process_group=False, timeout=_RELEASE_S - 2)
        took = time.monotonic() - start
    assert strangers.found.is_set(), "the test never saw the pool's port (the strangers did not connect)"
    assert out == [5]
    assert took < _RELEASE_S - 2, f"launch took {took:.1f} s: it waited for the silent client"


# ------------------------------------------------------------------ issue 30: which mpiexec runs
@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_mpiexec_next_to_the_interpreter_runs_without_it_on_path(monkeypatch):
    """``venv/bin/python -m pytest`` without an activated venv: PATH lacks the interpreter's
    folder, where the mpich wheel put ``mpiexec``. It is found there, and a job runs with it."""
    here = os.path.dirname(os.path.abspath(sys.executable))
    if not os.access(os.path.join(here, "mpiexec"), os.X_OK):
        pytest.skip(f"no mpiexec next to {sys.executable} (MPI installed elsewhere)")
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in ("/usr/bin", "/bin") if p != here))
    assert mpiexec_path() == os.path.join(here, "mpiexec")
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; total = c.allreduce(1); c.rank or print('ranks', total)"
    done = run_mpiexec(["-c", code], n=2, timeout=45)
    assert done.returncode == 0, done.output
    assert "ranks 2" in done.stdout, done.output
