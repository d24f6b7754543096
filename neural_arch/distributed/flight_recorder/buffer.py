"""The ring buffer: this process's last N collective and point-to-point records, always on.

Every operation of every backend passes through ``OpRunner._run`` (or the fused all_reduce path of
``Backend.allreduce``); each appends one record to :data:`RECORDER`'s ring when the recorder is on
(``NEURAL_ARCH_FLIGHT_RECORDER_SIZE`` records, default 2000; 0 turns it off) and moves the record's
state along as the op runs. A record is a plain list (the fields below, by index) and the
:class:`Ring` holds N of them, made once and **overwritten in place**: an op claims the next slot
(one C-level counter step) and fills it with one slice assignment; a state change is one item store.
Why not a new list per op in a ``deque(maxlen=N)``: every record would then be a container that
outlives the young generation, and the garbage collector's full passes -- which walk every live
object of a training process, model and autograd graph included -- came that much more often: on a
process holding many objects the 1 KiB all_reduce took twice as long, all of it in the collector
(``benchmarks/bench_flight_recorder.py`` measures what is left).

Fields: the group (its *global* ranks, as a :class:`GroupIdentity`: a list that also carries the group's
id, made once per backend, so the record stays one slot and one assignment), sequence number (per group; point-to-point ops have their
own counter), op, shape, dtype, reduce op, root or peer (group rank), state (``queued`` /
``started`` / ``completed`` / ``failed``), start and end times (``time.monotonic``; a dump turns
them into wall-clock seconds), the caller's file and line (the first frame outside ``neural_arch``)
and, for a failed op, its error. The caller is kept as its code object and instruction offset, and
becomes ``file`` and ``line`` when the record is read (:func:`as_dict`).

Example::

    >>> from neural_arch.distributed.flight_recorder.buffer import FlightRecorder, as_dict
    >>> rec = FlightRecorder(size=2)
    >>> for seq in (1, 2, 3):
    ...     _ = rec.ring.append(rec.record([0, 1], seq, "all_reduce", (4,), "float32", "sum", None))
    >>> [as_dict(r)["seq"] for r in rec.ring.records()]           # the oldest is forgotten
    [2, 3]
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import weakref

from neural_arch import config

__all__ = ["COMPLETED", "FAILED", "QUEUED", "RECORDER", "STARTED", "FlightRecorder", "GroupIdentity", "Ring", "as_dict",
           "caller", "line_of", "mark_failed"]

SIZE_ENV = "NEURAL_ARCH_FLIGHT_RECORDER_SIZE"
CALLER_ENV = "NEURAL_ARCH_FLIGHT_RECORDER_CALLER"

QUEUED, STARTED, COMPLETED, FAILED = "queued", "started", "completed", "failed"

# A record's fields, by index (a list, not an object: see the module docstring)
GROUP, SEQ, OP, SHAPE, DTYPE, REDUCE_OP, ROOT, STATE, T_START, T_END, CODE, OFFSET, ERROR, P2P, INDEX = range(15)

_getframe = sys._getframe
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
# code object -> whether it is neural_arch's own (a walk asks each frame once per code object)
_OWN_CODE: dict = {}


def caller(depth: int = 2) -> tuple:
    """``(code, offset)`` of the first frame outside ``neural_arch`` above the op's entry point: the
    user's line that issued the collective (for a DDP gradient all-reduce, the ``backward()`` call);
    :func:`as_dict` turns it into file and line.

    The line is resolved only when a record is read: ``frame.f_lineno`` scans the function's line
    table up to the current instruction, which in a long training function costs more than the
    collective, while the instruction offset (``f_lasti``) is one read. Each frame looked at also
    becomes a frame object (CPython builds them lazily), so the caller is recorded only with
    ``NEURAL_ARCH_FLIGHT_RECORDER_CALLER=1`` (``benchmarks/bench_flight_recorder.py`` measures both).

    Example::

        >>> def user_code():
        ...     return caller(depth=1)
        >>> code, offset = user_code()
        >>> code.co_name, line_of(code, offset) > 0
        ('user_code', True)
    """
    f = _getframe(depth)
    own = _OWN_CODE
    while f is not None:
        code = f.f_code
        inside = own.get(code)
        if inside is None:
            inside = own[code] = code.co_filename.startswith(_PACKAGE_DIR)
        if not inside:
            return code, f.f_lasti
        f = f.f_back
    return None, 0


def line_of(code, offset: int) -> int:
    """The source line of instruction ``offset`` (bytes) in ``code`` (0 if unknown).

    Example::

        >>> def f():
        ...     return 1
        >>> line_of(f.__code__, 0) >= f.__code__.co_firstlineno
        True
    """
    line = 0
    for start, end, ln in code.co_lines():
        if start <= offset < end:
            return ln or line
        if ln:
            line = ln
    return line


class GroupIdentity(list):
    """A group's members (global ranks) that also carry its id: what a record's group field holds.

    ``group_id`` is the same on every member of the group and differs between two groups with the
    same members (torch's ``pg_name``): ``"pg<generation>/WORLD"``, ``"pg<generation>/group<n>"`` for
    ``new_group`` and its kin (numbered in creation order on every rank of the world), a sub-communicator
    made by ``Backend.new_group`` its parent's id plus ``.<n>``, a fault-tolerant replica group its
    quorum's store prefix (``"ft/pg/<quorum id>"``). None: a backend nothing named (the analyzer
    then tells groups apart by their members only, as for dumps written before ids existed).

    Each backend makes one, once (``OpRunner._fr_group``), and every record of the backend's ops
    points at it: the id costs the hot path nothing, and a dump reads it from the record's group.

    Example::

        >>> g = GroupIdentity([0, 1], "pg1/group2")
        >>> g == [0, 1], g.group_id
        (True, 'pg1/group2')
        >>> as_dict(FlightRecorder.record(g, 1, "barrier", None, None, None, None))["group_id"]
        'pg1/group2'
    """

    __slots__ = ("group_id",)

    def __init__(self, ranks=(), group_id: str | None = None):
        super().__init__(ranks)
        self.group_id = group_id


def _no_caller(depth: int = 2) -> tuple:
    return None, 0


class Ring:
    """N record slots, overwritten in place, oldest first by their op index (see the module docstring).

    A backend claims a slot with ``rec = ring.slots[ring.next_index() % ring.size]`` and fills it
    with ``rec[:] = (..., index)``: no allocation that outlives the call. ``next_index`` is an
    ``itertools.count``'s ``__next__``, atomic under the GIL, so threads never share a slot.

    Example::

        >>> ring = Ring(2)
        >>> for seq in (1, 2, 3):
        ...     _ = ring.append(FlightRecorder.record([0], seq, "barrier", None, None, None, None))
        >>> [r[SEQ] for r in ring.records()]
        [2, 3]
    """

    __slots__ = ("next_index", "size", "slots")

    def __init__(self, size: int):
        self.size = size
        self.slots = [[None] * INDEX + [-1] for _ in range(size)]
        self.next_index = itertools.count().__next__

    def append(self, record: list) -> list:
        """Copy ``record`` (the fields without the index) into the next slot; returns the slot."""
        index = self.next_index()
        slot = self.slots[index % self.size]
        slot[:] = (*record[:INDEX], index)
        return slot

    def records(self) -> list:
        """Copies of the used slots, oldest first."""
        used = [list(s) for s in self.slots]
        return sorted((r for r in used if r[INDEX] >= 0), key=lambda r: r[INDEX])


class FlightRecorder:
    """This process's ring of op records, plus who it is (filled in as backends register).

    ``ring`` is None when the recorder is off (size 0): the backends test that one attribute.

    Example::

        >>> rec = FlightRecorder(size=0)
        >>> rec.ring is None
        True
    """

    def __init__(self, size: int | None = None, with_caller: bool | None = None):
        if size is None:
            size = int(config.get(SIZE_ENV))
        if with_caller is None:
            with_caller = bool(config.get(CALLER_ENV))
        self.size = max(0, int(size))
        self.ring: Ring | None = Ring(self.size) if self.size else None
        #: the function the backends call for a record's file and line (:func:`caller`, or a stub
        #: unless ``NEURAL_ARCH_FLIGHT_RECORDER_CALLER=1``)
        self.caller = caller if with_caller else _no_caller
        #: this process's global rank and the largest group it belongs to (set by ``attach``)
        self.rank: int | None = None
        self.world_size: int = 0
        self.backend: str | None = None
        #: The rendezvous store to dump to (``None`` means the largest group's own store, if it has
        #: one -- gloo's; MPI jobs have none -- looked up when a dump needs it).
        self.store = None
        #: wall-clock time of this recorder's last dump (a peer's dump request answered only if older)
        self.last_dump = float("-inf")
        self._largest = None

    @staticmethod
    def record(group, seq, op, shape, dtype, reduce_op, root, state=STARTED, t_start=0.0,
               code=None, offset=0, p2p=False) -> list:
        """A new record (what the backends build inline; this spelling is for tests and tools).

        >>> FlightRecorder.record([0, 1], 7, "broadcast", (2,), "float64", None, 0)[:3]
        [[0, 1], 7, 'broadcast']
        """
        return [group, seq, op, shape, dtype, reduce_op, root, state, t_start, 0.0, code, offset, None, p2p, -1]

    def attach(self, runner) -> None:
        """Learn this process's identity from a backend (``OpRunner.__init__`` calls it): its global
        rank, the size of its largest live group, that group's store when it has one.

        Example::

            >>> from neural_arch.distributed.comm.local import LocalBackend
            >>> rec = FlightRecorder(size=4)
            >>> rec.attach(LocalBackend())
            >>> rec.rank, rec.world_size, rec.backend
            (0, 1, 'local')
        """
        ranks = runner.group_ranks
        prev = self._largest() if self._largest is not None else None
        # a group destroyed since (an elastic re-form, a new init) no longer says who this rank is
        if prev is None or getattr(prev, "_closed", False) or len(ranks) >= self.world_size:
            self.world_size = len(ranks)
            self.rank = ranks[runner.rank]
            self.backend = runner.name
            # weakly (a destroyed group must not live on here); its store is set after this call
            self._largest = weakref.ref(runner)

    def rendezvous_store(self):
        """:attr:`store`, else the store of the largest group attached (None when it has none).

        Example::

            >>> FlightRecorder(size=1).rendezvous_store() is None
            True
        """
        if self.store is not None:
            return self.store
        runner = self._largest() if self._largest is not None else None
        return getattr(runner, "_store", None) if runner is not None else None

    def snapshot(self) -> list:
        """Every record as a dict, oldest first, times in wall-clock seconds (``time.time``).

        Example::

            >>> rec = FlightRecorder(size=4)
            >>> _ = rec.ring.append(rec.record([0, 1], 1, "barrier", None, None, None, None))
            >>> rec.snapshot()[0]["op"]
            'barrier'
        """
        if self.ring is None:
            return []
        records = self.ring.records()
        shift = time.time() - time.monotonic()
        out = []
        for r in records:
            d = as_dict(r)
            d["t_start"] = d["t_start"] + shift if d["t_start"] else None
            d["t_end"] = d["t_end"] + shift if d["t_end"] else None
            out.append(d)
        return out


def mark_failed(record: list, exc: BaseException) -> None:
    """Mark a record failed: state, end time, and the error in one line (what the backends do when
    an op raises).

    Example::

        >>> rec = FlightRecorder.record([0, 1], 4, "all_reduce", (2,), "float32", "sum", None)
        >>> mark_failed(rec, TimeoutError("late"))
        >>> as_dict(rec)["state"], as_dict(rec)["error"]
        ('failed', 'TimeoutError: late')
    """
    record[STATE] = FAILED
    record[T_END] = time.monotonic()
    record[ERROR] = f"{type(exc).__name__}: {exc}"[:500]


def as_dict(record: list) -> dict:
    """One record as a JSON-ready dict (lists for the group and shape; the group's id, None when the
    group has none; the caller as file and line).

    Example::

        >>> as_dict(FlightRecorder.record((0, 1), 3, "all_reduce", (2, 2), "float32", "sum", None))["shape"]
        [2, 2]
    """
    code = record[CODE]
    group = record[GROUP]
    d = {"group": list(group), "group_id": getattr(group, "group_id", None), "seq": record[SEQ], "op": record[OP],
         "shape": list(record[SHAPE]) if record[SHAPE] is not None else None, "dtype": record[DTYPE],
         "reduce_op": record[REDUCE_OP], "root": record[ROOT], "state": record[STATE],
         "t_start": record[T_START], "t_end": record[T_END],
         "file": code.co_filename if code is not None else None,
         "line": line_of(code, record[OFFSET]) if code is not None else 0,
         "error": str(record[ERROR])[:500] if record[ERROR] is not None else None, "p2p": record[P2P]}
    return d


#: this process's recorder (sized once, from ``NEURAL_ARCH_FLIGHT_RECORDER_SIZE``, at import)
RECORDER = FlightRecorder()
