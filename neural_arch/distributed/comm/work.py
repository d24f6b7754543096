"""``Work`` handles, ``ReduceOp`` and ``OpInfo``: the vocabulary every backend shares.

A collective always returns a :class:`Work`. ``async_op=False`` simply means the caller
waits on it at once. An exception raised while the operation ran (on a progress thread,
say) is stored in the handle and raised again by :meth:`Work.wait` in the caller's thread.

Example::

    work = backend.allreduce(arr, ReduceOp.SUM, async_op=True)
    ...                      # compute while the reduction runs
    work.wait()              # raises here if the reduction failed
"""

from __future__ import annotations

import enum
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from neural_arch.distributed.comm.debug import wire_word as _wire_word
from neural_arch.distributed.errors import CollectiveTimeoutError

_log = logging.getLogger("neural_arch.distributed")
_perf_counter = time.perf_counter
_MAIN_THREAD = threading.main_thread().ident

#: How many :meth:`Work.wait` calls the main thread is blocked in right now (0, or 1). The main
#: thread is where training computes; while it is blocked waiting for communication nobody in this
#: process needs the GIL or the core, so a progress thread may spin in its waits instead of
#: sleeping on a futex and paying a wake-up per chunk barrier (``ShmSegment._wait`` reads this).
#: Only the main thread writes it, so it needs no lock; readers may see a stale value, which only
#: costs a spin phase more or less.
main_thread_waiting = 0


class ReduceOp(enum.Enum):
    """Reduction operators. ``AVERAGE`` is an alias of ``AVG`` (the seeds spell it that way).

    Example::

        >>> ReduceOp.AVERAGE is ReduceOp.AVG
        True
        >>> ReduceOp.coerce("sum")
        <ReduceOp.SUM: 'sum'>
    """

    SUM = "sum"
    AVG = "avg"
    AVERAGE = "avg"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"

    # Members are singletons compared by identity, so the identity hash is consistent with ==; Enum's
    # own __hash__ (a Python function hashing the name) made every ``{ReduceOp: ufunc}[op]`` lookup
    # on the collective hot paths twice as slow.
    __hash__ = object.__hash__

    @classmethod
    def coerce(cls, op: ReduceOp | str, fn: str | None = None) -> ReduceOp:
        """Accept a ``ReduceOp`` or its name (``"sum"``, ``"AVG"``, ``"average"``...).

        An array or Tensor where the op goes is mpi4py's ``Allreduce(send, recv)`` habit: a
        TypeError naming ``fn`` says what to write instead.

        >>> import numpy as np
        >>> ReduceOp.coerce(np.zeros(2), "all_reduce")
        Traceback (most recent call last):
        ...
        TypeError: all_reduce reduces in place: its second argument is the op, not a receive buffer; use all_reduce(tensor, op=...) (mpi4py's Allreduce(send, recv) becomes recv[...] = send; all_reduce(recv))
        """
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            key = op.strip().upper()
            if key in cls.__members__:
                return cls.__members__[key]
        elif hasattr(op, "__array__") or hasattr(op, "__cuda_array_interface__"):
            if fn is None:
                raise TypeError("an array was passed where the reduction op goes: collectives reduce in place; "
                                "pass op=ReduceOp.SUM (or another ReduceOp)")
            raise TypeError(f"{fn} reduces in place: its second argument is the op, not a receive buffer; use "
                            f"{fn}(tensor, op=...) (mpi4py's {fn.capitalize().replace('_', '')}(send, recv) becomes "
                            f"recv[...] = send; {fn}(recv))")
        names = ", ".join(sorted(cls.__members__))
        raise ValueError(f"op={op!r} is not a reduction operator; use one of ReduceOp.{{{names}}}")


