"""The MPI backend's all_reduce strategies besides MPICH's ``Iallreduce``, as objects that
:class:`~neural_arch.distributed.comm.mpi.backend.MPIBackend` holds:

* :class:`InlineAllReduce`, **inside the call check**, for the smallest all_reduces (up to
  ``PERSISTENT_MAX_BYTES`` on groups of up to 8 ranks, :func:`~.check.inline_capacity`): the payload
  rides in the check's persistent allgather and every rank reduces the gathered slots in rank order;
* :class:`PairwiseAllReduce`, **the pairwise exchange**, for two-rank all_reduces of
  ``PAIRWISE_MIN_BYTES`` up to the agreed ``pairwise_max_bytes``: ``Irecv`` + ``Isend`` of the whole
  buffer on a private duplicate communicator, one ``Waitany``, one NumPy reduction in rank order.

``MPIBackend._allreduce`` decides which runs (the same decision on every rank: it depends only on the
group size, the byte count, the dtype, the op and settings agreed at init); the measurements behind
each threshold are with its constant below.

Example (what ``MPIBackend`` does; run under ``mpiexec -n 2``)::

    backend = MPIBackend.create(None, timeout=30)          # two ranks: the window is open
    x = np.ones(4096)                                      # 32 KiB: one exchange + np.add
    backend.allreduce(x)                                   # x == 2.0 on both ranks
    backend._pairwise.views                                # the scratch views it received into
"""

from __future__ import annotations

import numpy as np

from neural_arch import config
from neural_arch.distributed.comm.dtypes import REDUCE_UFUNCS, finish_average
from neural_arch.distributed.comm.mpi.check import DATA_INLINE, INLINE_MAX_BYTES, CallCheck
from neural_arch.distributed.comm.mpi.progress import DeadlinePassed
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.errors import DistributedError

_AVG = ReduceOp.AVG

# all_reduces of up to this many bytes ride inside the call check's persistent allgather (mpi_check: the
# check every collective starts with), on groups of up to 8 ranks (fewer bytes on larger groups:
# mpi_check.inline_capacity). Why persistent: building MPICH's nonblocking schedule was a third of a
# 1 KiB all_reduce. Measured before the check existed (raw mpi4py, 2 ranks, docs/benchmarks.md): a
# persistent Start + Waitany with two copies beat Iallreduce + Waitany in most rounds at 1 KiB, broke
# even at 4 KiB and lost at 16-64 KiB, so only the smallest messages take it. (The name says how:
# a persistent all_reduce per size did this before the call check carried it.)
PERSISTENT_MAX_BYTES = INLINE_MAX_BYTES

# Two-rank all_reduces of PAIRWISE_MIN_BYTES .. PAIRWISE_MAX_BYTES are one exchange of the whole buffer
# (Irecv + Isend on a private duplicate communicator, one Waitany) and one NumPy reduction, in rank
# order on both ranks (PairwiseAllReduce). MPICH's nonblocking all_reduce takes two steps there
# (reduce-scatter, then all-gather: its rule for every power-of-two count above 2 KiB). The exchange
# moves and reduces the whole buffer on each rank, twice Iallreduce's bytes, so it wins only while
# the per-step latency dominates. It loses at 8-12 KiB (a whole-buffer message crosses MPICH's eager
# limit before Iallreduce's halves do). An earlier quiet-machine measurement had it ahead by a tenth
# up to 256 KiB; the issue-30 re-measurement (benchmarks/bench_mpi_backend.py --windows, the backend
# with another window interleaved in one job, nine runs, docs/benchmarks.md) had it behind the backend's
# Iallreduce at 128-512 KiB in 25 of 27 size-runs and at 256 KiB in all nine (by a median of a fifth),
# a wash at 16 and 64 KiB (median ratio 0.99 and 1.12, either way from run to run), ahead by a few per
# cent at 32 KiB. So the default window ends at 32 KiB. NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES /
# create(pairwise_max_bytes=) move the end.
PAIRWISE_MIN_BYTES = 16 << 10
PAIRWISE_MAX_BYTES = config.get("NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES", {})   # the default (32 KiB)
# keyed by the op's value: hashing an Enum member is a measurable part of a small all_reduce
_UFUNC = {op._value_: ufunc for op, ufunc in REDUCE_UFUNCS.items()}
_PAIRWISE_VIEWS = 256       # cached scratch views (one per size and dtype) before the cache starts over


class InlineAllReduce:
    """All-reduces that ride inside the call check ``check`` of a group of ``size`` ranks; ``agree`` is
    the backend's call check with payload (``MPIBackend._agree``: raises on a mismatch).

    Call it with a flat NumPy array of at most ``check.inline_bytes``: the payload goes into this rank's
    slot, the check's allgather moves every slot, and every rank applies ``op`` to the gathered rows in
    rank order -- the same operation on the same operands, so every rank holds the same bits. One MPI
    operation in all, with no MPICH schedule built per call; a mismatch raises before any result is
    written.

    Example (what ``MPIBackend`` does once its call check exists)::

        inline = InlineAllReduce(backend._check, backend._agree, backend.size)
        inline(x.reshape(-1), ReduceOp.SUM, info, x.nbytes)      # x <= check.inline_bytes
    """

    __slots__ = ("agree", "check", "size")

    def __init__(self, check: CallCheck, agree, size: int):
        self.check = check
        self.agree = agree
        self.size = size

    def __call__(self, flat, op: ReduceOp, info: OpInfo, nbytes: int) -> None:
        """Reduce ``flat`` in place; ``nbytes`` is the caller's byte count, for the header."""
        mine, rows, row0, row1 = self.check.payload(flat.nbytes, flat.dtype)
        mine[...] = flat
        self.agree(info, nbytes, -1, DATA_INLINE)
        ufunc = _UFUNC[op._value_]
        if self.size == 2:
            ufunc(row0, row1, out=flat)
        else:
            ufunc.reduce(rows, axis=0, out=flat)
        if op is _AVG:
            finish_average(flat, self.size)


