"""Links: message framing and per-channel demultiplexing over one peer's byte stream.

A :class:`Link` is what :class:`~neural_arch.distributed.comm.transport.engine.LinkTransport` holds per
peer. Subclasses (``TcpLink``, ``ShmLink``) only provide non-blocking ``write_some``/``read_some``;
everything else -- framing, FIFO queues of pending sends, reading a frame straight into the waiting
receiver's buffer, keeping frames for other channels aside -- lives here, written once.

Frame: 16-byte header ``(channel u64, nbytes u64)`` then ``nbytes`` of payload. Channel
``2**63 - 1`` is reserved for abort frames ("rank N died: stop waiting").

Example (what ``LinkTransport.send`` does)::

    op = SendOp(link, as_bytes_view(array), channel)
    link.send_q.append(op); link.pump_sends()      # writes what the stream accepts now
"""

from __future__ import annotations

import collections
import struct
import threading

import numpy as np

__all__ = [
    "ABORT_CHANNEL",
    "CHANNEL_LIMIT",
    "FRAME",
    "Link",
    "PeerGone",
    "RecvOp",
    "SendOp",
    "abandon",
    "as_bytes_view",
]

FRAME = struct.Struct("<QQ")          # channel, nbytes
ABORT_CHANNEL = (1 << 63) - 1        # reserved: "a rank died, stop waiting" (payload: "dead_rank|why")
CHANNEL_LIMIT = ABORT_CHANNEL

class PeerGone(Exception):
    """Raised by a stream when the other side closed or died (turned into PeerFailureError)."""


def as_bytes_view(buf, writable: bool = False) -> memoryview:
    """A flat byte view of a C-contiguous array/memoryview, without copying."""
    if type(buf) is np.ndarray:
        try:
            view = memoryview(buf).cast("B")   # the cheapest zero-copy byte view; C-contiguous only
        except (TypeError, ValueError):        # not C-contiguous, or a dtype the buffer protocol cannot name
            view = None
        if view is not None and view.nbytes and not (writable and view.readonly):
            return view
        flags = buf.flags
        if not flags.c_contiguous:
            raise ValueError(f"buffer of shape {buf.shape} is not C-contiguous; pass np.ascontiguousarray(x)")
        if writable and not flags.writeable:
            raise ValueError("the receive buffer is read-only; pass a writable array")
        if buf.nbytes == 0:
            return memoryview(bytearray(0))
        try:
            return memoryview(buf).cast("B")   # the cheapest zero-copy byte view
        except (TypeError, ValueError):        # dtypes the buffer protocol cannot name (datetime...)
            return memoryview(buf.reshape(-1).view(np.uint8))
    if isinstance(buf, np.ndarray):  # subclasses: go through a plain view
        return as_bytes_view(buf.view(np.ndarray), writable)
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.nbytes == 0:
        return memoryview(bytearray(0))
    if not view.c_contiguous:
        raise ValueError("buffer is not C-contiguous; pass a contiguous copy")
    if writable and view.readonly:
        raise ValueError("the receive buffer is read-only; pass a writable buffer")
    return view.cast("B") if (view.format != "B" or view.ndim != 1) else view


