"""Seed 004's ``TensorParallelSKLinear`` and ``TensorParallelModel``: sketched layers split by output.

Each rank of the tensor-parallel group keeps ``out_features / p`` rows of the trained factor ``U``
(and of the bias) in ``local_sklinear`` and the *whole* sketch buffer ``S`` (identical on every
rank: it is drawn from the seeded generator, like the single-process layer's). The values are a
shard of the single-process ``SKLinear(in, out, k)`` built from the same seed, so the parallel
layer computes exactly what the single-process one does.

Forward: "f" on the input (identity; all-reduce of its gradient), the local sketched product,
then (``gather_output=True``, the seed's behaviour) an all-gather of the output slices along the
last dimension, whose backward keeps this rank's slice of the gradient.

Example (seed 004)::

    layer = TensorParallelSKLinear(1024, 512, 512, tp_group)
    y = layer(x)                                   # (..., 512) on every rank of tp_group
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.device_mesh import resolve_group_or_mesh
from neural_arch.distributed.nn.functional import (
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
)
from neural_arch.distributed.tensor._parameter import DTensorParameter
from neural_arch.distributed.tensor.parallel.layers import shard_range, tp_device_mesh
from neural_arch.distributed.tensor.placement_types import Shard
from neural_arch.nn.activation import ReLU
from neural_arch.nn.container import ModuleList
from neural_arch.nn.module import Module
from neural_arch.nn.sketched import SKLinear

__all__ = ["TensorParallelModel", "TensorParallelSKLinear"]


class TensorParallelSKLinear(Module):
    """``SKLinear(in, out, sketch_size)`` with output features split across ``tensor_parallel_group``.

    Args (seed 004's order): in_features, out_features (divisible by the group size),
    sketch_size, tensor_parallel_group (ProcessGroup, 1-d DeviceMesh or None = world).
    ``gather_output`` (default True, as in the seed) returns the full output on every rank.

    Example::

        layer = TensorParallelSKLinear(512, 1024, sketch_size=64, tensor_parallel_group=tp_group)
        y = layer(x)                                   # (..., 1024) on every rank
    """

    def __init__(self, in_features: int, out_features: int, sketch_size: int, tensor_parallel_group=None,
                 bias: bool = True, gather_output: bool = True, dtype=np.float32, *, _from: SKLinear | None = None):
        super().__init__()
        self.tp_group = resolve_group_or_mesh(tensor_parallel_group, "TensorParallelSKLinear")
        self.in_features, self.out_features, self.sketch_size = int(in_features), int(out_features), int(sketch_size)
        self.tp_world_size, self.tp_rank = self.tp_group.size(), self.tp_group.rank()
        self.gather_output = bool(gather_output)
        start, end = shard_range(self.out_features, self.tp_group, "TensorParallelSKLinear: out_features")
        self.local_out_features = end - start
        full = _from if _from is not None else SKLinear(in_features, out_features, sketch_size, bias=bias, dtype=dtype)
        local = SKLinear(self.in_features, self.local_out_features, self.sketch_size, bias=full.bias is not None,
                         dtype=full.weight_u.data.dtype, generator=np.random.default_rng(0))
        # Overwrite the placeholder draw with this rank's shard of the full layer.
        # (DTensor parameters, Shard(0) on the tp mesh, as ColumnParallelLinear's)
        mesh = tp_device_mesh(tensor_parallel_group, full.weight_u.device)
        local.weight_u = DTensorParameter(full.weight_u.data[start:end].copy(), mesh, [Shard(0)],
                                          full.weight_u.shape, device=full.weight_u.device)
        local.sketch_matrix.data = full.sketch_matrix.data.copy()
        if full.bias is not None:
            local.bias = DTensorParameter(full.bias.data[start:end].copy(), mesh, [Shard(0)], full.bias.shape,
                                          device=full.bias.device)
        self.local_sklinear = local
        self._tp_shard_dims = {"local_sklinear.weight_u": 0, "local_sklinear.bias": 0}

    @classmethod
    def from_sklinear(cls, layer: SKLinear, tensor_parallel_group=None, gather_output: bool = True):
        """Shard an existing ``SKLinear`` (values kept exactly)."""
        return cls(layer.in_features, layer.out_features, layer.sketch_size, tensor_parallel_group,
                   bias=layer.bias is not None, gather_output=gather_output, _from=layer)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        y = self.local_sklinear(copy_to_tensor_model_parallel_region(x, self.tp_group))
        return gather_from_tensor_model_parallel_region(y, self.tp_group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} ({self.local_out_features} on "
                f"rank {self.tp_rank} of {self.tp_world_size}), sketch_size={self.sketch_size}")


class TensorParallelModel(Module):
    """Seed 004's stack: ``TensorParallelSKLinear`` layers with ReLU between them.

    ``layer_configs``: dicts with ``in_features``, ``out_features``, ``sketch_size``.

    Example::

        model = TensorParallelModel([{"in_features": 64, "out_features": 128, "sketch_size": 16},
                                     {"in_features": 128, "out_features": 10, "sketch_size": 8}], tp_group)
    """

    def __init__(self, layer_configs, tensor_parallel_group=None, dtype=np.float32):
        super().__init__()
        self.tp_group = resolve_group_or_mesh(tensor_parallel_group, "TensorParallelModel")
        self.layers = ModuleList([
            TensorParallelSKLinear(c["in_features"], c["out_features"], c["sketch_size"], self.tp_group, dtype=dtype)
            for c in layer_configs])
        self.act = ReLU()

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x
