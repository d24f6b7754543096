"""Rank-side helpers for the transport tests (imported by the rank processes, not by pytest).

Example (inside a rank started by ``rank_snippets.run_ranks`` with ``PORT``/``MODE`` set)::

    t, store = connect()
    t.send(1, np.ones(3), 0, info(10))
"""

from __future__ import annotations

import os
import time

from neural_arch.distributed.comm.gloo.transport.engine import connect_transport
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.rendezvous.store import TCPStore


def connect(timeout: float = 30.0, token=None):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = TCPStore("127.0.0.1", int(os.environ["PORT"]), timeout=timeout, auth_token=token)
    t = connect_transport(store, rank, world, timeout, mode=os.environ.get("MODE", "auto"), auth_token=token)
    return t, store


def info(seconds: float, name: str = "test_op", seq: int = 1) -> OpInfo:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return OpInfo(name, seq, list(range(world)), rank, deadline=time.monotonic() + seconds)
