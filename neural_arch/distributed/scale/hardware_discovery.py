"""Seed 000's ``HardwareTopologyManager``: the project's topology discovery under the seed's name.

There is one discovery in the project, :func:`neural_arch.distributed.topology.discover`; this
class only gives it the seed's spelling. Inside a job (after ``init_process_group()``) it is
collective and returns every rank's host, cores, NUMA nodes, NICs and GPUs (CuPy, when present);
without a group it describes this process's host alone.

>>> from neural_arch.distributed.scale.hardware_discovery import HardwareTopologyManager
>>> topology = HardwareTopologyManager().discover_topology()
>>> topology.world_size, topology.num_hosts
(1, 1)
"""

from __future__ import annotations

from neural_arch.distributed.topology import Topology, discover

__all__ = ["HardwareTopologyManager"]


class HardwareTopologyManager:
    """Discovers where the job runs (a thin face over :func:`~neural_arch.distributed.topology.discover`).

    ``group``: the process group to describe (default: the world, or this process alone when no
    group is initialised). The last result is kept in ``topology``.

    Example::

        >>> manager = HardwareTopologyManager()
        >>> topology = manager.discover_topology()     # collective inside a job: call it on every rank
        >>> manager.topology is topology and topology.ranks[0].logical_cpus >= 1
        True
    """

    def __init__(self, group=None) -> None:
        self.group = group
        self.topology: Topology | None = None

    def discover_topology(self) -> Topology:
        """Gather every rank's host description (one ``all_gather_object``; every rank calls it).

        Example::

            >>> print(HardwareTopologyManager().discover_topology())   # doctest: +ELLIPSIS
            1 rank(s) on 1 host(s)
            ...
        """
        self.topology = discover(self.group)
        return self.topology
