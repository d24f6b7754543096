"""Exploring process groups, device meshes and the hierarchical all-reduce (hypothesis; one pool of 4 gloo ranks).

* ``new_group`` with ranks in any order: as in torch (its ``new_group`` sorts them), the group numbers
  its members in increasing global rank; ``get_group_rank``/``get_global_rank`` round-trip; a
  non-member gets ``NON_GROUP_MEMBER`` and a collective on it does nothing (with a warning);
* ``new_subgroups`` / ``new_subgroups_by_enumeration`` (lists in any order, ranks left out);
* ``init_device_mesh`` (2x2, 1x4, 4x1, 4, and 3-d 2x1x2) and its slices: coordinate == local rank ==
  rank in the dimension's group, and a gather over that group comes back in mesh order;
* the hierarchical all-reduce over host layouts given by hand, including ones that do not divide the
  ranks (3 ranks as 2+1, hosts with non-consecutive ranks) and ones that leave a rank of the world
  out: equal to the flat all-reduce over the same ranks (integers and max/min bitwise, floats within
  reduction-order rounding), for sizes 0, 1, odd, both forms, pipelined or not;
* wrong calls are clear errors at the call.

Pinned bugs (found here, fixed in neural_arch/distributed):

* ``hierarchical_all_reduce(op=AVG)`` with host groups given by hand divided by the size of the
  *world*, not by the number of ranks in the layout: over 3 of 4 ranks it returned 3/4 of the
  average and exited 0 (algorithms/hierarchical.py);
* ``DeviceMesh("cpu", [[1, 0], [3, 2]])`` was accepted although its dimension groups number their
  ranks in increasing order: ``get_local_rank`` disagreed with the rank in ``get_group`` and
  ``distribute_tensor(x, mesh, [Replicate(), Shard(1)]).full_tensor()`` came back with its columns
  swapped; now a clear error (device_mesh.py);
* the 2-D form (and the pipelined leader form) of the hierarchical all-reduce on an array that is not
  C-contiguous (Fortran-ordered, a strided view) reduced a copy and left the caller's array unchanged,
  also under ``dist.all_reduce`` on groups spanning hosts; now a clear error (algorithms/hierarchical.py);
* a float where a rank or a size goes was truncated: ``new_group([0, 1.5])`` made ``[0, 1]``,
  ``new_subgroups(2.5)`` groups of 2, ``init_device_mesh("cpu", (2.9, 2))`` a 2x2 mesh,
  ``get_global_rank(g, 1.5)`` rank 1; now TypeErrors (subgroups.py, device_mesh.py, process_group.py).
"""

import os
import re

import groups_explore_rank_fns as fns
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

#: ``NEURAL_ARCH_EXPLORE_SCALE=20`` (with ``HYPOTHESIS_PROFILE=dev``) explores 20x more examples
SCALE = int(os.environ.get("NEURAL_ARCH_EXPLORE_SCALE", "1"))
WORLD = 4


@pytest.fixture(scope="module")
def ranks():
    # the ranks build the world themselves, after choosing their simulated host (fns.HOSTS)
    with RankPool(WORLD, backend="gloo", timeout=120.0, init=False) as p:
        yield p


# ------------------------------------------------------------------------------------------ groups
@settings(max_examples=4 * SCALE)
@given(members=st.permutations(range(WORLD)).flatmap(lambda p: st.integers(1, WORLD).map(lambda k: list(p[:k]))))
@example(members=[2, 0, 3])
@example(members=[3, 1])
def test_new_group_numbers_members_in_increasing_global_rank(ranks, members):
    order = sorted(members)
    for me, got in enumerate(ranks.run(fns.group_case_run, members)):
        if me not in members:
            assert got is None
            continue
        group_rank, size, group_ranks, gathered, trips = got
        assert (group_rank, size, group_ranks) == (order.index(me), len(members), order)
        assert gathered == order and trips


@settings(max_examples=3 * SCALE)
@given(enum=st.permutations(range(WORLD)).flatmap(
    lambda p: st.lists(st.integers(1, 3), min_size=1, max_size=3).map(lambda cuts: _cut(list(p), cuts))))
@example(enum=[[3, 1], [0]])        # ranks in any order; rank 2 in no group
def test_subgroups_by_enumeration(ranks, enum):
    for me, (mine, group_rank, groups, total) in enumerate(ranks.run(fns.subgroups_run, "enum", enum)):
        assert groups == [sorted(g) if me in g else None for g in enum]
        home = next((sorted(g) for g in enum if me in g), None)
        assert mine == home
        if home is not None:
            assert group_rank == home.index(me) and total == float(sum(home))


def _cut(perm, cuts):
    out, at = [], 0
    for c in cuts:
        if at < len(perm):
            out.append(perm[at:at + c])
            at += c
    return out


@pytest.mark.parametrize("size", [1, 2, 4])
def test_new_subgroups_are_consecutive_blocks(ranks, size):
    for me, (mine, group_rank, groups, total) in enumerate(ranks.run(fns.subgroups_run, "size", size)):
        block = list(range(me - me % size, me - me % size + size))
        assert mine == block and group_rank == me % size and total == float(sum(block))
        assert [g for g in groups if g is not None] == [block]


