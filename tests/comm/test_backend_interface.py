"""The backend contract of base.py: validation at the call, Work handles, ordering, debug checks.

A tiny two-rank backend made of two threads and queues (``QueueBackend``) exercises the
derived operations written once in ``Backend``; it is a test double for *transports*, not
for the layer under test (base.py runs for real).
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from neural_arch.distributed.comm import ReduceOp, Work, get_backend_class
from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.dtypes import finish_average, reduce_into
from neural_arch.distributed.comm.local import LocalBackend
from neural_arch.distributed.errors import CollectiveMismatchError, CollectiveTimeoutError, DistributedError


class QueueBackend(Backend):
    """N ranks as N threads of one process; messages through per-(src, dst, tag) queues."""

    name = "queue"

    def __init__(self, rank, size, mailboxes, debug=False, timeout=5.0, jitter=0.0):
        super().__init__(rank, size, timeout=timeout, debug=debug)
        self.mailboxes = mailboxes
        self.sent = 0
        self.jitter = jitter  # random delay before each send: exposes ordering races
        self.rng = np.random.default_rng(rank)

    def _box(self, src, dst, tag):
        return self.mailboxes.setdefault((src, dst, tag), queue.Queue())

    def _send(self, array, dst, tag, info):
        if self.jitter:
            time.sleep(self.jitter * self.rng.random())
        self.sent += 1
        self._box(self.rank, dst, tag).put(np.array(array, copy=True))

    def _recv(self, array, src, tag, info):
        try:
            array[...] = self._box(src, self.rank, tag).get(timeout=info.remaining())
        except queue.Empty:
            raise info.timeout_error([src], self.timeout) from None

    def _allgather(self, output, input, info):
        for r in range(self.size):
            if r != self.rank:
                self._send(input, r, -2, info)
        for r in range(self.size):
            if r == self.rank:
                output[r] = input
            else:
                self._recv(output[r], r, -2, info)

    def _allreduce(self, array, op, info):
        table = np.empty((self.size,) + array.shape, array.dtype)
        self._allgather(table, array, info)
        acc = table[0].copy()
        for r in range(1, self.size):
            reduce_into(acc, table[r], op)
        if op is ReduceOp.AVG:
            finish_average(acc, self.size)
        array[...] = acc

    def _broadcast(self, array, root, info):
        if self.rank == root:
            for r in range(self.size):
                if r != root:
                    self._send(array, r, -3, info)
        else:
            self._recv(array, root, -3, info)

    def _new_group(self, ranks):
        raise NotImplementedError("QueueBackend has no sub-groups")


def run_threads(size, fn, debug=False, timeout=5.0, jitter=0.0):
    """Run fn(backend) on `size` thread-ranks; return results, re-raising the first error per rank."""
    boxes = {}
    backends = [QueueBackend(r, size, boxes, debug=debug, timeout=timeout, jitter=jitter) for r in range(size)]
    out = [None] * size

    def body(r):
        try:
            out[r] = ("ok", fn(backends[r]))
        except BaseException as exc:  # noqa: BLE001
            out[r] = ("err", exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out


def test_reduce_op_alias_and_coercion():
    assert ReduceOp.AVERAGE is ReduceOp.AVG
    assert ReduceOp.coerce("sum") is ReduceOp.SUM
    assert ReduceOp.coerce("average") is ReduceOp.AVG
    with pytest.raises(ValueError, match="not a reduction operator"):
        ReduceOp.coerce("median")


def test_work_stores_exception_and_raises_in_wait():
    work = Work()
    seen = []
    work.add_done_callback(lambda w: seen.append(w.is_completed()))
    assert not work.is_completed()
    threading.Thread(target=work._set_exception, args=(ValueError("boom"),)).start()
    with pytest.raises(ValueError, match="boom"):
        work.wait(timeout=5)
    assert seen == [True] and not work.is_success()
    assert Work.completed(3).result() == 3


def test_work_wait_timeout_is_an_error():
    with pytest.raises(CollectiveTimeoutError):
        Work().wait(timeout=0.01)


@pytest.mark.parametrize("bad, exc, match", [
    (lambda b: b.allreduce([1, 2]), TypeError, "NumPy or CuPy array"),
    (lambda b: b.allreduce(np.ones((4, 4))[:, ::2]), ValueError, "not C-contiguous"),
    (lambda b: b.allreduce(np.ones(3, dtype=np.complex64)), TypeError, "cannot be communicated"),
    (lambda b: b.allreduce(np.ones(3, dtype=np.int32), ReduceOp.AVG), TypeError, "floating dtype"),
    (lambda b: b.broadcast(np.ones(3), root=1), ValueError, "root=1 is out of range"),
    (lambda b: b.reduce_scatter(np.ones(1), np.ones(3)), ValueError, "reduce_scatter output"),
    (lambda b: b.allgather(np.ones((2, 3)), np.ones(3)), ValueError, r"should be \(1, 3\)"),
    (lambda b: b.allgather(np.ones((1, 3), np.float32), np.ones(3)), TypeError, "dtype"),
    (lambda b: b.gather(None, np.ones(3)), ValueError, "needs an output"),
    (lambda b: b.new_group([]), ValueError, "must not be empty"),
])
def test_bad_input_raises_at_the_call(bad, exc, match):
    with pytest.raises(exc, match=match):
        bad(LocalBackend())


def test_world_of_one_is_identity():
    b = LocalBackend()
    a = np.arange(6.0).reshape(2, 3)
    for op in ReduceOp:
        assert np.array_equal(b.allreduce(a.copy(), op).result(), a)
    out = np.zeros((1, 2, 3))
    b.allgather(out, a)
    assert np.array_equal(out[0], a)
    rs = np.zeros((2, 3))
    b.reduce_scatter(rs, a)
    assert np.array_equal(rs, a)
    assert b.broadcast_object({"k": [1]}) == {"k": [1]} and b.allgather_object(7) == [7]
    with pytest.raises(ValueError, match="cannot send to itself"):
        b.send(a, 0)


@pytest.mark.parametrize("size", [2, 3])
def test_derived_operations_match_numpy(size):
    rng = np.random.default_rng(0)
    glob = rng.standard_normal((size, size * 2, 3))

    def fn(b):
        r = b.rank
        red = glob[r].copy()
        b.reduce(red, root=1, op=ReduceOp.SUM)
        gat = np.zeros((size,) + glob[r].shape) if r == 0 else None
        b.gather(gat, glob[r].copy(), root=0)
        sc = np.zeros((2, 3))
        b.scatter(sc, glob[0].reshape(size, 2, 3).copy() if r == 2 % size else None, root=2 % size)
        rs = np.zeros((2, 3))
        b.reduce_scatter(rs, glob[r].copy(), ReduceOp.MAX)
        a2a = np.zeros_like(glob[r])
        b.alltoall(a2a, glob[r].copy())
        b.barrier()
        obj = b.allgather_object({"rank": r})
        return red, gat, sc, rs, a2a, obj

    out = run_threads(size, fn)
    for r, (status, val) in enumerate(out):
        assert status == "ok", val
        red, gat, sc, rs, a2a, obj = val
        if r == 1:
            assert np.allclose(red, glob.sum(0))
        else:
            assert np.array_equal(red, glob[r])  # non-root arrays are left unchanged
        if r == 0:
            assert np.array_equal(gat, glob)
        assert np.array_equal(sc, glob[0].reshape(size, 2, 3)[r])
        assert np.array_equal(rs, glob.max(0)[2 * r:2 * r + 2])
        expect = np.concatenate([glob[s][2 * r:2 * r + 2] for s in range(size)])
        assert np.array_equal(a2a, expect)
        assert obj == [{"rank": i} for i in range(size)]


def test_async_ops_complete_in_submission_order():
    def fn(b):
        arrays = [np.full(4, float(i + b.rank)) for i in range(20)]
        works = [b.allreduce(a, ReduceOp.SUM, async_op=True) for a in arrays]
        sync = np.ones(2)
        b.allreduce(sync)  # queued behind the async ones, not run inline ahead of them
        for w in works:
            w.wait(timeout=10)
        return [a[0] for a in arrays], [w.info.seq for w in works], sync

    out = run_threads(2, fn)
    for status, (firsts, seqs, sync) in out:
        assert status == "ok"
        assert firsts == [2.0 * i + 1 for i in range(20)]
        assert seqs == list(range(1, 21))
        assert np.array_equal(sync, [2.0, 2.0])


def test_debug_mode_raises_on_every_rank_for_mismatched_shapes():
    def fn(b):
        a = np.ones(3 if b.rank == 0 else 4)
        b.allreduce(a)

    out = run_threads(2, fn, debug=True)
    for status, exc in out:
        assert status == "err" and isinstance(exc, CollectiveMismatchError)
        assert "all_reduce shape (3,)" in str(exc) and "shape (4,)" in str(exc) and "#1" in str(exc)


def test_timeout_error_names_op_sequence_and_missing_rank():
    def fn(b):
        b.barrier()
        if b.rank == 0:
            return b.allreduce(np.ones(8, np.float32)).result()  # rank 1 never joins #2
        return None

    out = run_threads(2, fn, timeout=0.5)
    status, exc = out[0]
    assert status == "err" and isinstance(exc, CollectiveTimeoutError)
    msg = str(exc)
    assert "all_reduce #2" in msg and "(8,)" in msg and "float32" in msg and "ranks [1] did not arrive" in msg


def test_failed_collective_poisons_later_ones():
    def fn(b):
        if b.rank == 0:
            with pytest.raises(CollectiveTimeoutError):
                b.barrier()
            with pytest.raises(DistributedError, match="earlier operation on this group failed"):
                b.barrier()
        return True

    assert [s for s, _ in run_threads(2, fn, timeout=0.3)] == ["ok", "ok"]


def test_registry_knows_every_backend_and_names_the_extra(monkeypatch):
    import sys

    # Every backend the factory's table documents resolves (any case) to its Backend subclass.
    modules = {"gloo": ("neural_arch.distributed.comm.gloo.backend", "GlooBackend"),
               "mpi": ("neural_arch.distributed.comm.mpi.backend", "MPIBackend"),
               "nccl": ("neural_arch.distributed.comm.nccl.backend", "NCCLBackend"),
               "local": ("neural_arch.distributed.comm.local", "LocalBackend")}
    for name, (module, cls_name) in modules.items():
        cls = get_backend_class(name.upper())
        assert issubclass(cls, Backend) and (cls.__module__, cls.__name__) == (module, cls_name), name
    assert get_backend_class("local") is LocalBackend
    # An unknown name is an error that lists every registered backend.
    with pytest.raises(ValueError, match=r"unknown; choose one of \['gloo', 'local', 'mpi', 'nccl'\]"):
        get_backend_class("carrier-pigeon")
    # A backend whose module cannot be imported (its requirement missing) names the pip extra.
    extras = {"mpi": r"neural_arch\[mpi\]", "nccl": r"neural_arch\[gpu\]"}
    for name, extra in extras.items():
        monkeypatch.setitem(sys.modules, modules[name][0], None)  # None in sys.modules: ImportError
        with pytest.raises(ImportError, match=rf"the '{name}' backend cannot be imported .*{extra}"):
            get_backend_class(name)


def test_shutdown_then_use_is_a_clear_error():
    b = LocalBackend()
    b.allreduce(np.ones(2), async_op=True).wait()
    b.shutdown()
    with pytest.raises(DistributedError, match="destroyed"):
        b.allreduce(np.ones(2))
    time.sleep(0)


def test_derived_gather_and_scatter_handle_0d_arrays():
    def fn(b):
        gat = np.zeros(2) if b.rank == 0 else None
        b.gather(gat, np.array(float(b.rank + 1)), root=0)
        sc = np.array(0.0)
        b.scatter(sc, np.array([10.0, 20.0]) if b.rank == 1 else None, root=1)
        return gat, float(sc)

    (s0, (g0, sc0)), (s1, (g1, sc1)) = run_threads(2, fn)
    assert s0 == s1 == "ok"
    assert np.array_equal(g0, [1.0, 2.0]) and (sc0, sc1) == (10.0, 20.0)


def test_async_point_to_point_keeps_issue_order_per_peer_and_tag():
    def fn(b):
        if b.rank == 0:
            works = [b.send(np.full(64, float(i)), 1, tag=3, async_op=True) for i in range(12)]
            for w in works:
                w.wait(timeout=10)
            return None
        bufs = [np.zeros(64) for _ in range(12)]
        works = [b.recv(buf, 0, tag=3, async_op=True) for buf in bufs]
        for w in works:
            w.wait(timeout=10)
        return [float(buf[0]) for buf in bufs]

    for _ in range(3):  # random send delays would reorder messages sent from racing threads
        out = run_threads(2, fn, jitter=0.002)
        assert out[1] == ("ok", [float(i) for i in range(12)])


def test_a_raising_done_callback_does_not_stop_later_operations():
    attached = threading.Event()

    def fn(b):
        if b.rank == 1:
            assert attached.wait(10)  # rank 0 attaches its callback while the op is still pending
        w1 = b.allreduce(np.ones(2), async_op=True)
        if b.rank == 0:
            assert not w1.is_completed()  # rank 1 has not joined yet
            w1.add_done_callback(lambda w: 1 / 0)
            attached.set()
        w2 = b.allreduce(np.ones(2), async_op=True)
        w1.wait(timeout=5)
        w2.wait(timeout=5)
        return w2.result().tolist()

    assert [r for r in run_threads(2, fn)] == [("ok", [2.0, 2.0])] * 2


def test_queued_operations_fail_fast_after_a_fatal_error():
    def fn(b):
        if b.rank == 1:
            return None  # never joins: rank 0's first op times out
        start = time.monotonic()
        works = [b.allreduce(np.ones(2), async_op=True) for _ in range(4)]
        errors = []
        for w in works:
            with pytest.raises(DistributedError) as info:
                w.wait(timeout=10)
            errors.append(info.value)
        return time.monotonic() - start, errors

    (_, (elapsed, errors)), _ = run_threads(2, fn, timeout=0.5)
    assert isinstance(errors[0], CollectiveTimeoutError)
    assert all("was not run" in str(e) or "cannot run" in str(e) for e in errors[1:])
    assert elapsed < 2.0  # one timeout, not one per queued op


def test_float16_average_does_not_overflow():
    def fn(b):
        a = np.full(4, 40000, dtype=np.float16)  # the sum (80000) overflows float16, the mean does not
        b.allreduce(a, ReduceOp.AVG)
        out = np.zeros(2, dtype=np.float16)
        b.reduce_scatter(out, np.full(4, 40000, dtype=np.float16), ReduceOp.AVG)
        return a.tolist(), out.tolist()

    for status, (avg, rs) in run_threads(2, fn):
        assert status == "ok" and avg == [40000.0] * 4 and rs == [40000.0] * 2
