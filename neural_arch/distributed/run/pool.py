"""A pool of rank processes that run pickled calls: the engine of ``launch()``, ``spawn()`` and the tests.

:class:`RankPool` starts ``world_size`` processes (``python -m neural_arch.distributed.run.rank_worker``,
or one ``mpiexec -n N`` for the MPI backend), each connecting back over an authenticated loopback
connection; optionally each calls ``init_process_group()`` first. It then feeds them calls
(:meth:`RankPool.run`, :meth:`RankPool.run_packed`) and collects values or tracebacks per rank.
Every wait has a deadline and every process is reaped, even when a rank hangs.
:mod:`neural_arch.distributed.testing` re-exports it for tests.

Example::

    with RankPool(world_size=2) as pool:
        assert pool.run(total, 1) == [[3.0] * 3, [3.0] * 3]
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from typing import Any

from neural_arch.distributed.errors import DistributedError
from neural_arch.distributed.run.child_env import free_port, rank_env
from neural_arch.distributed.run.rank_worker import pack_call

__all__ = ["RankFailure", "RankPool", "RankResult", "mpiexec_path"]


class RankFailure(DistributedError):
    """One or more ranks raised (or died, or timed out) while running a pool function.

    Example::

        try:
            pool.run(fn)
        except RankFailure as exc:
            failed = [r.rank for r in exc.results if not r.ok]
    """

    def __init__(self, message: str, results: list[RankResult] | None = None):
        super().__init__(message)
        self.results = results or []


@dataclass
class RankResult:
    """What happened on one rank: ``ok`` with ``value``, or an ``error`` (type name in ``exc_type``).

    Example::

        >>> RankResult(rank=0, ok=True, value=42).value
        42
    """

    rank: int
    ok: bool
    value: Any = None
    error: str | None = None
    exc_type: str | None = None
    traceback: str | None = None
    exitcode: int | None = None


# Seconds one connection to the pool's port has to answer the key challenge. Anyone on this host
# can connect; a silent client must not hold up the ranks (each handshake runs in its own thread).
_HANDSHAKE_TIMEOUT = 10.0


def _set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """A kernel deadline (SO_RCVTIMEO/SO_SNDTIMEO) on every blocking read and write of ``sock``.

    ``multiprocessing``'s Connection reads the file descriptor with ``os.read``, so Python's
    ``settimeout`` (emulated on a non-blocking socket) would not apply; a read past the deadline
    raises ``BlockingIOError``. ``seconds=0`` removes the deadline.
    """
    whole = int(seconds)
    tv = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _handshake(sock: socket.socket, key: bytes, timeout: float, ready: queue.SimpleQueue, shaking: set) -> None:
    """Authenticate one connection to the pool's port within ``timeout`` s (both ways, as
    ``multiprocessing.connection.Listener`` does); put the Connection on ``ready``, or drop it."""
    conn = None
    try:
        sock.setblocking(True)
        _set_io_timeout(sock, timeout)
        conn = Connection(os.dup(sock.fileno()))
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        _set_io_timeout(sock, 0)  # authenticated: later reads wait on wait() with their own deadlines
    except (OSError, EOFError, AuthenticationError, ValueError):
        # silent past the deadline, wrong key, garbage, or hung up: not one of our ranks
        if conn is not None:
            conn.close()
        conn = None
    finally:
        shaking.discard(sock)
        sock.close()  # the Connection holds its own descriptor
    if conn is not None:
        ready.put(conn)


def mpiexec_path() -> str | None:
    """The ``mpiexec`` to use (an absolute path), or None when MPI is not installed.

    First the one next to this interpreter (where the ``mpich`` wheel installs it, so
    ``venv/bin/python -m pytest`` finds it without an activated venv), then ``mpiexec`` or
    ``mpirun`` on ``PATH``. ``sys.executable`` is not resolved: a venv's ``python`` is a link
    to the base interpreter, and the venv's own ``bin`` is where the wheel put ``mpiexec``.

    >>> path = mpiexec_path()
    >>> path is None or os.path.isabs(path)
    True
    """
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    here = os.path.dirname(os.path.abspath(sys.executable))
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=here)
        if found:
            return found
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    return os.path.abspath(found) if found else None


_LIVE_POOLS: weakref.WeakSet[RankPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


class RankPool:
    """``world_size`` ranks kept alive to run many functions (see the module docstring).

    Args:
        world_size: number of ranks (1-5 in tests; oversubscribing the cores is fine).
        backend: ``"gloo"``, ``"mpi"`` (started under a real ``mpiexec``) or any registered name.
        timeout: seconds one :meth:`run` may take before the pool is killed and the call fails;
            also the process group's collective timeout inside the ranks.
        env: extra environment variables for the ranks.
        init: call ``init_process_group()`` in each rank before running anything.
        start_timeout: seconds the ranks have to start and rendezvous.
        master_addr, master_port: the rendezvous address (default: loopback, a free port).
        echo: copy the ranks' output here, each line prefixed ``[rank{r}]: `` (what ``launch()``
            does, for notebooks); otherwise it goes to log files shown when a rank fails.

    Example::

        with RankPool(world_size=3) as pool:
            ranks = pool.run(get_rank)               # [0, 1, 2]: fn runs on every rank
            sums = pool.run(all_reduce_ones)         # the ranks stay up between calls
    """

    def __init__(self, world_size: int, backend: str = "gloo", timeout: float = 60.0,
                 env: dict[str, str] | None = None, init: bool = True, start_timeout: float = 60.0,
                 master_addr: str = "127.0.0.1", master_port: int | None = None, echo: bool = False):
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        self.master_addr, self.master_port, self.echo = master_addr, master_port, echo
        self._children: list = []  # _proc.Child objects when echo=True
        self.world_size = world_size
        self.backend = backend
        self.timeout = timeout
        self.env = dict(env or {})
        self.init = init
        self.start_timeout = start_timeout
        self._procs: list[subprocess.Popen] = []
        self._conns: dict[int, Connection] = {}
        self._pids: dict[int, int] = {}
        self._logdir: str | None = None
        self._started = False
        _LIVE_POOLS.add(self)

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> RankPool:  # noqa: PYI034  # noqa: PYI034
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        if self._started:
            return
        self._logdir = tempfile.mkdtemp(prefix="neural_arch_pool_")
        key = secrets.token_bytes(16)
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(0.2)
        env = self._child_env(server.getsockname()[1], key)
        try:
            self._spawn(env)
            self._accept(server, key)
        except BaseException:
            self.close()
            raise
        finally:
            server.close()
        self._started = True

    def _child_env(self, pool_port: int, key: bytes) -> dict[str, str]:
        # The ranks import exactly what this process can import (test modules included).
        paths = tuple(p for p in sys.path if p and os.path.isdir(p))
        env = rank_env(rank=None, world_size=self.world_size, master_addr=self.master_addr,
                       master_port=self.master_port or free_port(self.master_addr),
                       backend=self.backend, token=secrets.token_hex(16), python_path=paths)
        env.update({
            "NEURAL_ARCH_TIMEOUT": str(self.timeout),
            "NEURAL_ARCH_POOL_ADDR": f"127.0.0.1:{pool_port}", "NEURAL_ARCH_POOL_KEY": key.hex(),
            "NEURAL_ARCH_POOL_INIT": "1" if self.init else "0",
        })
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")  # one BLAS thread per rank unless asked: ranks share the cores
        env.update(self.env)
        return env

    def _spawn(self, env: dict[str, str]) -> None:
        worker = [sys.executable, "-m", "neural_arch.distributed.run.rank_worker"]
        if self.backend == "mpi":
            mpiexec = mpiexec_path()
            if mpiexec is None:
                raise RuntimeError("backend='mpi' needs mpi4py and mpiexec: pip install 'neural_arch[mpi]'")
            env = dict(env, NEURAL_ARCH_POOL_LAUNCHER="mpiexec")
            log = open(os.path.join(self._logdir, "mpiexec.log"), "wb")  # noqa: SIM115 - Popen owns it  # noqa: SIM115 - handed to Popen, closed below
            self._procs.append(subprocess.Popen([mpiexec, "-n", str(self.world_size)] + worker, env=env,
                                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True))
            log.close()
            return
        pump = None
        if self.echo:
            from neural_arch.distributed.run.procs import OutputPump

            pump = OutputPump()
        for rank in range(self.world_size):
            # Each rank leads its own session; NEURAL_ARCH_PARENT_PID arms its parent-death watch.
            child_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank),
                             NEURAL_ARCH_PARENT_PID=str(os.getpid()))
            if pump is not None:
                from neural_arch.distributed.run.procs import start_child

                child = start_child(worker, child_env, rank=rank, pump=pump, local_rank=rank)
                self._children.append(child)
                self._procs.append(child.proc)
                continue
            log = open(os.path.join(self._logdir, f"rank{rank}.log"), "wb")  # noqa: SIM115 - Popen owns it  # noqa: SIM115 - handed to Popen, closed below
            self._procs.append(subprocess.Popen(worker, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True))
            log.close()

    def _accept(self, server: socket.socket, key: bytes) -> None:
        """Take the ranks' connections until every rank said hello, or fail at the start deadline.

        Anyone on this host can reach the port, so a connection is trusted only after the key
        challenge, and no connection can stall the others: each one's challenge runs in its own
        thread under a deadline (:func:`_handshake`) while this loop keeps accepting. A client that
        stays silent, sends garbage or has the wrong key is dropped; only authenticated
        connections reach ``pending`` (whose first message a rank sends after its init).
        """
        deadline = time.monotonic() + self.start_timeout
        pending: list[Connection] = []
        ready: queue.SimpleQueue = queue.SimpleQueue()
        shaking: set[socket.socket] = set()
        try:
            while len(self._conns) < self.world_size:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.world_size)) - set(self._conns))
                    raise RankFailure(f"RankPool: ranks {missing} did not start within {self.start_timeout:.0f} s"
                                      f"{self._log_tail()}")
                dead = [p for p in self._procs if p.poll() is not None]
                if dead and not pending and ready.empty():
                    raise RankFailure(f"RankPool: a rank process exited with code {dead[0].returncode} "
                                      f"during start-up{self._log_tail()}")
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    sock = None
                if sock is not None:
                    shaking.add(sock)
                    limit = min(_HANDSHAKE_TIMEOUT, max(0.1, deadline - time.monotonic()))
                    threading.Thread(target=_handshake, args=(sock, key, limit, ready, shaking),
                                     name="neural_arch-pool-handshake", daemon=True).start()
                while not ready.empty():
                    pending.append(ready.get())
                for conn in wait(pending, timeout=0):
                    pending.remove(conn)
                    try:
                        kind, rank, pid, detail = conn.recv()
                    except (EOFError, OSError):
                        conn.close()  # an authenticated rank that died before its hello: the exit check reports it
                        continue
                    if kind == "init-error":
                        conn.close()
                        raise RankFailure(f"RankPool: rank {rank} failed in init_process_group:\n{detail}",
                                          [RankResult(rank, False, error="init_process_group failed",
                                                      exc_type="InitError", traceback=detail)])
                    self._conns[rank] = conn
                    self._pids[rank] = pid
        finally:
            # Wake handshakes still waiting on a silent client (shutdown ends their blocked read),
            # and drop connections nobody will use.
            for sock in list(shaking):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for conn in pending:
                conn.close()
            while not ready.empty():
                ready.get().close()

    def close(self, graceful: bool = True) -> None:
        """Stop every rank (politely, then SIGKILL) and reap them. Safe to call twice.

        ``graceful=False`` skips the polite stop: after a timeout a hung rank never reads it, and
        waiting 3 s for it would only delay the SIGKILL."""
        if graceful:
            for conn in self._conns.values():
                try:
                    conn.send(("stop",))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + (3.0 if graceful else 0.0)
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        for conn in self._conns.values():
            conn.close()
        if self._children:
            from neural_arch.distributed.run.procs import finish_children

            finish_children(self._children)
            self._children.clear()
        self._conns.clear()
        self._procs.clear()
        self._started = False
        if self._logdir:
            shutil.rmtree(self._logdir, ignore_errors=True)
            self._logdir = None

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
        for pid in self._pids.values():  # ranks that escaped the process group (mpiexec proxies)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self._procs:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                pass

    def _log_tail(self, limit: int = 4000) -> str:
        if not self._logdir or not os.path.isdir(self._logdir):
            return ""
        parts = []
        for name in sorted(os.listdir(self._logdir)):
            with open(os.path.join(self._logdir, name), "rb") as f:
                text = f.read().decode(errors="replace")[-limit:]
            if text.strip():
                parts.append(f"--- {name} ---\n{text}")
        return ("\n" + "\n".join(parts)) if parts else ""

    # -- running ---------------------------------------------------------------------------------
    def run(self, fn: Callable, *args, timeout: float | None = None, **kwargs) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        Raises :class:`RankFailure` naming every failing rank with its traceback. When some
        ranks fail and the others do not finish shortly after, the pool is restarted on the
        next call (its ranks may be stuck in a collective the failed ranks never joined).
        """
        results = self.run_detailed(fn, *args, timeout=timeout, **kwargs)
        failed = [r for r in results if not r.ok]
        if failed:
            detail = "\n".join(f"--- rank {r.rank}: {r.exc_type}: {r.error}\n{r.traceback or ''}" for r in failed)
            raise RankFailure(f"{getattr(fn, '__name__', fn)} failed on ranks {[r.rank for r in failed]}:\n"
                              f"{detail}", results)
        return [r.value for r in results]

    def run_detailed(self, fn: Callable, *args, timeout: float | None = None, **kwargs) -> list[RankResult]:
        """Like :meth:`run`, but return a :class:`RankResult` per rank instead of raising."""
        blob, main_path = pack_call(fn, args, kwargs)
        return self.run_packed(blob, main_path, timeout)

    def run_packed(self, blob: bytes, main_path: str | None, timeout: float | None,
                   failure_grace: float = 10.0) -> list[RankResult]:
        """Run a :func:`~neural_arch.distributed.run.rank_worker.pack_call` payload (``launch()`` and
        ``spawn()`` pack once, up front, so an unsendable function fails before any process starts);
        after a failure the other ranks get ``failure_grace`` s to report before they are stopped."""
        self.start()
        timeout = self.timeout if timeout is None else timeout
        results: dict[int, RankResult] = {}
        for rank, conn in self._conns.items():
            try:
                conn.send(("run", blob, main_path))
            except (OSError, ValueError) as exc:
                results[rank] = RankResult(rank, False, error=f"cannot reach rank: {exc}", exc_type="BrokenPipe")
        deadline = time.monotonic() + timeout
        waiting = {conn: rank for rank, conn in self._conns.items() if rank not in results}
        broken = timed_out = False
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                broken = timed_out = True
                for rank in sorted(waiting.values()):
                    results[rank] = RankResult(rank, False, error=f"no answer within {timeout:.0f} s "
                                               "(hung, or stuck in a collective another rank never joined)",
                                               exc_type="Timeout")
                break
            for conn in wait(list(waiting), timeout=min(left, 0.5)):
                rank = waiting.pop(conn)
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    broken = True
                    results[rank] = RankResult(rank, False, error="the rank process died", exc_type="Died",
                                               exitcode=self._exitcode(rank))
                    continue
                if reply[0] == "ok":
                    results[rank] = RankResult(rank, True, value=reply[1])
                else:
                    results[rank] = RankResult(rank, False, exc_type=reply[1], error=reply[2], traceback=reply[3])
            if any(not r.ok for r in results.values()):
                # Survivors of a failure get a short grace to finish, not the whole timeout.
                deadline = min(deadline, time.monotonic() + failure_grace)
        if broken:
            log = self._log_tail()
            self.close(graceful=not timed_out)
            for r in results.values():
                if not r.ok and r.traceback is None:
                    r.traceback = log
        return [results[r] for r in range(self.world_size)]

    def _exitcode(self, rank: int) -> int | None:
        if self.backend == "mpi":
            return None
        proc = self._procs[rank]
        try:
            return proc.wait(2.0)
        except subprocess.TimeoutExpired:
            return None
