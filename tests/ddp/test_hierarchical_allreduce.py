"""Hierarchical all-reduce (reduce in the host, all-reduce among host leaders, broadcast in the host)
equals the flat all_reduce: bitwise for integers, within rounding for floats. 4 real ranks play
2 hosts x 2 ranks through NEURAL_ARCH_HOST_ID (gloo: shared memory inside a host, TCP across)."""

import hier_rank_fns as fns
import pytest

from neural_arch.distributed.algorithms.hierarchical import hosts_from_keys
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=[
    pytest.param("gloo", id="gloo-2x2"),
    pytest.param("mpi", id="mpi-2x2", marks=pytest.mark.mpi),
])
def pool(request):
    # gloo: the ranks build the world themselves, after choosing their host identity
    with RankPool(4, backend=request.param, timeout=90.0, init=request.param == "mpi") as p:
        yield p


def test_host_groups_split_the_world_by_host(pool):
    for rank, hosts, intra, inter, leader, is_leader, kinds in pool.run(fns.layout):
        assert hosts == [[0, 1], [2, 3]]
        if kinds is not None:  # gloo: shared memory inside a "host", TCP across
            assert kinds == {r: "shm" if r // 2 == rank // 2 else "tcp" for r in range(4) if r != rank}
        assert intra == hosts[rank // 2] and leader == intra[0]
        assert is_leader == (rank in (0, 2))
        assert inter == ([0, 2] if is_leader else None)


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
