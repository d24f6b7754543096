"""``launch(fn, nprocs)``: run a Python function on N fresh processes with the process group set up.

Example (works from a script, a test or a notebook)::

    >>> from neural_arch.distributed import launch
    >>> def double_rank():                     # doctest: +SKIP
    ...     from neural_arch.distributed import get_rank
    ...     return 2 * get_rank()
    >>> launch(double_rank, nprocs=3)          # doctest: +SKIP
    [0, 2, 4]

Each rank is a new ``python`` process (never ``fork``: forking a process that holds threads and
sockets is unsafe), gets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, calls
``init_process_group(backend)``, runs ``fn(*args)``, and sends back its return value. The result is
the list of return values in rank order. If any rank raises, the others are stopped and
:class:`SpawnError` is raised *here* carrying that rank's traceback text. ``timeout`` bounds the
whole run; children are always reaped, even when this call is interrupted.

How ``fn`` travels: with ``cloudpickle`` installed it is sent by value (so functions typed into a
notebook cell work). Without it ``fn`` is pickled by reference, so it must be importable: defined in
a module, or in the ``__main__`` *script* (which each child re-imports as ``__mp_main__``, as
``multiprocessing`` does — keep the script's side effects under ``if __name__ == "__main__":``).
A function defined in a notebook without cloudpickle is rejected up front with that explanation.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._proc import OutputPump, describe_exit, start_child, terminate_all

__all__ = ["SpawnError", "launch"]


class SpawnError(RuntimeError):
    """A rank of :func:`launch` failed; ``rank``, ``exitcode`` and ``remote_traceback`` say how."""

    def __init__(self, rank: int, exitcode: int | None, remote_traceback: str | None) -> None:
        self.rank, self.exitcode, self.remote_traceback = rank, exitcode, remote_traceback
        if remote_traceback:
            last = remote_traceback.strip().splitlines()[-1]
            text = (f"rank {rank} raised {last}\n\n--- traceback from rank {rank} ---\n"
                    f"{remote_traceback.rstrip()}")
        else:
            text = f"rank {rank} {describe_exit(exitcode)} before returning a result"
        super().__init__(text)


def _dumps(fn: Callable, args: tuple) -> tuple[bytes, str | None]:
    """Pickle ``(fn, args)``; also return the __main__ script path children must import, if any."""
    try:
        import cloudpickle  # optional: lets notebook-defined functions travel by value
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        return cloudpickle.dumps((fn, args)), None
    main_path = None
    if getattr(fn, "__module__", None) == "__main__":
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        if main_path is None:
            raise ValueError(
                f"{getattr(fn, '__qualname__', fn)!r} is defined in an interactive session "
                f"(notebook/REPL), so the child processes cannot import it. Either `pip install "
                f"cloudpickle` (then launch() sends it by value) or move it into a .py module and "
                f"import it from there.")
        main_path = os.path.abspath(main_path)
    try:
        return pickle.dumps((fn, args)), main_path
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(f"cannot send {fn!r} and its args to the child processes: {exc}. "
                         f"Use a module-level function and picklable args (or install cloudpickle)"
                         ) from exc


def launch(fn: Callable, nprocs: int, args: Sequence[Any] = (), backend: str = "gloo",
           timeout: float = 300.0, master_addr: str = "127.0.0.1", master_port: int | None = None,
           init_process_group: bool = True, env: dict | None = None) -> list:
    """Run ``fn(*args)`` on ``nprocs`` new processes; return their results in rank order.

    ``init_process_group=False`` skips the process-group set-up (``fn`` then sees only the env
    variables). ``env`` adds variables to the children's environment.
    """
    from .launcher import _package_root, find_free_port

    if int(nprocs) < 1:
        raise ValueError(f"nprocs={nprocs}: launch at least one process")
    nprocs = int(nprocs)
    payload, main_path = _dumps(fn, tuple(args))
    workdir = tempfile.mkdtemp(prefix="neural_arch_spawn_")
    with open(os.path.join(workdir, "payload.pkl"), "wb") as f:
        pickle.dump({"fn": payload, "main_path": main_path, "sys_path": list(sys.path),
                     "backend": backend, "init": bool(init_process_group)}, f)
    port = master_port or find_free_port(master_addr)
    token = os.environ.get("NEURAL_ARCH_AUTH_TOKEN") or os.urandom(16).hex()
    base = dict(os.environ)
    base.update(env or {})
    root = _package_root()
    paths = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    base["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    base.setdefault("PYTHONUNBUFFERED", "1")
    pump = OutputPump()
    children = []
    try:
        for rank in range(nprocs):
            child_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs),
                             LOCAL_WORLD_SIZE=str(nprocs), NODE_RANK="0", GROUP_RANK="0",
                             MASTER_ADDR=master_addr, MASTER_PORT=str(port),
                             NEURAL_ARCH_BACKEND=backend, NEURAL_ARCH_RESTART_COUNT="0",
                             NEURAL_ARCH_AUTH_TOKEN=token, NEURAL_ARCH_PARENT_PID=str(os.getpid()))
            cmd = [sys.executable, "-u", "-m", "neural_arch.distributed._spawn_worker", workdir]
            children.append(start_child(cmd, child_env, rank=rank, pump=pump, local_rank=rank))
        deadline = time.monotonic() + timeout
        while True:
            codes = [c.proc.poll() for c in children]
            failed = [c for c, code in zip(children, codes) if code not in (None, 0)]
            if failed:
                first = _first_failure(failed, workdir)
                raise SpawnError(first.rank, first.proc.returncode, _read_error(workdir, first.rank))
            if all(code == 0 for code in codes):
                return [_read_result(workdir, rank) for rank in range(nprocs)]
            if time.monotonic() > deadline:
                running = [c.rank for c, code in zip(children, codes) if code is None]
                raise TimeoutError(f"launch({getattr(fn, '__name__', fn)!r}, nprocs={nprocs}) did not "
                                   f"finish within {timeout:g} s; ranks still running: {running} "
                                   f"(a collective waiting for a rank that never calls it?)")
            time.sleep(0.02)
    finally:
        terminate_all(children, grace=2.0, sig=signal.SIGTERM)
        shutil.rmtree(workdir, ignore_errors=True)


def _first_failure(failed: list, workdir: str):
    """Prefer a rank that raised (has a traceback) over ranks that died as a consequence."""
    with_tb = [c for c in failed if os.path.exists(os.path.join(workdir, f"error_{c.rank}.txt"))]
    return min(with_tb or failed, key=lambda c: c.rank)


def _read_error(workdir: str, rank: int) -> str | None:
    try:
        with open(os.path.join(workdir, f"error_{rank}.txt"), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _read_result(workdir: str, rank: int):
    path = os.path.join(workdir, f"result_{rank}.pkl")
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except OSError:
        raise SpawnError(rank, 0, f"rank {rank} exited 0 without writing its result (did fn call "
                                  f"sys.exit() or os._exit()?)") from None
