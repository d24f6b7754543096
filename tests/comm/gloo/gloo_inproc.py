"""An in-memory transport with one thread per rank: tests the gloo backend's logic in one process.

It implements the transport contract (FIFO per (peer, channel), sizes must match, timeouts
raise ``info.timeout_error``) with queues, so algorithm bugs show up in milliseconds, without
sockets. The real-transport tests (``test_gloo_procs.py``) then run the same checks across processes.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

from neural_arch.distributed.comm.gloo.backend import GlooBackend


class _Hub:
    def __init__(self, size: int):
        self.size = size
        self.queues: Dict[Tuple[int, int, int], queue.Queue] = {}
        self.lock = threading.Lock()

    def q(self, src: int, dst: int, channel: int) -> queue.Queue:
        with self.lock:
            return self.queues.setdefault((src, dst, channel), queue.Queue())


class InProcTransport:
    def __init__(self, hub: _Hub, rank: int):
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.sent = 0

    def send(self, peer, buf, channel, info):
        self.sent += 1
        self.hub.q(self.rank, peer, channel).put(np.array(buf, copy=True).reshape(-1).view(np.uint8))

    def recv_into(self, peer, buf, channel, info):
        start = time.monotonic()
        try:
            data = self.hub.q(peer, self.rank, channel).get(timeout=max(min(info.remaining(), 10.0), 0.01))
        except queue.Empty:
            raise info.timeout_error([peer], time.monotonic() - start) from None
        view = np.asarray(buf).reshape(-1).view(np.uint8)
        assert data.size == view.size, f"rank {self.rank}: message of {data.size} bytes into {view.size}"
        view[...] = data

    def sendrecv(self, dst, send_buf, src, recv_buf, channel, info):
        self.send(dst, send_buf, channel, info)
        self.recv_into(src, recv_buf, channel, info)

    def isend(self, peer, buf, channel, info):
        self.send(peer, buf, channel, info)

        class _Done:
            def wait(self):
                return None
        return _Done()

    def peer_kind(self, peer):
        return "inproc"

    def close(self):
        pass


def run_threads(size: int, fn: Callable, *args, timeout: float = 10.0) -> List:
    """Run ``fn(backend, *args)`` on ``size`` threads, one GlooBackend each; return the results."""
    hub = _Hub(size)
    results: List = [None] * size
    errors: List = [None] * size

    def body(r):
        backend = GlooBackend(InProcTransport(hub, r) if size > 1 else None, r, size, timeout=timeout)
        try:
            results[r] = fn(backend, *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors[r] = exc
        finally:
            backend.shutdown()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
        assert not t.is_alive(), "a rank thread hung"
    for exc in errors:
        if exc is not None:
            raise exc
    return results
