"""Hierarchical all-reduce, both forms (leader: reduce in the host, all-reduce among host leaders,
broadcast; 2-D: reduce-scatter in the host, all-reduce of each slice across hosts, all-gather) equals
the flat all_reduce: bitwise for integers, within rounding for floats; dist.all_reduce picks it by
itself on groups spanning hosts. 4 real ranks play 2 hosts x 2 ranks through NEURAL_ARCH_HOST_ID
(gloo: shared memory inside a host, TCP across)."""

import hier_rank_fns as fns
import pytest

from neural_arch.distributed.algorithms.hierarchical import hosts_from_keys
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", params=[
    pytest.param("gloo", id="gloo-2x2"),
    pytest.param("mpi", id="mpi-2x2", marks=pytest.mark.mpi),
])
def pool(request):
    # gloo: the ranks build the world themselves, after choosing their host identity
    with RankPool(4, backend=request.param, timeout=90.0, init=request.param == "mpi") as p:
        yield p


def test_host_groups_split_the_world_by_host(pool):
    for rank, hosts, intra, inter, leader, is_leader, kinds, cross in pool.run(fns.layout):
        assert hosts == [[0, 1], [2, 3]]
        if kinds is not None:  # gloo: shared memory inside a "host", TCP across
            assert kinds == {r: "shm" if r // 2 == rank // 2 else "tcp" for r in range(4) if r != rank}
        assert intra == hosts[rank // 2] and leader == intra[0]
        assert is_leader == (rank in (0, 2))
        assert inter == ([0, 2] if is_leader else None)
        assert cross == [rank % 2, rank % 2 + 2]   # the 2-D form: same local rank on every host


@pytest.mark.cases(lambda p: p["pool"] == "gloo")   # gloo's paths
def test_host_groups_run_shared_memory_directly_and_cross_host_groups_the_plans(pool):
    """gloo: a host group (all members shared-memory peers) takes the direct segment, equal bitwise to
    its ring plan; the cross-host group (TCP between its members) stays on the plans."""
    for (intra, cross), mapped, cross_unmapped, equal in pool.run(fns.host_group_paths, 9):
        assert intra == "direct" and cross != "direct" and cross.endswith("allreduce"), (intra, cross)
        assert mapped and cross_unmapped and equal


@pytest.mark.parametrize("dtype,shape,op", [
    ("int64", (1000,), "sum"), ("int32", (7, 3), "sum"), ("int64", (), "sum"), ("int64", (0,), "sum"),
    ("int32", (5,), "max"), ("int64", (3, 1), "min"), ("int8", (2,), "product"),
])
def test_integers_match_flat_all_reduce_bitwise(pool, dtype, shape, op):
    for diff, bitwise in pool.run(fns.compare, dtype, shape, op, 1):
        assert bitwise, diff


@pytest.mark.parametrize("dtype,op,tol", [("float64", "sum", 1e-12), ("float64", "avg", 1e-12), ("float32", "sum", 1e-5)])
def test_floats_match_flat_all_reduce_within_rounding(pool, dtype, op, tol):
    for diff, _ in pool.run(fns.compare, dtype, (257,), op, 2):
        assert diff <= tol


@pytest.mark.parametrize("algorithm", ["2d", "leader"])
@pytest.mark.parametrize("dtype,shape,op", [
    ("int64", (7, 3), "sum"),      # 21 elements: not a multiple of 2 ranks per host (padded slice)
    ("int32", (1,), "max"),        # fewer elements than ranks per host
    ("int64", (), "sum"), ("int64", (0,), "sum"), ("int8", (5,), "product"),
    ("int64", (1 << 15,), "sum"),  # several pipeline segments
])
def test_both_forms_match_flat_bitwise_for_integers(pool, algorithm, dtype, shape, op):
    for diff, bitwise in pool.run(fns.compare, dtype, shape, op, 3, algorithm):
        assert bitwise, diff


@pytest.mark.parametrize("dtype,shape,op,tol", [("float64", (1001,), "avg", 1e-12), ("float32", (4097,), "sum", 1e-5)])
def test_two_d_matches_flat_within_rounding(pool, dtype, shape, op, tol):
    for diff, _ in pool.run(fns.compare, dtype, shape, op, 4, "2d"):
        assert diff <= tol


@pytest.mark.parametrize("algorithm", ["2d", "leader"])
@pytest.mark.parametrize("dtype,shape,op,chunk", [
    ("int64", (4099,), "sum", 1 << 10),     # 32 pieces of 128 elements, the last takes 3 more (2-D: padded)
    ("int32", (37, 29), "max", 200),        # 1073 elements: pieces of 50, not a multiple of anything
    ("int64", (1 << 12,), "sum", 1 << 14),  # exactly 2 pieces of 1024 elements
    ("int8", (301,), "product", 16),
    ("float64", (5003,), "sum", 1 << 11),   # floats: bitwise too (2 x 2: every step adds two numbers)
    ("float64", (3001,), "avg", 1 << 10),
    ("float32", (2049,), "sum", 1 << 12),
])
def test_pipelined_forms_equal_unpipelined_bitwise(pool, algorithm, dtype, shape, op, chunk):
    for rank, (same, diff, cut, crossings) in enumerate(pool.run(fns.pipelined, dtype, shape, op, 5, algorithm, chunk)):
        assert same and cut >= 2
        leads = algorithm == "2d" or rank in (0, 2)       # who talks across hosts
        assert crossings == ((cut if pool.backend == "gloo" else 1) if leads else 0)   # MPI: never pipelined
        assert diff <= (1e-4 if dtype == "float32" else 1e-11 if dtype == "float64" else 0)


@pytest.mark.parametrize("algorithm", ["2d", "leader"])
def test_pipeline_of_one_piece_is_the_unpipelined_form(pool, algorithm):
    # 1500 bytes with 1 KiB pieces: one piece (the last absorbs the remainder) -> the plain form
    for same, diff, cut, crossings in pool.run(fns.pipelined, "int64", (187,), "sum", 6, algorithm, 1 << 10):
        assert same and diff == 0 and cut == 1 and crossings <= 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm,bad_rank", [("2d", 3), ("leader", 2)])
def test_a_failing_piece_raises_on_every_rank_and_leaves_nothing_running(algorithm, bad_rank):
    """A cross-host transfer of piece 3 fails on one rank's progress thread: every rank's call raises
    (the failing one with the fault, the others because the group was poisoned) well within the
    timeout, and no transfer is left queued. Own ranks: the fault poisons their world."""
    from neural_arch.distributed.testing import run_ranks

    results = run_ranks(fns.pipeline_failure, 4, args=(bad_rank, 3, algorithm), timeout=45.0, init=False)
    for r in results:
        assert r.ok, r
        (kind, message), took, pending = r.value
        assert kind != "no error" and took < 20 and pending == 0, (r.rank, kind, message, took)
    assert "injected fault in piece 3" in results[bad_rank].value[0][1]


def _ran(spans):
    return sorted({name for name, _ in spans})


def test_all_reduce_goes_hierarchical_by_itself_on_groups_spanning_hosts(pool):
    if pool.backend == "mpi":  # MPI stays flat (MPICH's all-reduce is already host-aware)
        for rows in pool.run(fns.auto, "auto", (0, 1, 2, 3), (8, 1 << 18), "int64"):
            assert [(chosen, ok) for chosen, _, ok in rows] == [("flat", True), ("flat", True)]
        return
    # world of 2 hosts x 2: small -> flat (one all_reduce of the world); 2 MiB -> the 2-D form
    for rank, rows in enumerate(pool.run(fns.auto, "auto", (0, 1, 2, 3), (8, 1 << 18, 1001), "int64")):
        (c0, s0, ok0), (c1, s1, ok1), (c2, _, ok2) = rows
        assert ok0 and ok1 and ok2
        assert c0 == "flat" and s0 == [("all_reduce", (0, 1, 2, 3))]
        host, cross = (0, 1) if rank < 2 else (2, 3), (rank % 2, rank % 2 + 2)
        # 2 MiB: two pipelined pieces of 1 MiB, each reduce-scattered in the host, all-reduced across, gathered
        steps = sorted(span for span in s1 if span[1] != (0, 1, 2, 3))     # (the layout's all-gather: world)
        assert c1 == "2d" and s1[-1] == ("all_gather", host)
        assert steps == sorted([("reduce_scatter", host), ("all_reduce", cross), ("all_gather", host)] * 2)
        assert c2 == "flat"
    # sub-group over hosts of 2 and 1 ranks: the leader form (the 2-D one needs equal hosts)
    for rank, rows in enumerate(pool.run(fns.auto, "auto", (0, 1, 2), (1 << 18 | 1,), "float64")):
        if rank == 3:
            assert rows is None
            continue
        chosen, spans, ok = rows[0]
        assert ok and chosen == "leader"
        steps = [span for span in spans if span[1] != (0, 1, 2)]        # (the layout's all-gather)
        assert _ran(steps) == (["all_reduce", "broadcast", "reduce"] if rank in (0, 2) else ["broadcast", "reduce"])
        assert len(steps) == (6 if rank in (0, 2) else 4)                # 2 MiB: two pipelined pieces
    # a sub-group on one host stays flat at every size
    for rank, rows in enumerate(pool.run(fns.auto, "auto", (2, 3), (1 << 18,), "int32")):
        if rows is not None:
            assert rows[0][0] == "flat" and rows[0][1] == [("all_reduce", (2, 3))] and rows[0][2]
    # hosts simulated on one machine stay flat under auto (loopback TCP: flat measured faster);
    # after the one layout all-gather, every call is the world's single all_reduce
    for rows in pool.run(fns.auto, "auto", (0, 1, 2, 3), (1 << 18, 1 << 18), "int64", False):
        assert [(chosen, spans[-1], ok) for chosen, spans, ok in rows] == [("flat", ("all_reduce", (0, 1, 2, 3)), True)] * 2
        assert rows[1][1] == [("all_reduce", (0, 1, 2, 3))]


@pytest.mark.parametrize("setting,small,large", [("0", "flat", "flat"), ("1", "leader", "2d")])
@pytest.mark.cases(lambda p: p["pool"] == "gloo")   # MPI groups stay flat whatever the setting
def test_hierarchical_setting_forces_it_on_or_off(pool, setting, small, large):
    for rows in pool.run(fns.auto, setting, (0, 1, 2, 3), (8, 1 << 18), "int64", False):  # 1: simulated hosts too
        assert [(chosen, ok) for chosen, _, ok in rows] == [(small, True), (large, True)]


def test_two_d_needs_the_cross_host_group(pool):
    for msg in pool.run(fns.two_d_without_cross_group):
        assert "algorithm='2d'" in msg and "algorithm='leader'" in msg


def test_communication_optimizer_facade_averages_in_place(pool):
    for same, err in pool.run(fns.facade, (3, 2)):
        assert same and err <= 1e-15


def test_wrong_groups_are_clear_errors(pool):
    for rank, (msg, msg2) in enumerate(pool.run(fns.misuse)):
        if rank in (0, 2):
            assert "leads its host group" in msg and "inter_node_group" in msg
        else:
            assert "not the leader" in msg
        assert "host_groups()" in msg2


def test_hosts_from_keys_orders_hosts_by_lowest_rank():
    assert hosts_from_keys([7, 3, 7, 3, 9]) == [[0, 2], [1, 3], [4]]
    assert hosts_from_keys([5, 5, 5]) == [[0, 1, 2]]
    assert hosts_from_keys([]) == []


def test_choose_algorithm_by_size_and_layout():
    from neural_arch.distributed.algorithms.hierarchical import TWO_D_MIN_BYTES, choose_algorithm

    two_by_two = [[0, 1], [2, 3]]
    assert choose_algorithm(TWO_D_MIN_BYTES, TWO_D_MIN_BYTES // 4, two_by_two) == "2d"
    assert choose_algorithm(TWO_D_MIN_BYTES - 1, 1000, two_by_two) == "leader"
    assert choose_algorithm(TWO_D_MIN_BYTES, 1, two_by_two) == "leader"            # fewer elements than local ranks
    assert choose_algorithm(TWO_D_MIN_BYTES, 1 << 20, [[0, 1, 2], [3, 4]]) == "leader"   # unequal hosts
    assert choose_algorithm(TWO_D_MIN_BYTES, 1 << 20, [[0, 1, 2, 3]]) == "flat"     # one host
    assert choose_algorithm(TWO_D_MIN_BYTES, 1 << 20, [[0], [1], [2]]) == "flat"    # one rank per host
