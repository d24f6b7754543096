"""Turning what a caller passed into what to use: a ``group`` argument into its ProcessGroup, a
Tensor into its array, a timeout into seconds.

Kept apart from :mod:`.groups` and :mod:`.collectives` so that :mod:`.subgroups`,
:mod:`.object_collectives` (which those two re-export) and the algorithms can resolve groups and
buffers without importing them back: imports go downward only.

Example::

    >>> _seconds(2, "timeout")
    2.0
    >>> from datetime import timedelta
    >>> _seconds(timedelta(minutes=1), "timeout")
    60.0
"""

from __future__ import annotations

import warnings
from datetime import timedelta

import numpy as np

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.errors import DistributedError, NotInitializedError
from neural_arch.distributed.process_group import GroupMember, GroupMembershipError, ProcessGroup
from neural_arch.distributed.state import STATE as _STATE

__all__: list = []  # private helpers; groups.py re-exports them under the same names


def _seconds(value, name: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={value!r} must be seconds (a number) or a datetime.timedelta") from None
    if value <= 0:
        raise ValueError(f"{name}={value} must be positive")
    return value


def _resolve_group(group=None, op: str = "this operation") -> ProcessGroup:
    """``group`` (None / GroupMember.WORLD / a ProcessGroup) -> the ProcessGroup to use.

    Raises NotInitializedError before init, GroupMembershipError for NON_GROUP_MEMBER, and a
    clear error for a group that was destroyed or belongs to an earlier init.
    """
    world = _STATE.world
    if world is None:
        raise NotInitializedError(f"{op} needs a process group; call "
                                  "neural_arch.distributed.init_process_group() first")
    if group is None or group is GroupMember.WORLD:
        return world
    if group is GroupMember.NON_GROUP_MEMBER:
        raise GroupMembershipError(
            f"{op}: this rank (global rank {world.rank()}) is not a member of the group; new_group() "
            "returned GroupMember.NON_GROUP_MEMBER here. Only the group's ranks may call it: guard the "
            "call with `if group is not GroupMember.NON_GROUP_MEMBER:`")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{op}: group={group!r} must be a ProcessGroup from new_group() (or None for the world)")
    if group.destroyed or group.generation != world.generation:
        raise DistributedError(f"{op}: {group!r} was destroyed (or made before the last "
                               "init_process_group()); create it again with new_group()")
    return group


def _group(group, op: str) -> ProcessGroup | None:
    """The group to run on, or None on a rank outside it.

    torch semantics: a collective called with ``GroupMember.NON_GROUP_MEMBER`` (what
    ``new_group`` returns on ranks that are not members) does nothing and returns None, with a
    warning, so ``all_reduce(t, group=g)`` may be written unguarded on every rank.
    """
    if group is None:
        world = _STATE.world     # the common case, without _resolve_group's checks of a group
        if world is not None:
            return world
    elif group is GroupMember.NON_GROUP_MEMBER:
        _resolve_group(None, op)  # still: NotInitializedError before init_process_group()
        warnings.warn(f"{op}: this rank is not a member of the group (new_group() returned "
                      "GroupMember.NON_GROUP_MEMBER here); the call does nothing and returns None",
                      stacklevel=3)
        return None
    return _resolve_group(group, op)


def _buf(x, arg: str = "tensor"):
    """A Tensor's data (made C-contiguous in place if needed); arrays pass through unchanged.

    Arrays are not copied: the backend checks them strictly, because a copy would silently
    leave the caller's buffer unchanged.
    """
    if x.__class__ is Tensor or isinstance(x, Tensor):
        data = x.data
        if data.__class__ is np.ndarray and data.flags.c_contiguous:   # the common case
            return data
        flags = getattr(data, "flags", None)
        if flags is not None and not flags.c_contiguous:
            data = _xp(data).ascontiguousarray(data)
            x.data = data
        return data
    if isinstance(x, _PYTHON_SCALARS):
        raise TypeError(f"{arg}={x!r} is a Python {type(x).__name__}: pass a numpy array or Tensor (np.array(x)), "
                        "or use broadcast_object_list / all_gather_object for Python objects")
    if isinstance(x, (list, tuple)):
        raise TypeError(f"{arg} must be a Tensor or an array, got a {type(x).__name__}; the list forms "
                        "are all_gather(tensor_list, tensor), reduce_scatter(output, input_list) and "
                        "all_to_all(output_list, input_list)")
    return x


# mpi4py habits, caught where the arguments are resolved (one owner for every collective's checks): a
# Python number has no buffer to fill in place (mpi4py's Allreduce(send, recv), an array where torch's
# all_reduce takes the op, is ReduceOp.coerce's).
_PYTHON_SCALARS = (bool, int, float, complex, str, bytes)


