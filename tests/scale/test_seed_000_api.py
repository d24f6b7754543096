"""Seed 000's quick start and factory blocks, with only ``kernel_pytorch.distributed_scale`` changed
to ``neural_arch.distributed.scale``: in one process without a group, and on 2 real gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import scale_rank_fns as fns

from neural_arch.distributed.testing import RankPool


def test_quick_start_in_one_process_without_a_group():
    # Direct imports from focused modules
    from neural_arch.distributed.scale.communication_primitives import AdvancedCollectiveOps
    from neural_arch.distributed.scale.hardware_discovery import HardwareTopologyManager
    from neural_arch.distributed.scale.job_management import TrainingJobSpec  # noqa: F401

    # Create hardware manager
    hardware_manager = HardwareTopologyManager()

    # Set up communication
    topology = hardware_manager.discover_topology()
    comm_ops = AdvancedCollectiveOps(world_size=8, rank=0, topology=topology)

    assert topology.world_size == 1 and topology.num_hosts == 1 and topology.ranks[0].logical_cpus >= 1
    assert comm_ops.world_size == 8 and comm_ops.topology is topology
    # built for 8 ranks but no group here: a collective says what is missing
    with pytest.raises(RuntimeError, match="no process group is initialised"):
        comm_ops.all_reduce(np.ones(2))


def test_legacy_imports():
    from neural_arch.distributed.scale import AdvancedCollectiveOps, HardwareTopologyManager, TrainingJobSpec

    assert AdvancedCollectiveOps(1, 0).all_reduce(np.ones(2)).tolist() == [1.0, 1.0]
    assert HardwareTopologyManager().discover_topology().world_size == 1
    assert TrainingJobSpec("j", "train.py").world_size == 1


def test_factory_blocks():
    from neural_arch.distributed.scale.communication_optimization import (
        create_bandwidth_scheduler,
        create_collective_ops,
        create_topology_optimizer,
    )
    from neural_arch.distributed.scale.orchestration import (
        create_kubernetes_orchestrator,
        create_slurm_manager,
    )

    assert create_collective_ops().all_gather(np.zeros(1))[0].tolist() == [0.0]
    assert create_topology_optimizer().ring_order() == [0]
    assert create_bandwidth_scheduler().plan({"w": 8}, world_size=2).total_bytes == 8
    assert create_slurm_manager().log_dir.endswith("slurm-jobs")
    with pytest.raises(NotImplementedError, match="out of scope.*launcher"):
        create_kubernetes_orchestrator()


def test_hardware_abstraction_names_say_why_and_what_instead():
    from neural_arch.distributed.scale.hardware_abstraction import HardwareAbstractionLayer
    from neural_arch.distributed.scale.hardware_adapter import HardwareAdapter

    with pytest.raises(NotImplementedError, match="out of scope.*HardwareTopologyManager"):
        HardwareAbstractionLayer()
    with pytest.raises(NotImplementedError, match="out of scope.*HardwareTopologyManager"):
        HardwareAdapter(enable_hal=True)


def test_collective_ops_refuse_a_world_that_is_not_the_groups(world_of_one):
    from neural_arch.distributed.scale import AdvancedCollectiveOps

    with pytest.raises(ValueError, match="world_size=1 and this process is rank 0"):
        AdvancedCollectiveOps(world_size=8, rank=0)
    assert AdvancedCollectiveOps(1, 0).all_reduce(np.ones(3)).tolist() == [1.0] * 3


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=60.0) as p:
        yield p


def test_quick_start_and_collectives_on_two_gloo_ranks(pool):
    results = pool.run(fns.quick_start_on_ranks)
    for r in results:
        assert r["topology"] == (2, 1)
        assert r["all_reduce_equal"] and r["all_reduce_oracle"] <= 1e-12 and r["avg"] <= 1e-12
        assert r["broadcast"] and r["all_gather"] and r["reduce_scatter"]
        assert r["algorithm"] == "flat"                  # one host: the group's own choice
        assert "initialised group has world_size=2" in r["mismatch"]


def test_tensors_and_the_topology_optimizers_groups_on_two_ranks(pool):
    for equal, ring, hosts, intra in pool.run(fns.tensor_all_reduce_and_host_groups):
        assert equal and ring == [0, 1] and hosts == [[0, 1]] and intra == 2
