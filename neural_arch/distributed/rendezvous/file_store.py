"""``FileStore``: the rendezvous store on a shared file (no server, no network).

The file is an append-only binary log of records, serialised with ``fcntl.flock``::

    u8 kind (1 = set, 2 = delete) | u32 key length | u64 value length | key | value

Every process replays the log from where it last stopped (so reads cost only what is new),
and writes one record with a single ``os.write`` under an exclusive lock, so a reader holding
the shared lock never sees half a record. Nothing is ever unpickled. With ``world_size`` given,
the last process to ``close()`` deletes the file.

Use it when ranks share a file system but no TCP port can be agreed on (e.g. a scheduler that
gives every job the same node list but no free-port service).

Example::

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "rdzv")
    >>> a, b = FileStore(path, world_size=2, timeout=5), FileStore(path, world_size=2, timeout=5)
    >>> a.set("k", b"v"); b.get("k")
    b'v'
    >>> b.add("n", 5), a.add("n", 1)
    (5, 6)
    >>> a.close(); b.close(); os.path.exists(path)
    False
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from neural_arch.distributed.errors import DistributedError, StoreTimeoutError
from neural_arch.distributed.rendezvous.base import (
    BytesLike,
    Store,
    _amount,
    _b,
    _key,
    _keys,
    _pairs,
    _seconds,
    _to_int,
)

__all__ = ["FileStore"]

_REC = struct.Struct("!BIQ")
_SET, _DEL = 1, 2
_USERS, _CLOSED = "\x00users", "\x00closed"


class FileStore(Store):
    """Key-value store on the file ``path`` (created if missing). See the module docstring.

    Example::

        # every rank, with the same path on a shared file system
        store = FileStore("/shared/job42/rdzv", world_size=4)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=4)
    """

    def __init__(self, path: str, world_size: int | None = None, timeout: float | timedelta = 300.0):
        self.path, self.world_size, self.timeout = str(path), world_size, _seconds(timeout)
        try:
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise DistributedError(f"FileStore cannot open {self.path!r} ({exc}); the directory must exist "
                                   "and be writable by every rank") from exc
        self._data: dict[str, bytes] = {}
        self._offset = 0
        self._lock = threading.Lock()  # threads of one process share the fd and the replay cache
        if world_size:
            self.add(_USERS, 1)

    # -- the log ----------------------------------------------------------------------------------
    def _replay(self) -> None:
        """Apply the records appended since the last call (the caller holds the flock)."""
        size = os.fstat(self._fd).st_size
        if size < self._offset:  # the file was recreated under us: start over
            self._data.clear()
            self._offset = 0
        if size == self._offset:
            return
        blob = os.pread(self._fd, size - self._offset, self._offset)
        pos = 0
        while pos + _REC.size <= len(blob):
            kind, klen, vlen = _REC.unpack_from(blob, pos)
            end = pos + _REC.size + klen + vlen
            if end > len(blob):
                break  # a torn record (a writer died mid-write): ignore it and everything after
            key = blob[pos + _REC.size:pos + _REC.size + klen].decode("utf-8")
            if kind == _SET:
                self._data[key] = bytes(blob[pos + _REC.size + klen:end])
            else:
                self._data.pop(key, None)
            pos = end
        self._offset += pos

    @contextlib.contextmanager
    def _locked(self, exclusive: bool):
        """Hold the thread lock and the file lock, with the cache replayed up to date."""
        if self._fd is None:
            raise DistributedError(f"FileStore({self.path!r}) was closed")
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._replay()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _append(self, kind: int, key: str, value: bytes = b"", *more: tuple[str, bytes]) -> None:
        """Write one record (``more``: further ``(key, value)`` set records) in a single ``os.write``."""
        blob = b""
        for k, v in ((key, value), *more):
            kb = k.encode("utf-8")
            blob += _REC.pack(kind, len(kb), len(v)) + kb + v
        os.write(self._fd, blob)
        self._replay()

    # -- the interface ----------------------------------------------------------------------------
    def set(self, key: str, value: BytesLike) -> None:
        key, value = _key(key), _b(value)
        with self._locked(True):
            self._append(_SET, key, value)

    def _poll(self, keys: list[str], timeout: float) -> list[str]:
        """Wait (sleeping with backoff: no server to notify us) until every key exists."""
        deadline, delay = time.monotonic() + timeout, 0.001
        while True:
            with self._locked(False):
                missing = [k for k in keys if k not in self._data]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)

    def get(self, key: str) -> bytes:
        key = _key(key)
        if self._poll([key], self.timeout):
            raise StoreTimeoutError(f"store key {key!r} did not appear in {self.path} within {self.timeout:.1f} s; "
                                    "the rank that should set it did not start, crashed, or is stuck")
        with self._locked(False):
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        key, amount = _key(key), _amount(amount)
        with self._locked(True):
            value = _to_int(self._data[key], key) + amount if key in self._data else amount
            self._append(_SET, key, str(value).encode("ascii"))
        return value

    def compare_set(self, key: str, expected: BytesLike, desired: BytesLike) -> bytes:
        key, expected, desired = _key(key), _b(expected), _b(desired)
        with self._locked(True):
            current = self._data.get(key)
            if (current is None and expected == b"") or current == expected:
                self._append(_SET, key, desired)
                return desired
            return expected if current is None else current

    def append(self, key: str, value: BytesLike) -> None:
        key, value = _key(key), _b(value)
        with self._locked(True):
            self._append(_SET, key, self._data.get(key, b"") + value)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        keys = _keys(keys)
        missing = self._poll(keys, self.timeout)
        if missing:
            raise StoreTimeoutError(f"store keys {missing} did not appear in {self.path} within {self.timeout:.1f} s; "
                                    "the rank that should set them did not start, crashed, or is stuck")
        with self._locked(False):
            return [self._data[k] for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[BytesLike]) -> None:
        keys, values = _pairs(keys, values)
        if not keys:
            return
        with self._locked(True):
            self._append(_SET, keys[0], values[0], *zip(keys[1:], values[1:]))

    def wait(self, keys: str | Sequence[str], timeout: float | timedelta | None = None) -> None:
        t = self.timeout if timeout is None else _seconds(timeout)
        missing = self._poll(_keys(keys), t)
        if missing:
            raise StoreTimeoutError(f"store keys {missing} did not appear in {self.path} within {t:.1f} s")

    def check(self, keys: str | Sequence[str]) -> bool:
        keys = _keys(keys)
        with self._locked(False):
            return all(k in self._data for k in keys)

    def delete_key(self, key: str) -> bool:
        key = _key(key)
        with self._locked(True):
            if key not in self._data:
                return False
            self._append(_DEL, key)
            return True

    def num_keys(self) -> int:
        with self._locked(False):
            return sum(1 for k in self._data if not k.startswith("\x00"))

    def close(self) -> None:
        """Release the file; with ``world_size``, the last of them deletes it."""
        if self._fd is None:
            return
        try:
            if self.world_size:
                with self._locked(True):
                    closed = _to_int(self._data.get(_CLOSED, b"0"), _CLOSED) + 1
                    self._append(_SET, _CLOSED, str(closed).encode())
                    if closed >= self.world_size:
                        try:
                            os.unlink(self.path)
                        except FileNotFoundError:
                            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"
