"""Collective spans: what every backend operation reports to :mod:`neural_arch.profiler.events`.

Every operation passes exactly once through ``Backend._execute`` (on a lane's thread) or the
synchronous path of ``Backend._run`` (on the caller's thread); both call :func:`begin` before the
primitive and :func:`end` after it -- only when someone subscribed: the backend tests the
observer lists inline (what :func:`observed` does), so with no subscriber a
collective pays one truthiness test per list and builds nothing.

A span: name = the op (``"all_reduce"``), category ``"collective"``, lane = ``"default"`` for a
group's collective lane (also for synchronous calls run on the caller's thread: they are ordered
on that lane), else the point-to-point lane's name. ``args``: ``op``, ``seq``, ``group`` (global
ranks), ``size``, ``rank``, ``bytes`` (this rank's buffer), ``dtype``, ``shape``, ``backend``,
``root`` / ``reduce_op`` when set, ``transport`` when the backend has one; at the end
``algorithm``/``transport`` if the backend stored them in ``info.extra``, or ``error`` when the
op failed.

**Operations in flight** are visible without any span: every backend registers itself in
:data:`RUNNERS` and keeps the op it is running in a slot (``_op_now`` for its collectives, which run
one at a time; ``_p2p_now`` for point-to-point ops, one per lane). Writing a slot costs two attribute
stores per op, always on; :func:`in_flight` reads them only when someone asks -- the stall
inspector, every few moments -- so watching for stalls costs a collective nothing per call.

Example::

    >>> from neural_arch.distributed.comm.local import LocalBackend
    >>> from neural_arch.profiler import events
    >>> import numpy as np
    >>> seen = []
    >>> events.subscribe(seen.append)
    >>> _ = LocalBackend().allreduce(np.ones(4, np.float32))
    >>> events.unsubscribe(seen.append)
    >>> seen[-1].name, seen[-1].category, seen[-1].lane, seen[-1].args["bytes"]
    ('all_reduce', 'collective', 'default', 16)
"""

from __future__ import annotations

import weakref

import numpy as np

from neural_arch.distributed.comm.work import OpInfo
from neural_arch.profiler import events

__all__ = ["RUNNERS", "begin", "end", "fail", "in_flight", "lane_label", "observed", "register"]

#: every live backend of this process (an ``OpRunner`` registers itself at construction)
RUNNERS: weakref.WeakSet = weakref.WeakSet()

_ITEMSIZE: dict = {"bfloat16": 2}


def observed() -> bool:
    """Whether anyone listens (the backend inlines this test on its hot path).

    Example::

        >>> from neural_arch.profiler import events
        >>> seen = []
        >>> events.subscribe(seen.append)
        >>> observed()
        True
        >>> events.unsubscribe(seen.append)
    """
    return bool(events.OBSERVERS or events.BEGIN_OBSERVERS or events.END_OBSERVERS)


def register(runner) -> None:
    """Make ``runner``'s op slots visible to :func:`in_flight` (``OpRunner.__init__`` calls it).

    Example::

        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> backend = LocalBackend()        # registered by its constructor; again is harmless
        >>> register(backend)
        >>> backend in RUNNERS
        True
    """
    RUNNERS.add(runner)


def in_flight() -> list:
    """``[(backend, OpInfo), ...]``: every operation running on this process right now.

    Read from another thread (the stall inspector's) while the producers run: each slot is read
    once, so a pair is a consistent snapshot of an op that was running at that moment (it may have
    finished since). ``OpInfo.deadline - backend.timeout`` is when it started (``time.monotonic``).

    >>> from neural_arch.distributed.comm.local import LocalBackend
    >>> from neural_arch.distributed.comm.work import OpInfo
    >>> b = LocalBackend()
    >>> b._op_now = OpInfo("all_reduce", 7)        # what a backend does while an op runs
    >>> [(i.name, i.seq) for r, i in in_flight() if r is b]
    [('all_reduce', 7)]
    >>> b._op_now = None
    """
    for _ in range(3):           # a backend created meanwhile changes the set under iteration: retry
        try:
            runners = list(RUNNERS)
            break
        except RuntimeError:
            continue
    else:
        return []
    out = []
    for runner in runners:
        info = runner.__dict__.get("_op_now")
        if info is not None:
            out.append((runner, info))
        p2p = runner.__dict__.get("_p2p_now")
        if p2p:
            out.extend((runner, i) for i in list(p2p.values()))
    return out


