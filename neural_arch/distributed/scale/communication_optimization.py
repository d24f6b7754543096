"""Seed 000's ``communication_optimization`` face: its three factories, under the seed's path.

>>> from neural_arch.distributed.scale.communication_optimization import (
...     create_collective_ops, create_topology_optimizer, create_bandwidth_scheduler)
>>> create_collective_ops().world_size, create_topology_optimizer().ring_order()
(1, [0])
"""

from __future__ import annotations

from neural_arch.distributed.scale.bandwidth_scheduler import BandwidthScheduler, create_bandwidth_scheduler
from neural_arch.distributed.scale.communication_primitives import (
           AdvancedCollectiveOps,
           create_collective_ops,
)
from neural_arch.distributed.scale.topology_optimizer import TopologyOptimizer, create_topology_optimizer

# the classes the factories return are named here too, so this page links to them
__all__ = ["AdvancedCollectiveOps", "BandwidthScheduler", "TopologyOptimizer", "create_bandwidth_scheduler",
           "create_collective_ops", "create_topology_optimizer"]
