"""Per-step fault tolerance across data-parallel replicas (torchft's model), one package.

==========================  ===============================================================
module                      what
==========================  ===============================================================
``lighthouse``              ``Lighthouse``: decides each step's quorum from heartbeats
``quorum``                  ``plan_quorum``: the quorum rule as a pure function (plans as data)
``manager``                 ``Manager``: ``start_quorum`` / ``allreduce`` / ``should_commit``,
                            healing a replacement from a live peer
``replica_group``           ``ProcessGroupGloo``: the cross-replica group, rebuilt per quorum
``transfer``                the heal's wire format (a pickled skeleton, large arrays raw, small ones
                            in bundles; optionally received in place)
``optim``, ``ddp``          ``OptimizerWrapper``, ``DistributedDataParallel``
``managed_group``           ``ManagedProcessGroup``: a shard's lane as a group (the
                            ``replicate_group`` of ZeRO-2 or ``fully_shard`` inside sharded
                            replicas)
``protocol``                the store keys the lighthouse and managers share
==========================  ===============================================================

A replica is one process, or several ranks that shard it (ZeRO, ``fully_shard`` or tensor
parallelism; ``Manager(shard=(index, count))``: each shard index reduces across the replicas in a
group of its own and heals from the peer with the same shard index). See docs/fault_tolerance.md ("Per-step fault tolerance"). Names load lazily::

    from neural_arch.distributed import ft
    with ft.Lighthouse(min_replicas=2) as lighthouse:
        ...   # replicas: ft.Manager(lighthouse_addr=lighthouse.address, ...)
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Lighthouse": "lighthouse",
    "Manager": "manager",
    "Quorum": "quorum", "QuorumRequest": "quorum", "plan_quorum": "quorum",
    "ProcessGroupGloo": "replica_group",
    "OptimizerWrapper": "optim",
    "DistributedDataParallel": "ddp",
    "ManagedProcessGroup": "managed_group",
}

__all__ = ["DistributedDataParallel", "Lighthouse", "ManagedProcessGroup", "Manager", "OptimizerWrapper",
           "ProcessGroupGloo", "Quorum", "QuorumRequest", "plan_quorum"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neural_arch.distributed.ft' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
