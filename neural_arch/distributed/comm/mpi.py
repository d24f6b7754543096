"""The MPI backend: mpi4py's buffer API on NumPy arrays, made interruptible.

Every primitive maps to one MPI call on the array's own buffer (never mpi4py's lowercase,
pickling methods): ``Iallreduce`` with ``MPI.IN_PLACE``, ``Ibcast``, ``Ireduce``,
``Iallgather``, ``Igather``, ``Iscatter``, ``Ireduce_scatter_block``, ``Ialltoall``,
``Isend``/``Irecv`` with tags, ``Ibarrier``. Sub-groups are ``Comm.Split`` communicators.

Why the nonblocking variants: a blocking MPI call cannot be interrupted, so a rank that never
arrives would hang its peers forever. Each call here starts the nonblocking operation and
polls ``Request.Test`` with a short backoff until the op's deadline, so a missing rank gives a
:class:`CollectiveTimeoutError` (naming op, sequence number, shape, dtype and group) instead.
MPI never says *which* ranks are missing, so each process runs a small daemon thread
(:class:`_Presence`) on a private communicator that answers peers' "what are you doing?";
the timeout error then reads "ranks [2] did not arrive; ranks [0, 1] were waiting (rank 2 is
in barrier #7 on group [0, 1, 2])".

**Timeout and abort policy.** MPI cannot cancel a started collective: after a timeout the
request is still pending inside MPI, its buffer still in use, and the communicator unusable.
So (1) the group refuses every later operation (the base class marks it failed), (2) the
error says the process must exit, and (3) when a process whose MPI group failed exits, this
module calls ``MPI.COMM_WORLD.Abort(1)`` from an ``atexit`` hook, because ``MPI_Finalize``
would wait for the pending operation forever and the peers stuck in it would never return.
We do not abort *inside* the failing call: the caller gets the exception first, to log it or
save a checkpoint. (A rank that *dies* is handled by ``mpiexec``, which ends the whole job.)

Reductions: ``ReduceOp`` maps to MPI's ops (AVG = SUM, then divide); float16 is reduced in
float32 (MPI has no portable half type); bool travels as uint8 (MAX/MIN = any/all).
Data movement that does no arithmetic sends raw bytes, so every supported dtype works.

CuPy arrays are passed straight to MPI when ``MPI.Query_cuda_support()`` says the library is
CUDA-aware, and staged through host memory otherwise.

Example (run under ``mpiexec -n 2 python script.py``)::

    from neural_arch.distributed.comm.mpi import MPIBackend
    backend = MPIBackend.create(None, timeout=30)
    x = np.full(3, float(backend.rank))
    backend.allreduce(x)             # x == [1., 1., 1.] on both ranks
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import sys
import threading
import time

import numpy as np

from neural_arch.distributed.comm.backend import Backend, finish_average
from neural_arch.distributed.errors import CollectiveTimeoutError, DistributedError
from neural_arch.distributed.comm.work import OpInfo, ReduceOp

_BROKEN: list[str] = []      # descriptions of MPI operations that timed out in this process
_ATEXIT_INSTALLED = False


def _mpi():
    from mpi4py import MPI  # initialises MPI on first import (mpi4py's default: THREAD_MULTIPLE)

    return MPI


# Seconds between flushing our output and MPI_Abort. Why: on Abort, MPICH's hydra kills the job as
# soon as its proxy handles the abort request, and the proxy does not first drain the rank's
# stdout/stderr pipes: 2 runs in 20 lost everything the aborting rank printed (its traceback,
# this module's message, even lines flushed seconds earlier). Output already in the pipe is
# forwarded within milliseconds once the proxy gets to it, so a short pause makes it arrive.
# How long a wait polls MPI_Test before it starts sleeping (seconds). Polling keeps small
# collectives near raw mpi4py's latency; sleeping afterwards keeps oversubscribed ranks fair.
_SPIN_S = float(os.environ.get("NEURAL_ARCH_MPI_SPIN_S", "0.001"))
ABORT_OUTPUT_GRACE_S = 0.5


def _abort_if_broken() -> None:
    """atexit: a pending MPI operation would make MPI_Finalize hang; end the whole job instead."""
    if not _BROKEN:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or replaced stream must not stop the abort
            stream.flush()
    sys.stderr.write(f"neural_arch MPI backend: {_BROKEN[0]} never completed; aborting the MPI job "
                     "(MPI cannot cancel a started collective, and MPI_Finalize would hang)\n")
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    time.sleep(ABORT_OUTPUT_GRACE_S)
    _mpi().COMM_WORLD.Abort(1)


def _bytes(a):
    """A flat uint8 view of a C-contiguous array (0-d and empty arrays included)."""
    return a.reshape(-1).view(np.uint8 if isinstance(a, np.ndarray) else _cupy().uint8)


def _cupy():
    import cupy

    return cupy


class MPIBackend(Backend):
    """One MPI communicator (``COMM_WORLD``'s duplicate, or a ``Split`` of it)."""

    name = "mpi"
    devices = ("cpu", "cuda")

    def __init__(self, comm, timeout: float = 300.0, group_ranks=None, debug=None, presence=None):
        super().__init__(comm.Get_rank(), comm.Get_size(), timeout, group_ranks, debug)
        MPI = _mpi()
        self.comm = comm
        #: answers peers' "what are you doing?" (shared by the world and its sub-groups)
        self._presence: _Presence | None = presence
        self._owns_presence = False
        self._MPI = MPI
        # Below THREAD_MULTIPLE, two threads (caller + progress thread) must not call MPI at once.
        self._mpi_lock = (threading.RLock() if MPI.Query_thread() < MPI.THREAD_MULTIPLE
                          else contextlib.nullcontext())
        query = getattr(MPI, "Query_cuda_support", None)
        self.cuda_aware = bool(query()) if query is not None else False
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.MAX: MPI.MAX,
                     ReduceOp.MIN: MPI.MIN, ReduceOp.PRODUCT: MPI.PROD}
        self.transport = "mpi"

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        # find_spec does not import mpi4py.MPI, so MPI is not initialised by asking.
        return importlib.util.find_spec("mpi4py") is not None

    @classmethod
    def create(cls, store=None, rank: int | None = None, world_size: int | None = None,
               timeout: float = 300.0, rendezvous_timeout: float | None = None, **options) -> MPIBackend:
        """The world communicator. MPI decides rank and size; explicit ones must agree.

        ``store`` is unused (MPI has its own rendezvous). Every rank must call this: it first
        waits (up to ``rendezvous_timeout``) for all ranks in a nonblocking barrier, then
        duplicates ``COMM_WORLD`` so our traffic never matches the user's own MPI messages.
        """
        global _ATEXIT_INSTALLED
        MPI = _mpi()
        world = MPI.COMM_WORLD
        if world_size is not None and int(world_size) != world.Get_size():
            raise ValueError(f"backend 'mpi': world_size={world_size} but MPI started {world.Get_size()} "
                             "processes; under mpiexec MPI decides the world (omit world_size, or use "
                             f"mpiexec -n {world_size})")
        if rank is not None and int(rank) != world.Get_rank():
            raise ValueError(f"backend 'mpi': rank={rank} but this is MPI rank {world.Get_rank()}; "
                             "under mpiexec MPI decides the rank (omit rank)")
        if not _ATEXIT_INSTALLED:
            atexit.register(_abort_if_broken)
            _ATEXIT_INSTALLED = True
        wait = float(rendezvous_timeout if rendezvous_timeout is not None else timeout)
        probe = cls(world, timeout)
        info = OpInfo("rendezvous (mpi barrier)", 0, list(range(world.Get_size())), world.Get_rank(),
                      deadline=time.monotonic() + wait)
        probe._wait([world.Ibarrier()], info)
        backend = cls(world.Dup(), timeout)
        if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            backend._presence = _Presence(MPI, world.Dup())
            backend._owns_presence = True
        return backend

    def describe(self) -> dict:
        MPI = self._MPI
        return {"library": MPI.Get_library_version().splitlines()[0].strip(),
                "standard": "{}.{}".format(*MPI.Get_version()), "thread_level": MPI.Query_thread(),
                "cuda_aware": self.cuda_aware, "processor": MPI.Get_processor_name()}

    # -- the polling loop that makes MPI interruptible ----------------------------------------------
    def _wait(self, requests, info: OpInfo, peer: int | None = None, status=None) -> None:
        """Poll ``requests`` until all completed, or raise CollectiveTimeoutError at the deadline."""
        MPI = self._MPI
        start, delay = time.monotonic(), 0.0
        spin_until = start + _SPIN_S
        key = object()
        if self._presence is not None:
            self._presence.enter(key, info)  # described only when a peer asks: saves ~5 us per op
        try:
            while True:
                try:
                    with self._mpi_lock:
                        done = (requests[0].Test(status) if len(requests) == 1
                                else MPI.Request.Testall(requests))
                except MPI.Exception as exc:
                    raise DistributedError(f"{info.describe()} on group {list(info.group_ranks)} failed inside "
                                           f"MPI on rank {info.rank}: {exc.Get_error_string()}") from None
                if done:
                    return
                now = time.monotonic()
                if now >= info.deadline:
                    raise self._timeout(info, now - start, peer)
                if now < spin_until:
                    # Poll for latency: any time.sleep(), even sleep(0), costs ~50-60 us on Linux
                    # (timer slack), more than a whole small MPI collective. sched_yield lets other
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
        if peer is not None:
            exc = info.timeout_error([self.global_rank(peer)], waited)
            return CollectiveTimeoutError(f"{exc} {tail}")
        group = list(info.group_ranks)
        others = [r for r in group if r != info.rank]
        answers = self._presence.ask(others) if self._presence is not None else {}
        if not answers:
            return CollectiveTimeoutError(
                f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: some of "
                f"ranks {others} did not arrive (MPI does not report which; rank {info.rank} was waiting). {tail}")
        mine = _where(info)
        waiting = [info.rank] + [r for r in others if mine in (answers.get(r) or "")]
        missing = [r for r in others if r not in waiting]
        doing = "; ".join(f"rank {r} is {answers[r]}" if answers.get(r) else
                          f"rank {r} did not answer (dead, or not making MPI progress)" for r in missing)
        return CollectiveTimeoutError(
            f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: ranks "
            f"{missing} did not arrive; ranks {sorted(waiting)} were waiting ({doing}). {tail}")

    # -- staging (CuPy without CUDA-aware MPI) and reduction dtypes --------------------------------
    def _host(self, a):
        if a is None or isinstance(a, np.ndarray):
            return a
        if self.cuda_aware:
            _cupy().cuda.get_current_stream().synchronize()  # MPI reads the buffer outside CUDA streams
            return a
        return a.get()

    @staticmethod
    def _back(dst, host) -> None:
        if dst is not None and host is not dst:
            dst.set(host)

    @staticmethod
    def _reducible(a):
        """The array MPI reduces: float16 widened to float32 (a copy), bool as uint8 (a view)."""
        if a.dtype == np.float16:
            return a.astype(np.float32).reshape(-1)
        if a.dtype == np.bool_:
            return a.reshape(-1).view(np.uint8)
        return a.reshape(-1)

    @staticmethod
    def _store(dst, red) -> None:
        if dst.dtype == np.float16:
            dst.reshape(-1)[...] = red

    # -- primitives --------------------------------------------------------------------------------
    def _allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        host = self._host(array)
        red = self._reducible(host)
        with self._mpi_lock:
            req = self.comm.Iallreduce(self._MPI.IN_PLACE, red, self._ops[op])
        self._wait([req], info)
        if op is ReduceOp.AVG:
            finish_average(red, self._size)
        self._store(host, red)
        self._back(array, host)

    def _reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        host = self._host(array)
        red = self._reducible(host)
        with self._mpi_lock:
            if self._rank == root:
                req = self.comm.Ireduce(self._MPI.IN_PLACE, red, self._ops[op], root)
            else:
                req = self.comm.Ireduce(red, None, self._ops[op], root)
        self._wait([req], info)
        if self._rank == root:
            if op is ReduceOp.AVG:
                finish_average(red, self._size)
            self._store(host, red)
            self._back(array, host)

    def _reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        host_in, host_out = self._host(input), self._host(output)
        red_in, red_out = self._reducible(host_in), self._reducible(host_out)
        with self._mpi_lock:
            req = self.comm.Ireduce_scatter_block(red_in, red_out, self._ops[op])
        self._wait([req], info)
        if op is ReduceOp.AVG:
            finish_average(red_out, self._size)
        self._store(host_out, red_out)
        self._back(output, host_out)

    def _broadcast(self, array, root: int, info: OpInfo) -> None:
        host = self._host(array)
        with self._mpi_lock:
            req = self.comm.Ibcast(_bytes(host), root)
        self._wait([req], info)
        self._back(array, host)

    def _allgather(self, output, input, info: OpInfo) -> None:
        host_in, host_out = self._host(input), self._host(output)
        with self._mpi_lock:
            req = self.comm.Iallgather(_bytes(host_in), _bytes(host_out))
        self._wait([req], info)
        self._back(output, host_out)

    def _gather(self, output, input, root: int, info: OpInfo) -> None:
        host_in = self._host(input)
        host_out = self._host(output) if self._rank == root else None
        with self._mpi_lock:
            req = self.comm.Igather(_bytes(host_in), None if host_out is None else _bytes(host_out), root)
        self._wait([req], info)
        self._back(output if self._rank == root else None, host_out)

    def _scatter(self, output, input, root: int, info: OpInfo) -> None:
        host_out = self._host(output)
        host_in = self._host(input) if self._rank == root else None
        with self._mpi_lock:
            req = self.comm.Iscatter(None if host_in is None else _bytes(host_in), _bytes(host_out), root)
        self._wait([req], info)
        self._back(output, host_out)

    def _alltoall(self, output, input, info: OpInfo) -> None:
        host_in, host_out = self._host(input), self._host(output)
        with self._mpi_lock:
            req = self.comm.Ialltoall(_bytes(host_in), _bytes(host_out))
        self._wait([req], info)
        self._back(output, host_out)

    def _barrier(self, info: OpInfo) -> None:
        with self._mpi_lock:
            req = self.comm.Ibarrier()
        self._wait([req], info)

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
        # Comm.Split blocks uninterruptibly: wait for everyone in a nonblocking barrier first,
        # so a rank that never calls new_group gives a timeout error instead of a hang.
        with self._mpi_lock:
            req = self.comm.Ibarrier()
        self._wait([req], info)
        member = self._rank in ranks
        with self._mpi_lock:
            sub = self.comm.Split(0 if member else MPI.UNDEFINED, ranks.index(self._rank) if member else 0)
        if not member:
            return None
        return MPIBackend(sub, self.timeout, [self.group_ranks[r] for r in ranks], self.debug, self._presence)

    def _shutdown(self) -> None:
        if self._owns_presence and self._presence is not None:
            self._presence.stop()
        # Freeing a communicator with a pending (timed-out) request is erroneous: leave it to Abort.
        if self._fatal is None and not _BROKEN and self.comm != self._MPI.COMM_WORLD:
            try:
                with self._mpi_lock:
                    self.comm.Free()
            except self._MPI.Exception:
                pass


