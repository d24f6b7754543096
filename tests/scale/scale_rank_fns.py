"""Functions the 2-rank tests of seed 000's scale API run on every rank (module level: pickled by reference)."""

from __future__ import annotations

import numpy as np


def quick_start_on_ranks():
    """The seed's quick start with only the imports changed, and ``world_size``/``rank`` from the job."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.scale.communication_primitives import AdvancedCollectiveOps
    from neural_arch.distributed.scale.hardware_discovery import HardwareTopologyManager
    from neural_arch.distributed.scale.job_management import TrainingJobSpec  # noqa: F401 - the seed imports it

    # Create hardware manager
    hardware_manager = HardwareTopologyManager()

    # Set up communication
    topology = hardware_manager.discover_topology()
    comm_ops = AdvancedCollectiveOps(world_size=dist.get_world_size(), rank=dist.get_rank(), topology=topology)

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(7)
    data = rng.standard_normal((world, 5, 3))           # every rank draws the same global array
    mine = data[rank].copy()
    ours = comm_ops.all_reduce(mine.copy())
    theirs = mine.copy()
    dist.all_reduce(theirs)
    out = {
        "topology": (topology.world_size, topology.num_hosts),
        "all_reduce_equal": bool(np.array_equal(ours, theirs)),
        "all_reduce_oracle": float(np.max(np.abs(ours - data.sum(0)))),
        "avg": float(np.max(np.abs(comm_ops.all_reduce(mine.copy(), op="avg") - data.mean(0)))),
        "broadcast": comm_ops.broadcast(mine.copy(), src=1).tolist() == data[1].tolist(),
        "all_gather": [a.tolist() for a in comm_ops.all_gather(mine)] == data.tolist(),
        "reduce_scatter": comm_ops.reduce_scatter(data.reshape(world * 5, 3).copy()).tolist()
        == (world * data.reshape(world * 5, 3))[rank * 5:(rank + 1) * 5].tolist(),
        "algorithm": comm_ops.algorithm(64 << 20),
    }
    comm_ops.barrier()
    try:
        AdvancedCollectiveOps(world_size=8, rank=0, topology=topology)
    except ValueError as exc:
        out["mismatch"] = str(exc)
    return out


def tensor_all_reduce_and_host_groups():
    """AdvancedCollectiveOps on Tensors equals dist.all_reduce; the topology optimizer's groups."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.scale.communication_optimization import (
        create_collective_ops,
        create_topology_optimizer,
    )

    ops = create_collective_ops()
    a = Tensor(np.arange(4.0) * (dist.get_rank() + 1))
    b = Tensor(a.data.copy())
    ops.all_reduce(a)
    dist.all_reduce(b)
    opt = create_topology_optimizer()
    hg = opt.host_groups()
    return np.array_equal(a.data, b.data), opt.ring_order(), hg.hosts, hg.intra.size()
