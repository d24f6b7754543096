"""The MPI backend's all_reduce strategies besides MPICH's ``Iallreduce``, as a mixin of
:class:`~neural_arch.distributed.comm.mpi.backend.MPIBackend`:

* **inside the call check** for the smallest all_reduces (up to ``PERSISTENT_MAX_BYTES`` on groups of
  up to 8 ranks, :func:`~.mpi_check.inline_capacity`): the payload rides in the check's persistent
  allgather and every rank reduces the gathered slots in rank order (:meth:`_inline_allreduce`);
* **the pairwise exchange** for two-rank all_reduces of ``PAIRWISE_MIN_BYTES`` up to the agreed
  ``pairwise_max_bytes``: ``Irecv`` + ``Isend`` of the whole buffer on a private duplicate
  communicator, one ``Waitany``, one NumPy reduction in rank order.

``MPIBackend._allreduce`` decides which runs (the same decision on every rank: it depends only on the
group size, the byte count, the dtype, the op and settings agreed at init); the measurements behind
each threshold are with its constant below.

Example (what ``MPIBackend`` does; run under ``mpiexec -n 2``)::

    backend = MPIBackend.create(None, timeout=30)          # two ranks: the window is open
    x = np.ones(8192)                                      # 64 KiB: one exchange + np.add
    backend.allreduce(x)                                   # x == 2.0 on both ranks
"""

from __future__ import annotations

import numpy as np

from neural_arch import config
from neural_arch.distributed.comm.gloo.executor import _UFUNCS as _REDUCE
from neural_arch.distributed.comm.backend import finish_average
from neural_arch.distributed.comm.mpi.check import DATA_INLINE, INLINE_MAX_BYTES
from neural_arch.distributed.comm.mpi.progress import DeadlinePassed
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.errors import DistributedError

_AVG = ReduceOp.AVG

# all_reduces of up to this many bytes ride inside the call check's persistent allgather (mpi_check: the
# check every collective starts with), on groups of up to 8 ranks (fewer bytes on larger groups:
# mpi_check.inline_capacity). Why persistent: building MPICH's nonblocking schedule was a third of a
# 1 KiB all_reduce. Measured before the check existed (2 ranks, MPICH 5.0, raw mpi4py, 41 interleaved
# rounds, two runs): a persistent Start + Waitany with two copies beat Iallreduce + Waitany in 31-34 of
# 41 rounds at 1 KiB (median 4.8-5.2 vs 6.8-7.7 us), broke even at 4 KiB and lost at 16-64 KiB, so
# only the smallest messages take it. (The name is historic: a persistent all_reduce per size did this.)
PERSISTENT_MAX_BYTES = INLINE_MAX_BYTES

# Two-rank all_reduces of PAIRWISE_MIN_BYTES .. PAIRWISE_MAX_BYTES are one exchange of the whole buffer
# (Irecv + Isend on a private duplicate communicator, one Waitany) and one NumPy reduction, in rank
# order on both ranks (MPIBackend._pairwise_allreduce). MPICH's nonblocking all_reduce takes two steps
# there (reduce-scatter, then all-gather: its rule for every power-of-two count above 2 KiB). Measured
# with raw mpi4py (2 ranks, MPICH 5.0.2, 31 interleaved rounds, quiet machine, three runs), exchange +
# add against Iallreduce + Waitany: 10.1-11.2 vs 11.8-12.7 us at 16 KiB, 18.7-19.4 vs 21.4-22.1 at 64
# KiB, 51-52 vs 56-57 at 256 KiB. It loses at 8-12 KiB (a whole-buffer message crosses MPICH's eager
# limit before Iallreduce's halves do). From 1 MiB it moves and reduces twice Iallreduce's bytes per
# rank: 18% faster on a quiet machine, 8-31% slower at 1-4 MiB when memory bandwidth is contended (the
# same run, benchmarks/bench_mpi_backend.py --probes), so the default window ends at 512 KiB, where it
# won in both states. NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES / create(pairwise_max_bytes=) move the end.
PAIRWISE_MIN_BYTES = 16 << 10
PAIRWISE_MAX_BYTES = config.get("NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES", {})   # the default (512 KiB)
# keyed by the op's value: hashing an Enum member costs ~0.4 us, a tenth of a 1 KiB all_reduce
_UFUNC = {op._value_: ufunc for op, ufunc in _REDUCE.items()}
_PAIRWISE_VIEWS = 256       # cached scratch views (one per size and dtype) before the cache starts over


