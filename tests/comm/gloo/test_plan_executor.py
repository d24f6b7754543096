"""The plan executor is a component built from what it needs (a transport, peers, rank, size and a
channel), so it runs without a backend: two executors over an in-memory transport, one thread each."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from neural_arch.distributed.comm.gloo.executor import PlanExecutor
from neural_arch.distributed.comm.work import OpInfo, ReduceOp

pytestmark = pytest.mark.timeout(60)


class _Done:
    def wait(self):
        return True


class MemoryTransport:
    """Unbounded queues per (src, dst, channel): sends never block, so no schedule can deadlock."""

    def __init__(self, rank: int, wires: dict):
        self.rank, self.wires = rank, wires

    def _wire(self, src, dst, ch):
        return self.wires.setdefault((src, dst, ch), queue.Queue())

    def send(self, dst, buf, ch, info):
        self._wire(self.rank, dst, ch).put(np.array(buf))

    def isend(self, dst, buf, ch, info):
        self.send(dst, buf, ch, info)
        return _Done()

    def recv_into(self, src, target, ch, info):
        target[...] = self._wire(src, self.rank, ch).get(timeout=10)

    def sendrecv(self, dst, buf, src, target, ch, info):
        self.send(dst, buf, ch, info)
        self.recv_into(src, target, ch, info)


def _run_pair(fn):
    wires: dict = {}     # filled from two threads: dict.setdefault is atomic under the GIL
    executors = [PlanExecutor(MemoryTransport(r, wires), [0, 1], r, 2, channel=0) for r in range(2)]
    out = [None, None]
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, fn(executors[r], r))) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return executors, out


def test_two_executors_all_reduce_with_the_plan_they_choose_and_the_one_forced():
    info = OpInfo("all_reduce", 1, [0, 1], 0)

    def body(ex, r):
        small = np.full(8, r + 1.0)
        ex.allreduce(small, ReduceOp.SUM, info)               # the latency path: one exchange
        big = np.arange(1000, dtype=np.float64) * (r + 1)
        with ex.forced_algorithm("ring"):                      # the seam, on the component itself
            chosen = ex.chosen_algorithm("all_reduce", big)
            ex.allreduce(big, ReduceOp.MAX, info)
        return small, big, chosen, ex.force

    executors, out = _run_pair(body)
    for small, big, chosen, force in out:
        assert (small == 3.0).all() and (big == np.arange(1000) * 2.0).all()
        assert chosen == "ring_allreduce" and force is None    # restored on exit
    names = {p.algorithm for p in executors[0].compiled_plans()}
    assert names == {"recursive_doubling_allreduce", "ring_allreduce"}
    executors[0].clear()
    assert executors[0].compiled_plans() == []
