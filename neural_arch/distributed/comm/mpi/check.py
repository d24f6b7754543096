"""The MPI backend's always-on call check: every collective first compares what each rank called.

**Why.** MPI trusts the caller: two ranks whose ``all_reduce`` buffers differ in size (1000 vs 1200
float64), dtype or reduce op do not get an error -- both return, and one holds values read from
MPICH's scratch memory (``3.5e+151``) or an unreduced tail; only some sizes raise a truncation error,
and ranks in *different* collectives (all_reduce on one, broadcast on the other) are undefined
behaviour too. The gloo backend catches most of this from the check word every frame carries; MPI
has no frame of ours, so the MPI backend adds one exchange whose *size never depends on the call*.

**How.** Each group owns a persistent ``MPI_Allgather_init`` (one ``Start`` per op, no schedule built
per call) on a private duplicate communicator, over fixed-size slots: one per rank, ``HEADER_BYTES``
of header -- the op's check word (kind, dtype, reduce op, sequence number: ``comm.debug.wire_word``),
its byte count, root and whether the payload rides along -- then ``inline_bytes`` of payload. Every
collective starts with it, so it always matches on every rank whatever the ranks called, and every
rank then reads *every* rank's header: they all take the same decision, an error on every rank
(:class:`~neural_arch.distributed.errors.CollectiveMismatchError`, naming what each rank called) or
go on. Nothing of the data was sent yet when a mismatch is found, so no MPI operation is left pending.

A cache of "signatures already agreed" would be cheaper but is unsound: rank A's key can be cached
while rank B's is new, and then one rank checks while the other does not -- the check itself
becomes the mismatched call. A check every K ops would return up to K-1 wrong results first.

**What it costs.** Collectives of up to ``inline_bytes`` (2 KiB on up to 8 ranks: all_reduce,
broadcast, all_gather, reduce_scatter) ride *inside* the check -- the payload goes in the slot, and
every rank reduces the gathered slots in rank order (the same bits on every rank) -- so they are
still one MPI operation; the check's MPI part costs about what the persistent all_reduce it
replaced did, and the header, its comparison and the NumPy reduction add a little Python.
Larger collectives pay one small allgather of the slots before their data
operation, and a broadcast becomes synchronising: the root hears from every rank before it returns
(``benchmarks/bench_mpi_backend.py --probes``, the ``check`` column; against the code before the
check: docs/benchmarks.md).

Example (what ``MPIBackend`` does; run under ``mpiexec -n 2``)::

    check = CallCheck(MPI, comm, persistent=True)
    req = check.stamp(info, nbytes=x.nbytes, root=-1)     # header into this rank's slot, Start
    watchdog.wait([req], info)
    if not check.agreed():
        raise check.error(info)                           # the same decision on every rank
"""

from __future__ import annotations

import struct

import numpy as np

from neural_arch.distributed.comm.debug import describe_wire
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.errors import CollectiveMismatchError

__all__ = ["DATA_FOLLOWS", "DATA_INLINE", "DATA_PAIRWISE", "HEADER_BYTES", "INLINE_MAX_BYTES", "CallCheck", "inline_capacity"]

HEADER_BYTES = 32            # check word, byte count, root + 1, mode (uint64 each): the payload stays 8-aligned
_HEADER = struct.Struct("<QQQQ")
#: The header's mode word, how the data moves (in a separate MPI collective, in the slot, or in the
#: two-rank pairwise exchange of ``mpi.allreduce``). Ranks whose choices differ must not go on, so it
#: is compared.
DATA_FOLLOWS, DATA_INLINE, DATA_PAIRWISE = 0, 1, 2
_MODE_TEXT = {DATA_INLINE: " (data in the check)", DATA_PAIRWISE: " (pairwise exchange)"}
INLINE_MAX_BYTES = 2 << 10   # collectives up to this many bytes ride inside the check (groups of <= 8 ranks)
_GATHER_BUDGET = 16 << 10    # ... and the whole gathered buffer stays under this on larger groups
_VIEWS = 256                 # cached typed views of the slots before the cache starts over


