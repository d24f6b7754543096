"""``spawn(fn, args, nprocs)`` (torch.multiprocessing.spawn's contract) and ``launch(fn, nprocs)``.

``spawn`` is what every torch DDP tutorial calls: ``fn(rank, *args)`` runs on ``nprocs`` new
processes, **without** a process group (``fn`` calls ``init_process_group`` itself, usually in a
``setup(rank, world_size)`` that sets ``MASTER_ADDR``/``MASTER_PORT``), returns None, and re-raises
the first failing rank's error here as :class:`ProcessRaisedException` (or
:class:`ProcessExitedException` for a rank that exited or was killed), after stopping every rank::

    import neural_arch.distributed as dist

    def demo(rank, world_size):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "12355"
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        ...
        dist.destroy_process_group()

    if __name__ == "__main__":
        dist.spawn(demo, args=(2,), nprocs=2, join=True)

``launch`` is the convenience form below: the group is initialised for ``fn(*args)`` and the
return values come back.

Example (works from a script, a test or a notebook)::

    >>> from neural_arch.distributed import launch
    >>> def double_rank():                     # doctest: +SKIP
    ...     from neural_arch.distributed import get_rank
    ...     return 2 * get_rank()
    >>> launch(double_rank, nprocs=3)          # doctest: +SKIP
    [0, 2, 4]

Both are thin layers over :class:`neural_arch.distributed.run.pool.RankPool` (which the test
harness re-uses): each rank is a new ``python`` process (never ``fork``: forking a process that holds
threads and sockets is unsafe), gets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
(:func:`~neural_arch.distributed.run.child_env.rank_env`), calls ``init_process_group(backend)``, runs ``fn(*args)``, and sends
back its return value. ``backend="mpi"`` starts the ranks under a real ``mpiexec``. The result is
the list of return values in rank order; the ranks' output is copied here, prefixed ``[rank{r}]: ``.
If any rank raises, the others are stopped and :class:`SpawnError` is raised *here* carrying that
rank's traceback text. ``timeout`` bounds the whole run; children are always reaped, even when this
call is interrupted, and end with their process group if this process is killed.

How ``fn`` travels: with ``cloudpickle`` installed it is sent by value (so functions typed into a
notebook cell work). Without it ``fn`` is pickled by reference, so it must be importable: defined in
a module, or in the ``__main__`` *script* (which each child re-imports as ``__mp_main__``, as
``multiprocessing`` does — keep the script's side effects under ``if __name__ == "__main__":``).
A function defined in a notebook without cloudpickle is rejected up front with that explanation.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from neural_arch.distributed.run.pool import RankFailure, RankPool
from neural_arch.distributed.run.procs import describe_exit, signal_name
from neural_arch.distributed.run.rank_worker import pack_call

__all__ = ["ProcessException", "ProcessExitedException", "ProcessRaisedException", "SpawnContext",
           "SpawnError", "launch", "spawn"]

# After one rank fails, how long the others get to report their own errors before being stopped.
_FAILURE_GRACE_S = 1.0


class SpawnError(RuntimeError):
    """A rank of :func:`launch` failed; ``rank``, ``exitcode`` and ``remote_traceback`` say how.

    Example::

        try:
            launch(train, nprocs=2)
        except SpawnError as exc:
            print(exc.rank, exc.exitcode, exc.remote_traceback)
    """

    def __init__(self, rank: int, exitcode: int | None, remote_traceback: str | None) -> None:
        self.rank, self.exitcode, self.remote_traceback = rank, exitcode, remote_traceback
        if remote_traceback:
            last = remote_traceback.strip().splitlines()[-1]
            text = (f"rank {rank} raised {last}\n\n--- traceback from rank {rank} ---\n"
                    f"{remote_traceback.rstrip()}")
        else:
            text = f"rank {rank} {describe_exit(exitcode)} before returning a result"
        super().__init__(text)


def _raise_for(results: list, name: str, nprocs: int, timeout: float) -> None:
    """Turn failed RankResults into the one error launch() raises (a rank that raised wins)."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return
    raised = [r for r in failed if r.exc_type not in ("Died", "Timeout", "BrokenPipe")]
    if raised:
        first = min(raised, key=lambda r: r.rank)
        raise SpawnError(first.rank, None, first.traceback or f"{first.exc_type}: {first.error}")
    died = [r for r in failed if r.exc_type != "Timeout"]
    if died:
        first = min(died, key=lambda r: r.rank)
        raise SpawnError(first.rank, first.exitcode, None)
    running = sorted(r.rank for r in failed)
    raise TimeoutError(f"launch({name!r}, nprocs={nprocs}) did not finish within {timeout:g} s; "
                       f"ranks still running: {running} (a collective waiting for a rank that "
                       f"never calls it?)")


