"""The MPI backend's two all_reduce strategies besides MPICH's ``Iallreduce``, as a mixin of
:class:`~neural_arch.distributed.comm.mpi.MPIBackend`:

* **persistent requests** for the smallest all_reduces (``PERSISTENT_MAX_BYTES``): ``MPI_Allreduce_init``
  once per (bytes, dtype, op) that every rank agreed on, ``Start`` + one wait per call;
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

from neural_arch.distributed import config
from neural_arch.distributed.comm.algorithms.executor import _UFUNCS as _REDUCE
from neural_arch.distributed.comm.backend import finish_average
from neural_arch.distributed.comm.mpi_progress import DeadlinePassed
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.errors import DistributedError

_AVG = ReduceOp.AVG

# all_reduces of 1 .. this many bytes run as persistent collectives on a staging buffer (see
# MPIBackend._new_persistent), at most _PERSISTENT_ENTRIES (bytes, dtype, op) kinds at a time.
# Measured (2 ranks, MPICH 5.0, raw mpi4py, 41 interleaved rounds, two runs): Start + Waitany with
# the two copies beat Iallreduce + Waitany in 31-34 of 41 rounds at 1 KiB (median 4.8-5.2 vs 6.8-7.7
# us), broke even at 4 KiB and lost at 16-64 KiB (12-23 of 41; MPICH schedules a persistent
# all_reduce differently), so only the smallest messages take it.
PERSISTENT_MAX_BYTES = 2 << 10
_PERSISTENT_ENTRIES = 256

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
_PAIRWISE_VIEWS = 256       # cached scratch views (one per size and dtype) before the cache starts over
_OP_CODES = {"sum": 1, "avg": 2, "max": 3, "min": 4, "product": 5}


class AllReduceStrategies:
    """Persistent and pairwise all_reduces for :class:`~neural_arch.distributed.comm.mpi.MPIBackend`,
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

    def _init_allreduce_strategies(self) -> None:
        #: (bytes, dtype.num, op value) -> (persistent all_reduce request, its staging buffer)
        self._persistent: dict = {}
        #: two-rank groups: the pairwise exchange's communicator and size window (_enable_pairwise)
        self._pair_comm = None
        self._pair_min, self._pair_max = 1 << 62, 0          # (empty window: off)
        self._pair_buf: np.ndarray | None = None             # scratch for the peer's buffer
        self._pair_views: dict = {}                           # (bytes, dtype.num) -> view of _pair_buf
        self._pair_status = None
        self._pair_limit = 0                                  # the agreed pairwise_max_bytes, for sub-groups

    def _new_persistent(self, nbytes: int, dtype, op: ReduceOp, info: OpInfo) -> tuple | None:
        """The persistent all_reduce of (``nbytes``, ``dtype``, ``op``) and its staging buffer, created
        and cached once every rank agreed on them; None (use ``Iallreduce`` this time) when not.

        Why: small all_reduces run as ``Start`` + wait on a persistent request (``MPI_Allreduce_init``
        once), so no schedule is built per call (see ``PERSISTENT_MAX_BYTES`` for the measurements).

        Persistent collectives match only persistent ones, and their init is a collective call: every
        rank must take the persistent path at the same ops and create each request at the same op.
        So the cache holds only keys that every rank *agreed* on at one op: a key seen for the first
        time is checked with one tiny all_reduce (MAX of the key's code and of its negation: equal
        everywhere iff every rank has the same key), whose result every rank reads the same way.
        Ranks whose ops disagree (a dtype mismatch, which MPI itself reduces silently) keep using
        ``Iallreduce`` for that op and check again next time, so their caches never diverge.
        Requests work on a staging buffer of their own, never on the caller's array (whose address
        differs across ranks and calls): two copies of at most ``PERSISTENT_MAX_BYTES``.
        Only with the watchdog (MPI_THREAD_MULTIPLE): no lock around the calls.
        """
        code = (nbytes << 16) | (dtype.num << 4) | _OP_CODES[op._value_]
        check = np.array([code, -code], np.int64)
        self._wait([self.comm.Iallreduce(self._IN_PLACE, check, self._MPI.MAX)], info)
        if int(check[0]) != code or int(check[1]) != -code:
            return None
        if len(self._persistent) >= _PERSISTENT_ENTRIES:
            # oldest first: the agreed keys, and so this decision, are the same on every rank
            req, _stage = self._persistent.pop(next(iter(self._persistent)))
            req.Free()
        stage = np.zeros(nbytes // dtype.itemsize, dtype)
        entry = (self.comm.Allreduce_init(self._IN_PLACE, stage, self._ops[op._value_]), stage)
        self._persistent[(nbytes, dtype.num, op._value_)] = entry
        return entry

    def _free_persistent(self) -> None:
        """Free the cached persistent requests (all inactive: ops on a group run one at a time)."""
        for req, _stage in self._persistent.values():
            try:
                req.Free()
            except self._MPI.Exception:   # pragma: no cover - best effort
                pass
        self._persistent.clear()

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
