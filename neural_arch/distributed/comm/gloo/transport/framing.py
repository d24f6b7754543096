"""Links: message framing and per-channel demultiplexing over one peer's byte stream.

A :class:`Link` is what :class:`~neural_arch.distributed.comm.gloo.transport.engine.LinkTransport` holds per
peer. Subclasses (``TcpLink``, ``ShmLink``) only provide non-blocking ``write_some``/``read_some``;
everything else -- framing, FIFO queues of pending sends, reading a frame straight into the waiting
receiver's buffer, keeping frames for other channels aside -- lives here, written once.

Frame: 32-byte header ``(channel u64, nbytes u64, check u64, op_bytes u64)`` then ``nbytes`` of
payload. ``check`` is the sending op's :attr:`~neural_arch.distributed.comm.work.OpInfo.wire` word
(op kind, dtype, reduce op, sequence number) and ``op_bytes`` its ``OpInfo.nbytes`` (the whole op's
byte count on the sender, 0 for unchecked messages): a receiver whose own word, op byte count or
frame byte count differs gets :class:`~neural_arch.distributed.errors.FrameMismatchError` (the frame
is still consumed, so the byte stream stays in step). The op
byte count is what tells a large op's pipelined segment from a small op's whole buffer when the two
happen to have the same frame size: without it, two ranks whose calls at one sequence number differ
only in size could exchange a segment for a whole buffer and return mixed data. Channel ``2**63 - 1``
is reserved for abort frames ("rank N died" / "group poisoned: stop waiting"). A header announcing more than ``MAX_FRAME_BYTES`` (or an
impossible channel) is a :class:`~neural_arch.distributed.errors.ProtocolError` that fails the
link -- never a ``MemoryError``.

Example (what ``LinkTransport.send`` does)::

    op = SendOp(link, as_bytes_view(array), channel)
    link.send_q.append(op); link.pump_sends()      # writes what the stream accepts now
"""

from __future__ import annotations

import collections
import struct
import threading

import numpy as np

from neural_arch import config
from neural_arch.distributed.comm.debug import describe_wire
from neural_arch.distributed.errors import FrameMismatchError

__all__ = [
    "ABORT_CHANNEL",
    "CHANNEL_LIMIT",
    "FRAME",
    "Frame",
    "HEADER",
    "MAX_FRAME_BYTES",
    "Link",
    "PeerGone",
    "RecvOp",
    "SendOp",
    "abandon",
    "as_bytes_view",
]

#: The header's first three words (channel, nbytes, check word ``OpInfo.wire``), enough to vet a
#: frame's announced size before the rest of the header is read.
FRAME = struct.Struct("<QQQ")
#: The whole header, ``FRAME`` and then the op's byte count on the sender (``OpInfo.nbytes``, or 0
#: for an unchecked message).
HEADER = struct.Struct("<QQQQ")
ABORT_CHANNEL = (1 << 63) - 1        # reserved: "a rank died, stop waiting" (payload: "dead_rank|why")
CHANNEL_LIMIT = ABORT_CHANNEL
#: largest frame a peer may announce (NEURAL_ARCH_MAX_FRAME_BYTES overrides); larger is a protocol
#: error. One frame is at most one collective step's slice, so 64 GiB leaves room for any real array.
MAX_FRAME_BYTES = config.get("NEURAL_ARCH_MAX_FRAME_BYTES")
_ABORT_MAX = 1 << 16

class PeerGone(Exception):
    """Raised by a stream when the other side closed or died (turned into PeerFailureError).

    Example::

        try:
            n = link.read_some(view)
        except PeerGone:
            link.fail("the peer closed its connection")
    """