class Link:
    """One peer's byte streams. Subclasses implement the four stream methods below.

    ``write_some(views) -> int`` and ``read_some(view) -> int`` never block: they move what they can
    (0 when they would block) and raise :class:`PeerGone` when the peer is gone.
    """

    kind = "?"
    whole_frames = False  # True when the stream implements the whole-frame fast paths below

    def __init__(self, peer: int):
        self.peer = peer
        self.failed: str | None = None            # why the peer is unusable (sticky)
        self.on_abort = lambda peer, payload: None  # set by the transport: an abort frame arrived
        self.lock = threading.Lock()                 # guards ``stash`` and ``send_q``
        self.send_lock = threading.Lock()            # held by whoever writes to the stream
        self.reader_lock = threading.Lock()          # held by whoever reads from the stream
        self.send_q: collections.deque = collections.deque()
        self.stash: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._hdr = bytearray(FRAME.size)
        self._hdr_view = memoryview(self._hdr)
        self._hdr_got = 0
        self._frame: list | None = None           # [channel, view, got, owner op or None, error]

    # stream interface --------------------------------------------------------------------------
    def write_some(self, views: list[memoryview]) -> int:
        raise NotImplementedError

    def read_some(self, view: memoryview) -> int:
        raise NotImplementedError

    def poll_fd(self) -> int | None:
        """A socket ``poll()`` can wait on for both directions, or None (see :meth:`arm`)."""
        return None

    def arm(self, sending: bool) -> int | None:
        """Ask the peer to ring a doorbell when it makes progress for us; return the doorbell fd,
        or -1 when progress is already possible (do not sleep), or None when there is no doorbell."""
        return None

    def disarm(self, sending: bool) -> None:
        pass

    def can_progress(self, sending: bool) -> bool | None:
        """Cheap check for busy-polling: could a write (``sending``) or a read move bytes now?
        None when the stream cannot tell without a system call (sockets)."""
        return None

    # whole-frame fast paths (optional): all or nothing, so no partial state is ever left behind
    def try_send_frame(self, channel: int, view: memoryview) -> bool:
        """Write one whole frame now if the stream takes all of it at once and nothing is queued
        before it; return False (nothing written) otherwise, and the caller queues a SendOp."""
        return False

    def _read_frame(self, channel: int, view: memoryview) -> bool:
        """With ``reader_lock`` held and no frame in progress: read one whole frame straight into
        ``view`` if the next frame is complete, for ``channel`` and of ``view``'s size; else False."""
        return False

    def try_recv_frame(self, channel: int, view: memoryview) -> bool:
        """Receive the next message on ``channel`` now if it is already complete in the stream
        (and none is stashed before it); False (nothing consumed) otherwise."""
        if not self.whole_frames or self.stash.get(channel) or self._frame is not None or self._hdr_got:
            return False
        if not self.reader_lock.acquire(False):
            return False
        try:
            # re-check under the lock: another reader may have stashed a frame meanwhile
            if self.stash.get(channel) or self._frame is not None or self._hdr_got:
                return False
            return self._read_frame(channel, view)
        except PeerGone as exc:
            self.fail(str(exc) or "connection closed")
            return False
        finally:
            self.reader_lock.release()

    def check_alive(self) -> None:
        """Raise PeerGone if the peer process is known dead (called every ~0.2 s while waiting)."""

    def close(self) -> None:
        pass

    # failure --------------------------------------------------------------------------------------
    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why

    # sending ----------------------------------------------------------------------------------
    def pump_sends(self) -> bool:
        """Write as much of the queued messages as the stream takes now. True if anything moved."""
        if not self.send_q or not self.send_lock.acquire(False):
            return False
        moved = False
        try:
            while self.send_q:
                op = self.send_q[0]
                n = self.write_some(op.pieces)
                if n:
                    moved = True
                    op.advance(n)
                if op.pieces:
                    return moved
                op.done = True
                with self.lock:
                    if self.send_q and self.send_q[0] is op:
                        self.send_q.popleft()
        except PeerGone as exc:
            self.fail(str(exc) or "connection closed")
        except OSError as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
        finally:
            self.send_lock.release()
        return moved

    # receiving --------------------------------------------------------------------------------
    def _take_stashed(self, op: RecvOp) -> bool:
        if not self.stash.get(op.channel):  # unlocked peek: only this check runs on the fast path
            return False
        with self.lock:
            q = self.stash.get(op.channel)
            if not q:
                return False
            data = q.popleft()
        if len(data) != op.view.nbytes:
            op.error = _size_error(self.peer, op.channel, len(data), op.view.nbytes)
        elif len(data):
            op.view[:] = data
        op.done = True
        return True

    def pump_recv(self, op: RecvOp) -> bool:
        """Read frames until ``op`` is complete or the stream is dry. True if anything moved."""
        if op.done:
            return False
        if self._take_stashed(op):
            return True
        if not self.reader_lock.acquire(False):
            return False
        moved = False
        try:
            while not op.done:
                frame = self._frame
                if frame is None:
                    if self._take_stashed(op):  # another thread may have stashed it meanwhile
                        return True
                    if not self._hdr_got and self._read_frame(op.channel, op.view):
                        op.done = True       # the whole frame was there: one copy, no state
                        return True
                    n = self.read_some(self._hdr_view[self._hdr_got:] if self._hdr_got else self._hdr_view)
                    if n == 0:
                        return moved
                    moved = True
                    self._hdr_got += n
                    if self._hdr_got < FRAME.size:
                        continue
                    self._hdr_got = 0
                    channel, nbytes = FRAME.unpack(self._hdr)
                    if channel == op.channel and nbytes == op.view.nbytes:
                        frame = [channel, op.view, 0, op, None]       # straight into the caller's buffer
                    else:
                        err = _size_error(self.peer, channel, nbytes, op.view.nbytes) if channel == op.channel else None
                        # kept aside for its own receiver (np.empty: no zero-fill, unlike bytearray)
                        frame = [channel, memoryview(np.empty(nbytes, np.uint8)), 0, op if err else None, err]
                    self._frame = frame
                view, got = frame[1], frame[2]
                if got < view.nbytes:
                    n = self.read_some(view[got:])
                    if n == 0:
                        return moved
                    moved = True
                    frame[2] = got = got + n
                if got == view.nbytes:
                    self._frame = None
                    owner = frame[3]
                    if owner is None:
                        if frame[0] == ABORT_CHANNEL:
                            self.on_abort(self.peer, bytes(view))
                            continue
                        with self.lock:
                            self.stash[frame[0]].append(view.obj)
                    else:
                        owner.error = frame[4]
                        owner.done = True
        except PeerGone as exc:
            self.fail(str(exc) or "connection closed")
        except OSError as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
        finally:
            self.reader_lock.release()
        return moved


