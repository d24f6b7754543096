"""The gloo backend's algorithms on an in-memory transport (threads, no sockets): fast and thorough."""

import gloo_checks as C
import numpy as np
import pytest
from gloo_inproc import run_threads

import neural_arch.distributed.comm.gloo.executor as GA

pytestmark = pytest.mark.timeout(60)
SIZES = [1, 2, 3, 4, 5]
SHAPES = [(), (0,), (1,), (2,), (3,), (7,), (3, 5), (1000,)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algo", [None, "ring", "rd"])
def test_allreduce_every_op_dtype_shape(size, algo):
    def body(b):
        for i, dtype in enumerate(C.DTYPES):
            for op in C.ops_for(dtype):
                for shape in SHAPES:
                    C.check_allreduce(b, i, shape, dtype, op, algo)
        return "ok"
    assert run_threads(size, body) == ["ok"] * size


@pytest.mark.parametrize("size", SIZES)
def test_allreduce_large_takes_the_ring(size):
    """At the world size's ring threshold an all_reduce takes the ring (and stays correct); one
    element below it, recursive doubling. Checked on what the executor compiled and ran, not only
    on what the selection says."""
    threshold = GA.RING_ALLREDUCE_MIN_BYTES.get(size, GA.RING_ALLREDUCE_DEFAULT_MIN_BYTES)
    n = threshold // 4                                  # float32: exactly the threshold

    def body(b):
        chosen = (b.chosen_algorithm("all_reduce", np.zeros(n, np.float32)),
                  b.chosen_algorithm("all_reduce", np.zeros(n - 1, np.float32)))
        for op in ("sum", "avg", "max"):
            C.check_allreduce(b, 3, (n,), "float32", op)
        ran = sorted({(p.nelems, p.algorithm) for p in b.compiled_plans() if p.op == "all_reduce"})
        return chosen, ran
    for chosen, ran in run_threads(size, body):
        if size == 1:
            assert (chosen, ran) == (("none", "none"), []), (chosen, ran)
        else:
            assert chosen == ("ring_allreduce", "recursive_doubling_allreduce"), chosen
            assert ran == [(n, "ring_allreduce")], ran


@pytest.mark.parametrize("size", SIZES)
def test_broadcast_reduce_every_root(size):
    def body(b):
        for root in range(b.size):
            for shape in SHAPES + [(70001,)]:
                C.check_broadcast(b, root, shape, "float32", root)
                C.check_reduce(b, root, shape, "int64", "sum", root)
            C.check_reduce(b, root, (70001,), "float64", "avg", root)
            C.check_gather_scatter(b, root, (3,), "float64", root)
        return "ok"
    run_threads(size, body)


@pytest.mark.parametrize("size", SIZES)
def test_allgather_reduce_scatter_alltoall(size):
    def body(b):
        for dtype in C.DTYPES:
            for shape in [(), (0,), (1,), (5,), (2, 3)]:
                C.check_allgather(b, 1, shape, dtype)
            for shape in [(0,), (1,), (3,), (2, 3)]:
                for op in C.ops_for(dtype):
                    C.check_reduce_scatter(b, 2, shape, dtype, op)
                C.check_alltoall(b, 4, shape, dtype)
        return "ok"
    run_threads(size, body)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_p2p_groups_async_objects(size):
    def body(b):
        for shape in [(), (0,), (4,), (2, 2)]:
            C.check_p2p_ring(b, 7, shape, "float32")
        C.check_bool(b, 1)
        C.check_async_and_objects(b)
        return C.check_groups(b)
    out = run_threads(size, body)
    assert out[0] == list(range(0, size, 2))


def test_p2p_header_mismatch_is_a_clear_error():
    assert run_threads(2, C.check_p2p_mismatch) == ["sent", "raised"]
    assert run_threads(3, C.check_sendrecv_mismatch) == ["ok", "raised", "idle"]


def test_barrier_and_world_of_one():
    def body(b):
        for _ in range(3):
            b.barrier()
        return C.check_allreduce(b, 0, (3,), "float32", "sum")
    for size in SIZES:
        run_threads(size, body)


@pytest.mark.parametrize("size", SIZES)
def test_pipelined_ring_and_chain_with_tiny_segments(size, monkeypatch):
    import neural_arch.distributed.comm.gloo.executor as GA

    monkeypatch.setattr(GA, "PIPELINE_SEGMENT_BYTES", 24)           # a few elements per segment
    monkeypatch.setattr(GA, "CHAIN_BROADCAST_MIN_BYTES", 1)
    monkeypatch.setattr(GA, "RING_REDUCE_MIN_BYTES", 1)
    monkeypatch.setattr(GA, "CHAIN_SEGMENT_BYTES", 40)

    def body(b):
        for shape in [(1,), (5,), (37,), (4, 25)]:
            for dtype in ("float32", "int64", "float16"):
                for op in C.ops_for(dtype):
                    C.check_allreduce(b, 9, shape, dtype, op, "ring")
                for root in range(b.size):
                    C.check_broadcast(b, root, shape, dtype, root)
                    C.check_reduce(b, root, shape, dtype, "max", root)
                C.check_allgather(b, 2, shape, dtype)
                C.check_reduce_scatter(b, 3, shape, dtype, "sum")
        return "ok"
    run_threads(size, body)


@pytest.mark.parametrize("size", SIZES)
def test_small_allreduce_repeats_take_the_exchange_path_correctly(size):
    """From the second call on, a small all_reduce whose plan is whole-buffer exchanges only (p = 2,
    4; ranks 2.. of 3 and 5) runs the cached latency path: results must not change, and the cache must be
    used exactly where the plan allows it (a lost fast path is a silent 2-3x latency regression)."""
    def body(b):
        for i in range(3):
            for dtype in ("float32", "float64", "int32", "float16", "bool"):
                for op in (("max", "min") if dtype == "bool" else C.ops_for(dtype)):
                    for shape in [(), (3,), (2, 5)]:
                        C.check_allreduce(b, 10 * i, shape, dtype, op)
        return sorted(p.nelems for p in b.compiled_plans()
                      if p.exchange_peers is not None and p.dtype == np.float32)
    expected_fast = [1, 3, 10]
    for r, sizes in enumerate(run_threads(size, body)):
        q = 1 << (size.bit_length() - 1)           # recursive doubling: ranks >= 2 (size - q) only exchange
        uses_exchanges = size > 1 and r >= 2 * (size - q)
        assert sizes == (expected_fast if uses_exchanges else []), (size, r, sizes)