def as_bytes_view(buf, writable: bool = False) -> memoryview:
    """A flat byte view of a C-contiguous array/memoryview, without copying.

    Example::

        >>> import numpy as np
        >>> view = as_bytes_view(np.zeros(4, np.float32), writable=True)
        >>> view.nbytes, view.format
        (16, 'B')
    """
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

    Example::

        link.send_q.append(SendOp(link, as_bytes_view(array), channel))
        link.pump_sends()                  # writes what the stream accepts now, never blocks
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
        self._hdr = bytearray(HEADER.size)
        self._hdr_view = memoryview(self._hdr)
        self._hdr_got = 0
        self._frame: Frame | None = None          # the frame being read, when it arrived in pieces

    # stream interface --------------------------------------------------------------------------
    def write_some(self, views: list[memoryview]) -> int:
        raise NotImplementedError

    def read_some(self, view: memoryview) -> int:
        raise NotImplementedError

    def poll_fd(self) -> int | None:
        """A socket ``poll()`` can wait on for both directions, or None (see ``Link.arm``)."""
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
    def try_send_frame(self, channel: int, view: memoryview, check: int = 0, op_bytes: int = 0) -> bool:
        """Write one whole frame now if the stream takes all of it at once and nothing is queued
        before it; return False (nothing written) otherwise, and the caller queues a SendOp."""
        return False

    def _read_frame(self, channel: int, view: memoryview, check: int = 0, op_bytes: int = 0) -> bool:
        """With ``reader_lock`` held and no frame in progress: read one whole frame straight into
        ``view`` if the next frame is complete, for ``channel``, of ``view``'s size and with the
        ``check`` word and op byte count ``op_bytes``; else False (the general path then reports any
        mismatch)."""
        return False

    def try_recv_frame(self, channel: int, view: memoryview, check: int = 0, op_bytes: int = 0) -> bool:
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
            return self._read_frame(channel, view, check, op_bytes)
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
            check, op_bytes, data = q.popleft()
        if len(data) != op.view.nbytes or check != op.wire or op_bytes != op.op_bytes:
            op.error = _mismatch_error(self.peer, op.channel, len(data), check, op_bytes,
                                       op.view.nbytes, op.wire, op.op_bytes)
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
                    if not self._hdr_got and self._read_frame(op.channel, op.view, op.wire, op.op_bytes):
                        op.done = True       # the whole frame was there: one copy, no state
                        return True
                    got = self._hdr_got
                    n = self.read_some(self._hdr_view[got:] if got else self._hdr_view)
                    if n == 0:
                        return moved
                    moved = True
                    self._hdr_got = got = got + n
                    if got < HEADER.size:
                        if got >= FRAME.size:   # vet the announced size now: a hostile peer may stop here
                            _check_header(self.peer, *FRAME.unpack_from(self._hdr)[:2])
                        continue
                    self._hdr_got = 0
                    channel, nbytes, check, op_bytes = HEADER.unpack(self._hdr)
                    if (channel == op.channel and nbytes == op.view.nbytes and check == op.wire
                            and op_bytes == op.op_bytes):
                        frame = Frame(channel, op.view, op, None, check, op_bytes)  # straight into the caller's buffer
                    else:
                        _check_header(self.peer, channel, nbytes)
                        err = (_mismatch_error(self.peer, channel, nbytes, check, op_bytes,
                                               op.view.nbytes, op.wire, op.op_bytes)
                               if channel == op.channel else None)
                        # kept aside for its own receiver (np.empty: no zero-fill, unlike bytearray);
                        # a mismatched one is consumed too, so the stream stays in step
                        try:
                            spare = np.empty(nbytes, np.uint8)
                        except MemoryError:
                            raise PeerGone(f"protocol error: cannot hold a {nbytes}-byte frame from rank "
                                           f"{self.peer} (out of memory)") from None
                        frame = Frame(channel, memoryview(spare), op if err else None, err, check, op_bytes)
                    self._frame = frame
                view, got = frame.view, frame.got
                if got < view.nbytes:
                    n = self.read_some(view[got:])
                    if n == 0:
                        return moved
                    moved = True
                    frame.got = got = got + n
                if got == view.nbytes:
                    self._frame = None
                    owner = frame.owner
                    if owner is None:
                        if frame.channel == ABORT_CHANNEL:
                            self.on_abort(self.peer, bytes(view))
                            continue
                        with self.lock:
                            self.stash[frame.channel].append((frame.check, frame.op_bytes, view.obj))
                    else:
                        owner.error = frame.error
                        owner.done = True
        except PeerGone as exc:
            self.fail(str(exc) or "connection closed")
        except OSError as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
        finally:
            self.reader_lock.release()
        return moved


def _check_header(peer: int, channel: int, nbytes: int) -> None:
    """A header no honest peer sends: fail the link (PeerGone -> the link is marked failed)."""
    if channel > ABORT_CHANNEL:
        raise PeerGone(f"protocol error: rank {peer} sent a frame for channel {channel}, which does not exist")
    limit = _ABORT_MAX if channel == ABORT_CHANNEL else MAX_FRAME_BYTES
    if nbytes > limit:
        raise PeerGone(f"protocol error: rank {peer} announced a {nbytes}-byte frame (limit {limit}; "
                       "NEURAL_ARCH_MAX_FRAME_BYTES raises it)")


