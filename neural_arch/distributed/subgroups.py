"""Sub-groups of the world: ``new_group``, ``new_subgroups``, ``new_subgroups_by_enumeration``, ``split_group``.

Every rank of the parent group must call these, in the same order, with the same arguments
(torch semantics); each call first exchanges the requested rank lists, so a rank that asks for
something else is an error on every rank instead of a hang. A rank outside the new group gets
``GroupMember.NON_GROUP_MEMBER``, on which collectives return without doing anything.

Example::

    evens = new_group([r for r in range(get_world_size()) if r % 2 == 0])
    mine, groups = new_subgroups(2)          # consecutive pairs
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence

from neural_arch.distributed.errors import DistributedError
from neural_arch.distributed.process_group import GroupMember, ProcessGroup
from neural_arch.distributed.resolve import _resolve_group, _seconds
from neural_arch.distributed.state import STATE as _STATE

__all__ = ["new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"]


def new_group(ranks: Sequence[int] | None = None, timeout=None, backend: str | None = None):
    """Make a sub-group of the world. **Every rank of the world must call it.**

    Two calling styles are accepted, and told apart by one small all-gather of every rank's
    list (so a wrong call fails at once, on every rank, instead of hanging later):

    * **torch's**: every rank passes the *same* list (non-members too). Members get the new
      :class:`~neural_arch.distributed.process_group.ProcessGroup`, the others
      ``GroupMember.NON_GROUP_MEMBER``.
    * **a split** (MPI_Comm_split; seed 004's pattern): each rank passes the ranks of *its own*
      group, and the lists form a partition of the world (each list holds its caller, two lists
      either agree or are disjoint). Every rank then gets the group it named.

    Anything else (e.g. rank 1 passing ``[0, 1]`` while rank 0 passes ``[0, 2]``) raises
    :class:`~neural_arch.distributed.errors.DistributedError` on every rank, naming each rank's list.

    ``ranks`` are global ranks (default: all). Example::

        pair = new_group([0, 1])                       # torch style, called by every rank
        if pair is not GroupMember.NON_GROUP_MEMBER:
            all_reduce(t, group=pair)
        tp = new_group([r - r % 2, r - r % 2 + 1])     # split style: each rank names its own pair
    """
    world = _resolve_group(None, "new_group")
    size = world.size()
    ranks = list(range(size)) if ranks is None else [_as_int(r, "new_group", "rank") for r in ranks]
    _check_ranks(ranks, size, "new_group")
    if backend is not None and str(backend).lower() != world.backend_name:
        raise ValueError(f"new_group(backend={backend!r}): sub-groups use the world's backend "
                         f"({world.backend_name!r}); omit backend=")
    lists = _exchange_rank_lists(world, ranks)
    me = world.rank()
    if all(lst == lists[0] for lst in lists):
        return _make_groups([ranks], me, timeout)[0]
    partition = _as_partition(lists)
    if partition is None:
        shown = "; ".join(f"rank {r}: {lst}" for r, lst in enumerate(lists))
        raise DistributedError(
            f"new_group: the ranks disagree on the group ({shown}). Either every rank passes the same "
            "list (torch's style, non-members included), or each rank passes the ranks of its own group "
            "and the lists form a partition of the world (a split); for several groups at once use "
            "new_subgroups_by_enumeration([[...], [...]])")
    groups = _make_groups(partition, me, timeout)
    return next(g for g, members in zip(groups, partition) if me in members)


def _as_int(value, op: str, what: str) -> int:
    """``value`` as an int if it is one (Python or NumPy integer); a float such as 1.5 is refused
    rather than truncated into another rank."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {what} {value!r} must be an int, got {type(value).__name__}") from None


def _check_ranks(ranks: list[int], size: int, op: str) -> None:
    if not ranks:
        raise ValueError(f"{op}: ranks must not be empty")
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(f"{op}: rank {r} is out of range for a world of size {size} "
                             f"(valid: 0..{size - 1})")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{op}: ranks {ranks} contain duplicates")


def _exchange_rank_lists(world: ProcessGroup, ranks: list[int]) -> list[list[int]]:
    """Every rank's (sorted) list, via one int64 all-gather over the world (arrays, no pickle)."""
    import numpy as np

    size = world.size()
    mine = np.full(size, -1, dtype=np.int64)
    mine[:len(ranks)] = sorted(ranks)
    table = np.empty((size, size), dtype=np.int64)
    world.backend.allgather(table, mine)
    return [[int(v) for v in row if v >= 0] for row in table]


def _as_partition(lists: list[list[int]]) -> list[list[int]] | None:
    """The distinct groups when ``lists[r]`` is rank r's own group in a partition; else None."""
    for r, lst in enumerate(lists):
        if r not in lst or any(lists[m] != lst for m in lst):
            return None
    return sorted({tuple(lst) for lst in lists}, key=lambda g: g[0])  # type: ignore[return-value]


