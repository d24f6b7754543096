"""NCCL backend: CuPy arrays on NVIDIA GPUs, through ``cupy.cuda.nccl``.

Requirements: ``pip install 'neural_arch[gpu]'`` (CuPy for CUDA 12), the NCCL library
(``pip install "nvidia-nccl-cu12>=2.18"``) and at least one GPU. Importing this module
never needs any of them; :meth:`NCCLBackend.is_available` says whether they are there,
and :meth:`NCCLBackend.create` says exactly which one is missing.

Example (one process per GPU, started by the launcher or ``mpiexec``)::

    from neural_arch.distributed.rendezvous.store import TCPStore
    from neural_arch.distributed.comm.nccl.backend import NCCLBackend
    store = TCPStore("127.0.0.1", 29500, world_size=2, is_master=(rank == 0))
    backend = NCCLBackend.create(store, rank, world_size=2, timeout=60)
    grads = cupy.ones(1024, dtype=cupy.float32)
    backend.allreduce(grads, ReduceOp.AVG)        # in place, on the GPU

How an operation runs (and what it costs)
-----------------------------------------
1. **Rendezvous.** Rank 0 calls ``nccl.get_unique_id()`` and publishes it as plain bytes
   (:func:`~neural_arch.distributed.comm.nccl.support.encode_unique_id`, no pickle) under ``nccl/uid``
   in the store; the others read it.
   The device is ``LOCAL_RANK % device_count`` unless ``device=`` says otherwise. Creating the
   communicator blocks until every rank joins, so it runs on a helper thread joined with the
   timeout: a missing rank is a :class:`~neural_arch.distributed.errors.RendezvousError`, never a hang.
2. **Ordering.** Each backend owns one non-blocking *communication stream*. When an op is
   *submitted* (in the caller's thread, see :meth:`NCCLBackend._new_info`) an event is
   recorded on the caller's current stream; the primitive makes the comm stream wait on it,
   so NCCL reads the inputs only after the compute kernels that wrote them. Compute kernels
   the caller launches afterwards are not delayed by the communication (they overlap).
3. **Completion and timeouts.** ``base.Backend._run`` treats a primitive's return as
   "done", so each primitive records a *done* event on the comm stream and polls it
   (``event.done`` + ``comm.check_async_error()``), spinning briefly and then sleeping with
   a back-off capped at 1 ms, until ``info.deadline``. Past the deadline the communicator is
   aborted (``comm.abort()``) and a :class:`~neural_arch.distributed.errors.CollectiveTimeoutError`
   is raised; an asynchronous NCCL error aborts it and raises
   :class:`~neural_arch.distributed.errors.PeerFailureError`. A host call that
   itself blocks (lazy connection set-up, ``commSplit``) is covered by a watchdog thread that
   aborts the communicator at the deadline, which makes the blocked call return.
4. **Cost of this design.** A synchronous op blocks its host thread until the GPU finished
   it (not merely until it was enqueued), adding up to ~1 ms of polling latency; an async op
   (``async_op=True``) is polled on the group's progress thread instead, so the caller keeps
   launching kernels. Because the Work completes only once the data is final, ``result()``
   is valid on *every* stream with no further synchronisation. Stream-ordered completion
   (a ``wait()`` that only makes the caller's stream wait on the done event) needs a hook in
   ``base.Backend._run``; see ``docs/gpu.md``.

The pure helpers (dtype/op tables, unique-id encoding, device choice, the poller, the watchdog)
live in :mod:`._nccl_support` and are re-exported here; they are unit-tested without a GPU.

Limits: tags of ``send``/``recv`` are ignored (NCCL matches point-to-point messages by order
per peer); a blocking ``send`` completes only once the peer posted its ``recv``, so exchange
data with ``alltoall`` or sub-groups rather than with crossed blocking send/recv pairs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.nccl.support import (
    SPLIT_MIN_VERSION,
    UID_STORE_KEY,
    _import_nccl,
    _Watchdog,
    decode_unique_id,
    encode_unique_id,
    local_rank_from_env,
    missing_requirement,
    nccl_dtype,
    nccl_reduce_op,
    poll_until,
    select_device,
    version_tuple,
)
from neural_arch.distributed.comm.work import OpInfo, ReduceOp
from neural_arch.distributed.errors import (
    CollectiveTimeoutError,
    DistributedError,
    PeerFailureError,
    RendezvousError,
)

_log = logging.getLogger(__name__)


class NCCLBackend(Backend):
    """One group's NCCL communicator, bound to one GPU. Build it with :meth:`create`.

    Example::

        store = TCPStore(master_addr, 29500, world_size=world_size, is_master=(rank == 0))
        backend = NCCLBackend.create(store, rank, world_size=world_size, timeout=60)
        backend.allreduce(cupy.ones(1024, dtype=cupy.float32), ReduceOp.AVG)
    """

    name = "nccl"
    devices = ("cuda",)

    def __init__(self, comm, rank: int, size: int, timeout: float, device_id: int, *, cupy, nccl,
                 group_ranks: Sequence[int] | None = None, store=None, debug=None):
        super().__init__(rank, size, timeout, group_ranks=group_ranks, debug=debug)
        self._cp, self._nccl, self._comm = cupy, nccl, comm
        self._device_id = int(device_id)
        self._store = store
        self._groups_made = 0
        self._version = version_tuple(nccl.get_version())
        self._comm_lock = threading.Lock()   # NCCL communicators are not thread-safe
        self._aborted = False
        self._watchdog = _Watchdog(self._abort, f"neural_arch-nccl-watchdog-r{rank}")
        with cupy.cuda.Device(self._device_id):
            self._stream = cupy.cuda.Stream(non_blocking=True)
            self._one = cupy.zeros(1, dtype=cupy.int32)    # barrier payload, allocated once

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        """CuPy imports, CuPy finds libnccl, and CUDA sees a GPU. Never raises."""
        try:
            return missing_requirement() is None
        except Exception:  # noqa: BLE001 - availability checks must never fail
            return False

    @classmethod
    def create(cls, store, rank: int, world_size: int, timeout: float = 300.0, device=None,
               group_ranks: Sequence[int] | None = None, store_key: str = UID_STORE_KEY,
               debug=None, **options) -> NCCLBackend:
        """Rendezvous through ``store`` and build the communicator (every rank must call it)."""
        missing = missing_requirement()
        if missing is not None:
            raise DistributedError(f"the 'nccl' backend cannot start on rank {rank}: {missing}. "
                                   "Use backend='gloo' to train on CPU.")
        if options:
            raise TypeError(f"NCCLBackend.create got unknown options {sorted(options)}")
        cp, nccl = _import_nccl()
        device_id = select_device(local_rank_from_env(rank), int(cp.cuda.runtime.getDeviceCount()), device)
        cp.cuda.Device(device_id).use()   # the caller's compute lands on the same GPU as its comm
        deadline = time.monotonic() + float(timeout)
        if rank == 0:
            uid = nccl.get_unique_id()
            store.set(store_key, encode_unique_id(uid))
        uid = decode_unique_id(store.get(store_key))
        _refuse_shared_gpus(store, store_key, rank, world_size, device_id, group_ranks, deadline)
        comm = _init_comm(cp, nccl, world_size, uid, rank, device_id, deadline, group_ranks)
        return cls(comm, rank, world_size, timeout, device_id, cupy=cp, nccl=nccl,
                   group_ranks=group_ranks, store=store, debug=debug)

    @property
    def device(self) -> str:
        return f"cuda:{self._device_id}"

    @property
    def nccl_version(self) -> tuple:
        return self._version

    # -- submission hooks (caller's thread) ---------------------------------------------------
    def _check_array(self, x, arg: str, writable: bool = False) -> None:
        super()._check_array(x, arg, writable)
        dev = getattr(getattr(x, "device", None), "id", self._device_id)
        if dev != self._device_id:
            raise ValueError(f"{arg} lives on cuda:{dev} but this NCCL group uses cuda:{self._device_id}; "
                             f"move it with cupy.asarray under cupy.cuda.Device({self._device_id})")

    def _new_info(self, name: str, array=None, root=None, op=None, p2p=False) -> OpInfo:
        info = super()._new_info(name, array, root=root, op=op, p2p=p2p)
        # Recorded here, in the caller's thread, because CuPy's current stream is per thread:
        # on the progress thread it would be the wrong (default) stream.
        info.extra["ready"] = self._record_on_current_stream()
        return info

    def _record_on_current_stream(self):
        cp = self._cp
        with cp.cuda.Device(self._device_id):
            event = cp.cuda.Event(disable_timing=True)
            event.record(cp.cuda.get_current_stream())
        return event

    # -- the engine: enqueue on the comm stream, then poll ----------------------------------------
    def _launch(self, info: OpInfo, enqueue: Callable[[int], None], after: Callable | None = None) -> None:
        """Run ``enqueue(stream_ptr)`` on the comm stream after the caller's work; wait for it."""
        if self._aborted or self._comm is None:
            raise DistributedError(f"{info.describe()}: the NCCL communicator was aborted by an earlier "
                                   "failure; destroy the process group and restart")
        cp, stream = self._cp, self._stream
        started = info.deadline - self.timeout if info.deadline != float("inf") else time.monotonic()
        with cp.cuda.Device(self._device_id):
            ready = info.extra.get("ready")
            if ready is None:   # ops built outside _new_info (the debug check): order after now
                ready = self._record_on_current_stream()
            stream.wait_event(ready)
            with self._comm_lock:
                self._watchdog.arm(info.deadline)
                try:
                    enqueue(stream.ptr)
                except Exception as exc:
                    if self._watchdog.disarm():
                        raise self._timeout_error(info, started, "while enqueueing") from exc
                    raise self._nccl_failure(info, exc) from exc
                if self._watchdog.disarm():
                    raise self._timeout_error(info, started, "while enqueueing")
            if after is not None:
                with stream:
                    after()            # e.g. the AVG divide, ordered after the reduction
            done = cp.cuda.Event(disable_timing=True)
            done.record(stream)
        try:
            finished = poll_until(lambda: done.done, self._check_async, info.deadline)
        except PeerFailureError:
            raise
        except Exception as exc:
            raise self._nccl_failure(info, exc) from exc
        if not finished:
            self._abort()
            raise self._timeout_error(info, started, "waiting for the GPU")

    def _check_async(self) -> None:
        try:
            self._comm.check_async_error()
        except Exception as exc:
            self._abort()
            raise PeerFailureError(
                f"NCCL reported an asynchronous error ({exc}) on rank {self.group_ranks[self._rank]}; "
                "a peer probably died or the network failed. The communicator was aborted: "
                "destroy the process group and restart the job") from exc

    def _abort(self) -> None:
        if self._aborted:
            return
        self._aborted = True
        comm = self._comm
        if comm is not None:
            try:
                comm.abort()
            except Exception as exc:  # noqa: BLE001 - aborting is best effort by nature
                _log.debug("ncclCommAbort failed: %s", exc)

    def _timeout_error(self, info: OpInfo, started: float, stage: str) -> CollectiveTimeoutError:
        me = self.group_ranks[self._rank]
        others = [r for r in self.group_ranks if r != me]
        return CollectiveTimeoutError(
            f"{info.describe()} on group {list(self.group_ranks)} timed out after "
            f"{time.monotonic() - started:.1f} s on rank {me} ({stage}): NCCL cannot tell which ranks "
            f"did not arrive; suspects are ranks {others}. The NCCL communicator was aborted, so destroy "
            "the process group and restart. Check that every rank calls the same collectives in the same "
            "order, or raise the timeout with init_process_group(timeout=...).")

    def _nccl_failure(self, info: OpInfo, exc: BaseException) -> DistributedError:
        if isinstance(exc, DistributedError):
            return exc
        return DistributedError(f"{info.describe()} failed in NCCL on rank {self.group_ranks[self._rank]}: "
                                f"{type(exc).__name__}: {exc}")

    def _codes(self, array, op=None) -> tuple:
        dtype = nccl_dtype(array.dtype, self._nccl)
        if op is None:
            return dtype, None, False
        code, divide = nccl_reduce_op(op, self._nccl, self._version)
        return dtype, code, divide

    def _device_array(self, array):
        """CuPy arrays pass through; NumPy ones (the base class's debug table) are staged."""
        if isinstance(array, np.ndarray):
            with self._cp.cuda.Device(self._device_id):
                return self._cp.asarray(array), True
        return array, False

    # -- primitives ------------------------------------------------------------------------------
    def _allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        if array.size == 0:
            return
        dtype, code, divide = self._codes(array, op)
        ptr = array.data.ptr
        self._launch(info, lambda s: self._comm.allReduce(ptr, ptr, array.size, dtype, code, s),
                     after=(lambda: array.__itruediv__(self._size)) if divide else None)

    def _broadcast(self, array, root: int, info: OpInfo) -> None:
        if array.size == 0:
            return
        dtype, _, _ = self._codes(array)
        ptr = array.data.ptr
        self._launch(info, lambda s: self._comm.broadcast(ptr, ptr, array.size, dtype, root, s))

    def _reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        if array.size == 0:
            return
        dtype, code, divide = self._codes(array, op)
        ptr = array.data.ptr
        divide = divide and self._rank == root   # only the root holds the sum
        self._launch(info, lambda s: self._comm.reduce(ptr, ptr, array.size, dtype, code, root, s),
                     after=(lambda: array.__itruediv__(self._size)) if divide else None)

    def _allgather(self, output, input, info: OpInfo) -> None:
        out, staged_out = self._device_array(output)
        inp, _ = self._device_array(input)
        if inp.size:
            dtype, _, _ = self._codes(inp)
            self._launch(info, lambda s: self._comm.allGather(inp.data.ptr, out.data.ptr, inp.size, dtype, s))
        if staged_out:
            output[...] = self._cp.asnumpy(out)

    def _reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        if output.size == 0:
            return
        dtype, code, divide = self._codes(input, op)
        self._launch(info, lambda s: self._comm.reduceScatter(input.data.ptr, output.data.ptr, output.size,
                                                              dtype, code, s),
                     after=(lambda: output.__itruediv__(self._size)) if divide else None)

    def _grouped(self, info: OpInfo, sends: list, recvs: list, local: Callable | None = None) -> None:
        """One ncclGroupStart/End around several sends and recvs: no ordering deadlock among them."""
        nccl = self._nccl
        sends = [(a, peer) for a, peer in sends if a.size]
        recvs = [(a, peer) for a, peer in recvs if a.size]

        def enqueue(s):
            nccl.groupStart()
            try:
                for a, peer in sends:
                    self._comm.send(a.data.ptr, a.size, nccl_dtype(a.dtype, nccl), peer, s)
                for a, peer in recvs:
                    self._comm.recv(a.data.ptr, a.size, nccl_dtype(a.dtype, nccl), peer, s)
            finally:
                nccl.groupEnd()
        # Even with nothing to send (empty chunks) the local copy must run after the caller's work.
        self._launch(info, enqueue if (sends or recvs) else (lambda s: None), after=local)

    def _send(self, array, dst: int, tag: int, info: OpInfo) -> None:
        self._grouped(info, [(array, dst)], [])

    def _recv(self, array, src: int, tag: int, info: OpInfo) -> None:
        self._grouped(info, [], [(array, src)])

    def _sendrecv(self, send_array, dst: int, recv_array, src: int, tag: int, info: OpInfo) -> None:
        self._grouped(info, [(send_array, dst)], [(recv_array, src)])

    def _alltoall(self, output, input, info: OpInfo) -> None:
        n, me = input.shape[0] // self._size, self._rank
        peers = [p for p in range(self._size) if p != me]
        chunk = lambda a, p: a[p * n:(p + 1) * n]
        self._grouped(info, [(chunk(input, p), p) for p in peers], [(chunk(output, p), p) for p in peers],
                      local=lambda: chunk(output, me).__setitem__(Ellipsis, chunk(input, me)))

    def _alltoallv(self, output, input, output_splits: list, input_splits: list, info: OpInfo) -> None:
        """Uneven all-to-all as torch's ProcessGroupNCCL runs it (``all2all_single_unequal_split``):
        inside one ``ncclGroupStart``/``ncclGroupEnd``, one ``ncclSend`` of ``input_splits[d]`` rows to
        every peer d and one ``ncclRecv`` of ``output_splits[s]`` rows from every peer s, each on a
        row slice of the caller's buffer, so no padded copy exists and only the real rows move; empty
        blocks post nothing, and this rank's own block is a device copy ordered after the exchange.

        NCCL matches a send with the peer's receive by order alone, so splits that disagree between
        peers are not detected before data moves (NCCL errors or hangs until the timeout aborts the
        communicator); callers that cannot trust the splits exchange them first, as
        ``dist.all_to_all_single`` does.

        Example (2 ranks; rank 0 keeps 1 row and sends 2, rank 1 sends 3 and keeps 1)::

            backend.alltoallv(out, inp, output_split_sizes=[1, 3], input_split_sizes=[1, 2])   # rank 0
        """
        me = self._rank
        send_at = [0, *accumulate(input_splits)]
        recv_at = [0, *accumulate(output_splits)]
        sends = [(input[send_at[p]:send_at[p + 1]], p) for p in range(self._size) if p != me and input_splits[p]]
        recvs = [(output[recv_at[p]:recv_at[p + 1]], p) for p in range(self._size) if p != me and output_splits[p]]
        local = None
        if input_splits[me]:
            own_in = input[send_at[me]:send_at[me + 1]]
            own_out = output[recv_at[me]:recv_at[me + 1]]
            local = lambda: own_out.__setitem__(Ellipsis, own_in)   # one device copy, after the exchange
        self._grouped(info, sends, recvs, local=local)

    def _gather(self, output, input, root: int, info: OpInfo) -> None:
        if self._rank != root:
            return self._grouped(info, [(input, root)], [])
        others = [p for p in range(self._size) if p != root]
        self._grouped(info, [], [(output[p], p) for p in others],
                      local=lambda: output[root].__setitem__(Ellipsis, input))

    def _scatter(self, output, input, root: int, info: OpInfo) -> None:
        if self._rank != root:
            return self._grouped(info, [], [(output, root)])
        others = [p for p in range(self._size) if p != root]
        self._grouped(info, [(input[p], p) for p in others], [],
                      local=lambda: output.__setitem__(Ellipsis, input[root]))

    def _barrier(self, info: OpInfo) -> None:
        one = self._one      # MAX keeps it 0 forever: no overflow after many barriers
        self._launch(info, lambda s: self._comm.allReduce(one.data.ptr, one.data.ptr, 1,
                                                          int(self._nccl.NCCL_INT32), int(self._nccl.NCCL_MAX), s))

    # -- object collectives: the base class stages through NumPy, which NCCL cannot move --------
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Pickle ``obj`` on ``root`` and return it everywhere (trusted peers only), via the GPU."""
        import pickle
        self._check_rank(root, "root")
        if self._size == 1:
            return obj
        cp = self._cp
        with cp.cuda.Device(self._device_id):
            payload = (np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if self._rank == root
                       else np.zeros(0, np.uint8))
            length = cp.asarray(np.array([payload.size], dtype=np.int64))
            self.broadcast(length, root)
            data = cp.asarray(payload) if self._rank == root else cp.empty(int(length.get()[0]), cp.uint8)
            self.broadcast(data, root)
            return obj if self._rank == root else pickle.loads(cp.asnumpy(data).tobytes())

    def allgather_object(self, obj: Any) -> list:
        """Every rank's ``obj`` in rank order (trusted peers only), via the GPU."""
        import pickle
        if self._size == 1:
            return [obj]
        cp = self._cp
        with cp.cuda.Device(self._device_id):
            payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
            lengths = cp.zeros((self._size, 1), dtype=cp.int64)
            self.allgather(lengths, cp.asarray(np.array([payload.size], dtype=np.int64)))
            lengths = cp.asnumpy(lengths)[:, 0]
            padded = np.zeros(int(lengths.max()), dtype=np.uint8)
            padded[:payload.size] = payload
            table = cp.zeros((self._size, padded.size), dtype=cp.uint8)
            self.allgather(table, cp.asarray(padded))
            table = cp.asnumpy(table)
        return [pickle.loads(table[r, :int(lengths[r])].tobytes()) for r in range(self._size)]

    # -- groups and teardown -------------------------------------------------------------------
    def _use_split(self) -> bool:
        return hasattr(self._comm, "commSplit") and self._version >= SPLIT_MIN_VERSION

    def _new_group(self, ranks) -> NCCLBackend | None:
        self._groups_made += 1      # same count on every rank: all ranks call new_group in order
        member = self._rank in ranks
        group_ranks = [self.group_ranks[r] for r in ranks]
        store = None
        if self._store is not None:
            from neural_arch.distributed.rendezvous.store import (
                PrefixStore,  # lazy: backends import without the store module
            )
            store = PrefixStore(f"nccl/group{self._groups_made}", self._store)
        if self._use_split():
            # Collective over *this* communicator: every rank calls it, non-members with color -1
            # (CuPy returns None for them). Run through _run so it queues behind pending async ops:
            # ncclCommSplit must not overlap outstanding operations on the parent communicator.
            info = self._new_info("new_group")
            color = 0 if member else int(getattr(self._nccl, "NCCL_SPLIT_NOCOLOR", -1))
            holder: list = []
            self._run(info, lambda: self._launch(info, lambda _s: holder.append(
                self._comm.commSplit(color, self._rank))), async_op=False)
            if not member:
                return None
            comm = holder[0]
        else:
            if not member:
                return None
            if store is None:
                raise DistributedError("new_group on the 'nccl' backend needs the rendezvous store "
                                       "(build the backend with NCCLBackend.create)")
            sub_rank = ranks.index(self._rank)
            if sub_rank == 0:
                store.set(UID_STORE_KEY, encode_unique_id(self._nccl.get_unique_id()))
            uid = decode_unique_id(store.get(UID_STORE_KEY))
            comm = _init_comm(self._cp, self._nccl, len(ranks), uid, sub_rank, self._device_id,
                              time.monotonic() + self.timeout, group_ranks)
        return NCCLBackend(comm, ranks.index(self._rank), len(ranks), self.timeout, self._device_id,
                           cupy=self._cp, nccl=self._nccl, group_ranks=group_ranks, store=store,
                           debug=self.debug)

    def _shutdown(self) -> None:
        self._watchdog.stop()
        comm, self._comm = self._comm, None
        if comm is None or self._aborted:
            return
        # Every op was polled to completion, so destroy has nothing to wait for; still, a
        # teardown must never hang, so it runs on a helper thread joined with a bound.
        def destroy():
            try:
                comm.destroy()
            except Exception as exc:  # noqa: BLE001 - teardown must not mask the error that caused it
                _log.debug("ncclCommDestroy failed: %s", exc)
        helper = threading.Thread(target=destroy, daemon=True, name="neural_arch-nccl-destroy")
        helper.start()
        helper.join(min(self.timeout, 30.0))