def inline_capacity(size: int) -> int:
    """Payload bytes per slot for a group of ``size`` ranks: 2 KiB up to 8 ranks, then less, so the
    gathered buffer stays near 16 KiB (the check must stay cheap for every collective). Depends on
    the group size only: every rank computes the same value.

    >>> inline_capacity(2), inline_capacity(8), inline_capacity(64)
    (2048, 2048, 256)
    """
    return max(0, min(INLINE_MAX_BYTES, (_GATHER_BUDGET // max(1, int(size))) // 64 * 64))


class CallCheck:
    """One group's call check (see the module docstring): a private communicator, the gathered
    slots and, where the MPI library has them (MPI 4), a persistent allgather request over them.

    Collective to build (``Comm.Dup``, ``Allgather_init``): built where every member builds the
    backend. Not thread-safe: a group runs one collective at a time.

    Example::

        check = CallCheck(MPI, comm)                       # every member of ``comm``, once
        check.stamp(info, nbytes=array.nbytes)             # this rank's header for the op
        # ... the backend then starts the allgather and compares every rank's header
    """

    def __init__(self, MPI, comm, persistent: bool = True):
        self.MPI = MPI
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.inline_bytes = inline_capacity(self.size)
        self.slot_bytes = HEADER_BYTES + self.inline_bytes
        self.gathered = np.zeros((self.size, self.slot_bytes), np.uint8)
        self._flat = memoryview(self.gathered).cast("B")
        start = self.rank * self.slot_bytes
        self._offset = start
        #: each rank's header bytes (live views of the gathered buffer), and this rank's
        self._headers = [self._flat[r * self.slot_bytes:r * self.slot_bytes + HEADER_BYTES] for r in range(self.size)]
        self._mine = self._headers[self.rank]
        self._others = [h for r, h in enumerate(self._headers) if r != self.rank]
        self._views: dict = {}
        self.request = None
        if persistent and hasattr(self.comm, "Allgather_init"):
            try:
                self.request = self.comm.Allgather_init(MPI.IN_PLACE, self.gathered)
            except (NotImplementedError, MPI.Exception):   # an MPI library before MPI 4
                self.request = None

    def stamp(self, info: OpInfo, nbytes: int, root: int = -1, mode: int = DATA_FOLLOWS):
        """Write ``info``'s header into this rank's slot and start the exchange; returns the request
        to wait for (the persistent one, or a fresh ``Iallgather`` on libraries without it).
        ``mode``: whether the payload is in the slot (``DATA_INLINE``, written before) or follows --
        part of the header, so ranks that would take different paths never agree."""
        _HEADER.pack_into(self._flat, self._offset, info.wire, nbytes, root + 1, mode)
        req = self.request
        if req is None:
            return self.comm.Iallgather(self.MPI.IN_PLACE, self.gathered)
        req.Start()
        return req

    def stamper(self, payload_format: str):
        """``stamp(info, nbytes, mode, *values)``: :meth:`stamp` (root -1) with ``values`` packed as
        ``payload_format`` (``struct`` codes, little-endian, at most ``inline_bytes``) into this rank's
        slot right after the header, header and payload in one ``pack_into``; returns the request to
        wait for. For hot paths whose payload is a few numbers (all_to_allv's split sizes).

        Example::

            stamp = check.stamper("4q")                          # two ranks' send and receive counts
            req = stamp(info, row_bytes, DATA_INLINE, 1, 2, 1, 3)
        """
        pack = struct.Struct("<" + _HEADER.format.lstrip("<") + payload_format).pack_into
        flat, offset = self._flat, self._offset
        MPI, comm, gathered = self.MPI, self.comm, self.gathered

        def stamp(info: OpInfo, nbytes: int, mode: int, *values):
            pack(flat, offset, info.wire, nbytes, 0, mode, *values)
            req = self.request
            if req is None:
                return comm.Iallgather(MPI.IN_PLACE, gathered)
            req.Start()
            return req
        return stamp

    def agreed(self) -> bool:
        """Whether every rank's header equals this rank's (read after the exchange completed)."""
        mine = self._mine
        for header in self._others:
            if header != mine:
                return False
        return True

    def payload(self, nbytes: int, dtype) -> tuple:
        """(this rank's payload view, every rank's payload as rows, row 0, row 1) for ``nbytes`` of
        ``dtype`` (``nbytes <= inline_bytes``): typed views of the slots, cached per (bytes, dtype)."""
        key = (nbytes, dtype)
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= _VIEWS:
                self._views.clear()
            rows = self.gathered[:, HEADER_BYTES:HEADER_BYTES + nbytes].view(dtype)
            views = self._views[key] = (rows[self.rank], rows, rows[0], rows[min(1, self.size - 1)])
        return views

    def calls(self, group_ranks) -> list[str]:
        """What each rank called, as read from the gathered headers: ``['rank 0: all_reduce #5 float64
        op sum (8000 bytes)', ...]``."""
        lines = []
        for r in range(self.size):
            word, nbytes, root1, mode = _HEADER.unpack_from(self._flat, r * self.slot_bytes)
            text = describe_wire(word, nbytes)
            if text.startswith("new_group"):
                text = f"new_group of {nbytes} ranks (list code {root1 - 1})"
            elif root1:
                text += f" root {root1 - 1}"
            text += _MODE_TEXT.get(mode, "")
            lines.append(f"rank {group_ranks[r]}: {text}")
        return lines

    def error(self, info: OpInfo) -> CollectiveMismatchError:
        """The error every rank raises when the headers differ (each rank reads the same headers)."""
        group = list(info.group_ranks)
        return CollectiveMismatchError(
            f"{info.describe()} on group {group}: the ranks called different collectives or passed different "
            f"arguments at this point ({'; '.join(self.calls(group))}). Nothing was exchanged: MPI does not check "
            "this itself and would have returned wrong values. Every rank must call the same collectives in the "
            "same order with the same shape, dtype, reduce op and root. This group is unusable now; the error is "
            "raised on every rank of it.")

    def free(self) -> None:
        """Release the persistent request and the communicator (best effort; not after a timeout,
        when the request may still be active)."""
        try:
            if self.request is not None:
                self.request.Free()
                self.request = None
            self.comm.Free()
        except self.MPI.Exception:   # pragma: no cover - best effort at teardown
            pass