def _make_groups(groups: Sequence[Sequence[int]], me: int, timeout) -> list:
    """Create each group in order on every rank (backends need all ranks to take part in each).

    Returns one entry per group: the ProcessGroup where this rank is a member,
    ``GroupMember.NON_GROUP_MEMBER`` elsewhere.
    """
    world = _resolve_group(None, "new_group")
    out = []
    for members in groups:
        members = sorted(int(r) for r in members)
        impl = world.backend.new_group(members)  # collective over the world
        with _STATE.lock:
            # counted on every rank, members or not (torch's group_count): the name -- and so the flight
            # recorder's group id -- is the same on each member, whichever groups each rank belongs to
            world._groups_made += 1
            if impl is None:
                out.append(GroupMember.NON_GROUP_MEMBER)
                continue
            if timeout is not None:
                impl.timeout = _seconds(timeout, "timeout")
            pg = ProcessGroup(impl, members, world.backend_name, f"group{world._groups_made}", world.generation)
            _STATE.groups.append(pg)
            out.append(pg)
    return out


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]], timeout=None,
                                 backend: str | None = None):
    """Make several disjoint groups at once (torch): returns ``(this rank's group, all groups)``.

    Every rank calls it with the same list of lists. The first item is None on a rank that is in
    none of them; the list holds ``GroupMember.NON_GROUP_MEMBER`` for groups this rank is not in.
    Example (4 ranks)::

        mine, groups = new_subgroups_by_enumeration([[0, 2], [1, 3]])
    """
    world = _resolve_group(None, "new_subgroups_by_enumeration")
    if backend is not None and str(backend).lower() != world.backend_name:
        raise ValueError(f"new_subgroups_by_enumeration(backend={backend!r}): sub-groups use the world's "
                         f"backend ({world.backend_name!r}); omit backend=")
    if not ranks_per_subgroup_list:
        raise ValueError("new_subgroups_by_enumeration: ranks_per_subgroup_list must not be empty")
    groups = [[_as_int(r, "new_subgroups_by_enumeration", "rank") for r in g] for g in ranks_per_subgroup_list]
    seen: dict[int, int] = {}
    for i, g in enumerate(groups):
        _check_ranks(g, world.size(), "new_subgroups_by_enumeration")
        for r in g:
            if r in seen:
                raise ValueError(f"new_subgroups_by_enumeration: rank {r} is in subgroup {seen[r]} and in "
                                 f"subgroup {i}; the subgroups must be disjoint")
            seen[r] = i
    # Same consistency check as new_group: every rank must pass the same enumeration.
    lists = _exchange_enumeration(world, groups)
    if any(lst != lists[0] for lst in lists):
        shown = "; ".join(f"rank {r}: {lst}" for r, lst in enumerate(lists))
        raise DistributedError(f"new_subgroups_by_enumeration: the ranks passed different subgroups ({shown}); "
                               "every rank must pass the same list of lists")
    out = _make_groups(groups, world.rank(), timeout)
    mine = next((g for g in out if g is not GroupMember.NON_GROUP_MEMBER), None)
    return mine, out


def _exchange_enumeration(world: ProcessGroup, groups: list[list[int]]) -> list[list[list[int]]]:
    """Every rank's list of groups (encoded as one int64 row: ranks, -1 between groups)."""
    import numpy as np

    size = world.size()
    width = 2 * size + 1
    code = [r for g in groups for r in (*g, -1)]
    if len(code) > width:  # cannot happen for disjoint groups of valid ranks; guards the encoding
        raise ValueError("new_subgroups_by_enumeration: too many subgroups for the world size")
    row = np.full(width, -2, dtype=np.int64)
    row[:len(code)] = code
    table = np.empty((size, width), dtype=np.int64)
    world.backend.allgather(table, row)
    decoded = []
    for line in table:
        gs, cur = [], []
        for v in line:
            if v == -2:
                break
            if v == -1:
                gs.append(cur)
                cur = []
            else:
                cur.append(int(v))
        decoded.append(gs)
    return decoded


def new_subgroups(group_size: int | None = None, group=None, timeout=None, backend: str | None = None):
    """Split the world into consecutive groups of ``group_size`` ranks (torch).

    Returns ``(this rank's group, all groups)``; ``group_size`` defaults to the ranks per node
    (``LOCAL_WORLD_SIZE``), and must divide the world size. Example (4 ranks)::

        mine, groups = new_subgroups(2)      # [[0, 1], [2, 3]]
    """
    world = _resolve_group(None, "new_subgroups")
    if group is not None and group is not GroupMember.WORLD and group is not world:
        raise NotImplementedError("new_subgroups(group=...): only splitting the world is supported; "
                                  "use new_subgroups_by_enumeration with global ranks instead")
    if group_size is None:
        group_size = int(os.environ.get("LOCAL_WORLD_SIZE") or (_STATE.info.get("layout") or {}).get(
            "local_world_size") or world.size())
    group_size = _as_int(group_size, "new_subgroups", "group_size")
    size = world.size()
    if group_size <= 0 or size % group_size:
        raise ValueError(f"new_subgroups: group_size={group_size} must be positive and divide the world "
                         f"size {size}")
    return new_subgroups_by_enumeration([list(range(s, s + group_size)) for s in range(0, size, group_size)],
                                        timeout=timeout, backend=backend)


def split_group(parent_pg=None, split_ranks: Sequence[Sequence[int]] | None = None, timeout=None,
                pg_options=None, group_desc: str | None = None):
    """Split ``parent_pg`` (default: the world) into the disjoint groups ``split_ranks`` (torch).

    Every rank calls it with the same ``split_ranks`` (global ranks); returns this rank's new
    group, or None when it is in none. Example (4 ranks)::

        tp = split_group(split_ranks=[[0, 1], [2, 3]])
    """
    world = _resolve_group(None, "split_group")
    if parent_pg is not None and parent_pg is not GroupMember.WORLD and parent_pg is not world:
        raise NotImplementedError("split_group(parent_pg=...): only the world can be split here; pass "
                                  "parent_pg=None with global ranks in split_ranks")
    if split_ranks is None:
        raise ValueError("split_group: split_ranks is required (a list of disjoint lists of global ranks)")
    if pg_options is not None:
        raise ValueError("split_group: pg_options are not supported by neural_arch backends; omit it")
    mine, _ = new_subgroups_by_enumeration(split_ranks, timeout=timeout)
    if mine is not None and group_desc:
        mine.name = str(group_desc)
    return mine


# ---------------------------------------------------------------------------------- queries
