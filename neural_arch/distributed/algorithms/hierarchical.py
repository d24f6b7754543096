"""Hierarchical all-reduce: shared memory inside each host, the network only between hosts.

On a job that spans hosts, a flat ring all-reduce sends every byte over the slow links between
hosts ``2 (n - 1) / n`` times. Two hierarchical forms send less over them:

``"leader"`` (one rank per host talks to the other hosts)::

    1. reduce      inside each host to its leader (the host's lowest rank)   shared memory
    2. all-reduce  among the leaders (one rank per host)                      network
    3. broadcast   inside each host from its leader                           shared memory

``"2d"`` (every rank talks to the other hosts, each about its own slice, so every host link works)::

    1. reduce-scatter inside each host: local rank i holds the host's sum of slice i    shared memory
    2. all-reduce of slice i among the ranks with local rank i on every host          network
    3. all-gather inside each host                                                     shared memory

The result is the flat all-reduce's: bitwise for integers (addition is associative there), within
reduction-order rounding for floats. Uneven sizes are fine (the 2-D form pads the last slice); the
2-D form needs the same number of ranks on every host, the leader form does not. On gloo the
host group's steps run on the direct shared-memory collectives (the host group maps its own
segment at its first collective: :mod:`neural_arch.distributed.comm.gloo.backend`), the cross-host step
on the message plans over TCP. Large messages are pipelined: pieces of
:data:`.hierarchical_pipeline.PIPELINE_CHUNK_BYTES` cross the network while the host works on their
neighbours (:mod:`.hierarchical_pipeline`).
:func:`host_groups` builds the groups from the host each rank runs on (the transport's notion of
"same host", which ``NEURAL_ARCH_HOST_ID`` overrides, so one machine can play several hosts in
tests). ``dist.all_reduce`` picks a form by itself on groups spanning hosts
(:mod:`.hierarchical_auto`; :func:`.hierarchical_auto.all_reduce_algorithm` says which).

Example (4 ranks on 2 hosts, every rank runs this)::

    hg = host_groups()                     # collective: every rank of the world calls it
    hg.hosts                               # [[0, 1], [2, 3]]
    t = np.full(3, float(get_rank()))
    hierarchical_all_reduce(t, intra_node_group=hg.intra, inter_node_group=hg.inter)
    # t == [6., 6., 6.] on every rank, as all_reduce(t) would give
    hierarchical_all_reduce(t, algorithm="2d")          # groups from host_groups()
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from neural_arch.distributed.algorithms.hierarchical_pipeline import (
    pipelines,
    run_leader_pipelined,
    run_two_d_pipelined,
)
from neural_arch.distributed.comm.dtypes import is_bfloat16
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.host import host_identity
from neural_arch.distributed.process_group import GroupMember, ProcessGroup

__all__ = [
    "ALGORITHMS",
    "TWO_D_MIN_BYTES",
    "HostGroups",
    "choose_algorithm",
    "hierarchical_all_reduce",
    "host_groups",
    "hosts_from_keys",
    "run_leader",
    "run_two_d",
]

#: what ``algorithm=`` accepts
ALGORITHMS = ("auto", "leader", "2d")
#: ``"auto"`` takes the 2-D form from this message size up (smaller: the leader form, whose three
#: steps are one message each). Not a measured crossover: on simulated hosts (loopback TCP, 2 cores)
#: the leader form beat the 2-D one at every size (``bench_collectives.py --hierarchical``); between
#: real machines the 2-D form sends the same bytes per host but over every local rank's connection.
TWO_D_MIN_BYTES = 1 << 20

_CACHE: dict = {}  # world generation -> HostGroups (building groups is collective: do it once)


@dataclass
class HostGroups:
    """The host layout of the world and the groups a hierarchical collective needs.

    ``hosts``: global ranks per host (hosts ordered by their lowest rank); ``intra``: this rank's
    host group; ``inter``: the group of host leaders (``GroupMember.NON_GROUP_MEMBER`` on ranks
    that do not lead their host); ``leader``: this host's leader (global rank); ``cross``: the
    group of the ranks with this rank's local rank on every host (the 2-D form's), or None when
    the hosts hold different numbers of ranks.

    Example::

        hg = host_groups()          # 4 ranks on 2 hosts
        hg.hosts, hg.leader         # ([[0, 1], [2, 3]], 2) on ranks 2 and 3
        hg.intra.size()             # 2
    """

    hosts: list[list[int]]
    intra: ProcessGroup
    inter: object
    leader: int
    cross: object = None

    @property
    def is_leader(self) -> bool:
        return self.intra.rank() == 0


def host_key() -> int:
    """This process's host identity (the one rendezvous and the transports use) as an int64."""
    return identity_key(host_identity())