def launch(fn: Callable, nprocs: int, args: Sequence[Any] = (), backend: str = "gloo",
           timeout: float = 300.0, master_addr: str = "127.0.0.1", master_port: int | None = None,
           init_process_group: bool = True, env: dict | None = None) -> list:
    """Run ``fn(*args)`` on ``nprocs`` new processes; return their results in rank order.

    ``init_process_group=False`` skips the process-group set-up (``fn`` then sees only the env
    variables). ``env`` adds variables to the children's environment.

    Example::

        def work():
            return dist.get_rank() * 10

        launch(work, nprocs=2)                       # [0, 10]
    """
    if int(nprocs) < 1:
        raise ValueError(f"nprocs={nprocs}: launch at least one process")
    nprocs = int(nprocs)
    name = getattr(fn, "__name__", repr(fn))
    blob, main_path = pack_call(fn, tuple(args), {})  # rejects an unsendable fn before any start
    deadline = time.monotonic() + timeout
    pool = RankPool(nprocs, backend=backend, timeout=timeout, env=env, init=init_process_group,
                    start_timeout=timeout, master_addr=master_addr, master_port=master_port,
                    echo=True)
    try:
        try:
            pool.start()
        except RankFailure as exc:
            if exc.results:
                _raise_for(exc.results, name, nprocs, timeout)
            raise
        left = max(0.1, deadline - time.monotonic())
        results = pool.run_packed(blob, main_path, left, failure_grace=_FAILURE_GRACE_S)
        _raise_for(results, name, nprocs, timeout)
        return [r.value for r in results]
    finally:
        pool.close()