def _mismatch_error(peer: int, channel: int, got: int, got_check: int, got_total: int,
                    want: int, want_check: int, want_total: int) -> ValueError:
    if got_check == want_check and got_total != want_total:
        # the same op at the same number, of another size: a pipelined segment of the larger one
        # may even have the smaller one's frame size, so the op's byte count is what tells them apart
        return FrameMismatchError(
            f"rank {peer} sent {describe_wire(got_check)} of {got_total} bytes in all on channel {channel}, but "
            f"this rank's {describe_wire(want_check)} has {want_total} bytes; every rank must call the same "
            "collectives, with the same sizes, dtypes and reduce ops, in the same order")
    if got_check == want_check:
        return FrameMismatchError(
            f"message from rank {peer} on channel {channel} has {got} bytes but the receive buffer has {want} "
            f"bytes ({describe_wire(want_check)}); sender and receiver must agree on shape and dtype")
    return FrameMismatchError(
        f"rank {peer} sent {describe_wire(got_check, got)} on channel {channel}, but this rank expected "
        f"{describe_wire(want_check, want)}; every rank must call the same collectives, with the same "
        "dtypes and sizes, in the same order")


class Frame:
    """A frame being read from the stream in pieces: where its payload goes (``view``: the waiting
    receiver's buffer, or a spare one kept aside for another channel's receiver), how much of it
    arrived (``got``), the op it completes (``owner``, or None when it is stashed) and the error
    that op gets (a size or check-word mismatch; the frame is consumed anyway).

    Example::

        >>> frame = Frame(channel=7, view=memoryview(bytearray(16)), owner=None, error=None, check=0)
        >>> frame.got, frame.view.nbytes
        (0, 16)
    """

    __slots__ = ("channel", "check", "error", "got", "op_bytes", "owner", "view")

    def __init__(self, channel: int, view: memoryview, owner, error, check: int, op_bytes: int = 0):
        self.channel, self.view, self.got, self.owner, self.error, self.check = channel, view, 0, owner, error, check
        self.op_bytes = op_bytes


class SendOp:
    """One frame to write (header, then payload), written in as many pieces as the stream takes.

    Example::

        >>> import numpy as np
        >>> op = SendOp(None, as_bytes_view(np.arange(4, dtype=np.float32)), channel=7)
        >>> op.total, op.done                  # the 32-byte header and 16 bytes of payload
        (48, False)
    """

    __slots__ = ("channel", "done", "link", "pieces", "sent", "total")

    def __init__(self, link: Link, view: memoryview, channel: int, check: int = 0, op_bytes: int = 0):
        self.link, self.channel, self.done, self.sent = link, channel, False, 0
        self.total = HEADER.size + view.nbytes     # this frame's bytes, header included
        self.pieces = [memoryview(HEADER.pack(channel, view.nbytes, check, op_bytes))]
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
    """A receive waiting for the next frame of its channel, read straight into ``view``.

    Example::

        >>> import numpy as np
        >>> out = np.empty(4, np.float32)
        >>> op = RecvOp(None, as_bytes_view(out, writable=True), channel=7)
        >>> op.done, op.view.nbytes
        (False, 16)
    """

    __slots__ = ("channel", "done", "error", "link", "op_bytes", "view", "wire")

    def __init__(self, link: Link, view: memoryview, channel: int, check: int = 0, op_bytes: int = 0):
        self.link, self.view, self.channel, self.done, self.error = link, view, channel, False, None
        self.wire, self.op_bytes = check, op_bytes      # the op's check word and byte count, as in the header

    def progress(self) -> bool:
        return self.link.pump_recv(self)

    def check(self) -> None:
        if self.error is not None:
            raise self.error


def abandon(op) -> None:
    """Forget an op whose deadline passed; a half-moved message leaves the stream unusable.

    Example::

        if time.monotonic() > info.deadline:
            abandon(op)                 # then raise the op's timeout error
    """
    link = op.link
    if isinstance(op, SendOp):
        with link.lock:
            if op.sent and op.pieces:
                link.fail("timed out in the middle of a message (the stream is out of step)")
            elif op in link.send_q:
                link.send_q.remove(op)
    else:
        frame = link._frame
        if frame is not None and frame.owner is op:
            link.fail("timed out in the middle of a message (the stream is out of step)")
