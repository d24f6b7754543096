"""Point-to-point byte transport under the gloo backend: one per process, one link per peer.

The collective algorithms (``gloo.py``) only ever call this small interface::

    t = connect_transport(store, rank, size, timeout=30.0)      # rendezvous through the store
    t.send(peer, array, channel, info)                          # returns when ``array`` may be reused
    t.recv_into(peer, out, channel, info)                       # fills ``out`` (sizes must match)
    t.sendrecv(dst, a, src, b, channel, info)                   # never deadlocks in a ring/pairwise
    h = t.isend(peer, array, channel, info); ...; h.wait()      # pipelining
    t.peer_kind(peer)                                           # "shm" or "tcp"

How it works. Each peer has a *link*
(:class:`~neural_arch.distributed.comm.gloo.transport.framing.Link`): a pair of byte streams (a TCP socket, or
two shared-memory rings) with non-blocking ``write_some``/``read_some``. On top of a stream every message is a
32-byte frame header ``(channel, nbytes, check word, op bytes)`` followed by the payload (see
:mod:`.framing`: the receiver compares all four with its own op's, so ranks that disagree get an error). There is **no
background thread**: the thread that waits drives the I/O itself (the latency-critical path never
hops threads), and every wait also pumps every pending ``isend``, so pipelined exchanges cannot
stall each other. A receiver reads the payload straight into the destination buffer when the frame
is for it; a frame for another channel is kept aside (per channel, FIFO) for whoever asks for it.
Fast path (shared memory): a message whose whole frame fits in the ring is written with one copy,
and one already complete at the ring's head is read with one copy -- no op objects, no queue, no
progress loop (it about halves a small message's one-way latency: docs/benchmarks.md,
``benchmarks/bench_transport.py shm``).

Rules a caller must know:

* messages on one (peer, channel) arrive in order; channels are independent;
* ``send`` of a large message may block until the peer reads it: exchanges must use ``sendrecv`` or
  ``isend`` (a plain send/send pair of big messages times out, it never hangs);
* every wait is bounded by ``info.deadline`` (then ``info.timeout_error([peer], waited)``); a peer that
  closed or died raises :class:`~neural_arch.distributed.errors.PeerFailureError` at once, and so
  does every later op on it;
* after any peer failure the transport is *aborted*: it tells every other rank (an abort frame), and
  every op on every rank then fails fast naming the dead rank -- nobody waits for the full timeout.

Example (two processes, after a store rendezvous)::

    t = connect_transport(store, rank, 2, timeout=30.0)
    info = OpInfo("demo", 1, [0, 1], rank, deadline=time.monotonic() + 10)
    if rank == 0:
        t.send(1, np.arange(4.0), 7, info)
    else:
        out = np.empty(4); t.recv_into(0, out, 7, info)
"""

from __future__ import annotations

import abc
import copy
import os
import select
import threading
import time
from collections.abc import Sequence

from neural_arch import config
from neural_arch.distributed.comm.gloo.transport.framing import (
    ABORT_CHANNEL,
    CHANNEL_LIMIT,
    Link,
    PeerGone,
    RecvOp,
    SendOp,
    abandon,
    as_bytes_view,
)
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.errors import (
    GroupDestroyedError,
    GroupPoisonedError,
    PeerFailureError,
    RendezvousError,
)
from neural_arch.distributed.host import host_identity

__all__ = [
    "TRANSPORT_ENV",
    "LinkTransport",
    "PeerGone",
    "Transport",
    "TransportHandle",
    "as_bytes_view",
    "connect_transport",
]

TRANSPORT_ENV = "NEURAL_ARCH_GLOO_TRANSPORT"
SPIN_ENV = "NEURAL_ARCH_SPIN_S"
_MAIN_THREAD = threading.main_thread().ident
_LIVENESS_EVERY = 0.2                 # seconds between "is the peer process still alive" checks
_SPIN_S = 200e-6                      # busy-poll this long before sleeping (when cores allow)
_MAX_SLEEP = 1e-3                     # longest nap between polls of a shared-memory ring
_POLL_SLICE = 0.1                     # longest poll() on sockets before re-checking deadline/liveness
_DOORBELL_SLICE = 2e-3                # longest sleep on a shared-memory doorbell
_RENDEZVOUS_SLICE = 0.5               # seconds between "who is still missing" checks of a rendezvous wait
_POISON_FLUSH_S = 2.0                 # longest a poisoning rank spends finishing its half-sent frames


