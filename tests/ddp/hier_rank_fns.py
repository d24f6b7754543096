"""Rank functions of the hierarchical all-reduce tests: 4 ranks playing 2 hosts x 2 ranks.

Each rank sets ``NEURAL_ARCH_HOST_ID`` to ``host<rank // 2>`` before the world is built (gloo: then
its transport really uses shared memory inside a "host" and TCP across) or, where the pool already
initialised the world (mpi), before the host groups are built (they read the identity then).
"""

from __future__ import annotations

import os

import numpy as np


def _world():
    import neural_arch.distributed as dist

    if not os.environ.get("NEURAL_ARCH_HOST_ID"):
        rank = int(os.environ.get("RANK") or os.environ.get("PMI_RANK") or 0)
        os.environ["NEURAL_ARCH_HOST_ID"] = f"host{rank // 2}"
    if not dist.is_initialized():
        dist.init_process_group()
    return dist


def layout():
    """What host_groups() builds on this rank."""
    dist = _world()
    from neural_arch.distributed.algorithms.hierarchical import host_groups

    hg = host_groups()
    inter = None if hg.inter is dist.GroupMember.NON_GROUP_MEMBER else hg.inter.ranks
    kinds = getattr(dist.get_default_group().backend, "transport_kinds", None)  # gloo: per peer
    kinds = kinds() if callable(kinds) else None
    return dist.get_rank(), hg.hosts, hg.intra.ranks, inter, hg.leader, hg.is_leader, kinds, hg.cross.ranks


def compare(dtype: str, shape: tuple, op: str, seed: int, algorithm: str = "auto"):
    """Hierarchical (``algorithm``) vs flat all_reduce of the same per-rank arrays: (max abs difference,
    bitwise equal)."""
    dist = _world()
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce

    rank = dist.get_rank()
    rng = np.random.default_rng(seed * 10 + rank)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = rng.normal(size=shape).astype(dt)
    else:
        x = rng.integers(-1000, 1000, size=shape).astype(dt)
    flat, hier = x.copy(), x.copy()
    flat_all_reduce(dist, flat, op)
    out = hierarchical_all_reduce(hier, op=op, algorithm=algorithm)
    assert out is hier
    diff = float(np.max(np.abs(flat.astype(np.float64) - hier.astype(np.float64)))) if flat.size else 0.0
    return diff, flat.tobytes() == hier.tobytes()


def flat_all_reduce(dist, x, op, group=None):
    """The flat reference: the group's backend all_reduce itself (dist.all_reduce may go hierarchical)."""
    from neural_arch.distributed.comm.work import ReduceOp

    pg = group if group is not None else dist.get_default_group()
    pg.backend.allreduce(x, ReduceOp.coerce(op) if isinstance(op, str) else op)


def _record_spans(fn):
    """(result of fn(), [(op name, group's global ranks)] of the collectives it ran on this rank)."""
    from neural_arch.profiler import events

    seen = []
    events.subscribe(seen.append)
    try:
        out = fn()
    finally:
        events.unsubscribe(seen.append)
    return out, [(s.name, tuple(s.args["group"])) for s in seen if s.category == "collective"]