class OpInfo:
    """What one numbered operation is, for error messages, debug checks and timelines.

    A plain ``__slots__`` class, not a dataclass: one is built per collective, and on the
    small-message path its construction was a third of the Python overhead (the dataclass's
    ``extra`` dict alone). ``extra`` (backend scratch, e.g. NCCL's ready event) is created on
    first use.

    Example::

        >>> info = OpInfo("all_reduce", 57, group_ranks=[0, 1, 2, 3], shape=(1024,), dtype="float32")
        >>> info.describe()
        'all_reduce #57 (shape (1024,), float32)'
    """

    __slots__ = (
        "_extra",
        "_wire",
        "deadline",
        "dtype",
        "group_ranks",
        "name",
        "nbytes",
        "rank",
        "reduce_op",
        "root",
        "seq",
        "shape",
    )

    def __init__(self, name: str, seq: int, group_ranks: Sequence[int] = (), rank: int = 0,
                 shape: tuple | None = None, dtype: str | None = None, root: int | None = None,
                 reduce_op: str | None = None, deadline: float = float("inf"), extra: dict | None = None,
                 wire: int | None = 0, nbytes: int = 0):
        self.name = name
        self.seq = seq
        self.group_ranks = group_ranks
        self.rank = rank
        self.shape = shape
        self.dtype = dtype
        self.root = root
        self.reduce_op = reduce_op
        self.deadline = deadline
        self._extra = extra
        self._wire = wire
        #: this op's byte count on this rank (its argument's, as ``Backend._new_info`` sets it), which
        #: every transport frame of the op carries beside :attr:`wire`: ranks whose calls at one
        #: sequence number differ only in size see an error, not a neighbour's segment as their
        #: buffer. 0: not checked (point-to-point messages, whose own header checks shape and dtype)
        self.nbytes = nbytes

    @property
    def wire(self) -> int:
        """The 8-byte "what is this message" word every transport frame of this op carries (op kind,
        reduce op, dtype, sequence number; see ``comm.debug.wire_word``): the receiver compares it
        with its own, so ranks that disagree get an error instead of each other's bytes. 0: not
        checked. Built with ``wire=None`` (what backends do), it is computed on first use: a
        backend whose transport never reads it (MPI) does not pay for it."""
        word = self._wire
        if word is None:
            word = self._wire = _wire_word(self.name, self.seq, self.dtype, self.reduce_op)
        return word

    @wire.setter
    def wire(self, word: int) -> None:
        self._wire = word

    @property
    def extra(self) -> dict:
        """Per-op scratch space for a backend (created on first use)."""
        if self._extra is None:
            self._extra = {}
        return self._extra

    def __repr__(self) -> str:
        return f"OpInfo({self.describe()}, group={list(self.group_ranks)}, rank={self.rank})"

    def describe(self) -> str:
        """``all_reduce #57 (shape (1024,), float32)``"""
        parts = []
        if self.shape is not None:
            parts.append(f"shape {tuple(self.shape)}")
        if self.dtype is not None:
            parts.append(str(self.dtype))
        if self.root is not None:
            parts.append(f"root {self.root}")
        detail = f" ({', '.join(parts)})" if parts else ""
        return f"{self.name} #{self.seq}{detail}"

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def timeout_error(self, missing: Sequence[int], waited: float) -> CollectiveTimeoutError:
        """The error for a deadline that passed while ``missing`` ranks had not arrived."""
        group = list(self.group_ranks)
        waiting = [r for r in group if r not in set(missing)]
        return CollectiveTimeoutError(
            f"{self.describe()} on group {group} timed out after {waited:.1f} s on rank {self.rank}: "
            f"ranks {sorted(missing)} did not arrive; ranks {waiting} were waiting. "
            "Check that every rank calls the same collectives in the same order, or raise the "
            "timeout with init_process_group(timeout=...)."
        )


class _Holder:
    __slots__ = ("obj",)


def _unshared_refcount() -> int:
    """``sys.getrefcount`` of an object that one slot holds, read into one local variable: the count
    the fused all_reduce path sees for its reusable OpInfo when nobody else keeps it (measured here,
    in the same shape, so no interpreter's counting rules are assumed)."""
    holder = _Holder()
    holder.obj = object()
    info = holder.obj
    return sys.getrefcount(info)


#: What ``sys.getrefcount(info)`` reads in ``Backend.allreduce``'s fused path when the backend's
#: ``_fast_info`` slot and that call's local variable are the only references; 0 where counts do
#: not mean that (a free-threaded build), so an OpInfo is never reused there.
UNSHARED_REFS = _unshared_refcount() if getattr(sys, "_is_gil_enabled", lambda: True)() else 0