class _Sent:
    """Stands for a send the fast path already completed (nothing left to drive)."""

    __slots__ = ()
    done = True
    link = None

    def progress(self) -> bool:
        return False

    def check(self) -> None:
        pass


_SENT = _Sent()


class TransportHandle:
    """Handle of an ``isend``: ``wait()`` drives it to completion (bounded by its op's deadline).

    Example::

        handle = transport.isend(peer, segment, channel, info)
        ...                                   # receive or reduce the previous segment meanwhile
        handle.wait()                         # ``segment`` may be reused from here
    """

    def __init__(self, transport: LinkTransport, op: SendOp, info: OpInfo):
        self._t, self._op, self._info = transport, op, info

    def is_completed(self) -> bool:
        return self._op.done

    def wait(self, timeout: float | None = None) -> None:
        info = self._info
        if timeout is not None:
            # a copy with the tighter deadline (OpInfo is a plain slotted class, not a dataclass)
            info = copy.copy(info)
            info.deadline = min(info.deadline, time.monotonic() + timeout)
        self._t._drive([self._op], info)


class Transport(abc.ABC):
    """Byte transport between the ``size`` ranks of the world (see the module docstring).

    Example::

        transport = connect_transport(store, rank, size, timeout=30.0)
        transport.sendrecv(right, send_buf, left, recv_buf, channel, info)   # one ring step
        transport.peer_kind(right)                                          # "shm" or "tcp"
    """

    rank: int
    size: int

    @abc.abstractmethod
    def send(self, peer: int, buf, channel: int, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def recv_into(self, peer: int, buf, channel: int, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def sendrecv(self, dst: int, send_buf, src: int, recv_buf, channel: int, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def isend(self, peer: int, buf, channel: int, info: OpInfo) -> TransportHandle: ...

    def interrupt_waits(self) -> None:
        """Ops other threads still wait in stop with an error naming the destroyed group (default: nothing)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def peer_kind(self, peer: int) -> str: ...


class LinkTransport(Transport):
    """The transport: one :class:`~neural_arch.distributed.comm.gloo.transport.framing.Link` per peer
    (TCP or shared memory, chosen per peer).

    Example::

        # what connect_transport builds once every link is up
        transport = LinkTransport(rank, size, {peer: link for peer, link in links.items()})
        transport.send(peer, np.arange(4.0), channel, info)
    """

    def __init__(self, rank: int, size: int, links: dict[int, Link], local_ranks: int | None = None):
        self.rank, self.size, self.links = rank, size, links
        self._closed = False
        #: set by ``interrupt_waits`` (destroy) and ``close``: an op still waiting in the progress loop
        #: (another thread's) stops with a clear error instead of reading links being closed under it
        self._closing = False
        self._driving = 0                 # threads inside ``_drive`` (close waits for them to leave)
        self._driving_done = threading.Condition()
        #: (dead rank, reporting rank, why) once any rank saw a peer fail: every op then fails fast
        self._abort: tuple | None = None
        self._abort_sent = False
        self._poisoned = False        # the abort is a poisoned group (a mismatch...), not a dead rank
        for link in links.values():
            link.on_abort = self._on_abort
        self._drain_op = RecvOp(None, memoryview(b""), -1)  # matches no frame: pulls abort frames in
        #: busy-poll this long before sleeping in poll(): a wake-up from sleep costs several times a
        #: small message's whole latency (a 1 KiB shm ping-pong, docs/benchmarks.md), but spinning
        #: steals the core a peer needs when the host is oversubscribed (measured 3-10x slower) -- so
        #: spin only when this host's ranks fit its cores and it is not already busy.
        #: ``NEURAL_ARCH_SPIN_S`` overrides.
        if local_ranks is None:
            local_ranks = 1 + sum(1 for link in links.values() if link.poll_fd() is None)
        cores = os.cpu_count() or 1
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        default = _SPIN_S if local_ranks <= cores and busy < cores else 0.0
        spin = config.get(SPIN_ENV)
        self.spin_s = default if spin is None else spin

    def peer_kind(self, peer: int) -> str:
        return self._link(peer, None).kind

    def _link(self, peer: int, info: OpInfo | None) -> Link:
        link = self.links.get(peer)
        if link is not None and link.failed is None and not self._closed and self._abort is None:
            return link
        if link is None:
            if peer == self.rank:
                raise ValueError(f"rank {self.rank} cannot send to or receive from itself; copy locally")
            raise ValueError(f"peer={peer} is not a rank of this world of {self.size}")
        if self._closed:
            raise PeerFailureError(f"the transport of rank {self.rank} was closed"
                                   + (f" (during {info.describe()})" if info else ""))
        if link.failed is not None and info is not None:
            raise self._peer_error(link, info)
        if self._abort is not None and info is not None:
            raise self._abort_error(info)
        return link

    # -- failure propagation ------------------------------------------------------------------------
    def _on_abort(self, reporter: int, payload: bytes) -> None:
        """An abort frame arrived (called with a link's reader lock held: only record it)."""
        if self._abort is None:
            dead, _, why = payload.decode("utf-8", "replace").partition("|")
            if dead.startswith("P"):      # "P<rank>|why": that rank's group was poisoned, not dead
                self._poisoned = True
                dead = dead[1:]
            self._abort = (int(dead) if dead.lstrip("-").isdigit() else -1, reporter, why)

    def poison(self, why: str) -> None:
        """This rank saw an op fail after bytes had moved: every later op here fails at once, and
        every other rank is told (an abort frame naming this rank and ``why``), so theirs do too.

        Nothing newer replaces the first failure: every rank's error names the same root cause."""
        if self._abort is None and not self._closed:
            self._poisoned = True
            self._abort = (self.rank, self.rank, why)
            self._send_abort()
            # The failed op may have left a frame half-written (its receive failed first): a peer
            # that is reading it would wait for the rest until its timeout, and the abort frame
            # queued behind it would never arrive. Nobody pumps this rank's sends once the op has
            # raised, so finish them now, briefly.
            self._flush(_POISON_FLUSH_S)

    def _flush(self, seconds: float) -> None:
        """Pump every queued send (reading what arrives meanwhile, so two flushing peers cannot
        block each other) until the queues are empty, a link failed, or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        links = self.links.values()
        while time.monotonic() < deadline and any(link.send_q and not link.failed for link in links):
            moved = False
            for link in links:
                if link.failed is None:
                    moved = link.pump_sends() or moved
                    moved = link.pump_recv(self._drain_op) or moved
            if not moved:
                time.sleep(1e-4)

    def _send_abort(self) -> None:
        """Tell every other rank (once) that the job is broken, so nobody waits for the full timeout."""
        if self._abort_sent or self._abort is None:
            return
        self._abort_sent = True
        dead, reporter, why = self._abort
        payload = memoryview(f"{'P' if self._poisoned else ''}{dead}|{why}".encode()[:4000])
        for link in self.links.values():
            if link.failed is None and link.peer not in (dead, reporter):
                op = SendOp(link, payload, ABORT_CHANNEL)
                with link.lock:
                    link.send_q.append(op)
                link.pump_sends()  # best effort; later waits and close() keep pumping

    def _abort_error(self, info: OpInfo, pending: Sequence = ()) -> PeerFailureError:
        self._send_abort()
        dead, reporter, why = self._abort
        if self._poisoned:
            waiting = sorted({op.link.peer for op in pending if op.link is not None} - {dead})
            if waiting and "CollectiveTimeoutError" in why:
                # rank ``dead`` timed out waiting, maybe for us; we were waiting for ``waiting``:
                # in a chain of waits, the rank nearest the missing one names it
                why += (f" -- and rank {self.rank}, in {info.describe()}, was itself still waiting for "
                        f"ranks {waiting}: look at those first")
            return GroupPoisonedError(
                f"{info.describe()} on rank {self.rank} cannot run: rank {dead} reported that an operation "
                "failed after data had started to move, so the job's streams may be out of step and no "
                "collective can be trusted; destroy the process group (destroy_process_group()) and "
                f"create it again on every rank. First failure (rank {dead}): {why}")
        return PeerFailureError(
            f"rank {dead} failed (rank {reporter} saw it: {why}); {info.describe()} on rank {self.rank} "
            f"cannot complete -- look at rank {dead}'s log first")

    def _peer_error(self, link: Link, info: OpInfo) -> PeerFailureError:
        if self._abort is None:
            # Before blaming this peer, read what already arrived: a peer that learned of another
            # rank's death sends every rank an abort frame naming it, then drops its links when its
            # process ends. Its abort frame is in our stream before the EOF -- but a write to it
            # fails (EPIPE/reset) without reading that stream, and the abort frame may also sit on
            # another link. Only when none names a culprit is this peer the first to have failed.
            self._read_abort_frames()
        if self._abort is not None and self._abort[0] != link.peer:
            # the link broke because its peer gave up after another rank died: name the root cause
            return self._abort_error(info)
        if self._abort is None:
            self._abort = (link.peer, self.rank, link.failed)
        self._send_abort()
        return PeerFailureError(
            f"rank {link.peer} failed during {info.describe()} on rank {self.rank} ({link.kind} link: "
            f"{link.failed}); it probably crashed or exited -- look at rank {link.peer}'s log first")

    def _read_abort_frames(self) -> None:
        """Read every link's already-arrived frames (never blocking): abort frames are recorded by
        :meth:`_on_abort`, other frames kept aside for their receivers as usual."""
        for link in self.links.values():
            if self._abort is not None:
                return
            link.pump_recv(self._drain_op)

    @staticmethod
    def _channel(channel: int) -> int:
        if type(channel) is int and 0 <= channel < CHANNEL_LIMIT:
            return channel
        channel = int(channel)
        if not 0 <= channel < CHANNEL_LIMIT:
            raise ValueError(f"channel={channel} must be a non-negative int64; map negative tags first")
        return channel

    # -- the interface ---------------------------------------------------------------------------
    def _queue_send(self, link: Link, view: memoryview, channel: int, check: int = 0, op_bytes: int = 0) -> SendOp:
        op = SendOp(link, view, channel, check, op_bytes)
        with link.lock:
            link.send_q.append(op)
        op.progress()  # start at once: whatever the stream takes now is written here
        return op

    # Fast paths: a whole frame that the stream takes at once (send) or that is already complete
    # in it (receive) moves with one copy -- no op objects, no queue, no progress loop.
    def send(self, peer: int, buf, channel: int, info: OpInfo) -> None:
        link = self._link(peer, info)
        view = as_bytes_view(buf)
        channel = self._channel(channel)
        check, op_bytes = info.wire, info.nbytes
        if link.try_send_frame(channel, view, check, op_bytes):
            return
        op = self._queue_send(link, view, channel, check, op_bytes)
        if not op.done:
            self._drive([op], info)

    def isend(self, peer: int, buf, channel: int, info: OpInfo) -> TransportHandle:
        link = self._link(peer, info)
        view = as_bytes_view(buf)
        channel = self._channel(channel)
        check, op_bytes = info.wire, info.nbytes
        if link.try_send_frame(channel, view, check, op_bytes):
            return TransportHandle(self, _SENT, info)
        return TransportHandle(self, self._queue_send(link, view, channel, check, op_bytes), info)

    def recv_into(self, peer: int, buf, channel: int, info: OpInfo) -> None:
        link = self._link(peer, info)
        view = as_bytes_view(buf, writable=True)
        channel = self._channel(channel)
        check, op_bytes = info.wire, info.nbytes
        if link.try_recv_frame(channel, view, check, op_bytes):
            return
        op = RecvOp(link, view, channel, check, op_bytes)
        op.progress()  # the message may be stashed, or only partly there
        if op.done:
            op.check()
        else:
            self._drive([op], info)

    def sendrecv(self, dst: int, send_buf, src: int, recv_buf, channel: int, info: OpInfo) -> None:
        rlink = self._link(src, info)
        rview = as_bytes_view(recv_buf, writable=True)
        channel = self._channel(channel)
        slink = self._link(dst, info)
        sview = as_bytes_view(send_buf)
        check, op_bytes = info.wire, info.nbytes
        if slink.try_send_frame(channel, sview, check, op_bytes):
            if rlink.try_recv_frame(channel, rview, check, op_bytes):
                return  # small exchange with a peer that is already there
            send = _SENT
        else:
            send = self._queue_send(slink, sview, channel, check, op_bytes)
        recv = RecvOp(rlink, rview, channel, check, op_bytes)
        recv.progress()
        if send.done and recv.done:
            recv.check()
        else:
            self._drive([send, recv], info)

    def interrupt_waits(self) -> None:
        """Ops still waiting in the progress loop (another thread's) stop within a poll slice with
        an error naming the destroyed group; new ops still run (the links stay open until ``close``)."""
        self._closing = True

    def close(self) -> None:
        """Close every link. Messages already sent are delivered (a peer reads them before EOF).

        An op another thread is still waiting in (``destroy_process_group()`` called while a recv
        or collective runs) stops within one poll slice with an error that says so; the links are
        closed only once it has left them."""
        if self._closed:
            return
        self._flush(1.0)      # give pending isends a moment to drain: a peer may still be reading them
        self.interrupt_waits()
        with self._driving_done:
            self._driving_done.wait_for(lambda: self._driving == 0, timeout=2 * _POLL_SLICE + 1.0)
        self._closed = True
        for link in self.links.values():
            try:
                link.close()
            except OSError:
                pass

    # -- the progress loop -----------------------------------------------------------------------
    def _drive(self, ops: Sequence, info: OpInfo) -> None:
        """Progress ``ops`` (and every pending send) until all are done, the deadline, or a failure."""
        with self._driving_done:
            self._driving += 1
        try:
            self._drive_until_done(ops, info)
        finally:
            with self._driving_done:
                self._driving -= 1
                if not self._driving:
                    self._driving_done.notify_all()

    def _drive_until_done(self, ops: Sequence, info: OpInfo) -> None:
        start = time.monotonic()
        last_check = start
        idle_since = None
        links = self.links.values()
        while True:
            pending = []
            progressed = False
            for op in ops:
                if not op.done:
                    if op.progress():
                        progressed = True
                    op.check()
                    if not op.done:
                        if op.link.failed is not None:
                            raise self._peer_error(op.link, info)
                        pending.append(op)
                else:
                    op.check()
            if not pending:
                return
            if self._abort is not None:
                raise self._abort_error(info, pending)
            if self._closing:
                for op in pending:
                    abandon(op)
                raise GroupDestroyedError.during(info.describe(), self.rank)
            moved = progressed
            for link in links:  # keep every pipelined isend flowing while we wait
                if link.send_q and link.pump_sends():
                    moved = True
            now = time.monotonic()
            if moved:
                idle_since = None
                continue
            if now >= info.deadline:
                for op in pending:
                    abandon(op)
                peers = sorted({op.link.peer for op in pending})
                raise info.timeout_error(peers, now - start)
            if now - last_check >= _LIVENESS_EVERY:
                last_check = now
                for op in pending:
                    try:
                        op.link.check_alive()
                    except PeerGone as exc:
                        op.link.fail(str(exc))
                        raise self._peer_error(op.link, info) from None
                # we have waited a while: read the other peers too, in case one sent an abort frame
                waiting_on = {op.link for op in pending}
                for link in links:
                    if link not in waiting_on and link.failed is None:
                        link.pump_recv(self._drain_op)
                if self._abort is not None:
                    raise self._abort_error(info, pending)
            if idle_since is None:
                idle_since = now
            self._wait(pending, now, idle_since, info.deadline)

    def _wait(self, pending, now, idle_since, deadline) -> None:
        """Sleep until a pending op can progress: poll() sockets and shared-memory doorbells."""
        left = max(0.0, deadline - now)
        if now - idle_since < self.spin_s and threading.get_ident() == _MAIN_THREAD:
            # spin (no yield: sched_yield can hand the core away for a whole time slice, and
            # time.sleep(0) naps for the kernel's timer slack); only when cores are free (see __init__)
            # and only on the main thread: a spinning progress thread would hold the GIL that the
            # training loop, overlapping compute with this communication, needs.
            # Spin on the links' own readiness checks (shared-memory counters: a few loads) rather
            # than on the whole progress loop, so an arriving message is seen after a few loads.
            watch = [(op.link, isinstance(op, SendOp)) for op in pending]
            watch += [(link, True) for link in self.links.values() if link.send_q]
            end, clock = idle_since + self.spin_s, time.monotonic
            while True:
                for link, sending in watch:
                    if link.can_progress(sending) is not False:
                        return  # ready, or a link that cannot tell (a socket): back to work
                if clock() >= end:
                    return
        fds: dict[int, int] = {}
        armed = []
        timeout = min(_POLL_SLICE, left)
        try:
            waiting = [(op.link, isinstance(op, SendOp)) for op in pending]
            waiting += [(link, True) for link in self.links.values() if link.send_q]
            for link, sending in waiting:
                fd = link.poll_fd()
                if fd is not None:
                    if not sending and link.reader_lock.locked():
                        # another thread is reading this socket (and may complete our frame):
                        # POLLIN would fire at once until it does, so nap briefly instead
                        timeout = min(timeout, _MAX_SLEEP)
                        continue
                    fds[fd] = fds.get(fd, 0) | (select.POLLOUT if sending else select.POLLIN)
                    continue
                fd = link.arm(sending)
                armed.append((link, sending))
                if not sending and link.reader_lock.locked():
                    timeout = min(timeout, _MAX_SLEEP)  # another thread reads this peer: it may finish our frame
                if fd == -1:
                    return  # progress became possible while arming: go back to work
                if fd is None:
                    timeout = min(timeout, _MAX_SLEEP)
                else:
                    fds[fd] = fds.get(fd, 0) | select.POLLIN
                    # safety net: a doorbell can be missed in a rare store/load race (no fences in Python)
                    timeout = min(timeout, _DOORBELL_SLICE)
            if fds:
                poller = select.poll()
                for fd, ev in fds.items():
                    poller.register(fd, ev)
                poller.poll(timeout * 1000.0)
            else:
                time.sleep(timeout)
        finally:
            for link, sending in armed:
                link.disarm(sending)


# -- rendezvous ---------------------------------------------------------------------------------
def _gather(store, prefix: str, rank: int, size: int, value: str, deadline: float) -> list[str]:
    """Publish ``value`` as ``prefix/rank`` and read every rank's; RendezvousError names the absent ones.

    The wait is sliced, remembering who was still missing: when the store's host gives up waiting for
    a rank that never started (its own deadline came first) and closes the store, the error here names
    that rank -- not the store's host, which only left because of it."""
    from neural_arch.distributed.errors import StoreTimeoutError

    store.set(f"{prefix}/{rank}", value)
    keys = [f"{prefix}/{r}" for r in range(size)]
    missing: list[int] = []
    while True:
        try:
            store.wait(keys, timeout=max(0.0, min(_RENDEZVOUS_SLICE, deadline - time.monotonic())))
            break
        except StoreTimeoutError:
            missing = [r for r in range(size) if not store.check([keys[r]])]
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"transport rendezvous {prefix!r} timed out on rank {rank}: ranks {missing} never arrived; "
                    "check that every rank started and uses the same MASTER_ADDR/MASTER_PORT") from None
        except PeerFailureError as exc:
            missing = [r for r in missing if r != rank]
            if not missing:
                raise
            raise RendezvousError(
                f"transport rendezvous {prefix!r} on rank {rank}: ranks {missing} never arrived, and the store "
                f"went away meanwhile (its host gave up waiting for them, or died: {exc}); look at rank "
                f"{missing[0]} first -- check that every rank started") from None
    return [store.get(k).decode() for k in keys]


def mesh_key(auth_token, job_secret: bytes | None, nonces: list[str]) -> bytes:
    """The key of this rendezvous's TCP mesh: the job key (token, else the store's job secret) and
    every rank's nonce from this rendezvous. Only its participants hold all of them, so a process that
    did not rendezvous cannot pass the mesh handshake (with neither token nor secret -- a store open
    to everyone -- the nonces are all there is: see docs/security.md)."""
    import hashlib

    base = auth_token.encode() if isinstance(auth_token, str) else (bytes(auth_token) if auth_token else b"")
    material = b"na-mesh|" + base + b"|" + (job_secret or b"") + b"|" + "|".join(nonces).encode()
    return hashlib.sha256(material).digest()


def connect_transport(store, rank: int, size: int, timeout: float, mode: str = "auto",
                      auth_token=None) -> Transport:
    """Connect this rank to every other one; return the transport.

    ``mode``: ``"auto"`` (shared memory with peers on this host, TCP otherwise), ``"tcp"`` or
    ``"shm"`` (an error if a peer is on another host). When ``mode`` is ``"auto"``, the env
    variable ``NEURAL_ARCH_GLOO_TRANSPORT`` may force ``tcp``/``shm``. Every rank must call this
    with the same store (use a fresh ``PrefixStore`` per process-group initialisation).
    ``timeout`` bounds the whole rendezvous; ``auth_token`` (the job token) authenticates TCP links.

    Example::

        store = PrefixStore("pg1/transport", TCPStore(host, port, world_size=size, is_master=rank == 0))
        transport = connect_transport(store, rank, size, timeout=60.0, mode="auto")
        transport.close()
    """
    from neural_arch.distributed.comm.gloo.transport import shm as shm_transport
    from neural_arch.distributed.comm.gloo.transport import tcp as tcp_transport

    mode = (mode or "auto").lower()
    if mode == "auto":
        mode = (config.get(TRANSPORT_ENV) or "auto").strip().lower() or "auto"
    if mode not in ("auto", "tcp", "shm"):
        raise ValueError(f"transport mode {mode!r} is unknown; use 'auto', 'tcp' or 'shm' "
                         f"(argument or {TRANSPORT_ENV})")
    deadline = time.monotonic() + float(timeout)
    me = f"{host_identity()}|{os.getpid()}|{mode}|{os.urandom(16).hex()}"
    everyone = [v.split("|") for v in _gather(store, "transport/host", rank, size, me, deadline)]
    modes = {v[2] for v in everyone}
    if len(modes) > 1:
        raise RendezvousError(f"ranks disagree on the transport mode ({sorted(modes)}); set {TRANSPORT_ENV} "
                              "the same way on every rank")
    kinds: dict[int, str] = {}
    for peer in range(size):
        if peer == rank:
            continue
        same_host = everyone[peer][0] == everyone[rank][0]
        if mode == "shm" and not same_host:
            raise RendezvousError(f"transport mode 'shm' but rank {peer} runs on another host "
                                  f"({everyone[peer][0]}); use mode 'auto' or 'tcp'")
        kinds[peer] = "shm" if mode == "shm" or (mode == "auto" and same_host) else "tcp"
    links: dict[int, Link] = {}
    try:
        tcp_peers = [p for p, k in kinds.items() if k == "tcp"]
        shm_peers = [p for p, k in kinds.items() if k == "shm"]
        if tcp_peers:
            key = mesh_key(auth_token, getattr(store, "job_secret", None), [v[3] for v in everyone])
            if not auth_token and not getattr(store, "job_secret", None):
                from neural_arch.distributed.auth import warn_open

                warn_open(f"the TCP mesh of rank {rank}")
            links.update(tcp_transport.connect_tcp_links(store, rank, tcp_peers, deadline, key))
        if shm_peers:
            pids = {p: int(everyone[p][1]) for p in shm_peers}
            links.update(shm_transport.connect_shm_links(store, rank, pids, deadline))
    except BaseException:
        for link in links.values():
            link.close()
        raise
    local = sum(1 for v in everyone if v[0] == everyone[rank][0])
    return LinkTransport(rank, size, links, local_ranks=local)
