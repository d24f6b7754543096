"""Seed 000's distributed-scale API (``kernel_pytorch.distributed_scale``) over the project's real parts.

The seed's modules keep their names: ``hardware_discovery`` (topology discovery),
``communication_primitives`` (the collectives as methods), ``communication_optimization``
(the factories: collective ops, topology optimizer, bandwidth scheduler), ``job_management``
(job specs and states, run locally through the launcher), ``orchestration`` (Slurm; Kubernetes is
out of scope). Nothing here discovers, communicates or launches by itself: each name wraps the
project's one implementation (``distributed.topology``, ``dist.all_reduce`` and friends,
``algorithms.hierarchical``, ``distributed.launcher``).

>>> from neural_arch.distributed.scale import HardwareTopologyManager, AdvancedCollectiveOps, TrainingJobSpec
>>> topology = HardwareTopologyManager().discover_topology()
>>> AdvancedCollectiveOps(world_size=8, rank=0, topology=topology).describe()
'AdvancedCollectiveOps: rank 0 of 8; topology: 1 rank(s) on 1 host(s)'
"""

from __future__ import annotations

from neural_arch.distributed.scale.communication_primitives import AdvancedCollectiveOps
from neural_arch.distributed.scale.hardware_discovery import HardwareTopologyManager
from neural_arch.distributed.scale.job_management import JobState, TrainingJobSpec

__all__ = ["AdvancedCollectiveOps", "HardwareTopologyManager", "JobState", "TrainingJobSpec"]
