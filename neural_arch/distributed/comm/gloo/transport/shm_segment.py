"""One shared-memory segment per same-host group: per-rank slots, a control area and a barrier.

The direct shared-memory collectives (:mod:`neural_arch.distributed.comm.gloo.shm_direct`)
run on this: instead of sending messages through per-pair rings, every rank writes its data into
its own slot of one segment that all ranks of the group map, and reads the others' slots in place.
This module owns the memory, the rendezvous that maps it, and the one synchronisation primitive the
collectives need -- a barrier that fails loudly.

Layout (every rank-written field on its own cache line, so writers never false-share)::

    0                 header: magic, world size, chunk bytes, small bytes, poisoned-by (rank + 1)
    64                gen   i32: futex word, the last completed barrier epoch (sleepers wait on it)
    128 + 128 r       rank r's control lines: arrive epoch, sleeping flag, pid | op words by parity
                      (per parity: the op's check word, then ``nbytes << 20 | root + 1``)
    ...               rank r's failure text (512 bytes each)
    ...               small area: [parity 2][rank n][SMALL bytes]  (latency path, one barrier per op)
    ...               large area: [buffer 2][rank n][CHUNK bytes]  (pipelined chunks)
    ...               result area: [buffer 2][CHUNK bytes]

Barrier: rank r stores ``arrive[r] = e`` (its e-th barrier) and waits until every ``arrive[i] >= e``
-- one counter per rank, written only by its owner, so no atomic read-modify-write is needed
(Python has none). On x86 (TSO) a rank's data stores are seen before its ``arrive`` store, and the
waiter's loads are not reordered either, so the slots are complete once the epochs are. A waiter
spins (only when the host has a core per local rank, and only on the main thread or while the main
thread is blocked in ``Work.wait``: a progress thread spinning while backward runs would hold the
GIL that backward needs), then sleeps on a futex (``gen``) that the rank which sees the barrier
complete wakes. Waits are sliced: every slice checks the deadline, the
group's poison flag and, every ~0.1 s, whether the missing ranks' processes are alive
(``os.kill(pid, 0)`` and ``/proc``), so a dead, stopped or diverged peer is an error on every rank.

The file is named ``na-<pid>-<hex>-coll`` in ``/dev/shm`` and unlinked as soon as every rank mapped
it (a SIGKILL before that is removed by the survivors, whose set-up waits notice the dead rank, and
by every later rendezvous: ``shm.clean_stale_rings()``). Its pages are reserved before it is mapped
(:func:`.shm.create_mapped`): a full ``/dev/shm`` is an error at set-up, not a SIGBUS.

A collective with one barrier (every small-message op) calls :meth:`ShmSegment.sync`: its op words,
the barrier and the cross-rank comparison of the words in one Python call (about half the CPU of the
three separate calls: ``benchmarks/bench_small_messages.py --overhead``).

Example::

    seg = ShmSegment.connect(store, rank, size, deadline=time.monotonic() + 30, names=[0, 1])
    seg.barrier(info)          # info: the op's OpInfo (deadline, name and number for errors)
    seg.sync(seg.ops & 1, info.wire, pack_words(nbytes, -1), info)   # words + barrier + check
    seg.close()
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import secrets
import sys
import threading
import time

from neural_arch import config
from neural_arch.distributed.comm import work as _work
from neural_arch.distributed.comm.debug import describe_wire
from neural_arch.distributed.comm.gloo.transport.shm import (
    _ring_dir,
    clean_stale_rings,
    create_mapped,
    pid_alive,
    remove_leftovers,
    wait_for_peers,
)
from neural_arch.distributed.errors import (
    CollectiveMismatchError,
    GroupDestroyedError,
    GroupPoisonedError,
    PeerFailureError,
    RendezvousError,
)

__all__ = ["SMALL_BYTES", "SPIN_ENV", "ShmSegment", "default_chunk_bytes", "direct_supported", "pack_words"]

_MAGIC = 0x6E612D636F6C6C31          # "na-coll1"
_HDR = 0
_GEN = 64
_CTL = 128
_CTL_BYTES = 128                      # line 0: arrive, sleeping, pid; line 1: op words by parity
_REASON_BYTES = 512
#: messages up to this many bytes per rank take the latency path (one barrier, no chunking)
SMALL_BYTES = 4096
SPIN_ENV = "NEURAL_ARCH_SHM_SPIN_S"
YIELD_ENV = "NEURAL_ARCH_SHM_YIELD_S"
CHUNK_ENV = "NEURAL_ARCH_SHM_CHUNK_BYTES"
_MAIN_THREAD = threading.main_thread().ident
_LIVENESS_EVERY = 0.1                 # seconds between pid checks of the ranks not yet arrived
_SLICE_S = 2e-3                       # longest futex sleep: the deadline/poison/pid checks run this often
# Waiting, when every local rank has a core, on the main thread or on a progress thread while the
# main thread is blocked waiting for communication (a progress thread spinning while the main thread
# computes would hold the GIL that backward needs): spin ``_SPIN_S``, then call sched_yield() in a loop for
# ``_YIELD_S`` (the core goes to whoever is runnable, the peer included, without a futex sleep and
# wake-up), then sleep on the futex. Otherwise straight to the futex.
# Measured on a shared 2-core box against a spin-only wait, a long spin and a short yield phase, a
# short spin then a long yield phase was the steadiest (docs/benchmarks.md, "shared-memory wait
# phases"); with more ranks than cores, going straight to the futex beat any yield phase, so
# oversubscribed hosts sleep at once.
# Both phases are also skipped while the host is busy (1-minute load average >= cores + local ranks,
# sampled every 0.5 s; our own ranks count in the load while they spin, hence "+ local ranks"): then a spinning or yielding rank takes CPU from the peer it waits for (measured at
# load 9, a 1 KiB all_reduce took more than twice as long with the yield phase as over the sleeping rings).
# NEURAL_ARCH_SHM_SPIN_S / NEURAL_ARCH_SHM_YIELD_S override both (and the load check).
_SPIN_S = 20e-6
_YIELD_S = 20e-3
_GEN_MASK = 0x7FFFFFFF
_POLL = range(8)                      # arrival checks before a wait sets up its spin/yield/sleep phases
#: an op's second check word is ``nbytes << _AUX_BITS | (root + 1)``: one store and one compare per rank
#: for the byte count and the root (roots below 2**20; byte counts from 2**44 up wrap, still equal
#: across ranks that agree)
_AUX_BITS = 20
_AUX_MASK = (1 << _AUX_BITS) - 1
_U64 = (1 << 64) - 1


def pack_words(nbytes: int, aux: int) -> int:
    """An op's second check word: its byte count and root (``aux``, -1 for none) in one unsigned word.

    >>> pack_words(1024, -1) >> 20, (pack_words(1024, 3) & 0xFFFFF) - 1
    (1024, 3)
    """
    return ((nbytes << _AUX_BITS) | (aux + 1)) & _U64


def direct_supported() -> bool:
    """Whether this machine can run the direct path: Linux on x86-64 (the barrier relies on x86's
    store order, like the rings of :mod:`.shm`, and sleeps on a Linux futex).

    Example::

        direct = DirectCollectives(segment) if direct_supported() else None    # else: the plans
    """
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def default_chunk_bytes(local_ranks: int) -> int:
    """Pipeline chunk per rank slot: 1 MiB unless ``NEURAL_ARCH_SHM_CHUNK_BYTES`` is set.

    1 MiB was the fastest chunk in the measurements (docs/benchmarks.md, "shared-memory chunk size"):
    larger chunks stop fitting the cache with two buffers per rank. Smaller chunks pay
    Python's per-call overhead on every chunk, and every chunk is a barrier: on a busy or
    oversubscribed host each barrier can cost a sleep and a wake-up, which argues for few chunks too.
    Halved (down to 64 KiB) while the segment would pass a quarter of the free space in ``/dev/shm``
    (containers often have only 64 MiB there).

    Example::

        >>> (64 << 10) <= default_chunk_bytes(local_ranks=2) <= (1 << 20)
        True
    """
    forced = config.get(CHUNK_ENV)
    if forced is not None:
        chunk = forced
        if chunk < 4096 or chunk % 64:
            raise ValueError(f"{CHUNK_ENV}={forced} must be a multiple of 64 and at least 4096")
        return chunk
    chunk = 1 << 20
    try:
        st = os.statvfs(_ring_dir())
        free = st.f_bavail * st.f_frsize
    except OSError:
        return min(chunk, 256 << 10)
    while chunk > (64 << 10) and 4 * ShmSegment.nbytes_for(local_ranks, chunk, SMALL_BYTES) > free:
        chunk //= 2
    return chunk


# -- futex (sleep until another process stores to a word of the shared mapping) ------------------
class _Futex:
    _NR = 202                          # SYS_futex on x86-64
    _WAIT, _WAKE = 0, 1                # shared (not FUTEX_PRIVATE): the word lives in a shared mapping

    class _Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)   # CDLL releases the GIL during the call
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._ts = self._Timespec(0, int(_SLICE_S * 1e9))
        self._ts_ref = ctypes.byref(self._ts)

    def wait(self, addr: int, expected: int) -> None:
        """Sleep while ``*addr == expected`` (at most one slice; spurious returns are fine)."""
        self._syscall(ctypes.c_long(self._NR), ctypes.c_void_p(addr), ctypes.c_long(self._WAIT),
                      ctypes.c_long(expected), self._ts_ref, None, ctypes.c_long(0))

    def wake(self, addr: int) -> None:
        self._syscall(ctypes.c_long(self._NR), ctypes.c_void_p(addr), ctypes.c_long(self._WAKE),
                      ctypes.c_long(_GEN_MASK), None, None, ctypes.c_long(0))


class ShmSegment:
    """The mapped segment of one group (see the module docstring).

    Example::

        # every rank of a one-host group, through the group's rendezvous store
        segment = ShmSegment.connect(store, rank, size, deadline=time.monotonic() + 30)
        segment.barrier(info)                 # info: the op's OpInfo (deadline, check word)
        segment.close()
    """

    def __init__(self, mm: mmap.mmap, rank: int, size: int, names, local_ranks: int | None = None):
        self.mm, self.rank, self.size = mm, rank, size
        #: group rank -> global rank (for error messages)
        self.names = list(names)
        self._q = memoryview(mm).cast("q")   # 8-byte words: plain aligned loads/stores
        # the op words through an unsigned view: a check word (up to 2**64) is stored as it is
        self._u = memoryview(mm).cast("Q")
        q = self._q
        if q[_HDR // 8] != _MAGIC or q[_HDR // 8 + 1] != size:
            raise RendezvousError(f"the shared-memory segment does not belong to this group of {size} "
                                  "(stale name in the store?)")
        self.chunk = int(q[_HDR // 8 + 2])
        self.small = int(q[_HDR // 8 + 3])
        self._poison_idx = _HDR // 8 + 4
        self._arrive = [(_CTL + r * _CTL_BYTES) // 8 for r in range(size)]
        self._sleep = [i + 1 for i in self._arrive]
        self._pid_idx = [i + 2 for i in self._arrive]
        self._words = [(_CTL + r * _CTL_BYTES + 64) // 8 for r in range(size)]
        self._word_bases = [[i + 2 * p for i in self._words] for p in (0, 1)]
        self._my_words = [bases[rank] for bases in self._word_bases]
        self._other_words = [[i for r, i in enumerate(bases) if r != rank] for bases in self._word_bases]
        self._my_arrive = self._arrive[rank]
        self._my_sleep = self._sleep[rank]
        # the other ranks' arrive and sleep words (this rank's own need no check: it is here, awake)
        self._other_arrive = [i for r, i in enumerate(self._arrive) if r != rank]
        self._other_sleep = [i for r, i in enumerate(self._sleep) if r != rank]
        reasons = _CTL + size * _CTL_BYTES
        self._reason_off = [reasons + r * _REASON_BYTES for r in range(size)]
        self.small_off = reasons + size * _REASON_BYTES
        self.large_off = self.small_off + 2 * size * self.small
        self.result_off = self.large_off + 2 * size * self.chunk
        self._gen = ctypes.c_int32.from_buffer(mm, _GEN)
        self._gen_addr = ctypes.addressof(self._gen)
        self._futex = _Futex()
        #: set by ``interrupt_waits``/``close``: a barrier another thread waits in stops with an error
        self._closing = False
        # threads inside ``_wait`` (close waits for them to leave); a plain count, not a lock, on this hot
        # path: one group's collectives run one at a time (its lane), so no two threads wait here at once
        self._waiters = 0
        self._epoch = int(q[self._my_arrive])
        self._pids: list[int] = [0] * size
        local = size if local_ranks is None else local_ranks
        fits = local <= (os.cpu_count() or 1)
        spin, yld = config.get(SPIN_ENV), config.get(YIELD_ENV)
        self.spin_s = spin if spin is not None else (_SPIN_S if fits else 0.0)
        self.yield_s = yld if yld is not None else (_YIELD_S if fits else 0.0)
        self._check_load = spin is None and yld is None
        self._busy_load = (os.cpu_count() or 1) + local
        self._load_ok, self._load_at = True, -1.0
        self.ops = 0                  # direct collectives run so far (the parity of the op words)
        self.buffer = 0               # next large-area buffer (continues across ops: see shm_direct)
        self._closed = False

    @staticmethod
    def nbytes_for(size: int, chunk: int, small: int) -> int:
        n = _CTL + size * (_CTL_BYTES + _REASON_BYTES) + 2 * size * small + 2 * size * chunk + 2 * chunk
        return (n + 4095) & ~4095

    # -- rendezvous -----------------------------------------------------------------------------------
    @classmethod
    def connect(cls, store, rank: int, size: int, deadline: float, names=None, prefix: str = "gloo/direct",
                chunk: int | None = None, small: int = SMALL_BYTES, local_ranks: int | None = None,
                pids: dict | None = None, directory: str | None = None) -> ShmSegment:
        """Rank 0 creates and publishes the segment; everyone maps it, writes its pid, and waits for the
        others; then rank 0 unlinks the file (every mapping keeps the memory alive).

        ``local_ranks``: the ranks of this job on this host (default ``size``); a sub-group's segment
        passes the host's count, so its spin decision sees every rank that competes for the cores.
        ``pids``: group rank -> pid of the members, where known (the transport's shared-memory links
        know them): a member that dies during the set-up is then an error at once, naming it, and the
        survivors remove what it left in ``/dev/shm``. ``directory``: where rank 0 creates the file
        (default ``/dev/shm``)."""
        names = list(range(size)) if names is None else list(names)
        pids = {names[r]: pid for r, pid in (pids or {}).items()}   # by the names errors use
        path = None
        mm = None

        def wait(keys, what, owners):
            wait_for_peers(store, keys, [names[r] for r in owners], pids, deadline,
                           f"shared-memory collective rendezvous on rank {names[rank]}", what, directory)
        try:
            if rank == 0:
                clean_stale_rings(directory)
                chunk = int(chunk or default_chunk_bytes(size))
                nbytes = cls.nbytes_for(size, chunk, small)
                path = os.path.join(directory or _ring_dir(), f"na-{os.getpid()}-{secrets.token_hex(4)}-coll")
                mm = create_mapped(path, nbytes, f"the shared-memory segment of group {names}")
                mm[:] = bytes(nbytes)         # fault the pages in now, not in the first (timed) op
                hdr = memoryview(mm).cast("q")
                hdr[0], hdr[1], hdr[2], hdr[3] = _MAGIC, size, chunk, small
                hdr.release()
                store.set(f"{prefix}/path", path)
            else:
                wait([f"{prefix}/path"], "published the segment", [0])
                theirs = store.get(f"{prefix}/path").decode()
                try:
                    fd = os.open(theirs, os.O_RDWR)
                except OSError as exc:
                    raise RendezvousError(
                        f"rank {names[rank]} cannot open the shared-memory segment {theirs} ({exc}); ranks on "
                        "one host must share /dev/shm (containers: --ipc=host), or set "
                        "NEURAL_ARCH_GLOO_DIRECT=0") from exc
                try:
                    mm = mmap.mmap(fd, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
            seg = cls(mm, rank, size, names, local_ranks)
            seg._q[seg._pid_idx[rank]] = os.getpid()
            store.set(f"{prefix}/attached/{rank}", b"1")
            wait([f"{prefix}/attached/{r}" for r in range(size)], "mapped the segment", list(range(size)))
            seg._pids = [int(seg._q[i]) for i in seg._pid_idx]
            return seg
        except BaseException:
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass
            remove_leftovers(directory, pids.values())   # a member that died here left its files: remove them now
            raise
        finally:
            if path is not None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def interrupt_waits(self) -> None:
        """A barrier another thread of this rank waits in stops (within a slice) with
        :class:`~neural_arch.distributed.errors.GroupDestroyedError`; new ops still run until ``close``."""
        self._closing = True
        if not self._closed:
            self._futex.wake(self._gen_addr)

    def close(self) -> None:
        if self._closed:
            return
        self.interrupt_waits()
        # unmapping under a waiting thread would fault it, not tell it: it leaves within a futex slice
        deadline = time.monotonic() + 1.0
        while self._waiters and time.monotonic() < deadline:
            time.sleep(1e-3)
        self._closed = True
        self._q.release()
        self._u.release()
        del self._gen
        try:
            self.mm.close()
        except BufferError:   # a NumPy view is still alive somewhere: the GC unmaps it later
            pass

    # -- views ------------------------------------------------------------------------------------------
    def buffer_view(self, offset: int, nbytes: int) -> memoryview:
        return memoryview(self.mm)[offset:offset + nbytes]

    # -- op words: what each rank is about to run (compared at the op's first barrier) -------------------
    def announce(self, parity: int, word: int, nbytes: int, aux: int) -> None:
        """Publish this op's check word, byte count and root (``aux``, -1: none) for :meth:`check_words`."""
        i = self._my_words[parity]
        u = self._u
        u[i] = word
        u[i + 1] = pack_words(nbytes, aux)

    def check_words(self, parity: int, info) -> None:
        """Raise CollectiveMismatchError (on every rank: they all read the same table) unless every
        rank announced the same op word, byte count and root."""
        u = self._u
        i = self._my_words[parity]
        w, x = u[i], u[i + 1]
        for i in self._word_bases[parity]:
            if u[i] != w or u[i + 1] != x:
                self._mismatch(parity, info)

    def _mismatch(self, parity: int, info) -> None:
        u = self._u
        rows = []
        for r in range(self.size):
            i = self._word_bases[parity][r]
            word, extra = u[i], u[i + 1]
            text = describe_wire(word, extra >> _AUX_BITS)
            aux = (extra & _AUX_MASK) - 1
            if aux >= 0:
                text += f" root {aux}"
            rows.append(f"rank {self.names[r]}: {text}")
        raise CollectiveMismatchError(
            f"{info.describe()} differs across ranks of group {self.names}: {'; '.join(rows)}. Every rank must "
            "call the same collectives, with the same shapes, dtypes, reduce ops and roots, in the same order.")

    def sync(self, parity: int, word: int, extra: int, info) -> None:
        """:meth:`announce`, :meth:`barrier` and :meth:`check_words` in one call (``extra``:
        :func:`pack_words`): what an op with a single barrier runs -- the small-message path, where
        the Python calls themselves are the cost. Same failures as the three (timeout, dead peer,
        poison, mismatch)."""
        u, q = self._u, self._q
        i = self._my_words[parity]
        u[i] = word
        u[i + 1] = extra
        e = self._epoch + 1
        self._epoch = e
        q[self._my_arrive] = e        # after the words (x86 keeps the order): arrived means announced
        for i in self._other_arrive:
            if q[i] < e:
                self._wait(e, info)    # (it polls briefly before setting up its wait)
                break
        else:
            for i in self._other_sleep:   # _complete, inline
                if q[i]:
                    self._gen.value = e & _GEN_MASK
                    self._futex.wake(self._gen_addr)
                    break
            if q[self._poison_idx]:
                # everyone had arrived -- but a rank may have given up on this very op since
                raise self._poison_error(info)
        for i in self._other_words[parity]:
            if u[i] != word or u[i + 1] != extra:
                self._mismatch(parity, info)

    # -- failure ------------------------------------------------------------------------------------------
    def poison(self, why: str) -> None:
        """Record this rank's failure and wake every sleeper: their waits fail at once naming it."""
        if self._closed:
            return
        q = self._q
        off = self._reason_off[self.rank]
        text = why.encode("utf-8", "replace")[:_REASON_BYTES - 1]
        self.mm[off:off + len(text)] = text
        self.mm[off + len(text)] = 0
        if not q[self._poison_idx]:
            q[self._poison_idx] = self.rank + 1
        self._gen.value = (self._gen.value + 1) & _GEN_MASK
        self._futex.wake(self._gen_addr)

    def poisoned_by(self) -> int | None:
        v = self._q[self._poison_idx] if not self._closed else 0
        return None if not v else int(v) - 1

    def _poison_error(self, info) -> GroupPoisonedError:
        who = self.poisoned_by()
        off = self._reason_off[who]
        raw = bytes(self.mm[off:off + _REASON_BYTES]).split(b"\0", 1)[0].decode("utf-8", "replace")
        return GroupPoisonedError(
            f"{info.describe()} on rank {self.names[self.rank]} cannot complete: rank {self.names[who]} reported "
            "that an operation of this group failed, so no collective can be trusted; destroy the process "
            f"group (destroy_process_group()) and create it again on every rank. First failure (rank "
            f"{self.names[who]}): {raw}")

    # -- the barrier ----------------------------------------------------------------------------------------
    def barrier(self, info) -> None:
        """Wait until every rank arrived here (the e-th barrier of every rank); see the module docstring."""
        e = self._epoch + 1
        self._epoch = e
        q = self._q
        q[self._my_arrive] = e
        for i in self._other_arrive:
            if q[i] < e:
                break
        else:
            self._complete(e)
            if q[self._poison_idx]:
                # everyone had arrived -- but a rank may have given up on this very op since
                raise self._poison_error(info)
            return
        self._wait(e, info)

    def _complete(self, e: int) -> None:
        # every rank that sees the barrier complete publishes it (an idempotent store: no atomics);
        # only sleepers need the futex word and the wake-up syscall
        q = self._q
        for i in self._sleep:
            if q[i]:
                self._gen.value = e & _GEN_MASK
                self._futex.wake(self._gen_addr)
                return

    def _finish(self, e: int, info) -> None:
        self._complete(e)
        if self._q[self._poison_idx]:
            # everyone had arrived -- but a rank may have given up on this very op since
            raise self._poison_error(info)

    def _missing(self, e: int) -> list[int]:
        q = self._q
        return [r for r, i in enumerate(self._arrive) if q[i] < e]

    def _may_spin(self, on_main: bool, now: float) -> bool:
        """Whether this wait may spin and yield now: on the main thread, or on another thread while
        the main thread is blocked waiting for communication (then nobody needs the GIL for compute),
        and only while the host is not busy (see the module docstring)."""
        if not (on_main or _work.main_thread_waiting):
            return False
        if self._check_load:
            if now - self._load_at > 0.5:
                self._load_at = now
                try:
                    self._load_ok = os.getloadavg()[0] < self._busy_load
                except OSError:
                    self._load_ok = True
            return self._load_ok
        return True

    def _wait(self, e: int, info) -> None:
        self._waiters += 1
        try:
            self._wait_for_ranks(e, info)
        finally:
            self._waiters -= 1

    def _wait_for_ranks(self, e: int, info) -> None:
        q, arrive, poison_idx = self._q, self._arrive, self._poison_idx
        # A short poll first: ranks in step (a loop of small collectives on an idle host) arrive within
        # moments of each other, sooner than setting up the wait below takes. Eight rounds of loads:
        # too short to need any of the spin rules below.
        others = self._other_arrive
        for _ in _POLL:
            for i in others:
                if q[i] < e:
                    break
            else:
                self._finish(e, info)
                return
        clock = time.monotonic
        start = clock()
        on_main = threading.get_ident() == _MAIN_THREAD
        spun = False
        last_check = start
        gen, futex, addr, target = self._gen, self._futex, self._gen_addr, e & _GEN_MASK
        while True:
            if not spun and (self.spin_s or self.yield_s) and self._may_spin(on_main, clock()):
                # Once per wait: on a progress thread this starts only when (or once) the main thread
                # blocks for communication, and stops as soon as it no longer does.
                spun = True
                if self._spin_then_yield(e, info, on_main):
                    return
            q[self._my_sleep] = 1
            for i in arrive:
                if q[i] < e:
                    break
            else:
                q[self._my_sleep] = 0
                self._finish(e, info)
                return
            if q[poison_idx]:
                q[self._my_sleep] = 0
                raise self._poison_error(info)
            if self._closing:
                q[self._my_sleep] = 0
                raise GroupDestroyedError.during(info.describe(), self.names[self.rank])
            g = gen.value
            if g != target:
                futex.wait(addr, g)
            q[self._my_sleep] = 0
            now = clock()
            if now - last_check >= _LIVENESS_EVERY or now >= info.deadline:
                last_check = now
                missing = self._missing(e)
                if not missing:
                    self._finish(e, info)
                    return
                for r in missing:
                    if not pid_alive(self._pids[r]):
                        raise PeerFailureError(
                            f"rank {self.names[r]} (pid {self._pids[r]}) died during {info.describe()} on "
                            f"rank {self.names[self.rank]} (shared-memory collective); it probably crashed "
                            f"or was killed -- look at rank {self.names[r]}'s log first")
                if now >= info.deadline:
                    raise info.timeout_error([self.names[r] for r in missing], now - start)

    def _spin_then_yield(self, e: int, info, on_main: bool) -> bool:
        """Spin ``spin_s``, then sched_yield() for ``yield_s`` while the barrier is open; True when it
        completed. Off the main thread both phases end early once the main thread stops waiting
        (it wants the GIL back). The deadline lies far beyond both phases; poison is checked."""
        q, arrive, poison_idx = self._q, self._other_arrive, self._poison_idx   # (this rank is here)
        clock = time.monotonic
        watch = _work if not on_main else None
        if self.spin_s:
            end = clock() + self.spin_s
            n = 0
            while True:
                for i in arrive:
                    if q[i] < e:
                        break
                else:
                    self._finish(e, info)
                    return True
                if q[poison_idx]:
                    raise self._poison_error(info)
                n += 1
                if not n & 31 and (clock() >= end or (watch is not None and not watch.main_thread_waiting)):
                    break
        if self.yield_s:
            # give the core to whoever is runnable here (the peer, maybe) without paying a futex
            # sleep and wake-up
            end = clock() + self.yield_s
            sched_yield = os.sched_yield
            while True:
                for i in arrive:
                    if q[i] < e:
                        break
                else:
                    self._finish(e, info)
                    return True
                if q[poison_idx]:
                    raise self._poison_error(info)
                if watch is not None and not watch.main_thread_waiting:
                    break
                sched_yield()
                if clock() >= end:
                    break
        return False
