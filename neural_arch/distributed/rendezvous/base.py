"""The rendezvous store interface (torch's ``Store`` names and semantics) and what works on any store.

* :class:`Store` -- the methods every store implements (``set``/``get``/``add``/``compare_set``/
  ``wait``/``check``/``delete_key``/``num_keys``), ``timeout``, a context manager.
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

import time
from collections.abc import Iterable, Sequence
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


def _keys(keys: str | Iterable[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else [str(k) for k in keys]


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

    def close(self) -> None:
        pass

    def set_timeout(self, timeout: float) -> None:
        self.timeout = float(timeout)

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
        return f"{self.prefix}/{key}"

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

    def set_timeout(self, timeout):
        self.timeout = float(timeout)
        self.store.set_timeout(timeout)

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
