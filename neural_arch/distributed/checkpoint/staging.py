"""Staging for ``async_save``: a training-safe host copy of the chunks this rank writes
(torch's ``torch.distributed.checkpoint.staging``).

``async_save(..., async_stager=stager)`` hands the stager this rank's chunks,
``{chunk name: array}`` (the arrays themselves or row-block views of them, never copies), and
writes whatever ``stager.stage(chunks)`` gives back: ``{chunk name: C-contiguous host array}``, or
a ``concurrent.futures.Future`` of it (asynchronous staging). With a future ``async_save`` returns
an :class:`~neural_arch.distributed.checkpoint.api.AsyncSaveResponse` at once: the forward and
backward run while the copy is made, and the optimizer's ``step()`` waits for it (see ``api``).

* :class:`DefaultStager` with ``StagingOptions(use_async_staging=True)`` (the default, as in
  torch) copies in a thread of its own, into host buffers it keeps for the next save;
* :class:`BlockingAsyncStager` copies in the caller before ``async_save`` returns (what
  ``async_save`` does without a stager, which also overlaps the copy with the plan exchange).

Example::

    >>> import tempfile
    >>> import numpy as np
    >>> from neural_arch.distributed.checkpoint import load
    >>> from neural_arch.distributed.checkpoint.api import async_save
    >>> stager = DefaultStager(StagingOptions(use_async_staging=True))
    >>> state, d = {"w": np.arange(4.0)}, tempfile.mkdtemp()
    >>> response = async_save(state, d, async_stager=stager)
    >>> response.staging_completion.result()      # before mutating state["w"] in place
    >>> response.upload_completion.result()["tensors"]["w"]["global_shape"]
    [4]
    >>> stager.close()
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["AsyncStager", "BlockingAsyncStager", "DefaultStager", "StagingOptions"]


@runtime_checkable
class AsyncStager(Protocol):
    """What ``async_save`` asks of a stager (torch's protocol): ``stage(chunks)`` returns a
    training-safe copy of ``{chunk name: array}``, as a dict (staged before ``async_save``
    returns) or as a ``Future`` of one (staged while training goes on; ``async_save`` then returns
    an :class:`~neural_arch.distributed.checkpoint.api.AsyncSaveResponse`). A copy returned must not
    change after ``stage`` (or its future) completes: the writer reads it in the background.

    ``should_synchronize_after_execute``: ``async_save`` calls ``synchronize_staging()`` after it
    has queued the write of a dict result. ``close()`` frees the stager's thread and buffers.

    Example::

        >>> import numpy as np
        >>> class CopyNow(AsyncStager):
        ...     _synchronize_after_execute = False
        ...     def stage(self, chunks):
        ...         return {name: np.array(a, order="C") for name, a in chunks.items()}
        >>> isinstance(CopyNow(), AsyncStager), CopyNow().stage({"w#0": np.ones(2)})["w#0"].tolist()
        (True, [1.0, 1.0])
    """

    _synchronize_after_execute: bool = True

    @property
    def should_synchronize_after_execute(self) -> bool:
        """Whether ``async_save`` calls :meth:`synchronize_staging` after queueing the write."""
        return self._synchronize_after_execute

    def stage(self, chunks: dict) -> dict | Future:
        """``{chunk name: C-contiguous host copy}``, or a ``Future`` of it."""
        raise NotImplementedError(f"{type(self).__name__} must implement stage()")

    def synchronize_staging(self) -> None:
        """Wait until the last :meth:`stage` has finished copying (nothing to wait for by default)."""

    def close(self) -> None:
        """Release the stager's resources (nothing by default)."""


@dataclass
class StagingOptions:
    """How :class:`DefaultStager` stages (torch's fields and defaults).

    ``use_async_staging``: copy in the stager's own thread, so ``async_save`` returns before the
    copy is made (see :class:`DefaultStager`). ``use_pinned_memory``, ``use_shared_memory`` and
    ``use_non_blocking_copy`` are accepted for torch's signature and change nothing here: the copies
    are plain NumPy buffers, read by a writer thread of this process (not a separate process), and
    device arrays reach the host when the state dict is described, before staging.

    Example::

        >>> StagingOptions(use_async_staging=False).use_async_staging
        False
    """

    use_pinned_memory: bool = True
    use_shared_memory: bool = True
    use_async_staging: bool = True
    use_non_blocking_copy: bool = True


class _ChunkCopier:
    """C-contiguous copies of chunks, in the buffers of the previous call when shapes and dtypes
    match (copying into memory already touched is several times faster than into fresh pages).

    Reusing a buffer is safe because ``async_save`` waits for the previous save's write before it
    stages the next one.
    """

    def __init__(self, reuse: bool) -> None:
        self._reuse = reuse
        self._buffers: dict = {}  # chunk key (a name, or async_save's (rank, name)) -> its buffer

    def copy(self, chunks: dict) -> dict:
        staged = {}
        for name, local in chunks.items():
            buf = self._buffers.get(name) if self._reuse else None
            if buf is None or buf.shape != np.shape(local) or buf.dtype != local.dtype:
                # empty + copyto rather than np.array(copy=True): copyto lets other threads run
                # (the training loop, under asynchronous staging) while it copies.
                buf = np.empty(np.shape(local), dtype=local.dtype)
            np.copyto(buf, local)
            staged[name] = buf
        if self._reuse:
            self._buffers = dict(staged)
        return staged

    def clear(self) -> None:
        self._buffers = {}


class BlockingAsyncStager(AsyncStager):
    """Stage in the caller: ``async_save`` returns once the copy is made, and returns a ``Future``.

    ``cache_staged_state_dict=True`` keeps the copies and reuses them for the next save of the same
    chunks (one host copy of this rank's chunks stays allocated). ``type_check`` is accepted for
    torch's signature (chunks are always arrays here).

    Example::

        >>> import tempfile
        >>> import numpy as np
        >>> from neural_arch.distributed.checkpoint.api import async_save
        >>> future = async_save({"w": np.ones(3)}, tempfile.mkdtemp(), async_stager=BlockingAsyncStager())
        >>> future.result()["tensors"]["w"]["dtype"]
        '<f8'
    """

    _synchronize_after_execute = False

    def __init__(self, cache_staged_state_dict: bool = False, type_check: bool = False) -> None:
        self.cache_staged_state_dict = cache_staged_state_dict
        self.type_check = type_check
        self._copier = _ChunkCopier(reuse=cache_staged_state_dict)

    def stage(self, chunks: dict) -> dict:
        """Copy ``chunks`` now; returns ``{chunk name: copy}``."""
        return self._copier.copy(chunks)

    def close(self) -> None:
        """Drop the cached copies."""
        self._copier.clear()


class DefaultStager(AsyncStager):
    """torch's default stager: with ``use_async_staging`` (the default) :meth:`stage` returns a
    ``Future`` at once and copies in a thread of this stager; otherwise it copies in the caller.
    The copies go into host buffers kept for the next save (one host copy of this rank's chunks
    stays allocated until :meth:`close`).

    The copy reads the live arrays while training goes on, so nothing may change them in place
    until ``staging_completion`` is done. ``async_save`` guards the changes a training loop makes:
    every optimizer's ``step()``, and the training-mode forward of a module whose buffers are being
    staged (BatchNorm's running statistics; DDP's forward, which broadcasts buffers), wait for the
    copy first. Anything else that writes into those arrays (your own ``p.data[...] = ...``) must
    call ``response.staging_completion.result()`` first.

    Example::

        >>> import numpy as np
        >>> stager = DefaultStager()                       # asynchronous staging
        >>> future = stager.stage({"w#0": np.arange(3.0)})
        >>> future.result()["w#0"].tolist()
        [0.0, 1.0, 2.0]
        >>> stager.close()
    """

    def __init__(self, config: StagingOptions | None = None) -> None:
        self.config = StagingOptions() if config is None else config
        # Synchronous staging is done when stage() returns: nothing left to synchronize.
        self._synchronize_after_execute = False
        self._copier = _ChunkCopier(reuse=True)
        self._lock = threading.Lock()
        self._worker: tuple[threading.Thread, queue.SimpleQueue] | None = None
        self._last: Future | None = None

    def stage(self, chunks: dict) -> dict | Future:
        """``{chunk name: copy}`` now, or (``use_async_staging``) a ``Future`` of it."""
        if not self.config.use_async_staging:
            return self._copy(chunks)
        future: Future = Future()

        def job():
            if not future.set_running_or_notify_cancel():
                return
            try:
                staged = self._copy(chunks)
            except BaseException as exc:  # noqa: BLE001 - handed to async_save through the future
                future.set_exception(exc)
            else:
                future.set_result(staged)

        with self._lock:
            self._last = future
            # One long-lived thread: starting a thread per save would block the caller until it runs.
            # A thread object inherited through fork is not alive: the child starts its own.
            if self._worker is None or not self._worker[0].is_alive():
                jobs: queue.SimpleQueue = queue.SimpleQueue()
                thread = threading.Thread(target=_run_jobs, args=(jobs,), name="neural_arch-stager", daemon=True)
                thread.start()
                self._worker = (thread, jobs)
            self._worker[1].put(job)
        return future

    def _copy(self, chunks: dict) -> dict:
        """The copy itself (in the stager's thread under asynchronous staging)."""
        return self._copier.copy(chunks)

    def synchronize_staging(self) -> None:
        """Wait until the last :meth:`stage` has finished copying (its error, if any, is not raised:
        it reaches ``async_save``'s futures)."""
        with self._lock:
            last = self._last
        if last is not None:
            last.exception()

    def close(self) -> None:
        """Wait for the last copy, stop the thread and drop the buffers."""
        self.synchronize_staging()
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None and worker[0].is_alive():
            worker[1].put(None)
            worker[0].join()
        self._copier.clear()


def _run_jobs(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job()  # each job reports its own outcome through its future
