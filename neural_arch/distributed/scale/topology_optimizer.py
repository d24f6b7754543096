"""Seed 000's topology optimizer: process groups and a ring order that follow the hosts.

Two things, both from the project's own notion of "same host" (the transport's host identity,
``NEURAL_ARCH_HOST_ID`` to simulate hosts):

* :func:`ring_order`: the job's ranks as a ring that crosses each host boundary once (ranks grouped by
  host, hosts in node order) — plain data, from a :class:`~neural_arch.distributed.topology.Topology`.
* ``TopologyOptimizer.host_groups()``: the intra-host, host-leader and cross-host process groups of
  :func:`neural_arch.distributed.algorithms.hierarchical.host_groups` (collective), the groups the
  hierarchical all-reduce runs on.

>>> from neural_arch.distributed.topology import RankInfo, Topology
>>> infos = [RankInfo(r, host, "h", 0, 1, 1, None, None) for r, host in enumerate("abab")]
>>> ring_order(Topology.from_infos(infos))
[0, 2, 1, 3]
"""

from __future__ import annotations

from neural_arch.distributed.algorithms.hierarchical import HostGroups
from neural_arch.distributed.algorithms.hierarchical import host_groups as _host_groups
from neural_arch.distributed.topology import Topology, discover

__all__ = ["TopologyOptimizer", "create_topology_optimizer", "ring_order"]


def ring_order(topology: Topology) -> list[int]:
    """Global ranks grouped by host (hosts in node order, ranks ascending inside a host): a ring in
    this order crosses the network ``num_hosts`` times instead of up to ``world_size`` times.

    Example::

        >>> from neural_arch.distributed.topology import local_info
        >>> ring_order(Topology.from_infos([local_info(0), local_info(1)]))
        [0, 1]
    """
    return [r for ranks in topology.hosts.values() for r in sorted(ranks)]


class TopologyOptimizer:
    """The groups and orders that follow ``topology`` (default: discovered now, collectively).

    Example::

        >>> opt = TopologyOptimizer()          # no group: this process alone
        >>> opt.ring_order(), opt.hosts()
        ([0], [[0]])
        >>> print(opt)
        1 host(s); ring order [0]; host boundaries crossed per ring pass: 0
    """

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology if topology is not None else discover()

    def hosts(self) -> list[list[int]]:
        """Global ranks per host, hosts in node order.

        Example::

            >>> TopologyOptimizer().hosts()
            [[0]]
        """
        return [sorted(ranks) for ranks in self.topology.hosts.values()]

    def ring_order(self) -> list[int]:
        """:func:`ring_order` of this topology.

        Example::

            >>> TopologyOptimizer().ring_order()
            [0]
        """
        return ring_order(self.topology)

    def host_groups(self, refresh: bool = False) -> HostGroups:
        """The intra-host, leader and cross-host process groups (collective: every rank of the world
        calls it; needs an initialised group). See :func:`~neural_arch.distributed.algorithms.hierarchical.host_groups`.

        Example::

            hg = TopologyOptimizer().host_groups()     # every rank of 2 hosts x 2 ranks
            hg.hosts, hg.intra.size()                  # ([[0, 1], [2, 3]], 2)
        """
        return _host_groups(refresh=refresh)

    def __str__(self) -> str:
        order = self.ring_order()
        host_of = {r: h for h, ranks in enumerate(self.hosts()) for r in ranks}
        crossings = sum(host_of[a] != host_of[b] for a, b in zip(order, order[1:] + order[:1])) if len(order) > 1 else 0
        return (f"{self.topology.num_hosts} host(s); ring order {order}; "
                f"host boundaries crossed per ring pass: {crossings}")


def create_topology_optimizer(topology: Topology | None = None) -> TopologyOptimizer:
    """A :class:`TopologyOptimizer` over ``topology`` (default: :func:`~neural_arch.distributed.topology.discover`).

    Example::

        >>> create_topology_optimizer().ring_order()
        [0]
    """
    return TopologyOptimizer(topology)