def _gpu_owner(device_id: int) -> str:
    """``host|pid|device``: what two ranks must not share (one GPU per process, NCCL's rule)."""
    from neural_arch.distributed.host import host_identity  # the one notion of "same host"

    return f"{host_identity()}|{os.getpid()}|{device_id}"


def _refuse_shared_gpus(store, store_key: str, rank: int, size: int, device_id: int,
                        group_ranks: Sequence[int] | None, deadline: float) -> None:
    """Every rank publishes the GPU it chose; two *processes* on one host that chose the same GPU
    fail here, on every rank, naming them -- instead of NCCL's "Duplicate GPU detected" deep in
    ncclCommInitRank on some ranks and a wait on the others. Ranks that have not published by the
    deadline are left to the communicator's own rendezvous timeout (it names them)."""
    ranks = list(group_ranks) if group_ranks is not None else list(range(size))
    keys = [f"{store_key}/gpu/{r}" for r in range(size)]
    store.set(keys[rank], _gpu_owner(device_id).encode())
    check = getattr(store, "check", None)
    if check is None:
        return
    while not check(keys):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)
    by_gpu: dict[tuple[str, str], dict[str, list[int]]] = {}
    for r, key in enumerate(keys):
        host, pid, dev = store.get(key).decode().rsplit("|", 2)
        by_gpu.setdefault((host, dev), {}).setdefault(pid, []).append(ranks[r])
    for (host, dev), pids in by_gpu.items():
        if len(pids) > 1:
            sharing = sorted(r for rs in pids.values() for r in rs)
            raise DistributedError(
                f"ranks {sharing} all chose cuda:{dev} on host {host.split('/')[0]}: NCCL needs one GPU per "
                f"process. Start at most as many processes per host as it has GPUs (--nproc_per_node <= "
                f"neural_arch.cuda.device_count()), give each rank its own device (device='cuda:N' or "
                f"LOCAL_RANK), or use backend='gloo', which stages CuPy arrays through the host")


