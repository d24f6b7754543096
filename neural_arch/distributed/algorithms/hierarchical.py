"""Hierarchical all-reduce: reduce inside each host, all-reduce among host leaders, broadcast back.

On a job that spans hosts, a flat ring all-reduce sends every byte over the slow links between
hosts ``2 (n - 1) / n`` times. The hierarchical form moves it over them once per host::

    1. reduce     inside each host to its leader (the host's lowest rank)   shared memory
    2. all-reduce among the leaders (one rank per host)                      network
    3. broadcast  inside each host from its leader                           shared memory

The result is the flat all-reduce's: bitwise for integers (addition is associative there), within
reduction-order rounding for floats. :func:`host_groups` builds the two kinds of groups from the
host each rank runs on (the transport's notion of "same host", which ``NEURAL_ARCH_HOST_ID``
overrides, so one machine can play several hosts in tests).

Example (4 ranks on 2 hosts, every rank runs this)::

    hg = host_groups()                     # collective: every rank of the world calls it
    hg.hosts                               # [[0, 1], [2, 3]]
    t = np.full(3, float(get_rank()))
    hierarchical_all_reduce(t, intra_node_group=hg.intra, inter_node_group=hg.inter)
    # t == [6., 6., 6.] on every rank, as all_reduce(t) would give
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.process_group import GroupMember, ProcessGroup

__all__ = ["HostGroups", "hierarchical_all_reduce", "host_groups", "hosts_from_keys"]

_CACHE: dict = {}  # world generation -> HostGroups (building groups is collective: do it once)


@dataclass
class HostGroups:
    """The host layout of the world and the groups a hierarchical collective needs.

    ``hosts``: global ranks per host (hosts ordered by their lowest rank); ``intra``: this rank's
    host group; ``inter``: the group of host leaders (``GroupMember.NON_GROUP_MEMBER`` on ranks
    that do not lead their host); ``leader``: this host's leader (global rank).
    """

    hosts: list[list[int]]
    intra: ProcessGroup
    inter: object
    leader: int

    @property
    def is_leader(self) -> bool:
        return self.intra.rank() == 0


def _host_key() -> int:
    """This process's host identity as an int64 (arrays on the wire, no pickle)."""
    from neural_arch.distributed.groups import _host_identity  # the identity rendezvous uses

    digest = hashlib.blake2b(_host_identity().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def hosts_from_keys(keys) -> list[list[int]]:
    """Ranks grouped by host key (``keys[r]``: rank r's host), hosts ordered by their lowest rank.

    >>> hosts_from_keys([7, 3, 7, 3, 9])
    [[0, 2], [1, 3], [4]]
    """
    by_host: dict = {}
    for r, k in enumerate(keys):
        by_host.setdefault(k, []).append(r)
    return list(by_host.values())  # dict order: first appearance, i.e. by lowest rank


def host_groups(group=None, *, refresh: bool = False) -> HostGroups:
    """Group the world's ranks by host and make the intra-host and leader groups (collective).

    Every rank of the world must call it (it all-gathers host identities and creates groups).
    The result is cached per ``init_process_group()``; ``refresh=True`` builds it again (after
    changing ``NEURAL_ARCH_HOST_ID``, say). Only the world can be split this way for now.
    """
    from neural_arch.distributed import groups as _groups

    if group is not None and group is not GroupMember.WORLD:
        raise NotImplementedError("host_groups(group=...): only the world can be split by host for now; "
                                  "build the groups of a sub-group with new_subgroups_by_enumeration and new_group")
    world = _groups._resolve_group(None, "host_groups")
    cached = _CACHE.get(world.generation)
    if cached is not None and not refresh:
        return cached
    keys = np.empty(world.size(), dtype=np.int64)
    world.backend.allgather(keys, np.array(_host_key(), dtype=np.int64))
    hosts = hosts_from_keys(keys.tolist())
    intra, _ = _groups.new_subgroups_by_enumeration(hosts)
    leaders = [h[0] for h in hosts]
    inter = _groups.new_group(leaders)
    me = world.rank()
    mine = next(h for h in hosts if me in h)
    _CACHE.clear()
    hg = _CACHE[world.generation] = HostGroups(hosts, intra, inter, mine[0])
    return hg


def _usable(group) -> bool:
    return group is not None and group is not GroupMember.NON_GROUP_MEMBER


def hierarchical_all_reduce(tensor, op=ReduceOp.SUM, intra_node_group=None, inter_node_group=None):
    """All-reduce ``tensor`` (a Tensor or a contiguous array) in place in three steps (see the module
    docstring) and return it, like ``all_reduce``.

    ``intra_node_group``: this rank's host group (its group rank 0 leads the host);
    ``inter_node_group``: the group of every host's leader, on the leaders (``None`` or
    ``GroupMember.NON_GROUP_MEMBER`` elsewhere). With both omitted they come from
    :func:`host_groups`. The intra groups must partition the world. ``ReduceOp.AVG`` sums and
    divides by the world size.
    """
    from neural_arch.distributed import groups as _groups
    from neural_arch.distributed.collectives import _buf

    if not isinstance(op, ReduceOp):
        op = ReduceOp.coerce(op)
    if intra_node_group is None and inter_node_group is None:
        hg = host_groups()
        intra_node_group, inter_node_group = hg.intra, hg.inter
    if not isinstance(intra_node_group, ProcessGroup):
        raise TypeError(f"hierarchical_all_reduce: intra_node_group must be this rank's host group (a ProcessGroup), "
                        f"got {intra_node_group!r}; host_groups() builds it")
    array = _buf(tensor)
    leader = intra_node_group.rank() == 0
    if leader and not _usable(inter_node_group):
        raise ValueError(f"hierarchical_all_reduce: this rank leads its host group {intra_node_group.ranks} "
                         "(group rank 0) but got no inter_node_group; pass the group of every host's leader")
    if not leader and _usable(inter_node_group):
        raise ValueError(f"hierarchical_all_reduce: this rank is not the leader of its host group "
                         f"{intra_node_group.ranks} (the leader is its group rank 0) but was given an "
                         "inter_node_group; pass None (or GroupMember.NON_GROUP_MEMBER) on non-leaders")
    avg = op is ReduceOp.AVG
    wire_op = ReduceOp.SUM if avg else op
    if avg and array.dtype.kind not in "fc":
        raise TypeError(f"ReduceOp.AVG needs a floating dtype, got {array.dtype}; use ReduceOp.SUM")
    intra = intra_node_group.backend
    intra.reduce(array, root=0, op=wire_op)
    if leader:
        inter_node_group.backend.allreduce(array, wire_op)
    intra.broadcast(array, root=0)
    if avg:
        array /= array.dtype.type(_groups.get_world_size())
    return tensor
