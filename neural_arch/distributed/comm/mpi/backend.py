"""The MPI backend: mpi4py's buffer API on NumPy arrays, made interruptible.

Every collective first runs the **call check** (:mod:`neural_arch.distributed.comm.mpi.check`): one persistent allgather of
fixed-size slots in which every rank states what it called (op kind, sequence number, dtype, reduce
op, byte count, root). MPI itself never compares these -- two ranks whose all_reduce buffers differ
in size both returned, one with values from MPICH's scratch memory -- so without it a mismatch was
silently wrong; with it, a mismatch is a
:class:`~neural_arch.distributed.errors.CollectiveMismatchError` on every rank before any
data moves. Collectives of up to 2 KiB (all_reduce, broadcast, all_gather, reduce_scatter; less on
groups above 8 ranks) ride inside the check: one MPI operation in all. Larger ones then map to one
MPI call on the array's own buffer (never mpi4py's lowercase, pickling methods): ``Iallreduce`` with
``MPI.IN_PLACE``, ``Ibcast``, ``Ireduce``, ``Iallgather``, ``Igather``, ``Iscatter``,
``Ireduce_scatter_block``, ``Ialltoall``, ``Ialltoallv`` (uneven splits, their counts checked inside the
call check; on groups of up to 8 ranks the blocks go as ``Isend``/``Irecv`` pairs instead) -- except a two-rank all_reduce of 16-32 KiB, which is one
``Irecv`` + ``Isend`` pair (below). ``Isend``/``Irecv`` with tags carry point-to-point messages (the
receiver checks the byte count). A barrier is the check alone. Sub-groups are ``Comm.Split``
communicators.

Why the nonblocking variants: a blocking MPI call cannot be interrupted, so a rank that never
arrives would hang its peers forever. Each call here starts the nonblocking operation and waits
for it in **one C call**, ``MPI_Waitany`` over the op's requests and this thread's wake-up
request, which a watchdog thread completes at the op's deadline
(:mod:`neural_arch.distributed.comm.mpi.progress`): the
wait runs at raw MPI speed with the GIL released, yet a missing rank still gives a
:class:`~neural_arch.distributed.errors.CollectiveTimeoutError` (naming op, sequence number, shape, dtype and group) *raised in
the caller*. (Below ``MPI_THREAD_MULTIPLE`` the watchdog cannot call MPI while the waiter is in
it, and the wait falls back to polling ``Request.Test`` with a short backoff.)
MPI never says *which* ranks are missing, so each process runs a small daemon thread
(:class:`~neural_arch.distributed.comm.mpi.progress.Presence`) on a private communicator that answers peers' "what are you
doing?"; the timeout error then reads "ranks [2] did not arrive; ranks [0, 1] were waiting
(rank 2 is in barrier #7 on group [0, 1, 2])".

Speed (``benchmarks/bench_collectives.py --contenders mpi,mpi4py``, ``bench_small_messages.py``):
float32/float64/integer reductions pass the caller's array itself to MPI (no reshape, no copy,
no lock under THREAD_MULTIPLE). The call check is a persistent collective (``MPI_Allgather_init``
once per group, ``Start`` per call): building MPICH's nonblocking schedule was a third of a 1 KiB
all_reduce. What the check costs (``bench_mpi_backend.py --probes``, its ``check`` column; against
the code before it, docs/benchmarks.md): a little Python on a 1 KiB all_reduce, which rides
inside it, and one small allgather on larger collectives; a broadcast becomes synchronising (the
root hears from every rank before it returns). On two ranks, all_reduces of 16-32 KiB are one
exchange of the whole buffer (``Irecv`` + ``Isend`` on a private duplicate communicator, one
``Waitany``) and one NumPy reduction in rank order, the same bits on both ranks: MPICH's nonblocking
all_reduce takes two steps there (``PAIRWISE_MIN_BYTES``; ``bench_mpi_backend.py --probes``).
Others are ``Iallreduce`` on the caller's array + one ``Waitany``, not the blocking ``MPI_Allreduce``:
on busy cores MPICH's blocking all_reduce was several times slower at 64-256 KiB in every run
(docs/benchmarks.md, "MPI blocking vs nonblocking"; ``MPIBackend.create``'s
``blocking_collectives=True`` opts in to it, with a job abort at the deadline).

**Timeout and abort policy.** MPI cannot cancel a started collective: after a timeout the
request is still pending inside MPI, its buffer still in use, and the communicator unusable.
So (1) the group refuses every later operation (the base class marks it failed), (2) the
error says the process must exit, and (3) when a process whose MPI group failed exits, this
module calls ``MPI.COMM_WORLD.Abort(1)`` from an ``atexit`` hook, because ``MPI_Finalize``
would wait for the pending operation forever and the peers stuck in it would never return.
We do not abort *inside* the failing call: the caller gets the exception first, to log it or
save a checkpoint -- except with ``blocking_collectives=True``, where the watchdog aborts the job at
the deadline of a blocking call (no error can reach its caller). (A rank that *dies* is handled by
``mpiexec``, which ends the whole job.) The policy's code:
:mod:`neural_arch.distributed.comm.mpi.failure`.

Reductions: ``ReduceOp`` maps to MPI's ops (AVG = SUM, then divide); float16 and bfloat16 are
reduced **in float32 on the host** (MPI has no half or bfloat16 type): each rank widens its array
to float32, MPI reduces those, and the result is rounded back once -- more accurate than summing
in 16 bits, at twice the bytes on the wire; bool travels as uint8 (MAX/MIN = any/all).
Data movement that does no arithmetic sends raw bytes, so every supported dtype works.

CuPy arrays are passed straight to MPI when ``MPI.Query_cuda_support()`` says the library is
CUDA-aware, and staged through host memory otherwise.

Example (run under ``mpiexec -n 2 python script.py``)::

    from neural_arch.distributed.comm.mpi.backend import MPIBackend
    backend = MPIBackend.create(None, timeout=30)
    x = np.full(3, float(backend.rank))
    backend.allreduce(x)             # x == [1., 1., 1.] on both ranks
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import threading
import time
import zlib
from itertools import accumulate

import numpy as np

from neural_arch import config
from neural_arch.backend import to_device_like, to_host
from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.dtypes import SUPPORTED_DTYPES, finish_average, is_bfloat16
from neural_arch.distributed.comm.mpi.allreduce import _UFUNC, InlineAllReduce, PairwiseAllReduce
from neural_arch.distributed.comm.mpi.alltoallv import AlltoallvPlan
from neural_arch.distributed.comm.mpi.check import DATA_FOLLOWS, DATA_INLINE, DATA_PAIRWISE, CallCheck
from neural_arch.distributed.comm.mpi.failure import (
    _BROKEN,
    _abort_if_broken,
    _mpi,
    abort_job,
    abort_on_uncaught_exception,
    timeout_message,
)
from neural_arch.distributed.comm.mpi.progress import DeadlinePassed, Presence, Watchdog
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.errors import CollectiveTimeoutError, DistributedError

# dtypes MPI reduces as they are (mpi4py names them from the buffer): the caller's array goes
# straight to MPI. float16/bfloat16 are widened, bool is viewed as uint8 (see _reducible).
_AVG = ReduceOp.AVG   # a module constant: the Enum class-attribute lookup is slow on the hot path
_NATIVE = frozenset(d for d in SUPPORTED_DTYPES if d.kind in "fiu" and d != np.float16)
# How often the watchdog looks for waiters past their deadline (seconds; the timeout error
# arrives at most this late). Scaled down for short timeouts, see MPIBackend.create.
_WATCHDOG_S = config.get("NEURAL_ARCH_MPI_WATCHDOG_S")

_ATEXIT_INSTALLED = False


# How long a wait polls MPI_Test before it starts sleeping (seconds). Polling keeps small
# collectives near raw mpi4py's latency; sleeping afterwards keeps oversubscribed ranks fair.
_SPIN_S = config.get("NEURAL_ARCH_MPI_SPIN_S")


def _bytes(a):
    """A flat uint8 view of a C-contiguous array (0-d and empty arrays included)."""
    return a.reshape(-1).view(np.uint8 if isinstance(a, np.ndarray) else _cupy().uint8)


def _ranks_code(ranks) -> int:
    """A 32-bit code of a new_group's rank list for the call check's header (members that disagree
    on the list would otherwise build different communicators)."""
    return zlib.crc32(np.asarray(ranks, np.int64).tobytes())


def _cupy():
    import cupy

    return cupy


class MPIBackend(Backend):
    """One MPI communicator (``COMM_WORLD``'s duplicate, or a ``Split`` of it).

    It holds its all_reduce strategies besides ``Iallreduce`` (:mod:`.allreduce`): ``_inline``, the
    all_reduce inside the call check, and ``_pairwise``, the two-rank exchange (None where it does not
    apply); both exist once the call check does (``_attach_check``, ``_enable_pairwise``).

    Example::

        # mpiexec -n 4 python train.py
        world = MPIBackend.create(timeout=60.0)          # MPI decides rank and size
        world.allreduce(grads, ReduceOp.AVG)
        evens = world.new_group([0, 2])                   # a Comm.Split; None on ranks 1 and 3
    """

    name = "mpi"
    devices = ("cpu", "cuda")

    def __init__(self, comm, timeout: float = 300.0, group_ranks=None, debug=None, presence=None,
                 watchdog=None, blocking_collectives: bool = False):
        super().__init__(comm.Get_rank(), comm.Get_size(), timeout, group_ranks, debug)
        MPI = _mpi()
        self.comm = comm
        #: answers peers' "what are you doing?" (shared by the world and its sub-groups)
        self._presence: Presence | None = presence
        #: wakes a waiting thread at its deadline (THREAD_MULTIPLE only; shared like presence)
        self._watchdog: Watchdog | None = watchdog
        self._owns_presence = False
        self._MPI = MPI
        self._IN_PLACE = MPI.IN_PLACE
        # Below THREAD_MULTIPLE, two threads (caller + progress thread) must not call MPI at once.
        self._mpi_lock = (threading.RLock() if MPI.Query_thread() < MPI.THREAD_MULTIPLE
                          else contextlib.nullcontext())
        query = getattr(MPI, "Query_cuda_support", None)
        self.cuda_aware = bool(query()) if query is not None else False
        # keyed by the op's value: hashing an Enum member is a measurable part of a small collective
        self._ops = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "product": MPI.PROD}
        self.transport = "mpi"
        #: all_reduces the call check does not carry call the blocking MPI_Allreduce (see create())
        self._blocking = bool(blocking_collectives)
        #: the call check every collective starts with (mpi_check; None only on create()'s probe)
        self._check: CallCheck | None = None
        #: the all_reduce inside the call check (set with the check: _attach_check)
        self._inline: InlineAllReduce | None = None
        #: two-rank groups: the pairwise exchange (None: off; see _enable_pairwise)
        self._pairwise: PairwiseAllReduce | None = None
        self._pair_limit = 0            # the agreed pairwise_max_bytes, handed on to sub-groups
        #: row bytes -> contiguous MPI datatype, for all_to_allv buffers beyond int32 byte counts
        self._row_types: dict = {}
        #: all_to_allv's plan (:class:`.alltoallv.AlltoallvPlan`), built at the first all_to_allv
        self._a2av: AlltoallvPlan | None = None

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        # find_spec does not import mpi4py.MPI, so MPI is not initialised by asking.
        return importlib.util.find_spec("mpi4py") is not None

    @classmethod
    def create(cls, store=None, rank: int | None = None, world_size: int | None = None,
               timeout: float = 300.0, rendezvous_timeout: float | None = None,
               blocking_collectives: bool = False, pairwise_max_bytes: int | None = None,
               **options) -> MPIBackend:
        """The world communicator. MPI decides rank and size; explicit ones must agree.

        ``store`` is unused (MPI has its own rendezvous). Every rank must call this: it first
        waits (up to ``rendezvous_timeout``) for all ranks in a nonblocking collective, then
        duplicates ``COMM_WORLD`` so our traffic never matches the user's own MPI messages.

        ``blocking_collectives=True`` (``init_process_group("mpi", blocking_collectives=True)``;
        every rank must pass the same value, which the rendezvous checks): every all_reduce larger
        than the call check carries (2 KiB) calls the blocking ``MPI_Allreduce`` -- no nonblocking schedule
        built per call -- and a rank whose call passes its deadline **aborts the whole MPI job** from
        the watchdog thread, printing the CollectiveTimeoutError's message (op, sequence number,
        missing ranks): a blocking call cannot return an error to its caller. Off by default: it
        turns timeouts into job aborts, and MPICH 5's blocking all_reduce degrades badly on busy
        cores (module docstring); compare with ``benchmarks/bench_mpi_backend.py --probes``.

        ``pairwise_max_bytes`` (default ``NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES``, 32 KiB; 0 turns it off;
        checked equal on every rank at the rendezvous): on two ranks, all_reduces of
        ``PAIRWISE_MIN_BYTES`` up to this many bytes are one exchange (:class:`.allreduce.PairwiseAllReduce`).
        """
        global _ATEXIT_INSTALLED
        MPI = _mpi(rendezvous_timeout if rendezvous_timeout is not None else None)
        world = MPI.COMM_WORLD
        if world_size is not None and int(world_size) != world.Get_size():
            # suggest `mpiexec -n N` only for an N that can be started (never "mpiexec -n 0")
            hint = f", or start with mpiexec -n {int(world_size)}" if int(world_size) >= 1 else ""
            raise ValueError(f"backend 'mpi': world_size={world_size} but MPI started {world.Get_size()} "
                             f"processes; under mpiexec MPI decides the world (omit world_size{hint})")
        if rank is not None and int(rank) != world.Get_rank():
            raise ValueError(f"backend 'mpi': rank={rank} but this is MPI rank {world.Get_rank()}; "
                             "under mpiexec MPI decides the rank (omit rank)")
        if not _ATEXIT_INSTALLED:
            atexit.register(_abort_if_broken)
            _ATEXIT_INSTALLED = True
        abort_on_uncaught_exception()      # one rank's crash ends the job at once (NEURAL_ARCH_MPI_ABORT_ON_EXCEPTION)
        wait = float(rendezvous_timeout if rendezvous_timeout is not None else timeout)
        probe = cls(world, timeout)
        info = OpInfo("rendezvous (mpi barrier)", 0, list(range(world.Get_size())), world.Get_rank(),
                      deadline=time.monotonic() + wait)
        # the barrier is a MAX of (flag, -flag): equal everywhere iff every rank chose the same mode
        # (blocking and nonblocking collectives never match each other: mixed ranks would hang)
        flag = int(bool(blocking_collectives))
        pair_max = int(config.get("NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES") if pairwise_max_bytes is None
                       else pairwise_max_bytes)
        if pair_max < 0:
            raise ValueError(f"backend 'mpi': pairwise_max_bytes={pair_max} must be >= 0 (0 turns the pairwise "
                             "all_reduce off)")
        agreed = np.array([flag, -flag, pair_max, -pair_max], np.int64)
        probe._poll([world.Iallreduce(MPI.IN_PLACE, agreed, MPI.MAX)], info)
        if int(agreed[0]) != -int(agreed[1]):
            raise ValueError("backend 'mpi': blocking_collectives differs across ranks; pass the same value on "
                             "every rank (blocking and nonblocking MPI collectives never match each other)")
        if int(agreed[2]) != -int(agreed[3]):
            raise ValueError("backend 'mpi': pairwise_max_bytes (NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES) differs across "
                             "ranks; set the same value on every rank (a pairwise exchange never matches an "
                             "Iallreduce)")
        threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        if flag and not threaded:
            raise NotImplementedError("blocking_collectives=True needs MPI_THREAD_MULTIPLE (its deadline watchdog "
                                      "runs beside the blocked call); this MPI library gave a lower thread level")
        backend = cls(world.Dup(), timeout, blocking_collectives=bool(flag))
        backend._attach_check(CallCheck(MPI, backend.comm, persistent=threaded))
        if threaded:
            private = world.Dup()       # presence queries (tags 1, 2) and wake-ups (tags >= 100)
            interval = min(_WATCHDOG_S, max(0.005, float(timeout) / 40))
            backend._watchdog = Watchdog(MPI, private, interval)
            backend._presence = Presence(MPI, private, backend._watchdog)
            backend._owns_presence = True
            backend._enable_pairwise(pair_max)
            # Before MPI_Finalize (mpi4py's own atexit hook, registered earlier, so run later):
            # the threads' posted receives would otherwise be reported as leaked by UCX.
            atexit.register(backend._stop_helpers)
        return backend

    def _attach_check(self, check: CallCheck) -> None:
        """Make ``check`` this group's call check, and the inline all_reduce that rides inside it."""
        self._check = check
        self._inline = InlineAllReduce(check, self._agree, self._size)

    def _enable_pairwise(self, max_bytes: int) -> None:
        """Two-rank groups with the watchdog and nonblocking collectives: all_reduces of
        ``PAIRWISE_MIN_BYTES`` .. ``max_bytes`` become one exchange (:class:`.allreduce.PairwiseAllReduce`).
        Collective (``Comm.Dup``): called where every member builds the backend."""
        self._pair_limit = int(max_bytes)
        self._pairwise = PairwiseAllReduce.open(self._MPI, self.comm, self._rank, self._size, self._watchdog,
                                                self._blocking, int(max_bytes), self._wait_failed,
                                                self.global_rank(1 - self._rank) if self._size == 2 else -1)

    def _stop_helpers(self) -> None:
        if self._presence is not None:
            self._presence.stop()
        if self._watchdog is not None:
            self._watchdog.stop()

    def describe(self) -> dict:
        MPI = self._MPI
        return {"library": MPI.Get_library_version().splitlines()[0].strip(),
                "standard": "{}.{}".format(*MPI.Get_version()), "thread_level": MPI.Query_thread(),
                "cuda_aware": self.cuda_aware, "processor": MPI.Get_processor_name()}

    # -- waiting: one C call woken at the deadline, or polling -----------------------------------------
    def _wait(self, requests, info: OpInfo, peer: int | None = None, status=None) -> None:
        """Wait until every request completed, or raise CollectiveTimeoutError at the deadline."""
        watchdog = self._watchdog
        if watchdog is None:
            self._poll(requests, info, peer, status)
            return
        try:
            watchdog.wait(requests, info, status)
        except (DeadlinePassed, self._MPI.Exception) as exc:
            raise self._wait_failed(info, exc, peer) from None

    def _agree(self, info: OpInfo, nbytes: int, root: int = -1, mode: int = DATA_FOLLOWS) -> None:
        """The call check (:mod:`.mpi_check`) for ``info``: exchange every rank's header (and, with
        ``mode=DATA_INLINE``, the payload already in this rank's slot); raise
        :class:`CollectiveMismatchError` on every rank when the headers differ. Every collective calls
        this before its data moves, so ranks never hand MPI mismatched buffers."""
        check = self._check
        watchdog = self._watchdog
        if watchdog is not None:
            try:
                watchdog.wait_one(check.stamp(info, nbytes, root, mode), info)
            except (DeadlinePassed, self._MPI.Exception) as exc:
                raise self._wait_failed(info, exc) from None
        else:
            with self._mpi_lock:
                req = check.stamp(info, nbytes, root, mode)
            self._wait([req], info)
        if not check.agreed():
            raise check.error(info)

    def _wait_one(self, request, info: OpInfo) -> None:
        """:meth:`_wait` for one request of a collective, with the watchdog (the hot paths)."""
        try:
            self._watchdog.wait_one(request, info)
        except (DeadlinePassed, self._MPI.Exception) as exc:
            raise self._wait_failed(info, exc) from None

    def _wait_failed(self, info: OpInfo, exc: BaseException, peer: int | None = None) -> DistributedError:
        """The error a watchdog wait for ``info`` ended with, for its caller: the deadline passed
        (``DeadlinePassed``: a CollectiveTimeoutError naming the late ranks) or MPI failed."""
        if isinstance(exc, DeadlinePassed):
            return self._timeout(info, time.monotonic() - (info.deadline - self.timeout), peer)
        return self._mpi_failed(info, exc)

    def _mpi_failed(self, info: OpInfo, exc) -> DistributedError:
        return DistributedError(f"{info.describe()} on group {list(info.group_ranks)} failed inside "
                                f"MPI on rank {info.rank}: {exc.Get_error_string()}")

    def _poll(self, requests, info: OpInfo, peer: int | None = None, status=None) -> None:
        """Poll ``requests`` until all completed, or raise CollectiveTimeoutError at the deadline
        (without MPI_THREAD_MULTIPLE, and for the rendezvous barrier before the watchdog exists)."""
        MPI = self._MPI
        start, delay = time.monotonic(), 0.0
        spin_until = start + _SPIN_S
        key = object()
        if self._presence is not None:
            self._presence.enter(key, info)  # described only when a peer asks: formatting it per op shows
        try:
            while True:
                try:
                    with self._mpi_lock:
                        done = (requests[0].Test(status) if len(requests) == 1
                                else MPI.Request.Testall(requests))
                except MPI.Exception as exc:
                    raise self._mpi_failed(info, exc) from None
                if done:
                    return
                now = time.monotonic()
                if now >= info.deadline:
                    raise self._timeout(info, now - start, peer)
                if now < spin_until:
                    # Poll for latency: any time.sleep(), even sleep(0), costs Linux's timer slack, more
                    # than a whole small MPI collective. sched_yield lets other
                    # processes on an oversubscribed core run without that cost.
                    os.sched_yield()
                    continue
                # then back off, so idle waiting leaves the CPU to ranks that have work
                delay = min(delay * 2 or 5e-5, 1e-3)
                time.sleep(delay)
        finally:
            if self._presence is not None:
                self._presence.leave(key)

    def _timeout(self, info: OpInfo, waited: float, peer: int | None) -> CollectiveTimeoutError:
        _BROKEN.append(info.describe())
        tail = ("MPI cannot cancel a started operation: this process group is unusable now and the MPI "
                "job is aborted when this process exits. Check that every rank calls the same "
                "collectives in the same order, or raise init_process_group(timeout=...).")
        presence = self._presence
        if presence is not None:
            # From now on this rank answers "timed out in all_reduce #5 on group [0, 1]": a peer that times
            # out a moment later in the same op must not hear "idle" (this rank has left the op).
            presence.timed_out(info)
        return CollectiveTimeoutError(timeout_message(
            info, waited, presence, tail, None if peer is None else self.global_rank(peer)))

    # -- staging (CuPy without CUDA-aware MPI) and reduction dtypes --------------------------------
    def _host(self, a):
        if a is None or isinstance(a, np.ndarray):
            return a
        if self.cuda_aware:
            _cupy().cuda.get_current_stream().synchronize()  # MPI reads the buffer outside CUDA streams
            return a
        return to_host(a)

    @staticmethod
    def _back(dst, host) -> None:
        if dst is not None and host is not dst:
            to_device_like(host, dst, out=dst)

    @staticmethod
    def _reducible(a):
        """The array MPI reduces: float16/bfloat16 widened to float32 (a copy), bool as uint8 (a view)."""
        if a.dtype == np.float16 or is_bfloat16(a.dtype):
            return a.astype(np.float32).reshape(-1)
        if a.dtype == np.bool_:
            return a.reshape(-1).view(np.uint8)
        return a.reshape(-1)

    @staticmethod
    def _store(dst, red) -> None:
        if dst.dtype == np.float16 or is_bfloat16(dst.dtype):
            dst.reshape(-1)[...] = red   # one rounding from the float32 result

    # -- primitives --------------------------------------------------------------------------------
    def _allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        watchdog = self._watchdog
        if array.__class__ is np.ndarray and watchdog is not None and array.dtype in _NATIVE:
            # The hot path, in one frame (Python right after MPI_Waitany runs with cold caches, so every
            # call layer counts): a small array rides inside the call check (InlineAllReduce), a
            # larger one is checked first, then is the MPI buffer itself (no view, no lock, no copy).
            nbytes = array.nbytes
            if nbytes <= self._check.inline_bytes:
                # the payload rides inside the call check: one MPI operation (InlineAllReduce)
                self._inline(array if array.ndim == 1 else array.reshape(-1), op, info, nbytes)
                return
            pair = self._pairwise
            pairwise = pair is not None and pair.min_bytes <= nbytes <= pair.max_bytes
            self._agree(info, nbytes, -1, DATA_PAIRWISE if pairwise else DATA_FOLLOWS)
            try:
                if pairwise:
                    pair(array if array.ndim == 1 else array.reshape(-1), op, info)
                    return
                elif self._blocking:
                    self._blocking_allreduce(array, op, info)
                else:
                    watchdog.wait_one(self.comm.Iallreduce(self._IN_PLACE, array, self._ops[op._value_]), info)
            except (DeadlinePassed, self._MPI.Exception) as exc:      # what _wait does, inlined
                raise self._wait_failed(info, exc) from None
            if op is _AVG:
                finish_average(array, self._size)
            return
        host = self._host(array)
        red = self._reducible(host)
        if red.nbytes <= self._check.inline_bytes and red.__class__ is np.ndarray:
            # (the hot path's decision for the same bytes; the header carries the mode, so a rank whose
            # CUDA-aware CuPy buffer goes to Iallreduce instead gets a CollectiveMismatchError, not a hang)
            self._inline(red, op, info, host.nbytes)
            self._store(host, red)
            self._back(array, host)
            return
        pair = self._pairwise
        pairwise = (pair is not None and pair.min_bytes <= red.nbytes <= pair.max_bytes
                    and red.__class__ is np.ndarray)
        self._agree(info, host.nbytes, -1, DATA_PAIRWISE if pairwise else DATA_FOLLOWS)
        if pairwise:
            # (the decision the hot path makes for the same bytes; a CUDA-aware CuPy buffer keeps
            # Iallreduce: the header carries the choice, so mixed ranks get a CollectiveMismatchError)
            pair(red, op, info)
            self._store(host, red)
            self._back(array, host)
            return
        elif self._blocking:
            self._blocking_allreduce(red, op, info)
        else:
            with self._mpi_lock:
                req = self.comm.Iallreduce(self._IN_PLACE, red, self._ops[op._value_])
            self._wait([req], info)
        if op is _AVG:
            finish_average(red, self._size)
        self._store(host, red)
        self._back(array, host)

    def _blocking_allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        """``MPI_Allreduce`` in place under the watchdog, which aborts the job at the deadline (create())."""
        watchdog = self._watchdog
        slot = watchdog.begin_blocking(info, self._abort_blocked)
        try:
            self.comm.Allreduce(self._IN_PLACE, array, self._ops[op._value_])
        except self._MPI.Exception as exc:
            raise self._mpi_failed(info, exc) from None
        finally:
            watchdog.end_blocking(slot)

    def _abort_blocked(self, info: OpInfo, still_blocked) -> None:
        """The watchdog thread, at the deadline of a blocking call: name the late ranks, then abort the job."""
        tail = ("A blocking MPI call cannot be interrupted (blocking_collectives=True), so the MPI job is "
                "aborted. Check that every rank calls the same collectives in the same order, or raise "
                "init_process_group(timeout=...).")
        try:
            message = timeout_message(info, time.monotonic() - (info.deadline - self.timeout), self._presence, tail)
        except Exception as exc:  # noqa: BLE001 - asking the peers failed: abort all the same, never hang
            message = f"{info.describe()} on group {list(info.group_ranks)} timed out ({exc!r}). {tail}"
        if still_blocked():              # (it may have completed while the peers were asked)
            abort_job(message)

    def _reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        self._agree(info, array.nbytes, root)
        host = self._host(array)
        red = self._reducible(host)
        with self._mpi_lock:
            if self._rank == root:
                req = self.comm.Ireduce(self._MPI.IN_PLACE, red, self._ops[op._value_], root)
            else:
                req = self.comm.Ireduce(red, None, self._ops[op._value_], root)
        self._wait([req], info)
        if self._rank == root:
            if op is _AVG:
                finish_average(red, self._size)
            self._store(host, red)
            self._back(array, host)

    def _reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        host_in, host_out = self._host(input), self._host(output)
        red_in, red_out = self._reducible(host_in), self._reducible(host_out)
        if red_in.nbytes <= self._check.inline_bytes and red_in.__class__ is np.ndarray:
            # inside the call check, like a small all_reduce: every rank reduces its own chunk of the
            # gathered inputs in rank order
            mine, rows, _row0, _row1 = self._check.payload(red_in.nbytes, red_in.dtype)
            mine[...] = red_in
            self._agree(info, input.nbytes, -1, DATA_INLINE)
            k = red_out.size
            _UFUNC[op._value_].reduce(rows[:, self._rank * k:(self._rank + 1) * k], axis=0, out=red_out)
        else:
            self._agree(info, input.nbytes)
            with self._mpi_lock:
                req = self.comm.Ireduce_scatter_block(red_in, red_out, self._ops[op._value_])
            self._wait([req], info)
        if op is _AVG:
            finish_average(red_out, self._size)
        self._store(host_out, red_out)
        self._back(output, host_out)

    def _broadcast(self, array, root: int, info: OpInfo) -> None:
        nbytes = array.nbytes
        if nbytes <= self._check.inline_bytes:
            # inside the call check: the root's payload rides in its slot, one MPI operation in all (the
            # check makes a broadcast synchronising: the root hears from every rank before it returns)
            host = array if array.__class__ is np.ndarray else to_host(array)
            flat = host.reshape(-1)
            mine, rows, _row0, _row1 = self._check.payload(nbytes, host.dtype)
            if self._rank == root:
                mine[...] = flat
            self._agree(info, nbytes, root, DATA_INLINE)
            if self._rank != root:
                flat[...] = rows[root]
                self._back(array, host)
            return
        self._agree(info, nbytes, root)
        if array.__class__ is np.ndarray and self._watchdog is not None and array.dtype in _NATIVE:
            self._wait_one(self.comm.Ibcast(array, root), info)
            return
        host = self._host(array)
        with self._mpi_lock:
            req = self.comm.Ibcast(_bytes(host), root)
        self._wait([req], info)
        self._back(array, host)

    def _allgather(self, output, input, info: OpInfo) -> None:
        nbytes = input.nbytes
        if nbytes <= self._check.inline_bytes:
            # inside the call check: every rank's input rides in its slot, one MPI operation in all
            host_in = input if input.__class__ is np.ndarray else to_host(input)
            host_out = output if output.__class__ is np.ndarray else to_host(output)
            mine, rows, _row0, _row1 = self._check.payload(nbytes, host_in.dtype)
            mine[...] = host_in.reshape(-1)
            self._agree(info, nbytes, -1, DATA_INLINE)
            host_out.reshape(self._size, -1)[...] = rows
            self._back(output, host_out)
            return
        self._agree(info, nbytes)
        if (input.__class__ is np.ndarray and output.__class__ is np.ndarray and self._watchdog is not None
                and input.dtype in _NATIVE):
            self._wait_one(self.comm.Iallgather(input, output), info)
            return
        host_in, host_out = self._host(input), self._host(output)
        with self._mpi_lock:
            req = self.comm.Iallgather(_bytes(host_in), _bytes(host_out))
        self._wait([req], info)
        self._back(output, host_out)

    def _gather(self, output, input, root: int, info: OpInfo) -> None:
        self._agree(info, input.nbytes, root)
        host_in = self._host(input)
        host_out = self._host(output) if self._rank == root else None
        with self._mpi_lock:
            req = self.comm.Igather(_bytes(host_in), None if host_out is None else _bytes(host_out), root)
        self._wait([req], info)
        self._back(output if self._rank == root else None, host_out)

    def _scatter(self, output, input, root: int, info: OpInfo) -> None:
        self._agree(info, output.nbytes, root)
        host_out = self._host(output)
        host_in = self._host(input) if self._rank == root else None
        with self._mpi_lock:
            req = self.comm.Iscatter(None if host_in is None else _bytes(host_in), _bytes(host_out), root)
        self._wait([req], info)
        self._back(output, host_out)

    def _alltoall(self, output, input, info: OpInfo) -> None:
        self._agree(info, input.nbytes)
        host_in, host_out = self._host(input), self._host(output)
        with self._mpi_lock:
            req = self.comm.Ialltoall(_bytes(host_in), _bytes(host_out))
        self._wait([req], info)
        self._back(output, host_out)

    def _alltoallv(self, output, input, output_splits: list, input_splits: list, info: OpInfo) -> None:
        """The split sizes ride inside the call check (each rank's send and receive counts in its slot,
        when ``2 * size`` int64 fit: groups of up to 128 ranks), so every rank sees the whole split
        matrix and all of them raise the same
        :class:`~neural_arch.distributed.errors.CollectiveMismatchError` before any data moves when a
        rank's sends disagree with its peer's receives: MPI itself would read past a buffer or leave
        part of one unwritten. Larger groups check the header only. Then the blocks move on the
        caller's buffers (raw bytes: every dtype; no padding, no staging copy of host arrays): as
        point-to-point messages on groups of up to 8 ranks (:class:`.alltoallv.AlltoallvPlan`, built
        once per group), else ``Ialltoallv``."""
        plan = self._a2av
        if plan is None:
            plan = self._a2av = AlltoallvPlan(self._MPI, self._check, self._agree, self._watchdog, self._wait_failed)
        if (plan.point_to_point and output.__class__ is np.ndarray and input.__class__ is np.ndarray
                and input.nbytes < (1 << 31) and output.nbytes < (1 << 31)):
            plan.exchange(output, input, output_splits, input_splits, info)
            return
        plan.check_splits(info, input_splits, output_splits)
        host_in, host_out = self._host(input), self._host(output)
        row = info.nbytes
        if max(host_in.nbytes, host_out.nbytes) < (1 << 31):
            unit, dtype = row, self._MPI.BYTE           # byte counts and displacements: MPI's plain int
        else:
            unit, dtype = 1, self._row_type(row)        # beyond int32 bytes: count rows of a contiguous type
        scounts = [c * unit for c in input_splits]
        rcounts = [c * unit for c in output_splits]
        sdispls = [0, *accumulate(scounts[:-1])]
        rdispls = [0, *accumulate(rcounts[:-1])]
        send = [_bytes(host_in), scounts, sdispls, dtype]
        recv = [_bytes(host_out), rcounts, rdispls, dtype]
        if self._watchdog is not None and host_in.__class__ is np.ndarray and host_out.__class__ is np.ndarray:
            self._wait_one(self.comm.Ialltoallv(send, recv), info)
            return
        with self._mpi_lock:
            req = self.comm.Ialltoallv(send, recv)
        self._wait([req], info)
        self._back(output, host_out)

    def _row_type(self, row: int):
        """A committed contiguous MPI datatype of ``row`` bytes (cached: one per row size in use)."""
        types = self._row_types
        dtype = types.get(row)
        if dtype is None:
            dtype = types[row] = self._MPI.BYTE.Create_contiguous(row).Commit()
        return dtype

    def _barrier(self, info: OpInfo) -> None:
        self._agree(info, 0)        # an allgather is a barrier: no rank completes it before all started it

    def _validate_tag(self, tag: int) -> None:
        super()._validate_tag(tag)
        self._check_tag(tag)          # in the caller, before any I/O

    def _check_tag(self, tag: int) -> int:
        upper = self.comm.Get_attr(self._MPI.TAG_UB) or 32767
        if not 0 <= int(tag) <= upper:
            raise ValueError(f"tag={tag} is outside MPI's tag range 0..{upper}")
        return int(tag)

    def _send(self, array, dst: int, tag: int, info: OpInfo) -> None:
        host = self._host(array)
        with self._mpi_lock:
            req = self.comm.Isend(_bytes(host), dst, self._check_tag(tag))
        self._wait([req], info, peer=dst)

    def _recv(self, array, src: int, tag: int, info: OpInfo) -> None:
        host = self._host(array)
        status = self._MPI.Status()
        with self._mpi_lock:
            req = self.comm.Irecv(_bytes(host), src, self._check_tag(tag))
        self._wait([req], info, peer=src, status=status)
        got = status.Get_count(self._MPI.BYTE)
        if got != host.nbytes:
            raise ValueError(f"{info.describe()}: received {got} bytes from rank {self.global_rank(src)} but the "
                             f"buffer holds {host.nbytes}; send and recv must use the same shape and dtype")
        self._back(array, host)

    def _sendrecv(self, send_array, dst: int, recv_array, src: int, tag: int, info: OpInfo) -> None:
        host_send, host_recv = self._host(send_array), self._host(recv_array)
        tag = self._check_tag(tag)
        with self._mpi_lock:
            reqs = [self.comm.Irecv(_bytes(host_recv), src, tag), self.comm.Isend(_bytes(host_send), dst, tag)]
        self._wait(reqs, info)
        self._back(recv_array, host_recv)

    def _new_group(self, ranks: list[int]) -> MPIBackend | None:
        MPI = self._MPI
        info = OpInfo("new_group", 0, self.group_ranks, self.group_ranks[self._rank],
                      deadline=time.monotonic() + self.timeout)
        # Comm.Split blocks uninterruptibly: wait for everyone in the call check first (a barrier),
        # so a rank that never calls new_group gives a timeout error instead of a hang, and one in
        # another collective a CollectiveMismatchError. (The ranks list is hashed into the header:
        # members that disagree on it would build different communicators.)
        while self._lane.pending and time.monotonic() < info.deadline:
            time.sleep(0.001)   # async collectives still queued use the call check: it is this group's, one op at a time
        self._agree(info, len(ranks), _ranks_code(ranks))
        member = self._rank in ranks
        with self._mpi_lock:
            sub = self.comm.Split(0 if member else MPI.UNDEFINED, ranks.index(self._rank) if member else 0)
        if not member:
            return None
        backend = MPIBackend(sub, self.timeout, [self.group_ranks[r] for r in ranks], self.debug, self._presence,
                             self._watchdog, self._blocking)
        backend._attach_check(CallCheck(MPI, sub, persistent=self._watchdog is not None))
        backend._enable_pairwise(self._pair_limit)   # (collective over the sub-group's members: all are here)
        return backend

    def _shutdown(self) -> None:
        if self._check is not None and not _BROKEN and not isinstance(self._fatal, CollectiveTimeoutError):
            self._check.free()         # (after a timeout its request may still be active: left to Abort)
        if self._owns_presence:
            self._stop_helpers()
        # Freeing a communicator with a pending (timed-out) request is erroneous: leave it to Abort.
        if self._fatal is None and not _BROKEN and self.comm != self._MPI.COMM_WORLD:
            try:
                with self._mpi_lock:
                    if self._pairwise is not None:
                        self._pairwise.free()
                    self.comm.Free()
            except self._MPI.Exception:
                pass
