"""The seam between DDP's reducer and the network: ``GradBucket`` and communication hooks.

The gradient's path (see docs/architecture.md)::

    backward -> post-accumulate hook -> bucket slot -> (bucket full) comm hook -> backend -> Work
             -> end of backward: Work.result() -> write back into .grad

A **comm hook** is ``hook(state, bucket) -> Work`` with torch's contract
(``DistributedDataParallel.register_comm_hook``): it receives a :class:`GradBucket` holding this
rank's *local* (summed, not yet averaged) gradients in one flat array, starts whatever
communication it likes, and returns a :class:`~neural_arch.distributed.comm.work.Work` whose
``result()`` is the flat array of **averaged** gradients (the bucket's own buffer, reduced in
place, or a new array of the same shape and dtype). Every rank must issue the same collectives
in the same order: the reducer calls the hook for bucket 0, 1, 2, ... in that order on every rank.

:func:`~neural_arch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook` (the default) is the one place where DDP's averaging is defined.

What the reducer may do for a hook is declared by :class:`CommHook` (``accepts_prescaled``,
``supports_inline``); a plain function is accepted as well and declares nothing.

Example (a hook that averages in float16 on the wire, as torch's ``fp16_compress_hook``)::

    def fp16_hook(process_group, bucket):
        group = process_group or dist.get_default_group()
        half = bucket.buffer().astype(np.float16) / group.size()
        work = group.backend.allreduce(half, ReduceOp.SUM, async_op=True)
        return then(work, lambda w: w.result().astype(bucket.buffer().dtype))

    ddp.register_comm_hook(None, fp16_hook)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from neural_arch.distributed.comm.work import Work
from neural_arch.distributed.groups import backend_or_world_of_one
from neural_arch.distributed.process_group import GroupMember, ProcessGroup
from neural_arch.distributed.resolve import _resolve_group

__all__ = ["CommHook", "GradBucket", "check_process_group", "comm_hook", "deferred", "hook_backend", "then"]


class GradBucket:
    """One bucket of gradients as a comm hook sees it (torch's ``dist.GradBucket``).

    The flat ``buffer()`` holds the bucket's gradients back to back, in the order of
    ``parameters()``; ``gradients()`` are views of it shaped like each parameter.

    Example::

        >>> import numpy as np
        >>> b = GradBucket(0, np.arange(5.0), [(0, 2, (2,)), (2, 5, (3,))], params=["w", "b"], last=True)
        >>> b.index(), b.is_last(), [g.tolist() for g in b.gradients()]
        (0, True, [[0.0, 1.0], [2.0, 3.0, 4.0]])
    """

    __slots__ = ("_buffer", "_index", "_last", "_params", "_slots", "prescaled")

    def __init__(self, index: int, buffer, slots: list[tuple[int, int, tuple]], params: list, last: bool):
        self._index = index
        self._buffer = buffer
        self._slots = slots      # (start, stop, shape) of each parameter's gradient in the buffer
        self._params = params
        self._last = last
        #: True when the reducer already multiplied the gradients by 1/world while copying
        #: them in (it does so for a :class:`CommHook` that declares ``accepts_prescaled``)
        self.prescaled = False

    def index(self) -> int:
        """The bucket's position in launch order (0 is reduced first)."""
        return self._index

    def buffer(self):
        """The flat array of this rank's gradients (NumPy or CuPy)."""
        return self._buffer

    def set_buffer(self, buffer) -> None:
        """Replace the flat buffer (same size and dtype): torch's ``GradBucket.set_buffer``."""
        if buffer.shape != self._buffer.shape or buffer.dtype != self._buffer.dtype:
            raise ValueError(f"set_buffer: expected shape {self._buffer.shape} and dtype {self._buffer.dtype}, "
                             f"got {buffer.shape} {buffer.dtype}")
        self._buffer[...] = buffer

    def gradients(self) -> list:
        """Per-parameter views into ``buffer()``, shaped like the parameters."""
        return [self._buffer[a:b].reshape(shape) for a, b, shape in self._slots]

    def parameters(self) -> list:
        """The parameters whose gradients this bucket holds (in buffer order)."""
        return list(self._params)

    def is_last(self) -> bool:
        """Whether this is the last bucket of the iteration (torch: the one reduced last)."""
        return self._last

    def __repr__(self) -> str:
        return (f"GradBucket(index={self._index}, numel={self._buffer.size}, dtype={self._buffer.dtype}, "
                f"params={len(self._params)}, last={self._last})")


class CommHook:
    """A comm hook and what it declares it can take: the reducer reads these attributes, once,
    when the hook is registered.

    * ``accepts_prescaled``: the reducer may hand the hook buckets already multiplied by 1/world
      (it folds the division into its copy of the gradients; the bucket then says ``prescaled``);
    * ``supports_inline``: the hook takes ``async_op=False`` and then runs its collective on the
      calling thread (the reducer does so for buckets left at the end of backward).

    A plain function registered with ``register_comm_hook`` is wrapped with both False (see
    :meth:`of`); calling a ``CommHook`` calls the function, passing ``async_op`` on only when it
    is declared. Make one with :func:`comm_hook`.

    Example::

        >>> hook = CommHook(lambda state, bucket: None)
        >>> hook.accepts_prescaled, hook.supports_inline
        (False, False)
        >>> from neural_arch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        >>> CommHook.of(allreduce_hook) is allreduce_hook, allreduce_hook.accepts_prescaled
        (True, True)
    """

    def __init__(self, fn: Callable[..., Work], *, accepts_prescaled: bool = False, supports_inline: bool = False):
        if not callable(fn):
            raise TypeError(f"CommHook: expected a callable hook(state, bucket) -> Work, got {fn!r}")
        self.fn = fn
        self.accepts_prescaled = bool(accepts_prescaled)
        self.supports_inline = bool(supports_inline)
        functools.update_wrapper(self, fn, updated=())  # the function's name and docstring

    @classmethod
    def of(cls, hook) -> CommHook:
        """``hook`` itself if it is a CommHook, else ``hook`` wrapped with nothing declared."""
        return hook if isinstance(hook, CommHook) else cls(hook)

    def __call__(self, state, bucket: GradBucket, async_op: bool = True) -> Work:
        if self.supports_inline:
            return self.fn(state, bucket, async_op=async_op)
        return self.fn(state, bucket)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return (f"CommHook({name}, accepts_prescaled={self.accepts_prescaled}, "
                f"supports_inline={self.supports_inline})")


def comm_hook(*, accepts_prescaled: bool = False, supports_inline: bool = False):
    """Decorator: make a function a :class:`CommHook` with the capabilities it declares.

    Example::

        @comm_hook(supports_inline=True)
        def my_hook(state, bucket, async_op=True):
            return hook_backend(state).allreduce(bucket.buffer(), ReduceOp.AVG, async_op=async_op)
    """
    def wrap(fn: Callable[..., Work]) -> CommHook:
        return CommHook(fn, accepts_prescaled=accepts_prescaled, supports_inline=supports_inline)
    return wrap


def then(work: Work, fn: Callable[[Work], Any]) -> Work:
    """A Work that completes with ``fn(work)`` once ``work`` is done (torch's ``Future.then``).

    ``fn`` runs on the thread that completes ``work``; an exception it raises fails the
    returned Work (and is raised by its ``wait()``), never the progress thread.

    Example:
        >>> from neural_arch.distributed.comm.work import Work
        >>> doubled = then(Work.completed(21), lambda done: done.result() * 2)
        >>> doubled.wait(), doubled.result()
        (True, 42)
    """
    chained = Work(work.info)

    def finish(done: Work) -> None:
        try:
            if done.exception() is not None:
                chained._set_exception(done.exception())
            else:
                chained._set_result(fn(done))
        except BaseException as exc:  # noqa: BLE001 - stored, raised by chained.wait()
            chained._set_exception(exc)

    work.add_done_callback(finish)
    return chained


class _DeferredWork(Work):
    """A Work whose last phase runs on the thread that first waits for it (see :func:`deferred`)."""

    __slots__ = ("_first", "_rest")

    def __init__(self, first: Work, rest: Callable[[Work], Any]):
        super().__init__(first.info)
        self._first, self._rest = first, rest

    def wait(self, timeout: float | None = None) -> bool:
        rest, self._rest = self._rest, None
        if rest is not None:  # the first waiter finishes the work, on its own thread
            try:
                self._first.wait(timeout)
                self._set_result(rest(self._first))
            except BaseException as exc:  # noqa: BLE001 - stored, raised below like any Work's failure
                self._set_exception(exc)
        return super().wait(timeout)


def deferred(work: Work, rest: Callable[[Work], Any]) -> Work:
    """A Work that, when first waited for, waits for ``work`` and completes with ``rest(work)``
    **on the waiting thread**.

    For hooks with several dependent communication phases (PowerSGD: all-reduce P, then Q from
    it): the first phase runs asynchronously while backward goes on, and the later phases'
    collectives are issued by DDP's end of backward, which waits for buckets in bucket order on
    every rank, so every rank issues the same collectives in the same order. (Issuing them from
    a completion callback instead would race with the next bucket's launch.)

        >>> w = deferred(Work.completed(2), lambda done: done.result() * 10)
        >>> w.result()
        20
    """
    return _DeferredWork(work, rest)


def hook_backend(process_group):
    """The backend a hook's ``process_group`` state means: a ProcessGroup, a backend, or None
    for the default group (torch's convention for the built-in hooks).

    Example::

        def my_hook(process_group, bucket):
            return hook_backend(process_group).allreduce(bucket.buffer(), op=ReduceOp.AVG, async_op=True)
    """
    if process_group is None:
        # the default group; a plain ``python`` run (DDP works without init_process_group) is a world of one
        return backend_or_world_of_one(None, "comm hook")
    check_process_group(process_group, "comm hook")
    if isinstance(process_group, ProcessGroup) or process_group is GroupMember.NON_GROUP_MEMBER:
        return _resolve_group(process_group, "comm hook").backend   # (destroyed, non-member: clear errors)
    return getattr(process_group, "backend", process_group)


def check_process_group(process_group, owner: str) -> None:
    """Refuse, at the call, a hook state's ``process_group`` that is none of: None (the default
    group), a ProcessGroup (or ``GroupMember.NON_GROUP_MEMBER``, refused when used), a backend.

    >>> check_process_group(None, "PowerSGDState")
    >>> check_process_group("gloo", "PowerSGDState")
    Traceback (most recent call last):
    ...
    TypeError: PowerSGDState: process_group='gloo' must be a ProcessGroup from new_group() (or None for the default group)
    """
    if process_group is None or isinstance(process_group, ProcessGroup) or process_group is GroupMember.NON_GROUP_MEMBER:
        return
    backend = getattr(process_group, "backend", process_group)
    if not (callable(getattr(backend, "allreduce", None)) and isinstance(getattr(backend, "size", None), int)):
        raise TypeError(f"{owner}: process_group={process_group!r} must be a ProcessGroup from new_group() "
                        "(or None for the default group)")