def identity_key(text: str) -> int:
    """An identity string as an int64 (arrays on the wire, no pickle)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def hosts_from_keys(keys) -> list[list[int]]:
    """Ranks grouped by host key (``keys[r]``: rank r's host), hosts ordered by their lowest rank.

    >>> hosts_from_keys([7, 3, 7, 3, 9])
    [[0, 2], [1, 3], [4]]
    """
    by_host: dict = {}
    for r, k in enumerate(keys):
        by_host.setdefault(k, []).append(r)
    return list(by_host.values())  # dict order: first appearance, i.e. by lowest rank


def choose_algorithm(nbytes: int, nelems: int, hosts) -> str:
    """The form ``algorithm="auto"`` takes for a message on this host layout (pure; no I/O).

    ``"flat"`` when there is no hierarchy (one host, or one rank per host), ``"2d"`` from
    :data:`TWO_D_MIN_BYTES` up when every host holds the same number of ranks (and the message
    has at least one element per local rank), else ``"leader"``.

    >>> choose_algorithm(4 << 20, 1 << 20, [[0, 1], [2, 3]])
    '2d'
    >>> choose_algorithm(1024, 256, [[0, 1], [2, 3]]), choose_algorithm(4 << 20, 1 << 20, [[0, 1, 2], [3, 4]])
    ('leader', 'leader')
    >>> choose_algorithm(4 << 20, 1 << 20, [[0, 1, 2, 3]]), choose_algorithm(4 << 20, 1 << 20, [[0], [1]])
    ('flat', 'flat')
    """
    if len(hosts) < 2 or all(len(h) == 1 for h in hosts):
        return "flat"
    local = len(hosts[0])
    if nbytes >= TWO_D_MIN_BYTES and all(len(h) == local for h in hosts) and nelems >= local:
        return "2d"
    return "leader"


def host_groups(group=None, *, refresh: bool = False) -> HostGroups:
    """Group the world's ranks by host and make the intra-host, leader and cross-host groups (collective).

    Every rank of the world must call it (it all-gathers host identities and creates groups).
    The result is cached per ``init_process_group()``; ``refresh=True`` builds it again (after
    changing ``NEURAL_ARCH_HOST_ID``, say). Only the world can be split this way here
    (``dist.all_reduce`` on a sub-group builds its own hierarchy: :mod:`.hierarchical_auto`).

    Example::

        hg = host_groups()                  # every rank of the world calls it
        print(dist.get_rank(), hg.hosts)    # e.g. 0 [[0, 1], [2, 3]]
    """
    from neural_arch.distributed.resolve import _resolve_group
    from neural_arch.distributed.subgroups import new_group, new_subgroups_by_enumeration

    if group is not None and group is not GroupMember.WORLD:
        raise NotImplementedError("host_groups(group=...): only the world can be split by host for now; "
                                  "build the groups of a sub-group with new_subgroups_by_enumeration and new_group")
    world = _resolve_group(None, "host_groups")
    cached = _CACHE.get(world.generation)
    if cached is not None and not refresh:
        return cached
    keys = np.empty(world.size(), dtype=np.int64)
    world.backend.allgather(keys, np.array(host_key(), dtype=np.int64))
    hosts = hosts_from_keys(keys.tolist())
    intra, _ = new_subgroups_by_enumeration(hosts)
    leaders = [h[0] for h in hosts]
    inter = new_group(leaders)
    cross = None
    if len({len(h) for h in hosts}) == 1:   # the 2-D form: local rank i of every host
        cross, _ = new_subgroups_by_enumeration([[h[i] for h in hosts] for i in range(len(hosts[0]))])
    me = world.rank()
    mine = next(h for h in hosts if me in h)
    _CACHE.clear()
    hg = _CACHE[world.generation] = HostGroups(hosts, intra, inter, mine[0], cross)
    return hg


# -- the two forms on backends (arrays, group ranks): shared by the explicit API and dist.all_reduce ---
def run_leader(array, op: ReduceOp, intra, inter, chunk_bytes=None) -> None:
    """The leader form on ``array`` (contiguous, in place): ``intra``/``inter`` are backends,
    ``inter`` None on ranks that do not lead their host. ``op`` is a wire op (no AVG).
    ``chunk_bytes``: pipeline piece size (None: :data:`.hierarchical_pipeline.PIPELINE_CHUNK_BYTES`;
    0: the three steps one after the other); see :mod:`.hierarchical_pipeline`.

    Example::

        hg = host_groups()
        inter = hg.inter.backend if hg.inter is not GroupMember.NON_GROUP_MEMBER else None
        run_leader(flat, ReduceOp.SUM, hg.intra.backend, inter)
    """
    _check_in_place(array)
    if pipelines(intra, array, chunk_bytes):
        return run_leader_pipelined(array, op, intra, inter, chunk_bytes)
    intra.reduce(array, root=0, op=op)
    if inter is not None:
        inter.allreduce(array, op)
    intra.broadcast(array, root=0)


def run_two_d(array, op: ReduceOp, intra, cross, chunk_bytes=None) -> None:
    """The 2-D form on ``array`` (contiguous, in place): ``intra`` is this host's backend (every
    host of the same size), ``cross`` the backend of the ranks with this local rank on every host.
    ``chunk_bytes``: as in :func:`run_leader` (large messages go through :mod:`.hierarchical_pipeline`).

    The flat buffer is cut in ``intra.size`` slices of ``ceil(n / size)`` elements; when ``n`` is
    not a multiple the input is padded in a scratch copy (the padding's reduction is thrown away,
    so its values do not matter; zeros keep float sums quiet).

    Example::

        hg = host_groups()                  # every host holds the same number of ranks
        run_two_d(flat, ReduceOp.SUM, hg.intra.backend, hg.cross.backend)
    """
    _check_in_place(array)
    if pipelines(intra, array, chunk_bytes):
        return run_two_d_pipelined(array, op, intra, cross, chunk_bytes)
    flat = array.reshape(-1)
    n, local = flat.size, intra.size
    if n == 0:
        return
    per = -(-n // local)
    xp = np if type(flat) is np.ndarray else _xp(flat)
    padded = per * local != n
    if not padded:
        source, table = flat, flat.reshape(local, per)   # slices and result in the caller's buffer
    else:
        source = xp.zeros(per * local, dtype=flat.dtype)
        source[:n] = flat
        table = xp.empty((local, per), dtype=flat.dtype)
    part = xp.empty(per, dtype=flat.dtype)
    intra.reduce_scatter(part, source, op)
    cross.allreduce(part, op)
    intra.allgather(table, part)
    if padded:
        flat[...] = table.reshape(-1)[:n]


def _check_in_place(array) -> None:
    """Both forms work on ``array.reshape(-1)``: for an array that is not C-contiguous (a Fortran-ordered
    or strided view) that is a copy, and the caller's buffer would silently keep its old values."""
    flags = getattr(array, "flags", None)
    if flags is not None and not flags.c_contiguous:
        raise ValueError("hierarchical all-reduce: the array is not C-contiguous; pass np.ascontiguousarray(array) "
                         "(the result is written into the buffer in place)")