# ---------------------------------------------------------------------------------- spawn (torch)
class ProcessException(Exception):
    """torch.multiprocessing's base: ``error_index`` (the rank) and ``error_pid``.

    Example::

        try:
            spawn(train, nprocs=2)
        except ProcessException as exc:
            print(exc.error_index, exc.pid)         # the rank that failed, and its pid
    """

    def __init__(self, msg: str, error_index: int, error_pid: int | None = None) -> None:
        super().__init__(msg)
        self.msg, self.error_index, self.pid = msg, error_index, error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A rank raised; the message carries its traceback (torch's wording).

    Example::

        try:
            spawn(train, nprocs=2)
        except ProcessRaisedException as exc:
            print(exc)                              # the failing rank's traceback
    """


class ProcessExitedException(ProcessException):
    """A rank exited (non-zero) or was killed by a signal before ``fn`` returned.

    Example::

        try:
            spawn(train, nprocs=2)
        except ProcessExitedException as exc:
            print(exc.error_index, exc.exit_code)   # e.g. -9: killed by SIGKILL
    """

    def __init__(self, msg: str, error_index: int, error_pid: int | None = None, exit_code: int | None = None,
                 signal_name: str | None = None) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code, self.signal_name = exit_code, signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code, self.signal_name)


# What the pool puts in a rank's environment that torch's spawn children do not have. They are
# removed before fn runs (unless the parent itself had them): a multi-node mp.spawn script passes
# rank = node * nprocs + i itself, which a RANK=i left here would contradict.
_POOL_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
              "MASTER_PORT", "NEURAL_ARCH_BACKEND", "NEURAL_ARCH_AUTH_TOKEN", "NEURAL_ARCH_RESTART_COUNT",
              "TORCHELASTIC_RESTART_COUNT", "NEURAL_ARCH_TIMEOUT")


def _call_with_rank(fn, argv, drop, *args):
    """Runs in each child: torch's ``fn(i, *args)``, ``i`` being this process's index.

    ``sys.argv`` is the parent's, as multiprocessing's spawn gives it (scripts parse it in fn).
    """
    index = int(os.environ["RANK"])
    for name in drop:
        os.environ.pop(name, None)
    sys.argv[:] = argv
    return fn(index, *args)


def _exit_code(result) -> int | None:
    """SystemExit's code as torch's exit status (None/0: success)."""
    text = (result.error or "").strip()
    if text in ("", "None", "0"):
        return 0
    return int(text) if text.lstrip("-").isdigit() else 1


def _spawn_error(results, nprocs: int, timeout: float | None) -> BaseException | None:
    """The exception ``spawn`` raises for these per-rank results (None: all fine), torch's wording."""
    failed = [r for r in results if not r.ok and not (r.exc_type == "SystemExit" and _exit_code(r) == 0)]
    if not failed:
        return None
    raised = [r for r in failed if r.exc_type not in ("Died", "Timeout", "BrokenPipe", "SystemExit", "InitError")]
    if raised:
        first = min(raised, key=lambda r: r.rank)
        trace = first.traceback or f"{first.exc_type}: {first.error}"
        return ProcessRaisedException(f"\n\n-- Process {first.rank} terminated with the following error:\n"
                                      f"{trace}", first.rank)
    exited = [r for r in failed if r.exc_type != "Timeout"]
    if exited:
        first = min(exited, key=lambda r: r.rank)
        code = _exit_code(first) if first.exc_type == "SystemExit" else first.exitcode
        if code is not None and code < 0:
            name = signal_name(-code)
            return ProcessExitedException(f"process {first.rank} terminated with signal {name}", first.rank,
                                          exit_code=code, signal_name=name)
        return ProcessExitedException(f"process {first.rank} terminated with exit code {code}"
                                      + (f"\n{first.traceback}" if first.traceback else ""),
                                      first.rank, exit_code=code)
    running = sorted(r.rank for r in failed)
    return TimeoutError(f"spawn(nprocs={nprocs}) did not finish within {timeout:g} s; processes still "
                        f"running: {running} (stopped now)")


class SpawnContext:
    """What ``spawn(..., join=False)`` returns (torch's ``ProcessContext``): call :meth:`join`.

    Example::

        ctx = spawn(train, args=(cfg,), nprocs=2, join=False)
        while not ctx.join(timeout=1.0):
            pass                                     # do other work while the ranks run
    """

    def __init__(self, pool: RankPool, blob: bytes, main_path: str | None, nprocs: int,
                 timeout: float | None) -> None:
        self._pool, self._nprocs, self._timeout = pool, nprocs, timeout
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(blob, main_path), daemon=True,
                                        name="neural_arch-spawn")
        self._thread.start()

    def _run(self, blob: bytes, main_path: str | None) -> None:
        try:
            results = self._pool.run_packed(blob, main_path, self._timeout or 10 ** 9,
                                            failure_grace=_FAILURE_GRACE_S)
            self._error = _spawn_error(results, self._nprocs, self._timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised by join()
            self._error = exc
        finally:
            self._pool.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self._pool._procs]

    def join(self, timeout: float | None = None) -> bool:
        """True once every process finished (raising the first failure); False if still running."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise self._error
        return True


def spawn(fn: Callable, args: Sequence[Any] = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: str = "spawn", timeout: float | None = None, env: dict | None = None):
    """torch.multiprocessing.spawn: run ``fn(rank, *args)`` on ``nprocs`` new processes.

    The process group is **not** initialised (``fn`` calls ``init_process_group``). As with torch,
    the children see this process's environment and no ``RANK``/``WORLD_SIZE``: ``fn`` passes
    ``rank``/``world_size`` itself, and its ``setup()`` sets ``MASTER_ADDR``/``MASTER_PORT`` (or
    this process did before calling ``spawn``). ``env`` adds variables. Returns None (``join=False``: a :class:`SpawnContext`). A rank that raises stops every
    rank and is re-raised here as :class:`ProcessRaisedException` with its traceback.
    ``start_method`` must be ``"spawn"`` (forking a process that holds threads and sockets is
    unsafe; say so rather than pretend). ``timeout`` (seconds, default none) is our addition.

    Example::

        def train(rank, cfg):
            dist.init_process_group("gloo", rank=rank, world_size=2)
            ...

        spawn(train, args=(cfg,), nprocs=2)
    """
    if start_method != "spawn":
        raise ValueError(f"spawn(start_method={start_method!r}): only 'spawn' is supported (each rank is a "
                         "fresh interpreter); drop start_method=")
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn(nprocs={nprocs!r}): pass the number of processes, an int >= 1")
    if not isinstance(args, tuple):
        raise TypeError(f"spawn(args=...) must be a tuple (torch), got {type(args).__name__}: "
                        f"write args=({args!r},)")
    child_env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT") if os.environ.get(k)}
    child_env.update(env or {})
    drop = [name for name in _POOL_VARS if name not in os.environ and name not in (env or {})]
    blob, main_path = pack_call(_call_with_rank, (fn, list(sys.argv), drop, *args), {}, user_fn=fn)
    pool = RankPool(nprocs, backend="gloo", timeout=timeout or 10 ** 9, env=child_env, init=False,
                    start_timeout=120.0, master_addr=child_env.get("MASTER_ADDR", "127.0.0.1"),
                    master_port=int(child_env["MASTER_PORT"]) if "MASTER_PORT" in child_env else None,
                    echo=True)
    try:
        pool.start()
    except RankFailure:
        pool.close()
        raise
    context = SpawnContext(pool, blob, main_path, nprocs, timeout)
    if not join:
        return context
    while not context.join(0.5):
        pass
    return None
