"""Rendezvous key-value stores: how the ranks of a job find each other.

Three stores share one small interface (torch's ``Store`` names and semantics)::

    set(key, value)            value: bytes or str (str is UTF-8 encoded)
    get(key) -> bytes          blocks until the key exists (up to the store's timeout)
    add(key, amount) -> int    atomic counter (the value is the decimal text, torch-compatible)
    compare_set(key, expected, desired) -> bytes
    wait(keys, timeout=None)   blocks until every key exists
    check(keys) -> bool        whether every key exists, without blocking
    append(key, value)         atomic append to the bytes at key (created when absent)
    multi_get(keys) -> list    multi_set(keys, values)
    delete_key(key) -> bool    num_keys() -> int          close()

Keys are str (UTF-8 bytes are read as text, as torch does); timeouts are seconds or a
``datetime.timedelta``; ``add`` takes an integer only.

* :class:`TCPStore` -- rank 0 (``is_master=True``) runs a small threaded server; everyone else
  connects to it (retrying while it is not up yet). The wire protocol is length-prefixed binary
  frames; the store **never unpickles** anything it receives (see :mod:`.tcp_store`).
* :class:`FileStore` -- a binary append-only log on a shared file system, serialised with
  ``fcntl.flock`` (see :mod:`neural_arch.distributed.rendezvous.file_store`).
* :class:`PrefixStore` -- namespacing wrapper (sub-groups, restarts).

:func:`store_barrier` is the rendezvous every backend starts with: it says *which ranks* never
arrived when it times out.

Authentication: every TCPStore connection passes the one mutual HMAC handshake of
:mod:`neural_arch.distributed.auth` (details in :mod:`.tcp_store`).

This module is the public face (the names torch users import); the interface and
:class:`PrefixStore`/:func:`store_barrier` live in :mod:`.base`, each store in its own module.

Example::

    >>> master = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=5)
    >>> restart = PrefixStore("restart1", master)    # a namespace per restart: keys never collide
    >>> restart.set("ready", "yes"); master.get("restart1/ready")
    b'yes'
    >>> master.close()
"""

from __future__ import annotations

from neural_arch.distributed.errors import StoreTimeoutError
from neural_arch.distributed.rendezvous.base import PrefixStore, Store, store_barrier
from neural_arch.distributed.rendezvous.file_store import FileStore
from neural_arch.distributed.rendezvous.tcp_store import TCPStore

__all__ = ["FileStore", "PrefixStore", "Store", "StoreTimeoutError", "TCPStore", "store_barrier"]