def _xp(array):
    from neural_arch.backend import get_array_module as xp

    return xp(array)


def wire_op(op, dtype) -> tuple[ReduceOp, bool]:
    """(the op to send, whether to average): AVG travels as SUM (see :func:`start_average`).

    >>> wire_op("avg", np.float32), wire_op(ReduceOp.MAX, np.int64)
    ((<ReduceOp.SUM: 'sum'>, True), (<ReduceOp.MAX: 'max'>, False))
    """
    if not isinstance(op, ReduceOp):
        op = ReduceOp.coerce(op)
    if op is ReduceOp.AVG:
        dtype = np.dtype(dtype)
        if dtype.kind not in "fc" and not is_bfloat16(dtype):
            raise TypeError(f"ReduceOp.AVG needs a floating dtype, got {dtype}; use ReduceOp.SUM")
        return ReduceOp.SUM, True
    return op, False


def start_average(array, total: int) -> bool:
    """Before an AVG's SUM over ``total`` ranks: float16 is multiplied by ``1 / total`` first, as the
    flat all-reduce does (its sum can overflow where the mean does not); returns whether the sum
    still has to be divided by ``total`` afterwards (every other dtype).

    >>> x = np.full(2, 40000.0, dtype=np.float16)
    >>> start_average(x, 4), x.tolist()
    (False, [10000.0, 10000.0])
    """
    if array.dtype == np.float16:
        array *= array.dtype.type(1.0 / total)
        return False
    return True


