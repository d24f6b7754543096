"""``launch(fn, nprocs)``: run a Python function on N fresh processes with the process group set up.

Example (works from a script, a test or a notebook)::

    >>> from neural_arch.distributed import launch
    >>> def double_rank():                     # doctest: +SKIP
    ...     from neural_arch.distributed import get_rank
    ...     return 2 * get_rank()
    >>> launch(double_rank, nprocs=3)          # doctest: +SKIP
    [0, 2, 4]

A thin layer over :class:`neural_arch.distributed.testing.RankPool`, the harness every distributed
test uses: each rank is a new ``python`` process (never ``fork``: forking a process that holds
threads and sockets is unsafe), gets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
(:func:`run_env.rank_env`), calls ``init_process_group(backend)``, runs ``fn(*args)``, and sends
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

import time
from collections.abc import Callable, Sequence
from typing import Any

from neural_arch.distributed.run.procs import describe_exit
from neural_arch.distributed.run.rank_worker import pack_call

__all__ = ["SpawnError", "launch"]

# After one rank fails, how long the others get to report their own errors before being stopped.
_FAILURE_GRACE_S = 1.0


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
    """
    from neural_arch.distributed.testing import RankFailure, RankPool

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
        results = pool._run_packed(blob, main_path, left, failure_grace=_FAILURE_GRACE_S)
        _raise_for(results, name, nprocs, timeout)
        return [r.value for r in results]
    finally:
        pool.close()
