"""The DataLoader's worker processes: start them, hand out tasks, collect results, reap them.

A :class:`WorkerPool` owns ``num_workers`` processes, one index queue each and one shared result
queue. It knows nothing about order or epochs (the loader's iterator does); it guarantees three
things the iterator relies on:

* :meth:`WorkerPool.get` never hangs on a dead worker: while it waits it checks every worker's
  liveness and raises ``RuntimeError`` naming the worker id, its pid and exit code (and signal);
  with ``timeout > 0`` it raises once no result came for that long (torch's ``timeout``);
* :meth:`WorkerPool.shutdown` (also run when the pool is garbage collected, and at interpreter
  exit) stops and joins every worker (terminating one that does not stop) and unlinks every
  shared-memory file its workers left (``/dev/shm/na-dl-<pid>-<pool>-*``);
* workers are daemons and exit on their own when the main process dies.

Example::

    >>> from neural_arch.data.worker_pool import WorkerPool
    >>> WorkerPool.__name__
    'WorkerPool'
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import multiprocessing
import os
import queue
import signal
import sys
import time
import weakref

from neural_arch.data.shared_batch import SHM_DIR
from neural_arch.data.worker import worker_loop

__all__ = ["WorkerPool", "default_context"]

#: seconds between liveness checks of the workers while the main process waits for a result
_CHECK_S = 0.1
#: seconds a worker gets to exit after being told to stop, before it is terminated
_JOIN_S = 1.0
_pool_ids = itertools.count()


def default_context() -> str:
    """torch's default start method: ``fork`` where the platform has it (Linux), else ``spawn``.

    Example::

        >>> import sys
        >>> from neural_arch.data.worker_pool import default_context
        >>> default_context() == ("fork" if sys.platform.startswith("linux") else "spawn")
        True
    """
    return "fork" if sys.platform.startswith("linux") else "spawn"


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"exit code {code} (killed by signal {signal.Signals(-code).name})"
    return f"exit code {code}"


def _shutdown(procs, index_queues, result_queue, shm_pattern) -> None:
    """Stop, join and reap the workers; remove what they left in shared memory (idempotent)."""
    for q in index_queues:
        with contextlib.suppress(Exception):
            q.put(None)
    deadline = time.monotonic() + _JOIN_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join(_JOIN_S)
        if p.is_alive():
            p.kill()
            p.join()
    for q in [*index_queues, result_queue]:
        q.cancel_join_thread()   # a feeder thread blocked on a full pipe must not keep us alive
        q.close()
    for path in glob.glob(shm_pattern):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class WorkerPool:
    """``num_workers`` processes, each running the worker loop of :mod:`neural_arch.data.worker`.

    Args:
        num_workers: how many processes.
        base_seed: worker ``i`` is seeded with ``base_seed + i``.
        dataset, fetch, make_batches, init_fn: handed to every worker (see ``worker_loop``).
        context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or a multiprocessing context.
        timeout: seconds :meth:`get` waits for a result (0: forever, still failing on a dead worker).
        random_states: per worker, the random streams to resume from (None: freshly seeded), see
            :func:`~neural_arch.data.worker.capture_random_state`.

    Example::

        pool = WorkerPool(2, base_seed=0, dataset=ds, fetch=fetch, make_batches=None, init_fn=None)
        pool.put(0, ("key", [0, 1])); key, payload, streams = pool.get(); pool.shutdown()
    """

    def __init__(self, num_workers: int, base_seed: int, dataset, fetch, make_batches, init_fn,
                 context=None, timeout: float = 0.0, random_states=None):
        ctx = context if context is not None and not isinstance(context, str) \
            else multiprocessing.get_context(context or default_context())
        self.num_workers = int(num_workers)
        self.timeout = float(timeout)
        prefix = f"na-dl-{os.getpid()}-{next(_pool_ids)}"
        self.result_queue = ctx.Queue()
        self.index_queues = [ctx.Queue() for _ in range(self.num_workers)]
        self.procs = []
        for worker_id in range(self.num_workers):
            p = ctx.Process(target=worker_loop, daemon=True, name=f"DataLoader-worker-{worker_id}",
                            args=(worker_id, self.num_workers, base_seed + worker_id, dataset, fetch,
                                  make_batches, init_fn, self.index_queues[worker_id], self.result_queue,
                                  prefix, os.getpid(),
                                  None if random_states is None else random_states[worker_id]))
            p.start()
            self.procs.append(p)
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.index_queues, self.result_queue,
                                           os.path.join(SHM_DIR, prefix + "-*"))

    def put(self, worker_id: int, task) -> None:
        """Queue ``task`` for worker ``worker_id``."""
        self.index_queues[worker_id].put(task)

    def get(self):
        """The next result of any worker, ``(key, pickled payload, random state)``; raises if a
        worker died or ``timeout`` passed."""
        deadline = time.monotonic() + self.timeout if self.timeout > 0 else None
        while True:
            wait = _CHECK_S if deadline is None else min(_CHECK_S, deadline - time.monotonic())
            if wait <= 0:
                raise RuntimeError(f"DataLoader timed out after {self.timeout:g} seconds waiting for a batch "
                                   f"from its {self.num_workers} worker(s); raise timeout= or look for a slow "
                                   "or stuck dataset")
            try:
                return self.result_queue.get(timeout=wait)
            except queue.Empty:
                pass
            for worker_id, p in enumerate(self.procs):
                if not p.is_alive():
                    pid, code = p.pid, p.exitcode
                    self.shutdown()
                    raise RuntimeError(f"DataLoader worker {worker_id} (pid {pid}) exited unexpectedly with "
                                       f"{_describe_exit(code)}; if it was killed for memory, lower batch_size, "
                                       "num_workers or prefetch_factor")

    @property
    def alive(self) -> bool:
        """True until :meth:`shutdown`."""
        return self._finalizer.alive

    def shutdown(self) -> None:
        """Stop and reap every worker and remove their shared-memory files (safe to call twice)."""
        self._finalizer()
