"""Rank functions of the process-group exploration tests (``test_groups_explore.py``; module level: pickled by reference).

Groups are collective to create and a pool's processes serve many examples, so every group a
function asks for is made once per process and cached under its arguments (every rank of the pool
asks for the same ones, in the same order, in the same example).

Example (on every rank of a RankPool of 4)::

    out = group_case_run([2, 0, 3])      # rank, size and gathered ranks of new_group([2, 0, 3])
"""

from __future__ import annotations

import os
import warnings

import numpy as np

_CACHE: dict = {}
#: the simulated host of each rank (``NEURAL_ARCH_HOST_ID``, set before the world is built: gloo then
#: really runs shared memory inside a host and TCP across): 4 ranks on 3 hosts, one of them of 2 ranks
HOSTS = ("h0", "h0", "h1", "h2")


def _dist():
    """The world of the pool (built here, on first use, after choosing this rank's host; every
    ``all_reduce`` on a group spanning hosts goes hierarchical: ``NEURAL_ARCH_HIERARCHICAL=1``)."""
    import neural_arch.distributed as dist

    if not dist.is_initialized():
        os.environ["NEURAL_ARCH_HOST_ID"] = HOSTS[int(os.environ["RANK"])]
        os.environ["NEURAL_ARCH_HIERARCHICAL"] = "1"
        dist.init_process_group()
    return dist


