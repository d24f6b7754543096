"""Shared-memory links for ranks on the same host: one single-producer ring per direction.

Each rank creates a file in ``/dev/shm`` for every same-host peer it *sends* to, maps it, and
publishes its path in the store; the peer maps it to *read*. Once every peer has attached (a small
store barrier) the creator unlinks the file, so nothing is left behind even if a rank is killed
later -- the memory lives exactly as long as the mappings. A rank SIGKILLed *between* creating and
the barrier leaves its files: the survivors notice at once (their waits check the peers' pids) and
remove the files of dead creators (``clean_stale_rings()``) before they raise; every shm
rendezvous on the host does the same first, for jobs that died entirely.

Space: every file's pages are reserved (``posix_fallocate``) before it is mapped. A nearly full
``/dev/shm`` (any user can fill it) is then a clear
:class:`~neural_arch.distributed.errors.RendezvousError` at set-up that suggests
the TCP transport -- not a SIGBUS on every rank at the first write into a page tmpfs cannot supply.

Ring layout (counters on separate cache lines, so writer and reader do not false-share)::

    0    head   u64   bytes ever written (only the writer stores it)
    64   tail   u64   bytes ever read    (only the reader stores it)
    128  writer closed flag    136  writer sleeping (wants a "space" doorbell)
    192  reader closed flag    200  reader sleeping (wants a "data" doorbell)
    256  data[capacity]

Waiting: a rank first busy-polls for a short while (only on the main thread, and only when the host
has at least as many cores as local ranks: see ``LinkTransport``), then *arms*: it sets its
"sleeping" flag, re-checks the ring, and blocks in ``poll()`` on a doorbell -- a named pipe next to
the ring that the other side writes one byte to after publishing ``head``/``tail`` when the flag is
set (clearing the flag first: one bell per arming, not one per write). So 5 ranks on 2 cores sleep in the kernel instead of spinning each other off the cores.
(Without fences in Python a wake-up can rarely be missed; waits are sliced at 2 ms.)

The writer copies data in, *then* publishes ``head``; the reader reads ``head``, copies out, *then*
publishes ``tail``. On x86 (TSO) plain aligned 8-byte stores are seen in program order, which is all
this single-producer/single-consumer ring needs (other architectures would need fences). Messages
larger than the ring stream through it in pieces: the reader drains while the writer fills
(pipelined). Ring size: ``NEURAL_ARCH_SHM_RING_BYTES`` (default: :func:`default_ring_bytes`, 1-8 MiB
per direction depending on the number of peers and the free space in ``/dev/shm``).

Liveness: a dead peer cannot close anything, so waiting ranks check its pid (``os.kill(pid, 0)`` and
``/proc/<pid>/stat`` for zombies) every ~0.2 s and raise ``PeerFailureError`` naming it.

Example::

    links = connect_shm_links(store, rank, pids={1: 4242}, deadline=time.monotonic() + 30)
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import secrets
import tempfile
import time

from neural_arch import config
from neural_arch.distributed.comm.gloo.transport.framing import HEADER, Link, PeerGone
from neural_arch.distributed.errors import PeerFailureError, RendezvousError

__all__ = ["ShmLink", "connect_shm_links", "create_mapped", "default_ring_bytes", "pid_alive", "wait_for_peers"]

RING_ENV = "NEURAL_ARCH_SHM_RING_BYTES"
_SETUP_SLICE = 0.2        # seconds between pid checks of the peers a set-up waits for
_EXIT_GRACE = 0.5         # after a failed set-up: how long a dying peer may take to leave the process table
_HEAD, _TAIL, _WCLOSED, _WWAIT, _RCLOSED, _RWAIT, _DATA = 0, 64, 128, 136, 192, 200, 256
_FRAME_SIZE, _pack_into, _unpack_from = HEADER.size, HEADER.pack_into, HEADER.unpack_from


def _ring_bell(fd: int) -> None:
    try:
        os.write(fd, b"\x01")
    except (BlockingIOError, OSError):
        pass  # the pipe is full: the sleeper is being woken already


def _wake(ring, data: bool) -> None:
    """Ring the doorbell the other side armed -- once per arming: the flag is cleared *before*
    the bell, so an arming that came earlier is answered by this bell and a later one sees the
    next write. (Ringing on every write while the sleeper waits for a core cost a syscall each:
    ~3 bells per wake-up were measured in a DDP step.)"""
    if data:
        ring.rwait.value = 0
        _ring_bell(ring.data_fd)
    else:
        ring.wwait.value = 0
        _ring_bell(ring.space_fd)


def _drain(fd: int) -> None:
    try:
        while len(os.read(fd, 4096)) == 4096:
            pass
    except (BlockingIOError, OSError):
        pass


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed child its parent has not reaped).

    Example::

        >>> import os
        >>> pid_alive(os.getpid())
        True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _ring_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def create_mapped(path: str, nbytes: int, what: str) -> mmap.mmap:
    """Create the file ``path`` (it must not exist) of ``nbytes``, **reserve** its pages, and map it.

    Without the reservation a tmpfs file is sparse: on a full ``/dev/shm`` the first store into a
    page the filesystem cannot supply kills the process with SIGBUS -- on every rank, with no error
    message. ``posix_fallocate`` makes that an ``ENOSPC`` here, at set-up, turned into a
    :class:`~neural_arch.distributed.errors.RendezvousError` that says how much is free and what to
    do; the file is removed again.

    >>> mm = create_mapped("/dev/shm/na-doc-example", 4096, "a ring")   # doctest: +SKIP
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        failure = None
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            # a filesystem that cannot reserve (EOPNOTSUPP...) is mapped sparse, as before
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                failure = exc.strerror
            elif exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
        if failure is not None:
            directory = os.path.dirname(path) or "."
            try:
                st = os.statvfs(directory)
                free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free of {st.f_blocks * st.f_frsize / 2**20:.1f} MiB"
            except OSError:
                free = "free space unknown"
            os.unlink(path)
            raise RendezvousError(
                f"cannot reserve {nbytes / 2**20:.1f} MiB in {directory} for {what} ({failure}; {free}): "
                "shared memory is nearly full (look for large files there, maybe another user's). Free some, "
                "or use the TCP transport (NEURAL_ARCH_GLOO_TRANSPORT=tcp on every rank); smaller rings "
                "need less (NEURAL_ARCH_SHM_RING_BYTES)")
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def wait_for_peers(store, keys: list[str], owners: list, pids: dict, deadline: float, where: str,
                   what: str, directory: str | None = None) -> None:
    """``store.wait(keys)`` until ``deadline``, in slices that check the pids of the owners (``owners[i]``
    sets ``keys[i]``; ``pids``: owner -> pid, where known) still missing: a peer that died during the
    set-up is an error at once, naming it, instead of at the rendezvous timeout. Either way the files
    that dead ranks left in the shared-memory directory are removed before the error is raised.

    Example::

        wait_for_peers(store, ["ring/1", "ring/2"], owners=[1, 2], pids={1: 4242, 2: 4243},
                       deadline=time.monotonic() + 30, where="shm rendezvous", what="published their rings")
    """
    from neural_arch.distributed.errors import StoreTimeoutError

    missing: list = []
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timeout=max(0.0, min(_SETUP_SLICE, left)))
            return
        except StoreTimeoutError:
            pass
        except PeerFailureError as exc:
            # the store's host left: name whom we were still waiting for, not the host (it may have
            # given up waiting for them, or be one of them)
            removed = remove_leftovers(directory, pids.values())
            if not missing:
                raise
            dead = [o for o, _ in missing if pids.get(o) and not pid_alive(pids[o])]
            raise RendezvousError(
                f"{where}: the store went away ({exc}) while ranks {[o for o, _ in missing]} had not "
                f"{what}{' (dead: ' + str(dead) + ')' if dead else ''}"
                f"{'; removed ' + str(len(removed)) + ' file(s) they left' if removed else ''}; look at rank "
                f"{(dead or [missing[0][0]])[0]} first") from None
        missing = [(o, k) for o, k in zip(owners, keys) if not store.check([k])]
        dead = [o for o, _ in missing if pids.get(o) and not pid_alive(pids[o])]
        if dead or time.monotonic() >= deadline:
            removed = clean_stale_rings(directory)
            cleaned = f"; removed {len(removed)} file(s) left in {directory or _ring_dir()}" if removed else ""
            if dead:
                raise RendezvousError(
                    f"{where}: rank(s) {dead} died (process gone) before they {what}{cleaned}; look at "
                    f"rank {dead[0]}'s log first")
            raise RendezvousError(f"{where}: ranks {[o for o, _ in missing]} never {what}{cleaned}; "
                                  "check that they started")