WRONG_CALLS = {
    "group-rank-of-non-member": r"(GroupMembershipError: get_group_rank: this rank|ValueError: global_rank=3 is not a "
                                r"member of group \S+ \[0, 1\])",
    "global-rank-out-of-group": r"(GroupMembershipError: get_global_rank: this rank|ValueError: group rank 2 is out "
                                r"of range)",
    "subgroups-not-dividing": r"ValueError: new_subgroups: group_size=3 must be positive and divide the world size 4",
    "enumeration-overlap": r"ValueError: new_subgroups_by_enumeration: rank 1 is in subgroup 0 and in subgroup 1",
    "new-group-rank-out-of-range": r"ValueError: new_group: rank 4 is out of range for a world of size 4",
    "new-group-float-rank": r"TypeError: new_group: rank 1.5 must be an int, got float",
    "enumeration-float-rank": r"TypeError: new_subgroups_by_enumeration: rank 2.0 must be an int, got float",
    "subgroups-float-size": r"TypeError: new_subgroups: group_size 2.5 must be an int, got float",
    "global-rank-float": r"TypeError: group_rank=1.5 must be an int",
    "mesh-float-shape": r"TypeError: init_device_mesh: mesh_shape=\(2.9, 2\) must hold ints",
    "hierarchical-2d-fortran": r"ValueError: hierarchical all-reduce: the array is not C-contiguous",
    "hierarchical-pipelined-strided": r"ValueError: hierarchical all-reduce: the array is not C-contiguous",
    "mesh-shape-not-world": r"ValueError: init_device_mesh: mesh_shape=\(3, 1\) holds 3 ranks but the world has 4",
    "mesh-not-increasing": r"ValueError: DeviceMesh: along dimension 1 the ranks \[1, 0\] are not in increasing order",
}


def test_wrong_calls_raise_clear_errors_at_the_call(ranks):
    for case, pattern in WRONG_CALLS.items():
        for me, got in enumerate(ranks.run(fns.wrong_call_run, case)):
            assert re.match(pattern, got), f"{case}, rank {me}: {got!r} does not match {pattern!r}"


# -------------------------------------------------------------------------------------- device mesh
@pytest.mark.parametrize("shape, names, slices", [
    ((2, 2), ("dp", "tp"), ["dp", "tp", ("tp", "dp")]),
    ((1, 4), ("dp", "tp"), ["dp", "tp"]),
    ((4, 1), ("dp", "tp"), ["dp", "tp"]),
    ((4,), None, []),
    ((2, 1, 2), ("pp", "dp", "tp"), ["pp", ("pp", "tp"), ("tp", "dp")]),
])
def test_device_mesh_coordinates_local_ranks_and_groups_agree(ranks, shape, names, slices):
    grid = np.arange(WORLD).reshape(shape)
    for me, views in enumerate(ranks.run(fns.mesh_run, shape, names, slices)):
        coord = [int(c) for c in np.argwhere(grid == me)[0]]
        for (mesh, got_coord, dims, gathered), s in zip(views, [None, *slices]):
            if s is None:
                want_dims = list(range(len(shape)))
                assert mesh == grid.tolist() and got_coord == coord
            else:
                want_dims = [names.index(n) for n in ((s,) if isinstance(s, str) else s)]
                index = tuple(slice(None) if d in want_dims else coord[d] for d in range(len(shape)))
                sub = grid[index]
                kept = [d for d in range(len(shape)) if d in want_dims]
                assert mesh == np.transpose(sub, [kept.index(d) for d in want_dims]).tolist()
                assert got_coord == [coord[d] for d in want_dims]
            for (local, group_rank, group_ranks), along, d in zip(dims, gathered, want_dims):
                line = np.moveaxis(grid, d, -1)[tuple(c for i, c in enumerate(coord) if i != d)].tolist()
                assert local == group_rank == coord[d], (me, s, d)
                assert group_ranks == line and along == line, (me, s, d, group_ranks, along, line)


# ----------------------------------------------------------------------------- hierarchical all-reduce
LAYOUTS = [
    [[0, 1], [2]],              # 3 ranks as 2 + 1 (rank 3 of the world left out)
    [[0], [1, 2]],
    [[0, 2], [1]],              # a host of non-consecutive ranks
    [[0, 1], [2, 3]],
    [[1, 3], [0, 2]],           # hosts listed out of order
    [[0, 1, 2], [3]],
    [[0], [1], [2], [3]],
    [[2, 3]],                   # one host, two ranks
]


@settings(max_examples=10 * SCALE)
@given(hosts=st.sampled_from(LAYOUTS), dtype=st.sampled_from(["float64", "float32", "int64", "int32", "float16",
                                                              "bfloat16"]),
       shape=st.sampled_from([(0,), (1,), (7,), (3, 5), (), (33,)]),
       op=st.sampled_from(["sum", "avg", "max", "min", "product"]), algorithm=st.sampled_from(["leader", "2d", "auto"]),
       chunk=st.sampled_from([None, 0, 16]), seed=st.integers(0, 9))
