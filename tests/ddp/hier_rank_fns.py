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
    return dist.get_rank(), hg.hosts, hg.intra.ranks, inter, hg.leader, hg.is_leader, kinds


def compare(dtype: str, shape: tuple, op: str, seed: int):
    """Hierarchical vs flat all_reduce of the same per-rank arrays: (max abs difference, bitwise equal)."""
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
    dist.all_reduce(flat, op=op)
    out = hierarchical_all_reduce(hier, op=op)
    assert out is hier
    diff = float(np.max(np.abs(flat.astype(np.float64) - hier.astype(np.float64)))) if flat.size else 0.0
    return diff, flat.tobytes() == hier.tobytes()


def facade(shape: tuple):
    """CommunicationOptimizer.hierarchical_all_reduce with explicit groups: the mean over ranks, on a Tensor."""
    dist = _world()
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.algorithms.communication_optimizer import CommunicationOptimizer
    from neural_arch.distributed.algorithms.hierarchical import host_groups

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
