"""How FSDP cuts a model into units and which process groups shard them.

``plan_units`` walks the module tree with an ``auto_wrap_policy`` (torch's callable protocol:
``policy(module=, recurse=, nonwrapped_numel=)``) and returns the units in post-order, the root
last; each unit owns the parameters not claimed by a unit inside it. ``plan_expert_units`` gives the
units of a mixture-of-experts model's experts (sharded over their expert-data-parallel group).
``shard_groups`` resolves
``process_group`` / ``device_mesh`` / ``NEURAL_ARCH_FSDP_SHARD_SIZE`` into the shard group and,
for ``HYBRID_SHARD``, the replicate group.

Example::

    >>> from neural_arch import nn
    >>> from neural_arch.distributed.fsdp.wrap import ModuleWrapPolicy, resolve_policy
    >>> m = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 3)))
    >>> [name for name, _, _ in plan_units(m, resolve_policy(ModuleWrapPolicy({nn.Sequential})))]
    ['1', '']
"""

from __future__ import annotations

import os

from neural_arch import config as _config
from neural_arch.distributed.fsdp.api import ShardingStrategy
from neural_arch.distributed.resolve import _resolve_group
from neural_arch.distributed.subgroups import new_group

__all__ = ["hybrid_groups", "plan_expert_units", "plan_units", "shard_groups"]


def plan_units(root, policy, ignored=()):
    """Post-order list of ``(name, module, params)`` units (root last): each unit's own parameters.

    Parameters in ``ignored`` (torch's ``ignored_states``: FSDP passes the expert parameters of a
    mixture-of-experts model) belong to no unit: they stay whole, ordinary parameters.

    Example:
        >>> from neural_arch import nn
        >>> from neural_arch.distributed.fsdp.wrap import ModuleWrapPolicy
        >>> m = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 3)))
        >>> [(name, len(params)) for name, _, params in plan_units(m, ModuleWrapPolicy({nn.Sequential}))]
        [('1', 2), ('', 2)]
        >>> [(name, len(params)) for name, _, params in plan_units(m, None, ignored=[m[0].weight])]
        [('', 3)]
    """
    units: list = []
    claimed: set = {id(p) for p in ignored}

    def own_params(module):
        out, seen = [], set()
        for _, p in module.named_parameters():
            if id(p) not in claimed and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def visit(name, module):
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            nonwrapped = sum(p.numel() for p in own_params(child))
            if policy is not None and policy(module=child, recurse=True, nonwrapped_numel=nonwrapped):
                visit(full, child)
            nonwrapped = sum(p.numel() for p in own_params(child))
            if policy is not None and policy(module=child, recurse=False, nonwrapped_numel=nonwrapped):
                params = own_params(child)
                claimed.update(id(p) for p in params)
                units.append((full, child, params))

    visit("", root)
    params = own_params(root)
    units.append(("", root, params))
    return units


def plan_expert_units(root, experts) -> tuple[list, list]:
    """``(units, whole)``: how FSDP shards the expert parameters ``experts`` of ``root``.

    ``units``: ``[(name, module, params, expert_dp_group)]``, one per expert (a child of a module
    list that expert parallelism sliced: it carries ``_global_indices``) whose parameters are held
    by an expert-data-parallel group of more than one rank (``param.expert_dp_group``): that unit
    is sharded over that group. ``name`` is the expert's **global** path
    (:mod:`neural_arch.distributed.checkpoint.expert_names`: ``moe.experts.3`` on the ranks holding
    expert 3), the same on every rank of the group. ``whole``: every other expert parameter (held
    by one rank only, or outside a sliced list): nothing to shard, it stays an ordinary parameter.

    Example:
        >>> from neural_arch import nn
        >>> layer = nn.Linear(2, 2); layer.weight.allreduce = False      # an expert held once
        >>> plan_expert_units(layer, [layer.weight])[0], len(plan_expert_units(layer, [layer.weight])[1])
        ([], 1)
    """
    from neural_arch.distributed.checkpoint.expert_names import named_modules

    wanted = {id(p) for p in experts}
    units, claimed = [], set()
    for prefix, sub in named_modules(root):
        if getattr(sub, "_global_indices", None) is None:
            continue
        children = [child for child in sub._modules.values() if child is not None]
        for index, child in zip(sub._global_indices, children):
            gprefix = f"{prefix}.{int(index)}" if prefix else str(int(index))
            params, groups = [], set()
            for p in child.parameters():
                if id(p) in wanted and id(p) not in claimed:
                    group = getattr(p, "expert_dp_group", None)
                    if group is not None and group.size() > 1:
                        params.append(p)
                        groups.add(id(group))
            if len(groups) > 1:
                raise ValueError(f"FSDP: the parameters of expert {gprefix} belong to different expert-data-"
                                 "parallel groups")
            if params:
                claimed.update(id(p) for p in params)
                units.append((gprefix, child, params, params[0].expert_dp_group))
    whole = [p for p in experts if id(p) not in claimed]
    return units, whole


