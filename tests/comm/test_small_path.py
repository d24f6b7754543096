"""The synchronous small-message path keeps every guarantee of the general one.

In-process (a backend of size 2 whose primitives are local, so the machinery itself is under
test): a synchronous call returns a finished Work, validation happens before a sequence number
is used, a failure inside the primitive raises in the caller and poisons the group, and a
synchronous call still queues behind pending async ones. Under a real ``mpiexec``: the
watchdog's wake-up requests (comm/mpi/progress.py) never leak into a later operation.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from polling import wait_for

from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.debug import wire_word
from neural_arch.distributed.comm.spans import in_flight
from neural_arch.distributed.comm.work import OpInfo, ReduceOp, Work
from neural_arch.distributed.errors import GroupPoisonedError
from neural_arch.distributed.stall import StallInspector
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(120)]


class Echo(Backend):
    """Size 2, no peer: all_reduce doubles (as if the peer held the same data), and an optional
    gate lets a test hold an async op on the lane."""

    name = "echo"

    def __init__(self):
        super().__init__(0, 2, timeout=10.0)
        self.log: list = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None

    def _allreduce(self, array, op, info):
        self.gate.wait(5)
        if self.fail_with is not None:
            raise self.fail_with
        self.log.append((info.name, info.seq))
        array *= 2

    def _broadcast(self, array, root, info):
        self.log.append((info.name, info.seq))

    def _allgather(self, output, input, info):
        output[...] = input

    def _send(self, array, dst, tag, info):  # pragma: no cover - not used
        raise NotImplementedError("Echo has no peers")

    def _recv(self, array, src, tag, info):  # pragma: no cover - not used
        raise NotImplementedError("Echo has no peers")

    def _new_group(self, ranks):  # pragma: no cover - not used
        raise NotImplementedError("Echo has no peers")


def test_sync_call_returns_a_finished_work_with_the_array():
    b = Echo()
    x = np.ones(4, np.float32)
    work = b.allreduce(x)
    assert isinstance(work, Work) and work.is_completed() and work.is_success()
    assert work.result() is x and x.tolist() == [2.0] * 4 and work.completed_at is not None
    assert work.info.seq == 1 and work.info.dtype == "float32" and work.info.reduce_op == "sum"
    seen = []
    work.add_done_callback(seen.append)          # already done: runs at once
    assert seen == [work]


def test_the_fused_path_reuses_its_opinfo_only_while_nobody_else_holds_it(monkeypatch):
    import neural_arch.distributed.comm.backend as backend_module

    built = []

    class Counted(OpInfo):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            built.append(args[1])                 # the sequence number it was built for
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(backend_module, "OpInfo", Counted)
    b = Echo()
    x32, x64 = np.ones(4, np.float32), np.ones(3)
    first = b.allreduce(x32)
    second = b.allreduce(x64, ReduceOp.MAX)       # the first Work holds op 1's OpInfo: a new one
    assert built == [1, 2] and first.info is not second.info
    assert (first.info.seq, first.info.dtype, first.info.reduce_op, first.info.shape) == (1, "float32", "sum", (4,))
    assert (second.info.seq, second.info.dtype, second.info.reduce_op, second.info.shape) == (2, "float64", "max", (3,))
    assert second.wait() is True and second.exception() is None and second.result() is x64
    del first, second
    b.allreduce(x32)                              # Works dropped at once: op 2's OpInfo becomes op 3's...
    b.allreduce(x64, ReduceOp.MIN, False, False)  # ...and op 4's
    assert built == [1, 2]
    info = b._fast_info                           # renewed field by field, wire word included
    assert (info.seq, info.dtype, info.reduce_op, info.shape) == (4, "float64", "min", (3,))
    assert info.wire == wire_word("all_reduce", 4, "float64", "min") and info.deadline > time.monotonic()
    held = [info]                                 # kept (as a recorded span or the stall inspector keeps it)
    del info
    b.allreduce(x32)
    assert built == [1, 2, 5] and held[0].seq == 4 and b._fast_info.seq == 5


def test_a_recorded_span_keeps_its_own_opinfo_on_the_fused_path():
    # A span builds its details from the OpInfo only when read, after later calls ran: reusing a
    # held OpInfo would relabel every recorded all_reduce as the last one.
    from neural_arch.profiler import events

    b = Echo()
    spans: list = []
    events.subscribe(spans.append)
    try:
        for n in (1, 2, 3):
            b.allreduce(np.ones(n, np.float32), _work=False)      # fused: no Work keeps the OpInfo
    finally:
        events.unsubscribe(spans.append)
    assert [(s.args["seq"], s.args["shape"]) for s in spans] == [(1, (1,)), (2, (2,)), (3, (3,))]
    kept = b.allreduce(np.ones(5, np.float32))                 # a Work kept alive over many calls
    for _ in range(4):
        b.allreduce(np.ones(6))
    assert (kept.info.seq, kept.info.shape, kept.info.dtype) == (4, (5,), "float32")


def test_the_fused_path_admits_only_what_the_one_validation_accepts():
    # both paths of allreduce validate with _check_allreduce: its shortcut (the _FAST table) must
    # never admit an array or op that the full checks would reject or convert
    from neural_arch.distributed.comm.dtypes import SUPPORTED_DTYPES

    b = Echo()
    for dtype in sorted(SUPPORTED_DTYPES, key=str):
        for op in ReduceOp:
            x = np.ones(3, dtype)
            try:
                got, fast = b._check_allreduce(x, op)
            except TypeError:            # rejected (bool SUM, integer AVG): so not admitted either
                continue
            if fast is not None:
                b._check_array(x, "array", writable=True)
                assert got is op and b._check_op(op, x) is op, (dtype, op)
    unaligned = np.frombuffer(bytearray(8 * 4 + 1), np.uint8)[1:].view(np.float64)
    unaligned[...] = 1.0
    assert not unaligned.flags.aligned and b._check_allreduce(unaligned, ReduceOp.SUM)[1] is None
    assert b.allreduce(unaligned).info.seq == 1 and (unaligned == 2.0).all()   # the general path
    frozen = np.ones(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        b._check_allreduce(frozen, ReduceOp.MAX)


def test_validation_errors_come_first_and_use_no_sequence_number():
    b = Echo()
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        b.allreduce(ro)
    with pytest.raises(ValueError, match="C-contiguous"):
        b.allreduce(np.ones((4, 4))[:, 0])
    with pytest.raises(TypeError, match="ReduceOp.AVG needs a floating dtype"):
        b.allreduce(np.ones(2, np.int32), ReduceOp.AVG)
    with pytest.raises(ValueError, match="not a reduction operator"):
        b.allreduce(np.ones(2), "bogus")
    with pytest.raises(TypeError, match="NumPy or CuPy array"):
        b.allreduce([1.0, 2.0])
    assert b.log == [] and b._seq == 0           # nothing ran, nothing was numbered
    b.allreduce(np.ones(2))
    assert b.log == [("all_reduce", 1)]


def test_a_failure_inside_the_op_raises_in_the_caller_and_poisons_the_group():
    b = Echo()
    b.fail_with = RuntimeError("the wire broke")
    with pytest.raises(RuntimeError, match="the wire broke"):
        b.allreduce(np.ones(2))
    b.fail_with = None
    with pytest.raises(GroupPoisonedError, match="the wire broke"):
        b.allreduce(np.ones(2))
    with pytest.raises(GroupPoisonedError):
        b.broadcast(np.ones(2), async_op=True)


def test_a_sync_call_waits_behind_pending_async_ops_in_order():
    b = Echo()
    b.gate.clear()                                # hold the async op on the progress lane
    a = np.ones(2)
    first = b.allreduce(a, async_op=True)
    threading.Timer(0.2, b.gate.set).start()
    second = b.broadcast(np.ones(2))              # synchronous, but the lane is busy: queued
    assert first.is_completed() and second.is_completed()
    assert b.log == [("all_reduce", 1), ("broadcast", 2)] and a.tolist() == [2.0, 2.0]
    b.shutdown()


def test_float16_average_is_premultiplied():
    b = Echo()
    x = np.full(3, 60000.0, np.float16)          # 2 * 60000 overflows float16; the mean does not
    b.allreduce(x, ReduceOp.AVG)
    assert np.isfinite(x).all() and x.tolist() == [60000.0] * 3


def _ops_of(b):
    return sorted((i.name, i.seq) for r, i in in_flight() if r is b)


def test_an_op_in_flight_sits_in_its_backends_slot_where_the_stall_inspector_finds_it():
    class Held(Echo):                 # broadcast and send wait on the gate too
        def _broadcast(self, array, root, info):
            self.gate.wait(5)

        def _send(self, array, dst, tag, info):
            self.gate.wait(5)

    b = Held()
    inspector = StallInspector(warning_s=0.05, store=None, rank=0, interval=10)   # check() by hand
    for call, expected in [(lambda: b.allreduce(np.ones(2)), ("all_reduce", 1)),            # fused path
                           (lambda: b.broadcast(np.ones(2)), ("broadcast", 2)),             # inline _run
                           (lambda: b.allreduce(np.ones(2), async_op=True).wait(), ("all_reduce", 3)),  # lane
                           (lambda: b.send(np.ones(2), 1), ("send", 1))]:                   # p2p slot
        b.gate.clear()
        t = threading.Thread(target=call)
        t.start()
        assert wait_for(lambda: _ops_of(b), 5, interval=0.001)
        assert _ops_of(b) == [expected]
        time.sleep(0.06)   # the stall itself (the op waits past warning_s): what the inspector must report
        reports = inspector.check()
        assert [(r.op, r.seq) for r in reports] == [expected]
        assert f"{expected[0]} #{expected[1]} of group [0, 1] has waited" in reports[0].message
        b.gate.set()
        t.join(5)
        assert _ops_of(b) == [] and inspector.check() == []     # done: the slot is empty, the op forgotten
    b.fail_with = RuntimeError("boom")                            # a failing op empties its slot too
    with pytest.raises(RuntimeError):
        b.allreduce(np.ones(2))
    assert _ops_of(b) == []
    b.shutdown()


def test_tensor_api_form_returns_no_work_and_debug_mode_leaves_the_fused_path():
    b = Echo()
    x = np.ones(2)
    assert b.allreduce(x, ReduceOp.SUM, False, False) is None and x.tolist() == [2.0, 2.0]
    assert b.log == [("all_reduce", 1)]
    checked = []
    b._debug_check = checked.append               # what DETAIL mode runs before every collective
    b.debug = True                                # set after construction, as tests and users do
    b.allreduce(x)
    assert [i.seq for i in checked] == [2]
    b.debug = False
    b.allreduce(x)
    assert [i.seq for i in checked] == [2] and b._seq == 3


def test_opinfo_wire_is_computed_lazily_and_explicit_words_stay():
    info = OpInfo("all_reduce", 7, [0, 1], 0, (4,), "float32", None, "sum", wire=None)
    assert info.wire == wire_word("all_reduce", 7, "float32", "sum")
    assert OpInfo("sendrecv", 1).wire == 0       # built by hand: unchecked, as before
    info.extra["ready"] = 1                      # backend scratch, created on first use
    assert info.extra == {"ready": 1}


# -- MPI: the watchdog's wake-ups ---------------------------------------------------------------------
def stale_wake_is_swallowed():
    """Fire the watchdog at this thread for an op that already finished (what happens when a
    deadline passes just as an op completes); the next collectives must ignore that wake-up."""
    import time

    import neural_arch.distributed as dist
    from neural_arch.distributed.resolve import _resolve_group

    backend = _resolve_group(None, "test").backend
    watchdog = backend._watchdog
    assert watchdog is not None, "mpi4py should run at MPI_THREAD_MULTIPLE"
    x = np.ones(3)
    backend.allreduce(x)
    slot = watchdog._slot()
    old = OpInfo("all_reduce", 0, [0, 1], 0, deadline=time.monotonic() - 1)
    slot.fired = old                              # the watchdog "fired for" an op that is done
    watchdog.comm.Send(np.ones(1, np.int64), watchdog.me, slot.tag)
    results = []
    for _ in range(3):
        y = np.full(2, float(dist.get_rank() + 1))
        backend.allreduce(y)                      # must neither time out nor return early
        results.append(y.tolist())
    stats = (backend._fatal is None, watchdog.active() == [])
    z = np.zeros((2, 1))
    backend.allgather(z, np.array([float(dist.get_rank())]))   # a second, different fast path
    return results, stats, z.ravel().tolist()


def persistent_all_reduces():
    """Small all_reduces ride inside the MPI backend's call check (comm/mpi/check.py: the payload in
    each rank's slot of one persistent allgather, reduced in rank order): sizes on both sides of the
    inline threshold, native and widened (float16) dtypes, several ops: every result matches NumPy
    on every rank. (Mismatched calls: tests/faults/test_mpi_mismatch.py.)"""
    import neural_arch.distributed as dist
    from neural_arch.distributed.comm.mpi import allreduce as M
    from neural_arch.distributed.resolve import _resolve_group

    backend = _resolve_group(None, "test").backend
    r, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(5)
    inline = backend._check.inline_bytes
    cases = [(size, dtype, op) for size in (1, 3, 100, inline // 8, inline // 8 + 1)
             for dtype in ("float64", "int64") for op in ("sum", "max")]
    cases += [(k + 1, "float32", "avg") for k in range(11)]
    cases += [(7, "float16", "sum"), (5, "int32", "product")]
    bad = []
    for repeat in range(2):
        for size, dtype, op in cases:
            data = rng.integers(1, 4, size=(n, size)).astype(dtype)
            mine = data[r].copy()
            backend.allreduce(mine, ReduceOp.coerce(op))
            want = {"sum": data.sum(0), "max": data.max(0), "avg": data.mean(0), "product": data.prod(0)}[op]
            if not np.allclose(mine.astype(np.float64), want.astype(np.float64), rtol=1e-3):
                bad.append((repeat, size, dtype, op))
    return bad, inline == M.PERSISTENT_MAX_BYTES, True


@pytest.mark.mpi
def test_mpi_stale_wake_up_never_ends_a_later_op_and_persistent_all_reduces_match_numpy():
    with RankPool(2, backend="mpi", timeout=60.0) as pool:
        for results, stats, gathered in pool.run(stale_wake_is_swallowed):
            assert results == [[3.0, 3.0]] * 3
            assert stats == (True, True)
            assert gathered == [0.0, 1.0]
        for bad, bounded, small_only in pool.run(persistent_all_reduces):
            assert bad == [] and bounded and small_only, (bad, bounded, small_only)
