"""Seed 000's ``orchestration`` face: ``create_slurm_manager`` and ``create_kubernetes_orchestrator``
(the latter out of scope: it raises ``NotImplementedError`` saying what to use instead).

>>> from neural_arch.distributed.scale.orchestration import create_kubernetes_orchestrator, create_slurm_manager
>>> create_slurm_manager("/tmp/jobs").log_dir
'/tmp/jobs'
"""

from __future__ import annotations

from neural_arch.distributed.scale.slurm import SlurmManager, create_slurm_manager
from neural_arch.distributed.scale.unsupported import create_kubernetes_orchestrator

__all__ = ["SlurmManager", "create_kubernetes_orchestrator", "create_slurm_manager"]