def _oracle_inputs(dtype, n, group_ranks, seed):
    """Every rank draws the same table (one row per group member) and takes its own row."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    table = (rng.normal(size=(len(group_ranks), n)) if dt.kind == "f"
             else rng.integers(-1000, 1000, size=(len(group_ranks), n))).astype(dt)
    return table


def auto(setting: str, members: tuple, sizes: tuple, dtype: str, as_machines: bool = True):
    """dist.all_reduce on a fresh group of ``members`` under NEURAL_ARCH_HIERARCHICAL=``setting``:
    per size (elements) the documented query's answer, the collectives this rank ran (their op names
    and groups), and whether the result equals the sum of every member's input (NumPy oracle,
    bitwise for integers, 1e-12 relative for float64). None on non-members.

    ``as_machines``: the simulated hosts play separate machines (auto keeps hosts of one machine
    flat; the machine key is then the host key, as it is between real machines)."""
    dist = _world()
    from neural_arch.distributed.algorithms import hierarchical_auto
    from neural_arch.distributed.algorithms.hierarchical import host_key
    from neural_arch.distributed.algorithms.hierarchical_auto import all_reduce_algorithm

    old = os.environ.get("NEURAL_ARCH_HIERARCHICAL")
    os.environ["NEURAL_ARCH_HIERARCHICAL"] = setting  # read at the group's first all_reduce
    real_machine_key = hierarchical_auto.machine_key
    if as_machines:
        hierarchical_auto.machine_key = host_key
    try:
        group = dist.new_group(list(members))         # every world rank calls new_group
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        out = []
        for i, n in enumerate(sizes):
            table = _oracle_inputs(dtype, n, members, seed=i)
            x = table[members.index(dist.get_rank())].copy()
            chosen = all_reduce_algorithm(x, group=group)
            result, spans = _record_spans(lambda x=x: dist.all_reduce(x, group=group))
            expect = table.sum(axis=0, dtype=table.dtype)
            if table.dtype.kind == "f":
                ok = bool(np.allclose(x, expect, rtol=1e-12, atol=1e-12))
            else:
                ok = x.tobytes() == expect.tobytes()
            out.append((chosen, spans, ok and result is x))
        return out
    finally:
        hierarchical_auto.machine_key = real_machine_key
        if old is None:
            os.environ.pop("NEURAL_ARCH_HIERARCHICAL", None)
        else:
            os.environ["NEURAL_ARCH_HIERARCHICAL"] = old


def two_d_without_cross_group():
    """algorithm='2d' with hand-made groups but no cross_node_group: the error, before any I/O."""
    _world()
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce, host_groups

    hg = host_groups()
    try:
        hierarchical_all_reduce(np.ones(4), intra_node_group=hg.intra, inter_node_group=hg.inter, algorithm="2d")
    except ValueError as exc:
        return str(exc)
    return "no error"


def facade(shape: tuple):
    """CommunicationOptimizer.hierarchical_all_reduce with explicit groups: the mean over ranks, on a Tensor."""
    dist = _world()
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.algorithms.hierarchical import host_groups
    from neural_arch.distributed.trainer.communication_optimizer import CommunicationOptimizer

    hg = host_groups()
    rank, world = dist.get_rank(), dist.get_world_size()
    t = Tensor(np.full(shape, float(rank), dtype=np.float64))
    out = CommunicationOptimizer().hierarchical_all_reduce(t, intra_node_group=hg.intra, inter_node_group=hg.inter)
    return out is t, float(np.max(np.abs(t.data - (world - 1) / 2)))


def misuse():
    """Wrong groups are errors at the call, before any communication, naming what to pass."""
    dist = _world()
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce, host_groups

    hg = host_groups()
    x = np.ones(3)
    try:
        if hg.is_leader:
            hierarchical_all_reduce(x, intra_node_group=hg.intra, inter_node_group=None)
        else:
            hierarchical_all_reduce(x, intra_node_group=hg.intra, inter_node_group=dist.get_default_group())
    except ValueError as exc:
        message = str(exc)
    else:
        message = "no error"
    try:
        hierarchical_all_reduce(x, intra_node_group="host", inter_node_group=hg.inter)
    except TypeError as exc:
        message2 = str(exc)
    else:
        message2 = "no error"
    return message, message2


def host_group_paths(seed: int):
    """Which path host_groups()' groups take (gloo): the host group's all_reduce (its members are all
    shared-memory peers) and the cross-host group's, and whether the host group's direct result
    equals its ring plan's bitwise (int64 all_reduce, reduce_scatter, all_gather)."""
    dist = _world()
    from neural_arch.distributed.algorithms.hierarchical import host_groups

    hg = host_groups()
    intra, cross = hg.intra.backend, hg.cross.backend
    if not hasattr(intra, "forced_algorithm"):
        return None                                   # mpi: no gloo paths
    x = np.random.default_rng(seed + dist.get_rank()).integers(-1000, 1000, 40001).astype(np.int64)
    paths = (intra.chosen_algorithm("all_reduce", x), cross.chosen_algorithm("all_reduce", x))
    res = {}
    for algo in ("direct", "ring"):
        a, rs, ag = x.copy(), np.empty(x.size // intra.size, np.int64), np.empty((intra.size, 7), np.int64)
        with intra.forced_algorithm(algo):
            intra.allreduce(a)
            intra.reduce_scatter(rs, x[:rs.size * intra.size].copy())
            intra.allgather(ag, x[:7].copy())
        res[algo] = a.tobytes() + rs.tobytes() + ag.tobytes()
    return paths, intra._direct is not None, cross._direct is None, res["direct"] == res["ring"]


def pipelined(dtype: str, shape: tuple, op: str, seed: int, algorithm: str, chunk_bytes: int):
    """The pipelined form (pieces of ``chunk_bytes``) vs the same form unpipelined (chunk 0) vs flat, on
    the same per-rank arrays: (bitwise equal to unpipelined, max abs difference from flat, pieces cut,
    cross-host all_reduces this rank ran in the pipelined call). MPI groups never pipeline (both runs
    then take the unpipelined path: still equal, one cross-host all_reduce)."""
    dist = _world()
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce
    from neural_arch.distributed.algorithms.hierarchical_pipeline import pieces

    rng = np.random.default_rng(seed * 10 + dist.get_rank())
    dt = np.dtype(dtype)
    x = (rng.normal(size=shape) if dt.kind == "f" else rng.integers(-1000, 1000, size=shape)).astype(dt)
    flat, serial, piped = x.copy(), x.copy(), x.copy()
    flat_all_reduce(dist, flat, op)
    hierarchical_all_reduce(serial, op=op, algorithm=algorithm, pipeline_chunk_bytes=0)
    out, spans = _record_spans(lambda: hierarchical_all_reduce(piped, op=op, algorithm=algorithm,
                                                               pipeline_chunk_bytes=chunk_bytes))
    assert out is piped
    crossings = sum(1 for name, ranks in spans if name == "all_reduce" and len(ranks) == 2 and ranks[0] // 2 != ranks[1] // 2)
    diff = float(np.max(np.abs(flat.astype(np.float64) - piped.astype(np.float64)))) if flat.size else 0.0
    align = 2 if algorithm == "2d" else 1
    return serial.tobytes() == piped.tobytes(), diff, len(pieces(x.size, dt.itemsize, chunk_bytes, align)), crossings


def pipeline_failure(bad_rank: int, bad_piece: int, algorithm: str):
    """One rank's cross-host transfer of one piece raises (an injected fault on its progress thread):
    what every rank's call raises (type name, message) and how long it took; whether an async op is
    still queued on this rank's cross-host group afterwards. Leaves the world poisoned: run last."""
    import time

    dist = _world()
    from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce, host_groups

    hg = host_groups()
    cross = (hg.cross if algorithm == "2d" else hg.inter)
    backend = None if cross is dist.GroupMember.NON_GROUP_MEMBER else cross.backend
    calls = [0]
    if backend is not None and dist.get_rank() == bad_rank:
        real = backend._allreduce

        def faulty(array, op, info):
            calls[0] += 1
            if calls[0] == bad_piece + 1:
                raise RuntimeError(f"injected fault in piece {bad_piece}")
            return real(array, op, info)
        backend._allreduce = faulty
    x = np.ones(1 << 14, np.float64)          # 128 KiB in pieces of 8 KiB: 16 pieces
    t0 = time.monotonic()
    try:
        hierarchical_all_reduce(x, algorithm=algorithm, pipeline_chunk_bytes=8 << 10)
        outcome = ("no error", "")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = (type(exc).__name__, str(exc))
    took = time.monotonic() - t0
    pending = backend._lane.pending if backend is not None else 0
    return outcome, took, pending