def _once(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def group_case_run(ranks: list[int]):
    """``new_group(ranks)`` (ranks in the order given): what this rank sees of it.

    Returns None on non-members (after checking that they got NON_GROUP_MEMBER, rank -1, and that a
    collective on it does nothing, with a warning); on members ``(group rank, size, group.ranks,
    global ranks gathered over the group in group-rank order, round trips ok)``."""
    dist = _dist()
    group = _once(("group", tuple(ranks)), lambda: dist.new_group(ranks))
    me = dist.get_rank()
    if me not in ranks:
        assert group is dist.GroupMember.NON_GROUP_MEMBER, group
        assert dist.get_rank(group) == -1 and dist.get_world_size(group) == -1
        x = np.array([7.0])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert dist.all_reduce(x, group=group) is None
        assert x.tolist() == [7.0] and seen, "a non-member's collective must do nothing, with a warning"
        return None
    gathered = np.empty(len(ranks), dtype=np.int64)
    group.backend.allgather(gathered, np.array(me, dtype=np.int64))
    mine = dist.get_rank(group)
    trips = all(dist.get_global_rank(group, dist.get_group_rank(group, g)) == g for g in ranks) and all(
        dist.get_group_rank(group, dist.get_global_rank(group, k)) == k for k in range(len(ranks)))
    return mine, dist.get_world_size(group), list(group.ranks), gathered.tolist(), trips


def subgroups_run(kind: str, arg):
    """``new_subgroups(arg)`` (kind ``"size"``) or ``new_subgroups_by_enumeration(arg)`` (kind
    ``"enum"``): ``(this rank's group ranks or None, its group rank, every group's ranks or None,
    SUM all_reduce of the global rank over this rank's group)``."""
    dist = _dist()
    if kind == "size":
        mine, groups = _once(("sub", arg), lambda: dist.new_subgroups(arg))
    else:
        key = ("enum", tuple(map(tuple, arg)))
        mine, groups = _once(key, lambda: dist.new_subgroups_by_enumeration(arg))
    if mine is None:
        return None, -1, [None if g is dist.GroupMember.NON_GROUP_MEMBER else g.ranks for g in groups], None
    x = np.array([float(dist.get_rank())])
    dist.all_reduce(x, group=mine)
    return (mine.ranks, dist.get_rank(mine),
            [None if g is dist.GroupMember.NON_GROUP_MEMBER else g.ranks for g in groups], float(x[0]))


def wrong_call_run(case: str) -> str:
    """What a wrong call raises on this rank (``"<ExcType>: message"``), or ``"no error"``."""
    dist = _dist()
    pair = _once(("group", (0, 1)), lambda: dist.new_group([0, 1]))
    try:
        if case == "group-rank-of-non-member":
            if pair is dist.GroupMember.NON_GROUP_MEMBER:
                dist.get_group_rank(pair, 0)
            else:
                dist.get_group_rank(pair, 3)
        elif case == "global-rank-out-of-group":
            if pair is dist.GroupMember.NON_GROUP_MEMBER:
                dist.get_global_rank(pair, 0)
            else:
                dist.get_global_rank(pair, 2)
        elif case == "subgroups-not-dividing":
            dist.new_subgroups(3)
        elif case == "enumeration-overlap":
            dist.new_subgroups_by_enumeration([[0, 1], [1, 2]])
        elif case == "new-group-rank-out-of-range":
            dist.new_group([0, 4])
        elif case == "new-group-float-rank":
            dist.new_group([0, 1.5])
        elif case == "enumeration-float-rank":
            dist.new_subgroups_by_enumeration([[0, 1], [2.0, 3]])
        elif case == "subgroups-float-size":
            dist.new_subgroups(2.5)
        elif case == "global-rank-float":
            dist.get_global_rank(dist.group.WORLD, 1.5)
        elif case == "mesh-float-shape":
            from neural_arch.distributed.device_mesh import init_device_mesh

            init_device_mesh("cpu", (2.9, 2))
        elif case in ("hierarchical-2d-fortran", "hierarchical-pipelined-strided"):
            from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce

            intra, inter, cross, _flat = _hier_groups(((0, 1), (2, 3)))
            inter = inter if inter is not dist.GroupMember.NON_GROUP_MEMBER else None
            if case == "hierarchical-2d-fortran":    # reshape(-1) of it is a copy: the result was lost
                hierarchical_all_reduce(np.asfortranarray(np.ones((4, 4))), intra_node_group=intra,
                                        inter_node_group=inter, cross_node_group=cross, algorithm="2d")
            else:
                hierarchical_all_reduce(np.ones((8, 8))[:, ::2], intra_node_group=intra, inter_node_group=inter,
                                        algorithm="leader", pipeline_chunk_bytes=16)
        elif case == "mesh-shape-not-world":
            from neural_arch.distributed.device_mesh import init_device_mesh

            init_device_mesh("cpu", (3, 1))
        elif case == "mesh-not-increasing":
            from neural_arch.distributed.device_mesh import DeviceMesh

            DeviceMesh("cpu", [[1, 0], [3, 2]])
        else:
            raise AssertionError(case)
    except Exception as exc:  # noqa: BLE001 - the answer is the exception
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def mesh_run(shape: tuple, names: tuple | None, slices: list):
    """``init_device_mesh("cpu", shape)``: for the mesh and for each ``mesh[s]`` of ``slices``:
    ``(mesh.mesh, coordinate, [(local rank, rank in the group, group ranks) per dim], [global ranks
    gathered over each dim's group])``."""
    from neural_arch.distributed.device_mesh import init_device_mesh

    dist = _dist()
    mesh = _once(("mesh", tuple(shape), names), lambda: init_device_mesh("cpu", shape, mesh_dim_names=names))

    def view(m):
        dims = []
        gathered = []
        for d in range(m.ndim):
            g = m.get_group(d)
            dims.append((m.get_local_rank(d), dist.get_rank(g), list(g.ranks)))
            out = np.empty(g.size(), dtype=np.int64)
            g.backend.allgather(out, np.array(dist.get_rank(), dtype=np.int64))
            gathered.append(out.tolist())
        return m.mesh.tolist(), m.get_coordinate(), dims, gathered

    return [view(mesh)] + [view(mesh[s]) for s in slices]


# ------------------------------------------------------------------------------ hierarchical all-reduce
def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _draw(dtype: str, shape: tuple, op: str, seed: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input (products stay near 1, integers small: no overflow to hide a bug)."""
    rng = np.random.default_rng([seed, rank])
    dt = _dtype(dtype)
    if dtype in ("float16", "bfloat16") and op == "avg":   # large: their sum overflows float16, the mean does not
        x = (3e4 * np.tanh(rng.standard_normal(shape))).astype(dt)
    elif dt.kind == "f" or dtype == "bfloat16":
        x = rng.standard_normal(shape).astype(dt)
    else:
        x = rng.integers(-50, 50, size=shape).astype(dt)
    if op == "product":
        x = np.where(x == 0, 1, np.sign(x)).astype(dt) if dt.kind == "i" else (1 + 0.1 * x).astype(dt)
    return np.array(x, dtype=dt)     # a 0-d draw is a NumPy scalar: make it a writable 0-d array


def _hier_groups(hosts: tuple):
    """(intra group, inter group or None, cross group or None, flat group over every host's ranks) of
    a host layout given by hand (made once per layout; NON_GROUP_MEMBER on ranks outside)."""
    dist = _dist()

    def make():
        lists = [list(h) for h in hosts]
        intra, _ = dist.new_subgroups_by_enumeration(lists)
        inter = dist.new_group([min(h) for h in lists])
        cross = None
        if len({len(h) for h in lists}) == 1:
            cross, _ = dist.new_subgroups_by_enumeration([[sorted(h)[i] for h in lists] for i in range(len(lists[0]))])
        flat = dist.new_group(sorted(r for h in lists for r in h))
        return intra, inter, cross, flat

    return _once(("hier", hosts), make)


def hierarchical_run(hosts: list[list[int]], dtype: str, shape: tuple, op: str, algorithm: str, chunk, seed: int):
    """Hierarchical all-reduce over the hand-made host layout ``hosts`` vs the flat all-reduce over
    the same ranks: ``(hierarchical result, flat result)`` as arrays (None on ranks outside)."""
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce
    from neural_arch.distributed.comm.work import ReduceOp

    dist = _dist()
    intra, inter, cross, flat = _hier_groups(tuple(map(tuple, hosts)))
    if flat is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    x = _draw(dtype, shape, op, seed, dist.get_rank())
    ref = x.copy()
    flat.backend.allreduce(ref, ReduceOp.coerce(op))    # the reference: the flat all-reduce, AVG included
    inter_arg = inter if inter is not dist.GroupMember.NON_GROUP_MEMBER else None
    got = hierarchical_all_reduce(x, op=op, intra_node_group=intra, inter_node_group=inter_arg,
                                  cross_node_group=cross if algorithm == "2d" else None, algorithm=algorithm,
                                  pipeline_chunk_bytes=chunk)
    assert got is x
    return x, ref


def auto_all_reduce_run(members: list[int], dtype: str, shape: tuple, op: str, seed: int):
    """``dist.all_reduce(x, op, group=new_group(members))`` (which goes hierarchical by itself on a group
    spanning hosts) vs the group's flat backend all-reduce: ``(result, flat result, the form it took)``
    (None on ranks outside)."""
    from neural_arch.distributed.algorithms.hierarchical_auto import all_reduce_algorithm
    from neural_arch.distributed.comm.work import ReduceOp

    dist = _dist()
    group = _once(("group", tuple(members)), lambda: dist.new_group(members))
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    x = _draw(dtype, shape, op, seed, dist.get_rank())
    ref = x.copy()
    group.backend.allreduce(ref, ReduceOp.coerce(op))
    form = all_reduce_algorithm(x, group=group)
    dist.all_reduce(x, op=op, group=group)
    return x, ref, form


def host_groups_run(dtype: str, shape: tuple, op: str, seed: int):
    """``hierarchical_all_reduce`` with the groups of ``host_groups()`` (the world on 3 hosts: the leader
    form; the 2-D form is refused) vs the world's flat all-reduce: ``(hosts, result, flat result, 2-D error)``."""
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce, host_groups
    from neural_arch.distributed.comm.work import ReduceOp

    dist = _dist()
    hosts = host_groups().hosts
    x = _draw(dtype, shape, op, seed, dist.get_rank())
    ref = x.copy()
    dist.get_default_group().backend.allreduce(ref, ReduceOp.coerce(op))
    hierarchical_all_reduce(x, op=op)
    try:
        hierarchical_all_reduce(x.copy(), op=op, algorithm="2d")
        refused = "no error"
    except ValueError as exc:
        refused = str(exc)
    return hosts, x, ref, refused