# -- the explicit API on process groups -----------------------------------------------------------
def _usable(group) -> bool:
    return group is not None and group is not GroupMember.NON_GROUP_MEMBER


def hierarchical_all_reduce(tensor, op=ReduceOp.SUM, intra_node_group=None, inter_node_group=None, *,
                            algorithm: str = "auto", cross_node_group=None, pipeline_chunk_bytes=None):
    """All-reduce ``tensor`` (a Tensor or a contiguous array) in place in three steps (see the module
    docstring) and return it, like ``all_reduce``.

    ``algorithm``: ``"leader"``, ``"2d"`` or ``"auto"`` (:func:`choose_algorithm`; with groups
    passed by hand, ``"2d"`` when a ``cross_node_group`` is given and the message is large enough).
    ``intra_node_group``: this rank's host group (its group rank 0 leads the host);
    ``inter_node_group``: the group of every host's leader, on the leaders (``None`` or
    ``GroupMember.NON_GROUP_MEMBER`` elsewhere); ``cross_node_group`` (2-D form): the ranks with
    this rank's local rank on every host. With all omitted they come from :func:`host_groups`.
    The intra groups must partition the ranks taking part, each of which calls this (and have one
    size, for the 2-D form); with groups from :func:`host_groups` those are the world's.
    ``ReduceOp.AVG`` sums and divides by the number of ranks taking part (float16 is multiplied
    by its inverse first, as the flat all-reduce does; in the leader form over groups passed by hand,
    which may leave ranks of the world out, the ranks are counted by the same reduction: it runs on
    a copy one element longer). The array must be C-contiguous (it is written in place).
    ``pipeline_chunk_bytes``: messages of
    two pieces or more overlap the host and cross-host steps of neighbouring pieces of this size
    (:mod:`.hierarchical_pipeline`, gloo only; None: its default; 0: never).

    Example::

        t = np.full(3, float(dist.get_rank()))
        hierarchical_all_reduce(t)                     # groups from host_groups(); t == all_reduce(t)
        hierarchical_all_reduce(t, op=ReduceOp.AVG, algorithm="2d")
    """
    from neural_arch.distributed.resolve import _buf

    if algorithm not in ALGORITHMS:
        raise ValueError(f"hierarchical_all_reduce(algorithm={algorithm!r}): use one of {ALGORITHMS}")
    array = _buf(tensor)
    _check_in_place(array)
    wire, avg = wire_op(op, array.dtype)
    hosts = None
    if intra_node_group is None and inter_node_group is None and cross_node_group is None:
        hg = host_groups()
        intra_node_group, inter_node_group, cross_node_group, hosts = hg.intra, hg.inter, hg.cross, hg.hosts
    if not isinstance(intra_node_group, ProcessGroup):
        raise TypeError(f"hierarchical_all_reduce: intra_node_group must be this rank's host group (a ProcessGroup), "
                        f"got {intra_node_group!r}; host_groups() builds it")
    if algorithm == "auto":
        if hosts is not None:
            algorithm = choose_algorithm(array.nbytes, array.size, hosts)
            algorithm = "leader" if algorithm == "flat" else algorithm
        else:
            algorithm = ("2d" if _usable(cross_node_group) and array.nbytes >= TWO_D_MIN_BYTES
                         and array.size >= intra_node_group.size() else "leader")
    if algorithm == "2d":
        if not _usable(cross_node_group):
            sizes = [len(h) for h in hosts] if hosts is not None else None
            why = (f"the hosts hold different numbers of ranks ({sizes})" if sizes is not None
                   else "no cross_node_group was given")
            raise ValueError(f"hierarchical_all_reduce(algorithm='2d'): {why}; the 2-D form needs the same number of "
                             "ranks on every host and the group of each local rank across hosts "
                             "(host_groups().cross); use algorithm='leader'")
        total = intra_node_group.size() * cross_node_group.size()
        divide = avg and start_average(array, total)
        run_two_d(array, wire, intra_node_group.backend, cross_node_group.backend, pipeline_chunk_bytes)
    else:
        leader = intra_node_group.rank() == 0
        if leader and not _usable(inter_node_group):
            raise ValueError(f"hierarchical_all_reduce: this rank leads its host group {intra_node_group.ranks} "
                             "(group rank 0) but got no inter_node_group; pass the group of every host's leader")
        if not leader and _usable(inter_node_group):
            raise ValueError(f"hierarchical_all_reduce: this rank is not the leader of its host group "
                             f"{intra_node_group.ranks} (the leader is its group rank 0) but was given an "
                             "inter_node_group; pass None (or GroupMember.NON_GROUP_MEMBER) on non-leaders")
        inter_backend = inter_node_group.backend if leader else None
        if avg and hosts is None:
            # Groups given by hand may cover part of the world, and no rank knows the other hosts'
            # sizes: every rank adds a 1 after its data, so the same reduction counts the ranks.
            return _leader_average_counting_ranks(tensor, array, intra_node_group.backend, inter_backend,
                                                  pipeline_chunk_bytes)
        total = sum(len(h) for h in hosts) if hosts is not None else None
        divide = avg and start_average(array, total)
        run_leader(array, wire, intra_node_group.backend, inter_backend, pipeline_chunk_bytes)
    if divide:
        array /= array.dtype.type(total)
    return tensor


def _leader_average_counting_ranks(tensor, array, intra, inter, chunk_bytes):
    """``ReduceOp.AVG`` in the leader form over host groups given by hand: SUM ``array`` with one
    extra element holding 1 on every rank, whose sum is the number of ranks taking part (the
    world's size would be wrong when the groups leave some of its ranks out)."""
    flat = array.reshape(-1)
    xp = np if type(flat) is np.ndarray else _xp(flat)
    # float16 sums in float32 here: the count is not known before the sum (to pre-scale, as
    # start_average does), and a float16 sum can overflow where the mean does not
    # (bfloat16 too: it holds whole numbers exactly only up to 256, and the count is one of them)
    low = flat.dtype == np.float16 or flat.dtype.name == "bfloat16"
    scratch = xp.empty(flat.size + 1, dtype=np.float32 if low else flat.dtype)
    scratch[:-1] = flat
    scratch[-1] = 1
    run_leader(scratch, ReduceOp.SUM, intra, inter, chunk_bytes)
    flat[...] = scratch[:-1] / scratch[-1]
    return tensor
