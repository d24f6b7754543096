"""Distributed checkpoints of DTensor-parameter models (torch's DCP on DTensor), with real gloo ranks.

Saved once: tensor parallel x DDP on a 2 x 2 mesh, after two Adam steps; the state dicts hold
DTensors (this rank's piece + placements, no communication). Loaded, bitwise, into one process,
tp2, ``fully_shard`` on 3 ranks (uneven pieces, one empty) and tp4, with an optimizer that has state
already (DTensor targets) or none yet (whole arrays, each rank keeps its piece). The full state dict
(``full_state_dict=True, cpu_offload=True``: rank 0 only) equals single-process training (float64).
The same training under ``fully_shard`` over dp of tp (2 x 2): 2-d DTensor parameters on the
(dp, tp) mesh (``_StridedShard`` inside a column-parallel ``Shard(0)``), its full state dict equal to
single-process training, loaded bitwise into one process, tp2 and ``fully_shard`` on 2 ranks; and the
tp x DDP save loaded into fully_shard over dp of tp.
One MPI case: the same save under mpiexec, loaded into ``fully_shard`` on 3 ranks.
"""

import dcp_dtensor_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.fixture(scope="module")
def saved(pool, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("dcp_dtensor") / "tp_ddp")
    results = pool.run(fns.save_tp_ddp, directory)
    _, full_model, full_optim = results[0]
    return directory, [r[0] for r in results], full_model, full_optim


@pytest.fixture(scope="module")
def saved_fsdp_tp(pool, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("dcp_dtensor") / "fsdp_tp")
    results = pool.run(fns.save_fsdp_tp, directory)
    _, full_model, full_optim = results[0]
    return directory, [r[0] for r in results], full_model, full_optim


def test_state_dicts_hold_dtensor_pieces_with_the_tp_placements(saved):
    from neural_arch.distributed.tensor import Replicate, Shard

    _, placements, _, _ = saved
    want = {"0.weight": ("DTensor", (Shard(0),), (4, 4)), "0.bias": ("DTensor", (Shard(0),), (4,)),
            "2.weight": ("DTensor", (Shard(1),), (4, 4)), "2.bias": ("DTensor", (Replicate(),), (4,))}
    for rank, got in enumerate(placements):
        for name, (kind, pl, _) in want.items():
            assert got[name] == want[name], (rank, name, got[name])
            assert got[f"exp_avg:{name}"] == (kind, pl), (rank, name)  # the optimizer state is laid out alike


def test_fully_shard_over_dp_of_tp_saves_2d_dtensors(saved_fsdp_tp):
    from neural_arch.distributed.tensor import Replicate, Shard
    from neural_arch.distributed.tensor.placement_types import _StridedShard

    _, placements, _, _ = saved_fsdp_tp
    strided = (_StridedShard(0, split_factor=2), Shard(0))   # the dp chunk inside the tp chunk
    want = {"0.weight": (strided, (2, 4)), "0.bias": (strided, (2,)),
            "2.weight": ((Shard(0), Shard(1)), (2, 4)), "2.bias": ((Shard(0), Replicate()), (2,))}
    for rank, got in enumerate(placements):
        for name, (pl, local) in want.items():
            assert got[name] == ("DTensor", pl, local), (rank, name, got[name])
            assert got[f"exp_avg:{name}"] == ("DTensor", pl), (rank, name)
            assert got["mesh"][name] == [[0, 1], [2, 3]], (rank, name)


@pytest.mark.parametrize("which", ["tp_ddp", "fsdp_tp"])
def test_full_state_dict_equals_single_process_training(saved, saved_fsdp_tp, which):
    from neural_arch.optim import Adam

    _, _, full_model, full_optim = saved if which == "tp_ddp" else saved_fsdp_tp
    model = fns._model()
    opt = Adam(model.parameters(), lr=0.05)
    for step in range(2):  # DDP averages the two dp ranks' mean losses: the mean over both batches
        (x0, y0), (x1, y1) = fns._batch(2 * step), fns._batch(2 * step + 1)
        fns._step(model, opt, np.concatenate([x0, x1]), np.concatenate([y0, y1]))
    for name, p in model.named_parameters():
        assert full_model[name].shape == p.data.shape
        assert np.abs(full_model[name] - p.data).max() <= 1e-10, name
        assert np.abs(full_optim[name]["exp_avg_sq"] - opt.state[p]["exp_avg_sq"]).max() <= 1e-10, name
        assert full_optim[name]["step"] == opt.state[p]["step"] == 2


@pytest.mark.parametrize("layout, fresh", [("tp2", False), ("fsdp3", True), ("fsdp3", False), ("tp4", False),
                                           ("tp4", True)])
def test_load_reshards_bitwise(pool, saved, layout, fresh):
    directory, _, full_model, full_optim = saved
    for rank, diffs in enumerate(pool.run(fns.load_into, layout, directory, full_model, full_optim, fresh)):
        assert diffs == [], f"rank {rank}: {diffs}"


def test_tp_ddp_save_loads_into_fully_shard_over_dp_of_tp_bitwise(pool, saved):
    directory, _, full_model, full_optim = saved
    for rank, diffs in enumerate(pool.run(fns.load_into, "fsdp_tp", directory, full_model, full_optim, False)):
        assert diffs == [], f"rank {rank}: {diffs}"


@pytest.mark.parametrize("layout, fresh", [("tp2", False), ("fsdp2", True)])
def test_fsdp_tp_save_reshards_bitwise(pool, saved_fsdp_tp, layout, fresh):
    directory, _, full_model, full_optim = saved_fsdp_tp
    for rank, diffs in enumerate(pool.run(fns.load_into, layout, directory, full_model, full_optim, fresh)):
        assert diffs == [], f"rank {rank}: {diffs}"


@pytest.mark.parametrize("which, fresh", [("tp_ddp", False), ("tp_ddp", True), ("fsdp_tp", False)])
def test_load_into_one_process_bitwise(saved, saved_fsdp_tp, world_of_one, which, fresh):
    directory, _, full_model, full_optim = saved if which == "tp_ddp" else saved_fsdp_tp
    assert fns.load_into("one", directory, full_model, full_optim, fresh) == []


def test_partial_dtensor_is_refused_with_what_to_do(world_of_one, tmp_path):
    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import DTensor, Partial

    dt = DTensor.from_local(Tensor(np.ones(3)), init_device_mesh("cpu", (1,)), [Partial()])
    with pytest.raises(ValueError, match="redistribute it to Replicate"):
        dcp.save({"w": dt}, checkpoint_id=str(tmp_path / "c"))


@pytest.mark.mpi
def test_mpi_save_on_tp_ddp_loads_into_fully_shard_on_3(tmp_path, saved):
    directory = str(tmp_path / "mpi")
    _, _, full_model, full_optim = saved  # the gloo run's full state: the same training, bitwise
    with RankPool(4, backend="mpi", timeout=120.0) as mpi:
        _, mpi_model, mpi_optim = mpi.run(fns.save_tp_ddp, directory)[0]
        for name, array in full_model.items():
            assert np.array_equal(mpi_model[name], array), name
            assert np.array_equal(mpi_optim[name]["exp_avg"], full_optim[name]["exp_avg"]), name
        for rank, diffs in enumerate(mpi.run(fns.load_into, "fsdp3", directory, mpi_model, mpi_optim, True)):
            assert diffs == [], f"rank {rank}: {diffs}"
