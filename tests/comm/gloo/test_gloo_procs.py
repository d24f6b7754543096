"""The gloo backend over the real transport: real processes, both transport modes, sizes 1-5.

Every check is an oracle test (global array from a fixed seed on every rank, NumPy on the whole
array). One pool of rank processes per (world size, transport), fed batches of checks.
"""

import gloo_checks as C
import gloo_procs
import pytest

import neural_arch.distributed.comm.gloo.transport.engine  # noqa: F401  (a broken transport must fail, not skip)
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(60)]
SIZES = [1, 2, 3, 4, 5]
MODES = ["tcp", "shm"]
SHAPES = [(), (0,), (1,), (2,), (7,), (3, 5), (70001,)]


@pytest.fixture(scope="module", params=[(s, m) for m in MODES for s in SIZES],
                ids=lambda p: f"{p[1]}-{p[0]}")
def pool(request):
    size, mode = request.param
    with RankPool(size, backend="gloo", init=False, timeout=45,
                  env={"GLOO_TEST_TRANSPORT": mode, "GLOO_TEST_TIMEOUT": "20"}) as p:
        p.mode = mode
        yield p


def _run(pool, calls):
    out = pool.run(gloo_procs.run_checks, calls)
    assert len(out) == pool.world_size


@pytest.mark.cases(lambda p: p["pool"][0] >= 2)   # a world of one has no links to check
def test_transport_mode_is_honoured(pool):
    kinds = pool.run(gloo_procs.transport_kinds)
    assert all(k == [pool.mode] for k in kinds), kinds


def test_allreduce_every_op_and_dtype(pool):
    calls = [("check_allreduce", (i, shape, dtype, op, None))
             for i, dtype in enumerate(C.DTYPES) for op in C.ops_for(dtype) for shape in SHAPES]
    _run(pool, calls)


def test_allreduce_both_algorithms(pool):
    calls = [("check_allreduce", (5, shape, "float32", op, algo))
             for algo in ("ring", "rd") for op in ("sum", "avg", "max") for shape in [(), (5,), (1001,)]]
    _run(pool, calls)


def test_broadcast_reduce_gather_scatter(pool):
    calls = []
    for root in range(pool.world_size):
        for shape in SHAPES:
            calls.append(("check_broadcast", (root, shape, "float64", root)))
            calls.append(("check_reduce", (root, shape, "int32", "sum", root)))
        calls.append(("check_reduce", (root, (70001,), "float32", "max", root)))
        calls.append(("check_gather_scatter", (root, (2, 3), "int64", root)))
    root = pool.world_size - 1
    calls += [("check_reduce", (8, shape, dtype, op, root))
              for dtype in C.DTYPES for op in C.ops_for(dtype) for shape in [(), (3,), (2, 5)]]
    _run(pool, calls)


def test_allgather_reduce_scatter_alltoall(pool):
    calls = []
    for dtype in C.DTYPES:
        for shape in [(), (0,), (1,), (5,), (20000,)]:
            calls.append(("check_allgather", (1, shape, dtype)))
        for shape in [(0,), (1,), (3, 2), (20000,)]:
            for op in C.ops_for(dtype):
                calls.append(("check_reduce_scatter", (2, shape, dtype, op)))
            calls.append(("check_alltoall", (4, shape, dtype)))
    _run(pool, calls)


@pytest.mark.cases(lambda p: p["pool"][0] >= 2)   # point-to-point needs two ranks
def test_p2p_groups_async_objects(pool):
    calls = [("check_p2p_ring", (7, shape, "float32")) for shape in [(), (0,), (4,), (300000,)]]
    calls += [("check_bool", (1,)), ("check_async_and_objects", ()), ("check_sendrecv_mismatch", ()),
              ("check_groups", ())]
    _run(pool, calls)


@pytest.mark.parametrize("size,mode", [(2, "shm"), (3, "tcp"), (4, "shm")])
def test_pipelined_segments_over_real_transport(size, mode):
    """Tiny pipeline segments: many isends in flight over the real links, forwarded as they finish."""
    env = {"GLOO_TEST_TRANSPORT": mode, "GLOO_TEST_TIMEOUT": "20", "NEURAL_ARCH_GLOO_SEGMENT_BYTES": "4096"}
    calls = [("check_allreduce", (11, (70001,), "float32", op, "ring")) for op in ("sum", "max")]
    calls += [("check_allreduce", (12, (100003,), "float64", "avg", None))]
    calls += [("check_broadcast", (root, (300001,), "float32", root)) for root in range(size)]  # chain
    calls += [("check_reduce", (root, (300001,), "float32", "sum", root)) for root in range(size)]  # ring
    calls += [("check_allgather", (3, (30001,), "float32")), ("check_reduce_scatter", (4, (30001,), "int64", "sum"))]
    with RankPool(size, backend="gloo", init=False, timeout=45, env=env) as pool:
        assert pool.run(gloo_procs.run_checks, calls) == [["ok"] * len(calls)] * size
