"""The rendezvous store interface (torch's ``Store`` names and semantics) and what works on any store.

* :class:`Store` -- the methods every store implements (``set``/``get``/``add``/``compare_set``/
  ``wait``/``check``/``delete_key``/``num_keys``/``append``/``multi_get``/``multi_set``), ``timeout``,
  a context manager.
* :class:`PrefixStore` -- namespacing wrapper (sub-groups, restarts).
* :func:`store_barrier` -- the rendezvous every backend starts with: it says *which ranks* never
  arrived when it times out.
* the value rules every store shares: values are bytes or str (UTF-8), counters are decimal text.

The stores themselves: :mod:`.tcp_store` (a server on rank 0) and :mod:`.file_store` (a shared
file); :mod:`.store` is the public face that names all of them.

Example::

    >>> class DictStore(Store):              # the smallest store: enough for store_barrier
    ...     def __init__(self): self.d = {}
    ...     def set(self, key, value): self.d[key] = _b(value)
    ...     def wait(self, keys, timeout=None): assert all(k in self.d for k in _keys(keys))
    ...     def check(self, keys): return all(k in self.d for k in _keys(keys))
    >>> s = DictStore()
    >>> store_barrier(PrefixStore("job1", s), rank=0, world_size=1, name="init", timeout=1.0)
    >>> sorted(s.d)
    ['job1/init/arrived/0']
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Union

from neural_arch.distributed.errors import RendezvousError, StoreTimeoutError

__all__ = ["BytesLike", "PrefixStore", "Store", "store_barrier"]

BytesLike = Union[bytes, bytearray, memoryview, str]  # noqa: UP007 (a runtime alias: 3.9-safe)


def _b(value: BytesLike) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store values must be bytes or str, got {type(value).__name__}; "
                    "encode it first (pickle only between trusted peers, in the *_object helpers)")


_FOREVER = 1e9  # seconds: "no timeout" (inf) as a number sockets and the wire format can carry


def _key(key: str | bytes) -> str:
    """A key as text: str as is, bytes as UTF-8 (torch takes both); anything else is a TypeError
    (``str(b"k")`` would quietly name another key, ``"b'k'"``)."""
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8")
    raise TypeError(f"store keys must be str (or UTF-8 bytes), got {type(key).__name__} {key!r}")


def _keys(keys: str | bytes | Iterable[str]) -> list[str]:
    if isinstance(keys, (str, bytes, bytearray)):
        return [_key(keys)]
    return [_key(k) for k in keys]


def _seconds(timeout, what: str = "timeout") -> float:
    """A timeout as seconds: a number or a ``datetime.timedelta`` (torch's type); never negative/NaN."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise TypeError(f"store {what} must be seconds or a datetime.timedelta, got {timeout!r}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"store {what} must be >= 0 seconds, got {timeout!r}")
    return min(value, _FOREVER)


def _pairs(keys, values) -> tuple[list[str], list[bytes]]:
    """``multi_set``'s arguments checked: as many values as keys (zip would drop the extra ones)."""
    keys, values = _keys(keys), [_b(v) for v in values]
    if len(keys) != len(values):
        raise ValueError(f"multi_set got {len(keys)} keys and {len(values)} values; give one value per key")
    return keys, values


def _amount(amount) -> int:
    """``add()``'s increment: an integer (``add(key, 1.7)`` used to add 1, ``add(key, "3")`` 3)."""
    try:
        return operator.index(amount)
    except TypeError:
        raise TypeError(f"store add() needs an integer amount, got {type(amount).__name__} {amount!r}") from None


def _to_int(value: bytes, key: str) -> int:
    try:
        return int(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"store key {key!r} holds {value[:32]!r}, not an integer; add() needs a counter key")


# -- the interface ------------------------------------------------------------------------------
class Store:
    """Base class: subclasses implement the methods; helpers shared by all live here.

    Every store has torch's methods, so code written against one runs on any of them.

    Example::

        >>> import os, tempfile
        >>> from neural_arch.distributed.rendezvous.file_store import FileStore
        >>> with FileStore(os.path.join(tempfile.mkdtemp(), "rdzv"), timeout=5) as store:
        ...     store.set("ready", "yes")
        ...     store.wait(["ready"])
        ...     store.get("ready"), store.add("count", 2), store.check("count")
        (b'yes', 2, True)
    """

    timeout: float = 300.0

    def set(self, key: str, value: BytesLike) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def add(self, key: str, amount: int) -> int:
        raise NotImplementedError

    def compare_set(self, key: str, expected: BytesLike, desired: BytesLike) -> bytes:
        raise NotImplementedError

    def wait(self, keys: str | Sequence[str], timeout: float | None = None) -> None:
        raise NotImplementedError

    def check(self, keys: str | Sequence[str]) -> bool:
        raise NotImplementedError

    def delete_key(self, key: str) -> bool:
        raise NotImplementedError

    def num_keys(self) -> int:
        raise NotImplementedError

    def append(self, key: str, value: BytesLike) -> None:
        """Atomically append ``value`` to the bytes stored at ``key`` (created when absent)."""
        raise NotImplementedError

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """The values of ``keys``, in order, waiting (like ``get``) until every one exists."""
        raise NotImplementedError

    def multi_set(self, keys: Sequence[str], values: Sequence[BytesLike]) -> None:
        """Set every ``keys[i]`` to ``values[i]`` at once."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def set_timeout(self, timeout: float | timedelta) -> None:
        self.timeout = _seconds(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PrefixStore(Store):
    """Every key of ``store`` seen through ``prefix + "/"``: sub-groups and restarts never collide.

    Example::

        sub = PrefixStore("group1", store)
        sub.set("x", b"1")            # is key "group1/x" of ``store``
    """

    def __init__(self, prefix: str, store: Store):
        self.prefix, self.store = str(prefix), store
        self.timeout = getattr(store, "timeout", 300.0)

    @property
    def job_secret(self) -> bytes | None:
        return getattr(self.store, "job_secret", None)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{_key(key)}"

    def set(self, key, value):
        self.store.set(self._k(key), value)

    def get(self, key):
        return self.store.get(self._k(key))

    def add(self, key, amount):
        return self.store.add(self._k(key), amount)

    def compare_set(self, key, expected, desired):
        return self.store.compare_set(self._k(key), expected, desired)

    def wait(self, keys, timeout=None):
        self.store.wait([self._k(k) for k in _keys(keys)], timeout)

    def check(self, keys):
        return self.store.check([self._k(k) for k in _keys(keys)])

    def delete_key(self, key):
        return self.store.delete_key(self._k(key))

    def num_keys(self):
        """Keys of the **whole** underlying store (as in torch)."""
        return self.store.num_keys()

    def append(self, key, value):
        self.store.append(self._k(key), value)

    def multi_get(self, keys):
        return self.store.multi_get([self._k(k) for k in _keys(keys)])

    def multi_set(self, keys, values):
        self.store.multi_set([self._k(k) for k in _keys(keys)], values)

    def set_timeout(self, timeout):
        self.timeout = _seconds(timeout)
        self.store.set_timeout(self.timeout)

    def close(self):
        """A view owns nothing: closing it leaves the underlying store open."""

    def __repr__(self) -> str:
        return f"PrefixStore({self.prefix!r}, {self.store!r})"


def store_barrier(store: Store, rank: int, world_size: int, name: str, timeout: float) -> None:
    """Every rank sets ``name/arrived/{rank}`` and waits for all; raise naming the absent ranks.

    Use a fresh ``name`` per barrier (e.g. with a counter): keys are never cleared.

    Example::

        store_barrier(store, rank, 4, "init", timeout=30.0)
        # RendezvousError: rendezvous 'init' timed out after 30.0 s: ranks [2] never arrived
        # (0, 1, 3 did); check that every rank started and uses the same MASTER_ADDR/MASTER_PORT
    """
    if isinstance(rank, bool) or not 0 <= operator.index(rank) < operator.index(world_size):
        # keys[-1] would announce the last rank's arrival for it
        raise ValueError(f"store_barrier({name!r}): rank {rank!r} is outside world size {world_size!r}")
    keys = [f"{name}/arrived/{r}" for r in range(world_size)]
    store.set(keys[rank], b"1")
    deadline = time.monotonic() + float(timeout)
    # wait in slices so a short rendezvous timeout is honoured even on a store with a long one
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timeout=max(0.0, min(left, 1.0)))
            return
        except StoreTimeoutError:
            if deadline - time.monotonic() <= 0:
                break
    arrived = [r for r in range(world_size) if store.check([keys[r]])]
    missing = [r for r in range(world_size) if r not in arrived]
    raise RendezvousError(
        f"rendezvous {name!r} timed out after {float(timeout):.1f} s: ranks {missing} never arrived "
        f"({', '.join(map(str, arrived))} did); check that every rank started and uses the same "
        "MASTER_ADDR/MASTER_PORT")
