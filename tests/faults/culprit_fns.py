"""Rank-side functions of ``test_culprit.py``: one rank is SIGKILLed in the middle of an all_reduce
over TCP, and every survivor -- which drops its links as soon as it learned of the failure, as a
real rank does when its error ends the process -- reports whom its error blames.

The pool is started with ``init=False``: the backend comes straight from ``GlooBackend.create``
over a TCPStore on the pool's MASTER_ADDR/MASTER_PORT.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np


def killed_mid_all_reduce(victim: int, nelems: int, delay_s: float):
    """Every rank joins a warm-up all_reduce, then an all_reduce of ``nelems`` float32 elements;
    ``victim`` SIGKILLs itself ``delay_s`` into it. A survivor returns (error type, message, seconds
    it waited) and then shuts its group down at once."""
    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.rendezvous.store import TCPStore

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=size,
                     is_master=rank == 0, timeout=20)
    b = GlooBackend.create(store, rank, size, timeout=20.0, transport="tcp")
    b.allreduce(np.ones(4, np.float32))
    x = np.ones(nelems, np.float32)
    if rank == victim:
        threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
    t0 = time.monotonic()
    try:
        b.allreduce(x)
        outcome = ("no error", "", time.monotonic() - t0)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = (type(exc).__name__, str(exc), time.monotonic() - t0)
    b.shutdown()        # what a real rank's exit does: its links drop right after it learned
    store.close()
    return outcome


def killed_during_shm_setup(victim: int, kill_key: str):
    """Every rank sets up a shared-memory gloo group; ``victim`` SIGKILLs itself right after it stored
    ``kill_key`` (its files exist, its peers have not all mapped them). A survivor returns (error type,
    message, seconds it waited, the dead rank's files still in the shared-memory directory right after)."""
    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.comm.gloo.transport.shm import _ring_dir
    from neural_arch.distributed.rendezvous.store import PrefixStore, TCPStore

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tcp = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=size,
                   is_master=rank == 0, timeout=20)
    tcp.set(f"pid/{rank}", str(os.getpid()))
    tcp.wait([f"pid/{r}" for r in range(size)])
    pids = [int(tcp.get(f"pid/{r}")) for r in range(size)]   # read now: rank 0 hosts the store

    class DieAfter(PrefixStore):
        # the fault: this process dies the moment the key is stored, as a SIGKILL mid set-up would
        def set(self, key, value):
            super().set(key, value)
            if rank == victim and key == kill_key:
                os.kill(os.getpid(), signal.SIGKILL)

    store = DieAfter("setup", tcp)
    t0 = time.monotonic()
    try:
        GlooBackend.create(store, rank, size, timeout=20.0, transport="shm")
        outcome = ("no error", "")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = (type(exc).__name__, str(exc))
    waited = time.monotonic() - t0
    left = sorted(n for n in os.listdir(_ring_dir()) if n.startswith(f"na-{pids[victim]}-"))
    return (*outcome, waited, left)


def rendezvous_without(size: int, timeouts: list):
    """Ranks 0..len(timeouts)-1 of a world of ``size`` rendezvous (``GlooBackend.create`` over TCP, rank 0
    hosting the store); the other ranks never start. Rank r gives up after ``timeouts[r]`` seconds, and
    the store's host closes the store when it gives up. Returns (error type, message, seconds)."""
    from neural_arch.distributed.comm.gloo.backend import GlooBackend
    from neural_arch.distributed.rendezvous.store import TCPStore

    rank = int(os.environ["RANK"])
    if rank >= len(timeouts):
        return ("absent", "", 0.0)
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=len(timeouts),
                     is_master=rank == 0, timeout=20)
    store.set(f"up/{rank}", b"1")
    store.wait([f"up/{r}" for r in range(len(timeouts))])   # both are in: only the absent rank is missing
    t0 = time.monotonic()
    try:
        GlooBackend.create(store, rank, size, timeout=timeouts[rank], transport="tcp")
        outcome = ("no error", "")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = (type(exc).__name__, str(exc))
    store.close()
    return (*outcome, time.monotonic() - t0)
