"""Tensor-parallel styles make DTensor parameters (torch's): placements (Colwise: weight and bias
Shard(0); Rowwise: weight Shard(1), bias Replicate(); vocab-parallel embedding Shard(0);
SequenceParallel's LayerNorm: Replicate()), the mesh passed in, the local piece the slice of the
single-process weight, ``full_tensor()`` the whole weight, and gradient clipping (the global norm over
the tp pieces) and training still equal to single-process (float64 <= 1e-10). Real gloo ranks (one RankPool of 2).
"""

import numpy as np
import pytest
import tp_dtensor_rank_fns as fns

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.mark.parametrize("by_group", [False, True], ids=["mesh", "group"])
def test_mlp_styles_make_dtensor_parameters(pool, by_group):
    for rank, bad in enumerate(pool.run(fns.mlp_placements_run, by_group)):
        assert bad == [], f"rank {rank}: {bad}"


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_gpt_parameters_are_dtensors_and_training_is_unchanged(pool, sequence_parallel):
    for rank, bad in enumerate(pool.run(fns.gpt_placements_run, sequence_parallel)):
        assert bad == [], f"rank {rank}: {bad}"


def test_world_of_one_and_sketched_layer(world_of_one):
    from neural_arch.distributed.tensor import DTensor, Shard
    from neural_arch.distributed.tensor.parallel import TensorParallelSKLinear
    from neural_arch.nn.sketched import SKLinear

    assert fns.mlp_placements_run(False) == []
    layer = TensorParallelSKLinear.from_sklinear(SKLinear(4, 6, 2, dtype=np.float64))
    for p in (layer.local_sklinear.weight_u, layer.local_sklinear.bias):
        assert isinstance(p, DTensor) and p.placements == (Shard(0),)


def test_a_piece_of_the_wrong_shape_is_refused(world_of_one):
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import Shard
    from neural_arch.distributed.tensor._parameter import DTensorParameter

    with pytest.raises(ValueError, match=r"give it \(4, 3\)"):
        DTensorParameter(np.zeros((2, 3)), init_device_mesh("cpu", (1,)), [Shard(0)], (4, 3))