class PairwiseAllReduce:
    """A two-rank group's all_reduces of ``min_bytes`` .. ``max_bytes`` as one exchange of the whole
    buffer, on ``comm`` (a duplicate of the group's communicator, so its messages never meet the user's
    own point-to-point traffic on the group), waited for with the group's ``watchdog``.

    Build it with :meth:`open`, which returns None where the exchange does not apply. ``wait_failed``
    is the backend's ``_wait_failed(info, exc)`` (the error a watchdog wait ended with) and
    ``peer_rank`` the peer's global rank, for error messages.

    Example::

        pairwise = PairwiseAllReduce.open(MPI, comm, rank=0, size=2, watchdog=watchdog, blocking=False,
                                          max_bytes=512 << 10, wait_failed=backend._wait_failed, peer_rank=1)
        pairwise(np.ones(8192), ReduceOp.SUM, info)               # both ranks: 2.0
        pairwise.free()                                           # frees its communicator
    """

    def __init__(self, MPI, comm, rank: int, watchdog, max_bytes: int, wait_failed, peer_rank: int):
        self._MPI = MPI
        self.comm = comm
        self.status = MPI.Status()
        self.min_bytes, self.max_bytes = PAIRWISE_MIN_BYTES, int(max_bytes)
        self._rank = rank
        self._watchdog = watchdog
        self._wait_failed = wait_failed
        self._peer_rank = peer_rank
        self.buf: np.ndarray | None = None     # scratch for the peer's buffer
        self.views: dict = {}                  # (bytes, dtype.num) -> view of buf

    @classmethod
    def open(cls, MPI, group_comm, rank: int, size: int, watchdog, blocking: bool, max_bytes: int,
             wait_failed, peer_rank: int):
        """The exchange for a two-rank group with the watchdog and nonblocking collectives whose agreed
        window ``max_bytes`` reaches ``PAIRWISE_MIN_BYTES``; None otherwise. Collective (``Comm.Dup``):
        called where every member builds the backend, and decided only by the group size, the MPI
        library's thread level and options (the same on every rank, so every rank makes the same
        choice at every op)."""
        if size != 2 or watchdog is None or blocking or max_bytes < PAIRWISE_MIN_BYTES:
            return None
        return cls(MPI, group_comm.Dup(), rank, watchdog, max_bytes, wait_failed, peer_rank)

    def __call__(self, flat, op: ReduceOp, info: OpInfo) -> None:
        """A two-rank all_reduce of the flat NumPy array ``flat``, in place: each rank sends its whole
        buffer to the other and receives the peer's (both posted before either waits, so neither can
        block the other), then both apply ``op`` to (rank 0's, rank 1's) in that order -- the same
        operation on the same operands, so both ranks hold the same bits (also for MAX of +0.0 and
        -0.0, where the operand order decides). A peer whose buffer has another size is an error on
        both ranks: MPI's truncation error on the smaller side, the byte count check on the larger."""
        key = (flat.nbytes, flat.dtype.num)
        other = self.views.get(key)
        if other is None:
            other = self._scratch(flat, key)
        peer = 1 - self._rank
        comm, status = self.comm, self.status
        try:   # (the watchdog itself: this is a hot path; status: the Irecv's)
            self._watchdog.wait([comm.Irecv(other, peer, 0), comm.Isend(flat, peer, 0)], info, status)
        except (DeadlinePassed, self._MPI.Exception) as exc:
            raise self._wait_failed(info, exc) from None
        got = status.Get_count(self._MPI.BYTE)
        if got != flat.nbytes:
            raise DistributedError(f"{info.describe()} on group {list(info.group_ranks)}: rank "
                                   f"{self._peer_rank} sent {got} bytes but this rank's array holds "
                                   f"{flat.nbytes}; every rank must pass the same shape and dtype")
        ufunc = REDUCE_UFUNCS[op]
        if self._rank == 0:
            ufunc(flat, other, out=flat)
        else:
            ufunc(other, flat, out=flat)
        if op is _AVG:
            finish_average(flat, 2)

    def _scratch(self, flat, key):
        """A view, shaped like ``flat``, of the scratch buffer that receives the peer's data."""
        nbytes = flat.nbytes
        buf = self.buf
        if buf is None or buf.nbytes < nbytes or len(self.views) >= _PAIRWISE_VIEWS:
            if buf is None or buf.nbytes < nbytes:
                # grow geometrically (DDP's buckets come in a few sizes), never past the window
                size = max(nbytes, min(2 * (0 if buf is None else buf.nbytes), self.max_bytes))
                self.buf = buf = np.empty(size, np.uint8)
            self.views.clear()
        view = self.views[key] = buf[:nbytes].view(flat.dtype)
        return view

    def free(self) -> None:
        """Free the duplicate communicator (the group shuts down)."""
        self.comm.Free()