def lane_label(thread_name: str) -> str:
    """``"default"`` for a group's collective lane, else the p2p lane's own thread name.

    Example::

        >>> lane_label("gloo-rank0-progress"), lane_label("p2p-send-1")
        ('default', 'p2p-send-1')
    """
    return "default" if thread_name.endswith("-progress") else thread_name


def _nbytes(shape, dtype: str) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize
    n = 1
    for d in shape:
        n *= d
    return n * size


def _transport(backend) -> str | None:
    """``backend.transport`` (MPI: "mpi"), else the kinds of its links (gloo: "shm", "tcp", "shm+tcp")."""
    transport = getattr(backend, "transport", None)
    if isinstance(transport, str):
        return transport
    kinds = getattr(backend, "transport_kinds", None)
    if callable(kinds):
        try:
            return "+".join(sorted(set(kinds().values()))) or None
        except Exception:  # noqa: BLE001 - a span detail must never fail the collective
            return None
    return None


def begin(backend, info: OpInfo, lane: str):
    """Start the span of ``info`` on ``backend`` (a ``Pending``, or None when nobody listens).

    The span's details are built only when read (a recorder exporting it, metrics summing bytes,
    the stall inspector reporting a long wait), not on the thread running the op: a collective
    pays for the ``Pending`` record, a closure and the observer calls. What never changes for the
    group is taken now, once per backend, so that reading the details after the group was
    destroyed still names its transport.

    Example::

        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> from neural_arch.profiler import events
        >>> seen = []
        >>> events.subscribe(seen.append)
        >>> info = OpInfo("all_reduce", 1, shape=(4,), dtype="float32")
        >>> span = begin(LocalBackend(), info, "default")
        >>> end(span, info)
        >>> events.unsubscribe(seen.append)
        >>> seen[-1].name, seen[-1].args["bytes"]
        ('all_reduce', 16)
    """
    static = backend.__dict__.get("_span_static") or _static(backend)
    # positional arguments: a keyword call costs a dict on every collective
    return events.begin(info.name, "collective", lane, None, lambda: _args(static, info))


def _static(backend) -> dict:
    """What never changes for a group (its ranks, size, backend and transport), cached on the backend."""
    static = {"group": list(backend.group_ranks), "size": backend.size, "backend": backend.name}
    transport = _transport(backend)
    if transport:
        static["transport"] = transport
    backend._span_static = static
    return static


def _args(static: dict, info: OpInfo) -> dict:
    shape, dtype = info.shape, info.dtype
    args = {"op": info.name, "seq": info.seq, "rank": info.rank,
            "bytes": _nbytes(shape, dtype) if shape is not None and dtype is not None else 0,
            "dtype": dtype, "shape": shape, **static}
    if info.root is not None:
        args["root"] = info.root
    if info.reduce_op is not None:
        args["reduce_op"] = info.reduce_op
    return args


def end(span, info: OpInfo) -> None:
    """End the span; adds ``algorithm``/``transport`` a backend stored in ``info.extra``, and ``blocking``
    (True) when the caller's thread waited through the op (a synchronous call).

    Example::

        span = begin(backend, info, "default")
        ...                                  # run the primitive
        end(span, info)
    """
    extra = info._extra
    more = {k: extra[k] for k in ("algorithm", "transport", "blocking") if k in extra} if extra else None
    if more:
        events.end(span, **more)
    else:
        events.end(span)


def fail(span, exc: BaseException) -> None:
    """End the span of an op that raised, naming the error.

    Example::

        span = begin(backend, info, "default")
        try:
            backend._allreduce(array, op, info)
        except Exception as exc:
            fail(span, exc)
            raise
    """
    events.end(span, error=f"{type(exc).__name__}: {exc}"[:300])
