"""``ProcessGroup``: one backend communicator plus its members as global ranks.

``group.py`` creates these; :mod:`neural_arch.distributed.collectives` and DDP use them to
translate the global ranks users pass (``src``, ``dst``, ``root``) into the group ranks a
backend speaks.

Example::

    pg = ProcessGroup(backend, ranks=[0, 2], name="evens")
    pg.group_rank(2)        # 1
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.errors import DistributedError
from neural_arch.distributed.state import STATE


class GroupMembershipError(DistributedError, ValueError):
    """A rank-local operation was called with a group this rank does not belong to.

    Also a ``ValueError`` (a wrong argument).

    Example::

        >>> from neural_arch.distributed.process_group import GroupMembershipError
        >>> issubclass(GroupMembershipError, ValueError)
        True
    """


class _NonGroupMember:
    """What :func:`new_group` returns on ranks outside the new group (torch's sentinel)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"

    def __reduce__(self):  # stays a singleton through pickle
        return (_NonGroupMember, ())


class GroupMember:
    """``WORLD`` is the default group once initialised (None before); ``NON_GROUP_MEMBER`` is
    what ``new_group`` returns on ranks that are not in the new group.

    Example::

        >>> from neural_arch.distributed.process_group import GroupMember
        >>> GroupMember.NON_GROUP_MEMBER
        GroupMember.NON_GROUP_MEMBER
    """

    WORLD: ProcessGroup | None = None
    NON_GROUP_MEMBER = _NonGroupMember()


#: ``ProcessGroup._hierarchical_min_bytes`` of a group whose all_reduce always stays flat (the hot
#: path tests identity with it).
FLAT_ALWAYS = float("inf")


class ProcessGroup:
    """A set of ranks that run collectives together, over one backend communicator.

    ``rank()``/``size()`` are this process's rank within the group and the group's size
    (torch's names); ``ranks`` lists the members as global ranks.

    Example::

        pg = get_default_group()
        pg.rank(), pg.size(), pg.ranks, pg.backend_name
        pg.group_rank(3)     # global rank 3 -> its rank inside this group
    """

    # all_reduce's hierarchical threshold for this group (bytes), decided on its first large call by
    # algorithms/hierarchical_auto.py: None = not decided yet; FLAT_ALWAYS = this group stays flat.
    _hierarchical_min_bytes = None

    def __init__(self, backend: Backend, ranks: Sequence[int], backend_name: str, name: str,
                 generation: int):
        self.backend = backend
        self.ranks: list[int] = [int(r) for r in ranks]
        self.backend_name = backend_name
        #: the group's name as torch gives it, ``"WORLD"`` or ``"group<n>"`` for the n-th group made by
        #: ``new_group`` and its kin in this world (counted on every rank of the world, members or not,
        #: so the name is the same on each member, as torch's ``pg_name``)
        self.name = name
        #: the world's incarnation, counted up by ``init_process_group`` (a re-initialised or re-formed
        #: world has another), so a group made again with the same members and name is another group
        self.generation = generation
        self.destroyed = False
        self._index = {g: i for i, g in enumerate(self.ranks)}
        # groups made by new_group and its kin in this world so far (on the world's ProcessGroup only)
        self._groups_made = 0
        # the backend's records and stall keys carry the group's identity (the flight recorder's analyzer
        # and the stall inspector tell two groups with the same members apart by it)
        backend.group_id = self.group_id

    @property
    def group_id(self) -> str:
        """The group's id, ``"pg<generation>/<name>"``, the same on every member and different for
        every group of a process's life (the flight recorder's records carry it as ``group_id``).

        Example::

            >>> from neural_arch.distributed.comm.local import LocalBackend
            >>> ProcessGroup(LocalBackend(), [0], "local", "WORLD", 3).group_id
            'pg3/WORLD'
        """
        return f"pg{self.generation}/{self.name}"

    def rank(self) -> int:
        return self.backend.rank

    def size(self) -> int:
        return self.backend.size

    @property
    def timeout(self) -> float:
        return self.backend.timeout

    def group_rank(self, global_rank: int, arg: str = "rank") -> int:
        """Translate a global rank into this group's numbering; a clear error if it is not a member."""
        try:
            g = operator.index(global_rank)
        except TypeError:
            raise TypeError(f"{arg}={global_rank!r} must be an int (a global rank)") from None
        if g not in self._index:
            world = STATE.world.size() if STATE.world is not None else None
            if world is not None and not 0 <= g < world:
                raise ValueError(f"{arg}={g} is out of range for a world of size {world} "
                                 f"(valid: 0..{world - 1})")
            raise ValueError(f"{arg}={g} is not a member of group {self.name} {self.ranks}; "
                             f"{arg} is a global rank (as in torch): pick one of {self.ranks}")
        return self._index[g]

    def global_rank(self, group_rank: int) -> int:
        """Translate a rank of this group into the global numbering; a clear error if out of range."""
        try:
            k = operator.index(group_rank)
        except TypeError:
            raise TypeError(f"group_rank={group_rank!r} must be an int (a rank of group {self.name})") from None
        if not 0 <= k < len(self.ranks):
            raise ValueError(f"group rank {group_rank} is out of range for group {self.name} of size "
                             f"{len(self.ranks)}")
        return self.ranks[k]

    def __repr__(self) -> str:
        state = ", destroyed" if self.destroyed else ""
        return (f"ProcessGroup({self.name}, backend={self.backend_name!r}, ranks={self.ranks}, "
                f"rank={self.rank()}{state})")