class AllReduceStrategies:
    """Inline and pairwise all_reduces for :class:`~neural_arch.distributed.comm.mpi.backend.MPIBackend`,
    which provides the attributes and methods annotated here."""

    comm: object
    _MPI: object
    _IN_PLACE: object
    _ops: dict
    _rank: int
    _size: int
    _watchdog: object
    _blocking: bool
    _wait: object          # MPIBackend._wait(requests, info): wait with the watchdog, errors named
    _wait_failed: object   # MPIBackend._wait_failed(info, exc): the error a watchdog wait ended with
    _check: object         # the group's CallCheck (mpi_check)
    _agree: object         # MPIBackend._agree(info, nbytes, root, mode): the call check, raising on a mismatch

    def _init_allreduce_strategies(self) -> None:
        #: two-rank groups: the pairwise exchange's communicator and size window (_enable_pairwise)
        self._pair_comm = None
        self._pair_min, self._pair_max = 1 << 62, 0          # (empty window: off)
        self._pair_buf: np.ndarray | None = None             # scratch for the peer's buffer
        self._pair_views: dict = {}                           # (bytes, dtype.num) -> view of _pair_buf
        self._pair_status = None
        self._pair_limit = 0                                  # the agreed pairwise_max_bytes, for sub-groups

    def _inline_allreduce(self, flat, op: ReduceOp, info: OpInfo, nbytes: int) -> None:
        """All-reduce the flat NumPy array ``flat`` (at most ``self._check.inline_bytes``) inside the call
        check: the payload goes into this rank's slot, the check's allgather moves every slot, and every
        rank applies ``op`` to the gathered rows in rank order -- the same operation on the same operands,
        so every rank holds the same bits. ``nbytes``: the caller's byte count, for the header. One MPI
        operation in all, with no MPICH schedule built per call; a mismatch raises before any result is
        written (:meth:`_agree` is the same check without payload)."""
        mine, rows, row0, row1 = self._check.payload(flat.nbytes, flat.dtype)
        mine[...] = flat
        self._agree(info, nbytes, -1, DATA_INLINE)
        ufunc = _UFUNC[op._value_]
        if self._size == 2:
            ufunc(row0, row1, out=flat)
        else:
            ufunc.reduce(rows, axis=0, out=flat)
        if op is _AVG:
            finish_average(flat, self._size)

    def _enable_pairwise(self, max_bytes: int) -> None:
        """Two-rank groups with the watchdog and nonblocking collectives: all_reduces of
        ``PAIRWISE_MIN_BYTES`` .. ``PAIRWISE_MAX_BYTES`` become one exchange (:meth:`_pairwise_allreduce`)
        on a duplicate of the group's communicator, so its messages never meet the user's own
        point-to-point traffic on this group. Collective (``Comm.Dup``): called where every member
        builds the backend, which depends only on the group size and the MPI library's thread level
        and options (the same on every rank, so every rank makes the same choice at every op)."""
        self._pair_limit = int(max_bytes)
        if self._size != 2 or self._watchdog is None or self._blocking or max_bytes < PAIRWISE_MIN_BYTES:
            return
        self._pair_comm = self.comm.Dup()
        self._pair_status = self._MPI.Status()
        self._pair_min, self._pair_max = PAIRWISE_MIN_BYTES, int(max_bytes)

    def _pairwise_allreduce(self, flat, op: ReduceOp, info: OpInfo) -> None:
        """A two-rank all_reduce of the flat NumPy array ``flat``, in place: each rank sends its whole
        buffer to the other and receives the peer's (both posted before either waits, so neither can
        block the other), then both apply ``op`` to (rank 0's, rank 1's) in that order -- the same
        operation on the same operands, so both ranks hold the same bits (also for MAX of +0.0 and
        -0.0, where the operand order decides). A peer whose buffer has another size is an error on
        both ranks: MPI's truncation error on the smaller side, the byte count check on the larger."""
        key = (flat.nbytes, flat.dtype.num)
        other = self._pair_views.get(key)
        if other is None:
            other = self._pair_scratch(flat, key)
        peer = 1 - self._rank
        comm, status = self._pair_comm, self._pair_status
        try:   # (the watchdog itself, not _wait: this is a hot path; status: the Irecv's)
            self._watchdog.wait([comm.Irecv(other, peer, 0), comm.Isend(flat, peer, 0)], info, status)
        except (DeadlinePassed, self._MPI.Exception) as exc:
            raise self._wait_failed(info, exc) from None
        got = status.Get_count(self._MPI.BYTE)
        if got != flat.nbytes:
            raise DistributedError(f"{info.describe()} on group {list(info.group_ranks)}: rank "
                                   f"{self.global_rank(peer)} sent {got} bytes but this rank's array holds "
                                   f"{flat.nbytes}; every rank must pass the same shape and dtype")
        ufunc = _REDUCE[op]
        if self._rank == 0:
            ufunc(flat, other, out=flat)
        else:
            ufunc(other, flat, out=flat)
        if op is _AVG:
            finish_average(flat, 2)

    def _pair_scratch(self, flat, key):
        """A view, shaped like ``flat``, of the scratch buffer that receives the peer's data."""
        nbytes = flat.nbytes
        buf = self._pair_buf
        if buf is None or buf.nbytes < nbytes or len(self._pair_views) >= _PAIRWISE_VIEWS:
            if buf is None or buf.nbytes < nbytes:
                # grow geometrically (DDP's buckets come in a few sizes), never past the window
                size = max(nbytes, min(2 * (0 if buf is None else buf.nbytes), self._pair_max))
                self._pair_buf = buf = np.empty(size, np.uint8)
            self._pair_views.clear()
        view = self._pair_views[key] = buf[:nbytes].view(flat.dtype)
        return view
