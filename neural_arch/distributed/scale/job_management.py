"""Seed 000's job specification and job states, runnable on this machine through the launcher.

A :class:`TrainingJobSpec` says what to run and on how much; ``TrainingJobSpec.run_local()``
starts it on this machine with :class:`~neural_arch.distributed.launcher.DistributedLauncher`
(one node: ``processes_per_node`` ranks, ``restarts`` restarts) and returns its
:class:`JobState`. The same spec goes to Slurm through
:func:`~neural_arch.distributed.scale.slurm.create_slurm_manager`.

>>> spec = TrainingJobSpec(name="demo", script="train.py", arguments=["--epochs", "1"], processes_per_node=2)
>>> spec.world_size, JobState.PENDING.value
(2, 'pending')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from neural_arch.distributed.launcher import DistributedLauncher
from neural_arch.distributed.run.launch_config import LaunchConfig

__all__ = ["JobState", "TrainingJobSpec"]


class JobState(enum.Enum):
    """Where a job is in its life.

    Example::

        >>> JobState("completed") is JobState.COMPLETED, JobState.FAILED.finished
        (True, True)
    """

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the states a job does not leave."""
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


#: the keys ``resources`` accepts (Slurm maps each to an ``#SBATCH`` line; run_local ignores them)
RESOURCE_KEYS = ("cpus_per_task", "gpus_per_node", "memory", "time", "partition")


@dataclass
class TrainingJobSpec:
    """A training job: ``script`` (a path, or a module with ``module=True``) with ``arguments`` on
    ``nodes`` x ``processes_per_node`` ranks over ``backend``, restarted up to ``restarts`` times.

    ``resources``: what a scheduler should reserve, keys from ``RESOURCE_KEYS`` (``cpus_per_task``,
    ``gpus_per_node``, ``memory`` such as ``"16G"``, ``time`` such as ``"01:00:00"``, ``partition``).

    Example::

        >>> TrainingJobSpec("j", "train.py", nodes=2, processes_per_node=4).world_size
        8
        >>> TrainingJobSpec("j", "train.py", resources={"gpu": 1})
        Traceback (most recent call last):
        ...
        ValueError: TrainingJobSpec 'j': unknown resource(s) ['gpu']; use cpus_per_task, gpus_per_node, memory, time, partition
    """

    name: str
    script: str
    arguments: list[str] = field(default_factory=list)
    nodes: int = 1
    processes_per_node: int = 1
    backend: str = "gloo"
    restarts: int = 0
    resources: dict = field(default_factory=dict)
    module: bool = False

    def __post_init__(self) -> None:
        if not self.name or not str(self.name).replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"TrainingJobSpec name {self.name!r}: use letters, digits, '-', '_' or '.'")
        if int(self.nodes) < 1 or int(self.processes_per_node) < 1 or int(self.restarts) < 0:
            raise ValueError(f"TrainingJobSpec {self.name!r}: need nodes >= 1, processes_per_node >= 1, restarts >= 0")
        unknown = sorted(set(self.resources) - set(RESOURCE_KEYS))
        if unknown:
            raise ValueError(f"TrainingJobSpec {self.name!r}: unknown resource(s) {unknown}; use "
                             f"{', '.join(RESOURCE_KEYS)}")
        self.nodes, self.processes_per_node, self.restarts = int(self.nodes), int(self.processes_per_node), int(self.restarts)
        self.arguments = [str(a) for a in self.arguments]

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    def launch_config(self, **overrides) -> LaunchConfig:
        """The :class:`~neural_arch.distributed.run.launch_config.LaunchConfig` of one node of this job.

        Example::

            >>> TrainingJobSpec("j", "train.py", processes_per_node=2).launch_config().nproc_per_node
            2
        """
        fields = {"nproc_per_node": self.processes_per_node, "nnodes": self.nodes, "backend": self.backend,
                  "max_restarts": self.restarts, "module": self.module, "standalone": self.nodes == 1}
        fields.update(overrides)
        return LaunchConfig(**fields)

    def run_local(self) -> JobState:
        """Run the job on this machine through the launcher; ``COMPLETED`` when every rank exits 0,
        ``FAILED`` otherwise (after the restarts), ``CANCELLED`` on Ctrl-C. One node only: a job of
        several nodes needs one launcher per node (Slurm: :func:`~neural_arch.distributed.scale.slurm.create_slurm_manager`).

        Example::

            state = TrainingJobSpec("demo", "train.py", processes_per_node=2).run_local()
            state is JobState.COMPLETED
        """
        if self.nodes != 1:
            raise ValueError(f"TrainingJobSpec {self.name!r}.run_local(): nodes={self.nodes}, but run_local starts "
                             "one node on this machine; submit it with create_slurm_manager().submit(spec), or "
                             "start `python -m neural_arch.distributed.launcher --nnodes ...` on each node")
        launcher = DistributedLauncher(self.launch_config())
        try:
            code = launcher.launch(self.script, *self.arguments)
        except KeyboardInterrupt:
            return JobState.CANCELLED
        if code == 0:
            return JobState.COMPLETED
        # the launcher turns SIGINT/SIGTERM into an exit status and records the signal: a job stopped
        # from outside was cancelled, not failed
        return JobState.CANCELLED if getattr(launcher, "_signum", None) is not None else JobState.FAILED