def hybrid_groups(world_group, shard_size: int):
    """(shard_group, replicate_group) for consecutive blocks of ``shard_size`` ranks (a collective).

    Example::

        # 4 ranks, shard_size=2: shards {0, 1} and {2, 3}; replicas {0, 2} and {1, 3}
        shard_group, replicate_group = hybrid_groups(dist.group.WORLD, 2)
    """
    world = world_group.size()
    if shard_size < 1 or world % shard_size:
        raise ValueError(f"HYBRID_SHARD: shard group size {shard_size} does not divide the world size {world}")
    me = world_group.rank()
    shard_group = replicate_group = None
    for start in range(0, world, shard_size):
        g = new_group(list(range(start, start + shard_size)))
        if start <= me < start + shard_size:
            shard_group = g
    for offset in range(shard_size):
        g = new_group(list(range(offset, world, shard_size)))
        if me % shard_size == offset:
            replicate_group = g
    return shard_group, replicate_group


def shard_groups(process_group, device_mesh, strategy):
    """``(shard_group, replicate_group)`` FSDP shards over (``replicate_group`` only for ``HYBRID_SHARD``).

    Example::

        shard, replicate = shard_groups(None, None, ShardingStrategy.FULL_SHARD)   # (WORLD, None)
        shard, replicate = shard_groups(None, mesh_2d, ShardingStrategy.HYBRID_SHARD)
    """
    if device_mesh is not None:
        get = getattr(device_mesh, "get_group", None)
        if get is None:
            raise TypeError("device_mesh must have get_group(dim)")
        if strategy is ShardingStrategy.HYBRID_SHARD:
            return get(1), get(0)
        return get(0), None
    if strategy is ShardingStrategy.HYBRID_SHARD:
        if isinstance(process_group, tuple):
            if len(process_group) != 2:
                raise ValueError("HYBRID_SHARD: process_group must be a pair (shard_group, replicate_group)")
            shard, replicate = process_group
            return _resolve_group(shard, "FSDP"), (replicate if _follows_a_quorum(replicate)
                                                  else _resolve_group(replicate, "FSDP"))
        world = _resolve_group(process_group, "FullyShardedDataParallel")
        # LOCAL_WORLD_SIZE is torchrun's (and our launcher's) variable, not a neural_arch setting
        size = int(_config.get("NEURAL_ARCH_FSDP_SHARD_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 0)
        if not size:
            raise ValueError("HYBRID_SHARD needs process_group=(shard_group, replicate_group), a 2-D "
                             "device_mesh, or NEURAL_ARCH_FSDP_SHARD_SIZE / LOCAL_WORLD_SIZE set")
        return hybrid_groups(world, size)
    if isinstance(process_group, tuple):
        raise TypeError(f"a (shard_group, replicate_group) pair is only for HYBRID_SHARD, not {strategy.name}")
    return _resolve_group(process_group, "FullyShardedDataParallel"), None


def _follows_a_quorum(group) -> bool:
    """A replicate group that is not a ProcessGroup but reduces like one (``ft.ManagedProcessGroup``:
    the replicas of the current fault-tolerance quorum, re-formed every step)."""
    from neural_arch.distributed.process_group import ProcessGroup

    return not isinstance(group, ProcessGroup) and callable(getattr(getattr(group, "backend", None), "allreduce", None))