class _Ring:
    """A mapped ring file: counters as ctypes views, data as a memoryview (no copies beyond memcpy)."""

    def __init__(self, path: str, create: bool, capacity: int = 0):
        if create:  # doorbells: named pipes, opened O_RDWR so that open() never blocks
            os.mkfifo(path + ".d", 0o600)
            os.mkfifo(path + ".s", 0o600)
        self.data_fd = os.open(path + ".d", os.O_RDWR | os.O_NONBLOCK)    # writer -> sleeping reader
        self.space_fd = os.open(path + ".s", os.O_RDWR | os.O_NONBLOCK)   # reader -> sleeping writer
        try:
            if create:
                self.mm = create_mapped(path, _DATA + capacity, "a shared-memory ring")
            else:
                fd = os.open(path, os.O_RDWR)
                try:
                    self.mm = mmap.mmap(fd, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
        except BaseException:
            for fd in (self.data_fd, self.space_fd):
                os.close(fd)
            if create:
                for p in (path + ".d", path + ".s"):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
            raise
        size = len(self.mm)
        if create:  # fault the pages in now, not on the first (timed) message
            self.mm[:] = bytes(size)
        self.cap = size - _DATA
        self.head = ctypes.c_uint64.from_buffer(self.mm, _HEAD)
        self.tail = ctypes.c_uint64.from_buffer(self.mm, _TAIL)
        self.wclosed = ctypes.c_uint64.from_buffer(self.mm, _WCLOSED)
        self.rclosed = ctypes.c_uint64.from_buffer(self.mm, _RCLOSED)
        self.wwait = ctypes.c_uint64.from_buffer(self.mm, _WWAIT)
        self.rwait = ctypes.c_uint64.from_buffer(self.mm, _RWAIT)
        self.data = memoryview(self.mm)[_DATA:]

    def release(self) -> None:
        self.data.release()
        del self.head, self.tail, self.wclosed, self.rclosed, self.wwait, self.rwait
        for fd in (self.data_fd, self.space_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere: the GC unmaps it later
            pass


class ShmLink(Link):
    """One same-host peer: we write ``out`` (our ring), we read ``inp`` (the peer's ring).

    Example::

        links = connect_shm_links(store, rank, pids={1: 4242}, deadline=time.monotonic() + 30)
        links[1].kind                      # "shm"
    """

    kind = "shm"
    whole_frames = True

    def __init__(self, peer: int, pid: int, out: _Ring, inp: _Ring):
        super().__init__(peer)
        self.pid, self.out, self.inp = pid, out, inp
        self._head = out.head.value     # only we write out.head: keep it in a Python int
        self._tail = inp.tail.value     # only we write inp.tail

    def write_some(self, views) -> int:
        ring = self.out
        cap, head = ring.cap, self._head
        free = cap - (head - ring.tail.value)
        if free <= 0:
            if ring.rclosed.value:
                raise PeerGone("the peer closed its shared-memory ring")
            return 0
        data, total = ring.data, 0
        for v in views:
            n = v.nbytes
            n = min(n, free)
            pos = head % cap
            first = cap - pos
            first = min(first, n)
            data[pos:pos + first] = v[:first]
            if n > first:
                data[:n - first] = v[first:n]
            head += n
            free -= n
            total += n
            if n < v.nbytes or not free:
                break
        self._head = head
        ring.head.value = head  # publish after the copy (x86 keeps store order)
        if ring.rwait.value:
            _wake(ring, True)
        return total

    def read_some(self, view: memoryview) -> int:
        ring = self.inp
        tail = self._tail
        avail = ring.head.value - tail
        if avail <= 0:
            if ring.wclosed.value:
                # the writer may have published its last bytes just before closing: look again
                avail = ring.head.value - tail
                if avail <= 0:
                    raise PeerGone("the peer closed its shared-memory ring")
            else:
                return 0
        cap, data = ring.cap, ring.data
        n = view.nbytes
        n = min(n, avail)
        pos = tail % cap
        first = cap - pos
        first = min(first, n)
        view[:first] = data[pos:pos + first]
        if n > first:
            view[first:n] = data[:n - first]
        self._tail = tail + n
        ring.tail.value = tail + n
        if ring.wwait.value:
            _wake(ring, False)
        return n

    def try_send_frame(self, channel: int, view: memoryview, check: int = 0, op_bytes: int = 0) -> bool:
        # The small-message fast path: header and payload in one go when the ring has room for
        # both without wrapping (no SendOp, no queue, one publication of ``head``).
        if self.send_q or not self.send_lock.acquire(False):
            return False
        try:
            if self.send_q:
                return False
            ring = self.out
            n = view.nbytes
            head, cap = self._head, ring.cap
            end = _FRAME_SIZE + n
            if cap - (head - ring.tail.value) < end:
                return False
            pos = head % cap
            if pos + end > cap:
                return False  # would wrap: the general path splits it
            data = ring.data
            _pack_into(data, pos, channel, n, check, op_bytes)
            if n:
                data[pos + _FRAME_SIZE:pos + end] = view
            head += end
            self._head = head
            ring.head.value = head  # publish after the copy (x86 keeps store order)
            if ring.rwait.value:
                _wake(ring, True)
            return True
        finally:
            self.send_lock.release()

    def _read_frame(self, channel: int, view: memoryview, check: int = 0, op_bytes: int = 0) -> bool:
        ring = self.inp
        tail = self._tail
        n = view.nbytes
        end = _FRAME_SIZE + n
        if ring.head.value - tail < end:
            return False
        cap = ring.cap
        pos = tail % cap
        if pos + end > cap:
            return False
        data = ring.data
        if _unpack_from(data, pos) != (channel, n, check, op_bytes):
            return False
        if n:
            view[:] = data[pos + _FRAME_SIZE:pos + end]
        tail += end
        self._tail = tail
        ring.tail.value = tail
        if ring.wwait.value:
            _wake(ring, False)
        return True

    def can_progress(self, sending: bool) -> bool:
        if sending:
            ring = self.out
            return ring.cap - (self._head - ring.tail.value) > 0 or bool(ring.rclosed.value)
        ring = self.inp
        return ring.head.value != self._tail or bool(ring.wclosed.value)

    def arm(self, sending: bool) -> int | None:
        if sending:
            ring = self.out
            ring.wwait.value = 1
            if ring.cap - (self._head - ring.tail.value) > 0 or ring.rclosed.value:
                return -1
            return ring.space_fd
        ring = self.inp
        ring.rwait.value = 1
        if ring.head.value != self._tail or ring.wclosed.value:
            return -1
        return ring.data_fd

    def disarm(self, sending: bool) -> None:
        ring = self.out if sending else self.inp
        if sending:
            ring.wwait.value = 0
            _drain(ring.space_fd)
        else:
            ring.rwait.value = 0
            _drain(ring.data_fd)

    def check_alive(self) -> None:
        if not pid_alive(self.pid):
            raise PeerGone(f"process {self.pid} is dead (killed or crashed)")

    def close(self) -> None:
        for ring, flag in ((self.out, "wclosed"), (self.inp, "rclosed")):
            try:
                getattr(ring, flag).value = 1
                ring.release()
            except (AttributeError, ValueError):
                pass


def default_ring_bytes(npeers: int) -> int:
    """Ring size per direction when ``NEURAL_ARCH_SHM_RING_BYTES`` is unset: 8 MiB, halved (down to
    1 MiB) while this rank's rings would pass 32 MiB or the host's rings a quarter of the free
    space in ``/dev/shm`` (containers often have only 64 MiB there).

    Why large: a message that fits in the ring is written in one go and the sender moves on; one
    larger than the ring makes sender and receiver take turns, and on a busy host every turn is
    a sleep and a wake-up. DDP's 7.4 MB gradient all-reduce on 2 ranks measured ~6.5 blocking
    waits per step with 1 MiB rings vs ~2.5 with 8 MiB.

    Example::

        >>> (1 << 20) <= default_ring_bytes(npeers=3) <= (8 << 20)
        True
    """
    try:
        st = os.statvfs(_ring_dir())
        free = st.f_bavail * st.f_frsize
    except OSError:
        return 1 << 20
    npeers = max(1, npeers)
    cap = 8 << 20
    while cap > (1 << 20) and (npeers * cap > (32 << 20) or 4 * (npeers + 1) * npeers * cap > free):
        cap //= 2
    return cap


def clean_stale_rings(directory: str | None = None) -> list[str]:
    """Unlink ring files (and doorbells) -- and the direct collectives' segments
    (``na-<pid>-<hex>-coll``, :mod:`.shm_segment`) -- left by processes that died between creating
    them and the attach barrier (a SIGKILL there skips every ``finally``). Only files of this user whose
    creator pid is dead are touched. Returns the paths removed; called at every shm rendezvous."""
    directory = directory or _ring_dir()
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != "na" or not parts[1].isdigit():
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != uid or pid_alive(int(parts[1])):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def remove_leftovers(directory: str | None = None, pids=(), grace: float = _EXIT_GRACE) -> list[str]:
    """After a failed set-up: give the peers ``pids`` up to ``grace`` seconds to finish dying (a killed
    process closes its sockets -- which is how we may have learned of it -- before it is gone from
    the process table), then remove the files of every dead creator (``clean_stale_rings()``)."""
    end = time.monotonic() + grace
    while any(pid_alive(p) for p in pids if p) and time.monotonic() < end:
        time.sleep(0.01)
    return clean_stale_rings(directory)


def connect_shm_links(store, rank: int, pids: dict[int, int], deadline: float) -> dict[int, ShmLink]:
    """Create our outgoing rings, attach the peers' rings, unlink once everyone attached.

    Example::

        # pids: same-host peer rank -> its pid (from the store rendezvous)
        links = connect_shm_links(store, rank, pids={1: 4242, 2: 4243}, deadline=time.monotonic() + 30)
    """
    clean_stale_rings()

    capacity = config.get(RING_ENV) or default_ring_bytes(len(pids))
    if capacity < 4096:
        raise ValueError(f"{RING_ENV}={capacity} is too small; use at least 4096 (default 1-8 MiB)")
    peers = sorted(pids)
    created: list[str] = []
    outs: dict[int, _Ring] = {}
    inps: dict[int, _Ring] = {}

    def wait(keys: list[str], what: str) -> None:
        wait_for_peers(store, keys, peers, pids, deadline, f"shared-memory rendezvous on rank {rank}", what)

    try:
        base = os.path.join(_ring_dir(), f"na-{os.getpid()}-{secrets.token_hex(4)}")
        for peer in peers:
            path = f"{base}-{rank}to{peer}"
            created.append(path)
            outs[peer] = _Ring(path, create=True, capacity=capacity)
            store.set(f"transport/shm/{rank}/{peer}", path)
        keys = [f"transport/shm/{peer}/{rank}" for peer in peers]
        wait(keys, "created their rings")
        for peer, key in zip(peers, keys):
            path = store.get(key).decode()
            try:
                inps[peer] = _Ring(path, create=False)
            except OSError as exc:
                raise RendezvousError(
                    f"rank {rank} cannot open rank {peer}'s ring {path} ({exc}); ranks on one host must share "
                    "/dev/shm (containers: --ipc=host) -- or use NEURAL_ARCH_GLOO_TRANSPORT=tcp") from exc
        store.set(f"transport/shm_attached/{rank}", b"1")
        wait([f"transport/shm_attached/{peer}" for peer in peers], "attached to our rings")
    except BaseException:
        for ring in list(outs.values()) + list(inps.values()):
            ring.release()
        remove_leftovers(None, pids.values())   # a peer that died here left its rings: remove them now
        raise
    finally:
        for path in created:  # attached or failed: the files are no longer needed either way
            for p in (path, path + ".d", path + ".s"):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
    return {peer: ShmLink(peer, pids[peer], outs[peer], inps[peer]) for peer in peers}
