"""Names of seed 000 that stay out of scope: each raises ``NotImplementedError`` saying why and
what to use instead.

* ``create_kubernetes_orchestrator``: there is no Kubernetes to test against, and an untested
  orchestrator would be a placeholder. A pod per node running
  ``python -m neural_arch.distributed.launcher --nnodes N --node_rank $INDEX ...`` is what it would create.
* ``HardwareAbstractionLayer`` and ``HardwareAdapter`` (cross-vendor meshes, PrivateUse1 devices,
  thermal and power management): the project runs on NumPy (CPU) and CuPy (NVIDIA) only, and reads
  hardware through :mod:`neural_arch.distributed.topology`; it has no vendor layer to abstract.

>>> create_kubernetes_orchestrator()
Traceback (most recent call last):
...
NotImplementedError: create_kubernetes_orchestrator: Kubernetes is out of scope (no cluster to test against, and an untested orchestrator would be a placeholder); run `python -m neural_arch.distributed.launcher --nnodes N --node_rank $INDEX ...` in one pod per node, or use create_slurm_manager() / TrainingJobSpec.run_local()
"""

from __future__ import annotations

__all__ = ["HardwareAbstractionLayer", "HardwareAdapter", "create_kubernetes_orchestrator"]

_HARDWARE = ("the project runs on NumPy (CPU) and CuPy (NVIDIA GPUs) only and has no vendor layer to "
             "abstract; use neural_arch.distributed.scale.hardware_discovery.HardwareTopologyManager (or "
             "neural_arch.distributed.topology.discover) to see the hardware, and neural_arch.backend "
             "to choose CPU or GPU arrays")


def create_kubernetes_orchestrator(*args, **kwargs):
    """Out of scope: raises ``NotImplementedError`` with what to use instead.

    Example::

        >>> try:
        ...     create_kubernetes_orchestrator(namespace="train")
        ... except NotImplementedError as exc:
        ...     "out of scope" in str(exc)
        True
    """
    raise NotImplementedError(
        "create_kubernetes_orchestrator: Kubernetes is out of scope (no cluster to test against, and an "
        "untested orchestrator would be a placeholder); run `python -m neural_arch.distributed.launcher "
        "--nnodes N --node_rank $INDEX ...` in one pod per node, or use create_slurm_manager() / "
        "TrainingJobSpec.run_local()")


class HardwareAbstractionLayer:
    """Seed 000's cross-vendor hardware layer: out of scope; constructing one raises ``NotImplementedError``.

    Example::

        >>> HardwareAbstractionLayer()
        Traceback (most recent call last):
        ...
        NotImplementedError: HardwareAbstractionLayer is out of scope: the project runs on NumPy ...
    """

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError(f"HardwareAbstractionLayer is out of scope: {_HARDWARE}")


class HardwareAdapter:
    """Seed 000's hardware adapter (HAL, thermal and power management): out of scope; constructing
    one raises ``NotImplementedError``.

    Example::

        >>> HardwareAdapter(enable_hal=True)
        Traceback (most recent call last):
        ...
        NotImplementedError: HardwareAdapter (HAL, thermal and power management) is out of scope: ...
    """

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError(f"HardwareAdapter (HAL, thermal and power management) is out of scope: {_HARDWARE}")
