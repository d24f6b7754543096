"""Process groups and device meshes made once per rank process of a reused ``RankPool``.

Every new group (and so every new mesh) gets shared-memory buffers that live as long as the process,
and a pool's processes serve many examples: rank functions that draw a world size or a mesh shape per
example take them from here, made once per process (every rank of the pool asks for the same ones).

Example (inside a rank function)::

    member = group_of(3)            # None on the ranks outside the first 3
    mesh = mesh_of((2, 2))
"""

from __future__ import annotations

_GROUPS: dict = {}   # world size -> the group of the first ranks
_MESHES: dict = {}   # mesh shape -> its DeviceMesh


def group_of(world: int):
    """``(group, rank in it, world)`` for the first ``world`` ranks, or None on the ranks outside it."""
    import neural_arch.distributed as dist

    if world not in _GROUPS:
        _GROUPS[world] = dist.new_group(list(range(world)))
    group = _GROUPS[world]
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    return group, dist.get_rank(group), world


def mesh_of(shape):
    """The CPU ``DeviceMesh`` of ``shape`` over the world's ranks (``init_device_mesh``), one per shape."""
    from neural_arch.distributed.device_mesh import init_device_mesh

    shape = tuple(shape)
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]