def _size_error(peer: int, channel: int, got: int, want: int) -> ValueError:
    return ValueError(f"message from rank {peer} on channel {channel} has {got} bytes but the receive buffer "
                      f"has {want} bytes; sender and receiver must agree on shape and dtype")


class SendOp:
    __slots__ = ("channel", "done", "link", "pieces", "sent", "total")

    def __init__(self, link: Link, view: memoryview, channel: int):
        self.link, self.channel, self.done, self.sent = link, channel, False, 0
        self.total = FRAME.size + view.nbytes
        self.pieces = [memoryview(FRAME.pack(channel, view.nbytes))]
        if view.nbytes:
            self.pieces.append(view)

    def advance(self, n: int) -> None:
        self.sent += n
        if self.sent == self.total:  # the common case: everything went in one write
            self.pieces = []
            return
        pieces = self.pieces
        while n and pieces:
            first = pieces[0]
            if n >= first.nbytes:
                n -= first.nbytes
                pieces.pop(0)
            else:
                pieces[0] = first[n:]
                n = 0

    def progress(self) -> bool:
        return self.link.pump_sends()

    def check(self) -> None:
        pass


class RecvOp:
    __slots__ = ("channel", "done", "error", "link", "view")

    def __init__(self, link: Link, view: memoryview, channel: int):
        self.link, self.view, self.channel, self.done, self.error = link, view, channel, False, None

    def progress(self) -> bool:
        return self.link.pump_recv(self)

    def check(self) -> None:
        if self.error is not None:
            raise self.error


def abandon(op) -> None:
    """Forget an op whose deadline passed; a half-moved message leaves the stream unusable."""
    link = op.link
    if isinstance(op, SendOp):
        with link.lock:
            if op.sent and op.pieces:
                link.fail("timed out in the middle of a message (the stream is out of step)")
            elif op in link.send_q:
                link.send_q.remove(op)
    else:
        frame = link._frame
        if frame is not None and frame[3] is op:
            link.fail("timed out in the middle of a message (the stream is out of step)")