def _init_comm(cp, nccl, size: int, uid: tuple, rank: int, device_id: int, deadline: float,
               group_ranks: Sequence[int] | None = None):
    """``NcclCommunicator(size, uid, rank)`` on a helper thread, joined with the deadline.

    ncclCommInitRank blocks until all ``size`` ranks called it; a rank that never comes would
    hang the caller forever. On timeout the helper thread is left behind (daemon: it cannot be
    cancelled) and a RendezvousError says so.
    """
    box: dict = {}

    def build():
        try:
            with cp.cuda.Device(device_id):   # CommInitRank binds to the *calling thread's* device
                try:
                    box["comm"] = nccl.NcclCommunicator(size, uid, rank)
                except TypeError:
                    box["comm"] = nccl.NcclCommunicator(size, bytes(v & 0xFF for v in uid), rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=build, daemon=True, name=f"neural_arch-nccl-init-r{rank}")
    thread.start()
    thread.join(max(deadline - time.monotonic(), 0.0))
    ranks = list(group_ranks) if group_ranks is not None else list(range(size))
    if thread.is_alive():
        raise RendezvousError(
            f"rank {ranks[rank]}: creating the NCCL communicator for group {ranks} did not finish before "
            "the timeout; some ranks did not join (or cannot reach this host: set NCCL_SOCKET_IFNAME, "
            "and NCCL_DEBUG=INFO to see why). Every rank must call init_process_group(backend='nccl').")
    if "error" in box:
        raise DistributedError(f"rank {ranks[rank]}: creating the NCCL communicator failed: "
                               f"{type(box['error']).__name__}: {box['error']}") from box["error"]
    return box["comm"]
