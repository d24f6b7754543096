"""The core's small thread pool: large NumPy kernels split into chunks along their first axis.

NumPy runs every ufunc on one thread but releases the GIL inside its loops (and inside the BLAS), so
the same kernel run on disjoint chunks of an array from a few threads uses the other cores: what
PyTorch's intra-op threads do for its elementwise ops. The core uses it for its fused host kernels
(GELU, layer norm, attention over heads, AdamW's update); every chunk does exactly the arithmetic of
the unsplit kernel on its rows, so the results are bit-identical for any thread count.

How many threads: ``NEURAL_ARCH_INTRAOP_THREADS`` when set (1 turns the pool off), else the thread
count of the loaded BLAS *now* (threadpoolctl's ``threadpool_limits`` and ``OMP_NUM_THREADS`` /
``OPENBLAS_NUM_THREADS`` rule it, as they rule the GEMMs), capped by the CPUs this process may run
on. A kernel below ``min_work`` (elements times passes over them) runs inline: handing a small array to a thread costs more
than it saves. Only NumPy arrays are ever split (callers check); a device array's kernel runs as is.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.thread_pool import parallel_chunks
    >>> x = np.arange(10.0)
    >>> out = np.empty_like(x)
    >>> def square(lo, hi):
    ...     np.multiply(x[lo:hi], x[lo:hi], out=out[lo:hi])
    >>> _ = parallel_chunks(len(x), square, min_work=0)
    >>> out.tolist()[:4]
    [0.0, 1.0, 4.0, 9.0]
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from neural_arch import config

__all__ = ["MIN_WORK", "PIECES_PER_THREAD", "intraop_threads", "parallel_chunks", "splits"]

#: the work, in element-passes, below which a kernel runs inline (a hand-off to a thread and the
#: extra pieces cost about as much as a few dozen passes over 64 Ki elements)
MIN_WORK = 1 << 21

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_workers = 0
_blas = None  # threadpoolctl's BLAS controllers, looked up once (None: not looked up yet)


_cpu_count: int | None = None  # CPUs this process may run on, looked up once (and after a fork)


def _cpus() -> int:
    global _cpu_count
    if _cpu_count is None:
        try:
            _cpu_count = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _cpu_count = os.cpu_count() or 1
    return _cpu_count


def _blas_threads() -> int | None:
    """The loaded BLAS's thread count now (a C call per controller), None when unknown."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        except Exception:  # noqa: BLE001 - not installed or an unknown library: fall back to the env
            _blas = []
    if not _blas:
        return None
    return max(c.get_num_threads() for c in _blas)


def _env_threads() -> int | None:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        raw = os.environ.get(name, "").split(",")[0].strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return None


def intraop_threads() -> int:
    """Threads :func:`parallel_chunks` uses now (1: the pool is off).

    Example::

        >>> from neural_arch.core.thread_pool import intraop_threads
        >>> intraop_threads() >= 1
        True
    """
    forced = config.get("NEURAL_ARCH_INTRAOP_THREADS")
    if forced is not None:
        return max(1, forced)
    n = _blas_threads() or _env_threads() or _cpus()
    return max(1, min(n, _cpus()))


def _pool(workers: int) -> ThreadPoolExecutor:
    global _executor, _executor_workers
    with _lock:
        if _executor is None or _executor_workers < workers:
            old = _executor
            _executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neural_arch-intraop")
            _executor_workers = workers
            if old is not None:
                old.shutdown(wait=False)
        return _executor


def _forget_pool_in_child() -> None:
    # a forked child has the executor object but none of its threads
    global _executor, _executor_workers, _cpu_count
    _executor, _executor_workers, _cpu_count = None, 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def splits(work: int, min_work: int | None = None) -> bool:
    """Whether :func:`parallel_chunks` would split a kernel of ``work`` elements now (callers that
    must allocate their outputs differently for the split form ask first).

    Example::

        >>> from neural_arch.core.thread_pool import splits
        >>> splits(10)                            # far below MIN_WORK: inline
        False
    """
    return work >= (MIN_WORK if min_work is None else min_work) and intraop_threads() > 1


#: how many pieces each thread's share is cut into. The threads take pieces from a shared counter,
#: so a thread the OS does not schedule (a busy machine) leaves its pieces to the others instead of
#: making the caller wait.
PIECES_PER_THREAD = 2


class _Job:
    """One split kernel: pieces handed out by a counter, the caller told when the last one ends."""

    __slots__ = ("bounds", "done", "error", "fn", "left", "lock", "next", "pieces", "results")

    def __init__(self, fn, bounds):
        self.fn, self.bounds = fn, bounds
        self.pieces = len(bounds) - 1
        self.next = itertools.count()  # next() on a count is atomic in CPython
        self.results = [None] * self.pieces
        self.left = self.pieces
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None

    def work(self) -> None:
        while (i := next(self.next)) < self.pieces:
            try:
                self.results[i] = self.fn(self.bounds[i], self.bounds[i + 1])
            except BaseException as e:  # noqa: BLE001 - raised by the caller once every piece ended
                self.error = self.error or e
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


def parallel_chunks(n: int, fn, *, work: int | None = None, min_work: int | None = None,
                    threads: int | None = None) -> list:
    """Run ``fn(lo, hi)`` over contiguous chunks covering ``range(n)``; their results in order.

    ``work`` is the kernel's cost in element-passes (elements times the passes its NumPy calls make
    over them; default ``n``): below ``min_work``
    (default :data:`MIN_WORK`), or with one thread, ``fn(0, n)`` runs inline and the list has that
    one result. Otherwise ``range(n)`` is cut into :data:`PIECES_PER_THREAD` pieces per thread, which
    the calling thread and the pool's threads take in turn (the caller never waits for a thread
    that has not started); an exception in any piece is raised here, after every piece has ended.
    ``fn`` must only write its own piece's rows.

    Example::

        >>> from neural_arch.core.thread_pool import parallel_chunks
        >>> parallel_chunks(10, lambda lo, hi: (lo, hi), min_work=0, threads=2)
        [(0, 2), (2, 5), (5, 7), (7, 10)]
    """
    if (n if work is None else work) < (MIN_WORK if min_work is None else min_work):
        return [fn(0, n)]
    k = min(intraop_threads() if threads is None else max(1, threads), n)
    if k <= 1:
        return [fn(0, n)]
    pieces = min(n, k * PIECES_PER_THREAD)
    job = _Job(fn, [n * i // pieces for i in range(pieces + 1)])
    pool = _pool(k - 1)
    for _ in range(k - 1):
        pool.submit(job.work)
    job.work()
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.results