# ---------------------------------------------------------------------------------- presence
_QUERY_TAG, _REPLY_TAG = 1, 2
_STATUS_LEN = 1024


def _where(info: OpInfo) -> str:
    """How a rank describes the operation it waits in (peers compare these strings)."""
    return f"in {info.describe()} on group {list(info.group_ranks)}"


class _Presence:
    """A daemon thread answering peers' "what are you doing?" on a private communicator.

    Why: MPI itself never says which ranks are missing from a collective. With this, the
    timeout error of rank 0 can say "ranks [2] did not arrive (rank 2 is in barrier #7 on
    group [0, 1, 2])" or "rank 2 did not answer". Replies are fixed-size UTF-8 byte buffers
    (no pickle). Needs MPI_THREAD_MULTIPLE; without it, errors fall back to "some of ranks".
    """

    def __init__(self, MPI, comm):
        self.MPI, self.comm = MPI, comm
        self._active: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="neural_arch-mpi-presence")
        self._thread.start()

    def enter(self, key, info: OpInfo) -> None:
        with self._lock:
            self._active[key] = info

    def leave(self, key) -> None:
        with self._lock:
            self._active.pop(key, None)

    def _snapshot(self) -> bytes:
        with self._lock:
            text = "; ".join(_where(info) for info in self._active.values())
        text = text or "idle (in no neural_arch operation)"
        return text.encode()[:_STATUS_LEN]

    def _serve(self) -> None:
        MPI = self.MPI
        query, status, sending = np.zeros(1, np.int64), MPI.Status(), []
        pending = self.comm.Irecv(query, MPI.ANY_SOURCE, _QUERY_TAG)
        try:
            while not self._stop.is_set():
                sending = [(req, buf) for req, buf in sending if not req.Test()]
                if pending.Test(status):
                    reply = np.zeros(_STATUS_LEN, np.uint8)
                    text = self._snapshot()
                    reply[:len(text)] = np.frombuffer(text, np.uint8)
                    sending.append((self.comm.Isend(reply, status.Get_source(), _REPLY_TAG), reply))
                    pending = self.comm.Irecv(query, MPI.ANY_SOURCE, _QUERY_TAG)
                else:
                    time.sleep(0.02)  # a query is rare: 50 polls a second cost nothing
        except Exception:  # noqa: BLE001 - never let diagnostics kill the process  # pragma: no cover
            return
        pending.Cancel()

    def ask(self, peers: list[int], wait: float = 2.0) -> dict:
        """``{peer: what it says it is doing}``; peers that do not answer within ``wait`` s map to None."""
        asks = {}
        for p in peers:
            reply = np.zeros(_STATUS_LEN, np.uint8)
            recv = self.comm.Irecv(reply, p, _REPLY_TAG)
            send = self.comm.Isend(np.zeros(1, np.int64), p, _QUERY_TAG)
            asks[p] = (recv, send, reply)
        answers: dict = {p: None for p in peers}
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(a is None for a in answers.values()):
            for p, (recv, _send, reply) in asks.items():
                if answers[p] is None and recv.Test():
                    answers[p] = bytes(reply).rstrip(b"\0").decode(errors="replace")
            time.sleep(0.01)
        for p, (recv, send, _reply) in asks.items():
            if answers[p] is None:
                recv.Cancel()
                send.Cancel()
        return answers

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