@example(hosts=[[0, 1], [2]], dtype="float64", shape=(7,), op="avg", algorithm="leader", chunk=None, seed=0)
@example(hosts=[[0, 1], [2]], dtype="float64", shape=(33,), op="avg", algorithm="leader", chunk=16, seed=1)
@example(hosts=[[1, 3], [0, 2]], dtype="float64", shape=(33,), op="avg", algorithm="2d", chunk=16, seed=2)
@example(hosts=[[0, 2], [1]], dtype="int64", shape=(0,), op="sum", algorithm="leader", chunk=0, seed=0)
@example(hosts=[[0, 1], [2, 3]], dtype="float16", shape=(7,), op="avg", algorithm="2d", chunk=None, seed=3)
@example(hosts=[[0, 1], [2]], dtype="float16", shape=(33,), op="avg", algorithm="leader", chunk=16, seed=4)
@example(hosts=[[0, 1], [2, 3]], dtype="bfloat16", shape=(3, 5), op="avg", algorithm="leader", chunk=None, seed=5)
def test_hierarchical_all_reduce_equals_flat_over_the_same_ranks(ranks, hosts, dtype, shape, op, algorithm, chunk,
                                                                 seed):
    if op == "avg" and dtype.startswith("int"):
        dtype = "float64"
    uniform = len({len(h) for h in hosts}) == 1
    if algorithm == "2d" and not uniform:
        algorithm = "leader"
    results = ranks.run(fns.hierarchical_run, hosts, dtype, shape, op, algorithm, chunk, seed)
    members = sorted(r for h in hosts for r in h)
    for me, out in enumerate(results):
        if me not in members:
            assert out is None
            continue
        got, ref = out
        _check_equal(me, got, ref, dtype, op, f"hierarchical ({algorithm}) over {hosts}")


def _check_equal(me, got, ref, dtype, op, what):
    assert got.shape == ref.shape and got.dtype == ref.dtype, (me, what)
    if dtype.startswith("int") or op in ("max", "min"):
        assert np.array_equal(got, ref), (me, what, got, ref)
    else:
        assert np.isfinite(got.astype(np.float64)).all(), f"rank {me}: {what} {op} overflowed: {got}"
        tol = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
        scale = 1.0 + (float(np.max(np.abs(ref.astype(np.float64)))) if ref.size else 0.0)
        err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0
        assert err <= tol * scale, f"rank {me}: {what} {op} off the flat one by {err:g}"


def _hosts_of(members):
    by_host = {}
    for r in members:
        by_host.setdefault(fns.HOSTS[r], []).append(r)
    return list(by_host.values())


@settings(max_examples=6 * SCALE)
@given(members=st.sampled_from([[0, 1, 2], [0, 1, 3], [1, 2, 3], [0, 1, 2, 3], [0, 2], [0, 1]]),
       dtype=st.sampled_from(["float64", "float32", "int64", "float16", "bfloat16"]),
       shape=st.sampled_from([(0,), (1,), (7,), (2, 3), ()]),
       op=st.sampled_from(["sum", "avg", "max", "product"]), seed=st.integers(0, 9))
@example(members=[0, 1, 2], dtype="float64", shape=(7,), op="avg", seed=0)       # 3 ranks as 2 + 1
@example(members=[0, 1, 2, 3], dtype="int64", shape=(0,), op="sum", seed=0)
@example(members=[0, 1, 2, 3], dtype="float16", shape=(7,), op="avg", seed=1)   # the sum overflows, the mean not
@example(members=[0, 1, 2], dtype="bfloat16", shape=(2, 3), op="avg", seed=2)   # AVG of bfloat16 was refused
def test_all_reduce_on_groups_spanning_hosts_equals_flat(ranks, members, dtype, shape, op, seed):
    if op == "avg" and dtype.startswith("int"):
        dtype = "float64"
    hosts = _hosts_of(members)
    want_form = "flat" if len(hosts) < 2 or all(len(h) == 1 for h in hosts) else "leader"
    for me, out in enumerate(ranks.run(fns.auto_all_reduce_run, members, dtype, shape, op, seed)):
        if me not in members:
            assert out is None
            continue
        got, ref, form = out
        assert form == want_form, (members, form)
        _check_equal(me, got, ref, dtype, op, f"all_reduce over {members} ({form})")


@pytest.mark.parametrize("dtype, shape, op", [("float64", (5,), "avg"), ("int64", (3, 3), "sum"), ("float32", (), "max")])
def test_hierarchical_all_reduce_with_host_groups_of_unequal_hosts(ranks, dtype, shape, op):
    for me, (hosts, got, ref, refused) in enumerate(ranks.run(fns.host_groups_run, dtype, shape, op, 5)):
        assert hosts == [[0, 1], [2], [3]]
        _check_equal(me, got, ref, dtype, op, "hierarchical_all_reduce over host_groups()")
        assert "the hosts hold different numbers of ranks ([2, 1, 1])" in refused, refused