def _blocking_wait(event: threading.Event, timeout: float | None) -> bool:
    """``event.wait(timeout)``, counted in :data:`main_thread_waiting` when on the main thread
    (uncounted again however the wait ends: a KeyboardInterrupt or timeout included)."""
    global main_thread_waiting
    if threading.get_ident() != _MAIN_THREAD:
        return event.wait(timeout)
    main_thread_waiting += 1
    try:
        return event.wait(timeout)
    finally:
        main_thread_waiting -= 1


class Work:
    """Handle of one (possibly asynchronous) operation.

    ``wait(timeout=None)`` blocks until the operation finished and returns True, or raises
    the exception it failed with. ``result()`` is the operation's output (the array it
    filled, or a Python object for the object collectives).

    Example::

        >>> import numpy as np
        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> work = LocalBackend().allreduce(np.ones(3), ReduceOp.SUM, async_op=True)
        >>> work.wait(), work.is_success()
        (True, True)
        >>> Work.failed(ValueError("bad buffer")).exception()
        ValueError('bad buffer')
    """

    __slots__ = ("_callbacks", "_done", "_event", "_exc", "_result", "completed_at", "info", "started_at")

    # One lock for all handles: it only guards the lazy creation of an Event and the callback
    # list, both rare. A synchronous collective that completes inline never creates an Event,
    # which keeps the per-call overhead of small collectives low.
    _guard = threading.Lock()

    def __init__(self, info: OpInfo | None = None):
        self.info = info
        self._done = False
        self._event: threading.Event | None = None
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list | None = None
        #: ``time.perf_counter()`` when the operation finished (None while pending)
        self.completed_at: float | None = None
        #: ``time.perf_counter()`` when a backend began running it (None until then; DDP's
        #: per-bucket "comm hidden" measures from here)
        self.started_at: float | None = None

    @classmethod
    def completed(cls, result: Any = None, info: OpInfo | None = None) -> Work:
        """A handle that is already done (world of one, or a synchronous fast path): always the done
        subclass below, whatever class it is called on."""
        # no __init__ call and four stores, not eight: this is on every synchronous collective
        work = _new_object(_CompletedWork)
        work.info = info
        work._result = result
        work.completed_at = work.started_at = _perf_counter()
        return work

    @classmethod
    def failed(cls, exc: BaseException, info: OpInfo | None = None) -> Work:
        work = cls(info)
        work._exc = exc
        work.completed_at = time.perf_counter()
        work._done = True
        return work

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; raise the stored exception if the operation failed."""
        if not self._done:
            with Work._guard:
                event = None
                if not self._done:
                    if self._event is None:
                        self._event = threading.Event()
                    event = self._event
            if event is not None and not _blocking_wait(event, timeout):
                what = self.info.describe() if self.info else "operation"
                raise CollectiveTimeoutError(f"Work.wait(timeout={timeout}) expired before {what} completed")
        if self._exc is not None:
            raise self._exc
        return True

    def result(self) -> Any:
        self.wait()
        return self._result

    def add_done_callback(self, fn: Callable[[Work], None]) -> None:
        """Run ``fn(work)`` when done (at once, in this thread, if already done).

        ``fn`` runs on the thread that completes the work; an exception it raises is logged,
        never propagated (it would otherwise kill a backend's progress thread)."""
        with Work._guard:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    # -- completion, called by backends -------------------------------------------------
    def _finish(self) -> None:
        self.completed_at = time.perf_counter()
        with Work._guard:
            self._done = True
            event, callbacks, self._callbacks = self._event, self._callbacks, None
        if event is not None:
            event.set()
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a user callback must not kill a progress thread
                _log.exception("a done-callback of %r raised; the operation itself completed", self)

    def _set_result(self, result: Any = None) -> None:
        self._result = result
        self._finish()

    def _set_exception(self, exc: BaseException) -> None:
        self._exc = exc
        self._finish()

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        if self._exc is not None:
            state = f"failed: {type(self._exc).__name__}"
        what = self.info.describe() if self.info else "op"
        return f"Work({what}, {state})"


class _CompletedWork(Work):
    """A :class:`Work` born done (``Work.completed``). Its state never changes, so the fields that
    say "done, no error, nobody waiting" are class attributes instead of four stores per handle:
    every method reads ``_done`` first and writes nothing on a done handle."""

    __slots__ = ()
    _done = True
    _event = None
    _exc = None
    _callbacks = None


_new_object = object.__new__
