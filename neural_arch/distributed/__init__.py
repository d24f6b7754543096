"""neural_arch.distributed: the public face of distributed training.

Every name the seeds import lives here, loaded lazily from the module that implements it
(so ``import neural_arch.distributed`` stays cheap, and never imports mpi4py or cupy)::

    from neural_arch.distributed import (
        init_process_group, destroy_process_group, get_rank, get_world_size,
        all_reduce, ReduceOp, DistributedDataParallel, DistributedSampler,
    )

    init_process_group()                 # backend picked from the environment
    t = all_reduce(Tensor(np.ones(3)), ReduceOp.SUM)

=================================  ===========================================
module                             names
=================================  ===========================================
``groups`` ``subgroups``           process groups, init/destroy, rank queries; new_group and friends
``collectives``                    Tensor collectives, p2p, object collectives
``comm`` / ``errors``              ``ReduceOp``, ``Work``, the error classes
``ddp``                            ``DistributedDataParallel``, ``no_sync``
``expert_parallel``                ``parallelize_moe``, ``expert_parallel_mesh`` (mixture of experts)
``trainer``                        seed 003's ``DistributedTrainer``, ``EnhancedDistributedTrainer``
``data.sampler``                   ``DistributedSampler``, ``distributed_evaluate``
``launcher`` / ``run.spawn``       the process launcher, ``launch(fn, nprocs)``
``rendezvous.store``               ``TCPStore``, ``FileStore``, ``PrefixStore``
=================================  ===========================================
"""

from __future__ import annotations

import importlib

_LAZY: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _LAZY[name] = module


_export("groups", "init_process_group", "destroy_process_group", "is_initialized", "is_available",
        "get_rank", "get_world_size", "get_backend", "get_default_group", "get_global_rank", "get_group_rank")
_export("process_group", "ProcessGroup", "GroupMember")
_export("info", "get_distributed_info")
_export("collectives", "sendrecv", "barrier", "all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
        "reduce_scatter", "all_to_all", "send", "recv", "isend", "irecv", "broadcast_object_list",
        "all_gather_object", "gather_object", "scatter_object_list", "all_to_all_single",
        "reduce_scatter_tensor", "all_gather_into_tensor", "P2POp", "batch_isend_irecv", "send_object_list",
        "recv_object_list", "monitored_barrier", "group", "reduce_op",
        "get_process_group_ranks")
_export("comm", "ReduceOp", "Work", "DistributedError", "NotInitializedError", "CollectiveTimeoutError",
        "PeerFailureError", "CollectiveMismatchError", "RendezvousError", "AuthenticationError",
        "available_backends", "is_backend_available")
_export("ddp", "DistributedDataParallel", "no_sync", "SyncBatchNorm")
_export("data.sampler", "DistributedSampler", "distributed_evaluate")
_export("launcher", "LaunchConfig", "DistributedLauncher", "launch_distributed_training")
_export("run.spawn", "launch", "spawn", "ProcessRaisedException", "ProcessExitedException", "SpawnError")
_export("launch_env", "is_torchelastic_launched", "get_node_local_rank", "get_local_rank")
_export("elastic", "ElasticDistributedSampler")
_export("checkpoint.manager", "find_latest_checkpoint")
_export("rendezvous.store", "TCPStore", "FileStore", "PrefixStore")
_export("fsdp", "FullyShardedDataParallel", "ShardingStrategy", "CPUOffload", "MixedPrecision",
        "ShardedGradScaler")
_export("optim", "ZeroRedundancyOptimizer")
_export("subgroups", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group")
_export("device_mesh", "DeviceMesh", "init_device_mesh")
_export("pipelining", "PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
        "ScheduleInterleavedZeroBubble", "ScheduleZBH1", "ScheduleZBVZeroBubble")
_export("trainer.communication_optimizer", "CommunicationOptimizer")
_export("algorithms.hierarchical", "hierarchical_all_reduce", "host_groups")
_export("algorithms.hierarchical_auto", "all_reduce_algorithm")
_export("metrics", "DistributedMetrics")
_export("expert_parallel", "parallelize_moe", "expert_parallel_mesh")
_export("trainer", "DistributedTrainer", "EnhancedDistributedTrainer", "DistributedMonitor")

__all__ = sorted(_LAZY)  # noqa: PLE0605 - built from the table above


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neural_arch.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
