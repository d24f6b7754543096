"""Megatron's tensor-parallel layers: ``ColumnParallelLinear``, ``RowParallelLinear``, ``VocabParallelEmbedding``.

A group of ``p`` ranks holds one layer between them:

* **column parallel** ``Y = X W^T + b``: rank r keeps rows ``r*out/p ... (r+1)*out/p`` of ``W``
  (and of ``b``) and computes that slice of ``Y``. The input enters through "f"
  (identity forward, all-reduce backward); ``gather_output=True`` all-gathers the slices.
* **row parallel**: rank r keeps the matching *columns* of ``W`` and multiplies its slice of the
  input; "g" (all-reduce) sums the partial products, then the (replicated) bias is added.
* **vocab parallel embedding**: rank r keeps rows ``r*V/p ... (r+1)*V/p`` of the table, looks up
  the ids it owns (zeros for the others), and "g" sums the ranks' rows.

Initialisation: every layer draws the **full** weight from the seeded global generator exactly
as the single-process layer (``nn.Linear`` / ``nn.Embedding``) would, then keeps its shard. So a
tensor-parallel model built after ``manual_seed(s)`` holds exactly the single-process model's
weights, whatever ``p`` is. ``from_linear`` / ``from_embedding`` shard an existing layer.

Parameters are :class:`~neural_arch.distributed.tensor._parameter.DTensorParameter` s, as torch's
styles make them: the Tensor face is this rank's slice (what the layer computes with and the
optimizer steps), the DTensor face says where it lies in the whole parameter (column parallel:
weight and bias ``Shard(0)``; row parallel: weight ``Shard(1)``, bias ``Replicate()``; vocab
parallel: weight ``Shard(0)``), on the 1-d mesh of ``process_group`` (:func:`tp_device_mesh`).
``fc1.weight.full_tensor()`` all-gathers the whole weight.

Example (every rank of ``tp``)::

    fc1 = ColumnParallelLinear(64, 256, process_group=tp)        # (.., 64) -> (.., 256/p)
    fc2 = RowParallelLinear(256, 64, process_group=tp)           # (.., 256/p) -> (.., 64)
    y = fc2(F.gelu(fc1(x)))                                      # equals the dense MLP
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.ops_loss import _eager_checks
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.device_mesh import DeviceMesh, resolve_group_or_mesh
from neural_arch.distributed.nn.functional import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from neural_arch.distributed.tensor._parameter import DTensorParameter
from neural_arch.distributed.tensor.placement_types import Replicate, Shard
from neural_arch.nn import functional as F
from neural_arch.nn.linear import Embedding, Linear
from neural_arch.nn.module import Module

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "shard_range",
           "tp_device_mesh"]


def shard_range(total: int, group, what: str) -> tuple[int, int]:
    """``[start, end)`` of this rank's equal shard of ``total`` items; an error if it does not divide.

    Example::

        start, end = shard_range(1024, tp_group, "out_features")   # rank 1 of 4: (256, 512)
    """
    n, r = group.size(), group.rank()
    if total % n:
        raise ValueError(f"{what} ({total}) must be divisible by the tensor-parallel size {n}; pick a size "
                         f"that is a multiple of {n} (or pad it)")
    step = total // n
    return r * step, (r + 1) * step


def tp_device_mesh(process_group=None, device: str = "cpu") -> DeviceMesh:
    """The 1-d DeviceMesh a tensor-parallel layer's DTensor parameters live on.

    ``process_group`` itself when it is a 1-d DeviceMesh (e.g. ``mesh["tp"]``); otherwise a mesh
    over the ranks of the group (a ProcessGroup, or None for the world) that reuses that group:
    torch's ``DeviceMesh.from_group``, with no collective (groups are created collectively, and
    the group exists already).

    Example::

        tp_device_mesh(tp_group).mesh.tolist()      # e.g. [2, 3] on ranks 2 and 3
    """
    if isinstance(process_group, DeviceMesh):
        resolve_group_or_mesh(process_group, "tp_device_mesh")  # the same error for a 2-d mesh
        return process_group
    group = resolve_group_or_mesh(process_group, "tp_device_mesh")
    return DeviceMesh.from_group(group, str(device).split(":")[0])


def _param(array, like: Tensor, mesh: DeviceMesh, placement, global_shape) -> DTensorParameter:
    """This rank's piece ``array`` of ``like`` (the whole parameter) as a DTensor parameter."""
    xp_array = array.copy() if hasattr(array, "copy") else np.array(array)
    return DTensorParameter(xp_array, mesh, [placement], global_shape, device=like.device)


class ColumnParallelLinear(Module):
    """``Linear(in, out)`` split by output features across ``process_group`` (Megatron's API).

    Args:
        in_features, out_features: of the whole layer (``out_features`` divisible by the group size).
        bias: learn a bias (sharded like the output).
        gather_output: all-gather the output slices so every rank gets ``(..., out_features)``;
            False (default) leaves ``(..., out_features / p)`` for a following row-parallel layer.
        process_group: the tensor-parallel group (ProcessGroup, 1-d DeviceMesh, None = world).
        sequence_parallel: the input is this rank's share of the sequence ``(B, T/p, in)``: it is
            all-gathered along the sequence first (backward: reduce-scatter), Megatron's flag.

    ``weight`` has shape ``(out/p, in)``; ``_tp_shard_dims`` tells the state-dict helpers how to
    reassemble it.

    Example::

        fc1 = ColumnParallelLinear(512, 2048, gather_output=False, process_group=tp_group)
        fc2 = RowParallelLinear(2048, 512, input_is_parallel=True, process_group=tp_group)
        y = fc2(F.gelu(fc1(x)))                      # one all-reduce, in fc2
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = False,
                 process_group=None, dtype=np.float32, device=None, *, sequence_parallel: bool = False,
                 _from: Linear | None = None):
        super().__init__()
        self.process_group = resolve_group_or_mesh(process_group, "ColumnParallelLinear")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.gather_output = bool(gather_output)
        self.sequence_parallel = bool(sequence_parallel)
        self.tp_size, self.tp_rank = self.process_group.size(), self.process_group.rank()
        start, end = shard_range(self.out_features, self.process_group, "ColumnParallelLinear: out_features")
        self.out_features_per_partition = end - start
        full = _from if _from is not None else Linear(in_features, out_features, bias=bias, dtype=dtype,
                                                      device=device)
        mesh = tp_device_mesh(process_group, full.weight.device)
        self.weight = _param(full.weight.data[start:end], full.weight, mesh, Shard(0), full.weight.shape)
        if full.bias is not None:
            self.bias = _param(full.bias.data[start:end], full.bias, mesh, Shard(0), full.bias.shape)
        else:
            self.register_parameter("bias", None)
        self._tp_shard_dims = {"weight": 0, "bias": 0}

    @classmethod
    def from_linear(cls, linear: Linear, process_group=None, gather_output: bool = False,
                    sequence_parallel: bool = False) -> ColumnParallelLinear:
        """Shard an existing ``nn.Linear`` (its values are kept exactly)."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, gather_output,
                   process_group, sequence_parallel=sequence_parallel, _from=linear)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        if self.sequence_parallel:  # the all-gather's backward reduce-scatters: it also does f's all-reduce
            x = gather_from_sequence_parallel_region(x, self.process_group)
        else:
            x = copy_to_tensor_model_parallel_region(x, self.process_group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tensor_model_parallel_region(y, self.process_group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.out_features_per_partition} on rank {self.tp_rank} of {self.tp_size}), "
                f"bias={self.bias is not None}, gather_output={self.gather_output}"
                + (", sequence_parallel=True" if self.sequence_parallel else ""))


class RowParallelLinear(Module):
    """``Linear(in, out)`` split by input features across ``process_group`` (Megatron's API).

    Args:
        in_features, out_features: of the whole layer (``in_features`` divisible by the group size).
        bias: learn a bias (replicated; added once, after the all-reduce).
        input_is_parallel: the input is already this rank's slice ``(..., in/p)`` (what a
            column-parallel layer without ``gather_output`` gives); False scatters a full input.
        process_group: the tensor-parallel group.
        sequence_parallel: reduce-scatter the output along the sequence (each rank gets
            ``(B, T/p, out)``) instead of all-reducing it; the bias is added to those positions and
            its gradient all-reduced (Megatron's flag).

    Example::

        fc2 = RowParallelLinear(2048, 512, input_is_parallel=True, process_group=tp_group)
        y = fc2(h_shard)                             # h_shard: (..., 2048 / tp); y: (..., 512) on every rank
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = True,
                 process_group=None, dtype=np.float32, device=None, *, sequence_parallel: bool = False,
                 _from: Linear | None = None):
        super().__init__()
        self.process_group = resolve_group_or_mesh(process_group, "RowParallelLinear")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.input_is_parallel = bool(input_is_parallel)
        self.sequence_parallel = bool(sequence_parallel)
        if self.sequence_parallel and not self.input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel=True needs input_is_parallel=True (the input "
                             "comes from a column-parallel layer)")
        self.tp_size, self.tp_rank = self.process_group.size(), self.process_group.rank()
        start, end = shard_range(self.in_features, self.process_group, "RowParallelLinear: in_features")
        self.in_features_per_partition = end - start
        full = _from if _from is not None else Linear(in_features, out_features, bias=bias, dtype=dtype,
                                                      device=device)
        mesh = tp_device_mesh(process_group, full.weight.device)
        self.weight = _param(full.weight.data[:, start:end], full.weight, mesh, Shard(1), full.weight.shape)
        if full.bias is not None:
            self.bias = _param(full.bias.data, full.bias, mesh, Replicate(), full.bias.shape)
        else:
            self.register_parameter("bias", None)
        self._tp_shard_dims = {"weight": 1}

    @classmethod
    def from_linear(cls, linear: Linear, process_group=None, input_is_parallel: bool = True,
                    sequence_parallel: bool = False) -> RowParallelLinear:
        """Shard an existing ``nn.Linear`` (its values are kept exactly)."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, input_is_parallel,
                   process_group, sequence_parallel=sequence_parallel, _from=linear)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.process_group)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(F.linear(x, self.weight), self.process_group)
            # each rank adds the bias to its own positions only: its gradient is partial, so "f"
            # all-reduces it (the replicated bias then stays identical on every rank)
            bias = None if self.bias is None else copy_to_tensor_model_parallel_region(self.bias, self.process_group)
        else:
            y = reduce_from_tensor_model_parallel_region(F.linear(x, self.weight), self.process_group)
            bias = self.bias
        return y + bias if bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.in_features_per_partition} on rank {self.tp_rank} of "
                f"{self.tp_size}), out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}"
                + (", sequence_parallel=True" if self.sequence_parallel else ""))


class VocabParallelEmbedding(Module):
    """``Embedding(num, dim)`` split by rows (the vocabulary) across ``process_group`` (Megatron).

    Rank r owns ids ``[r*num/p, (r+1)*num/p)``; every rank returns the full ``(*ids.shape, dim)``
    result (one all-reduce). Ids outside ``[0, num)`` raise ``IndexError`` like ``nn.Embedding`` on
    NumPy arrays (or with ``NEURAL_ARCH_EAGER_CHECKS=1``); on a device, where the check would wait
    for the device every step, their output rows are NaN instead.

    Example::

        emb = VocabParallelEmbedding(50257, 768, process_group=tp_group)
        h = emb(idx)                                 # (B, T, 768) on every rank
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, process_group=None, dtype=np.float32,
                 device=None, *, _from: Embedding | None = None):
        super().__init__()
        self.process_group = resolve_group_or_mesh(process_group, "VocabParallelEmbedding")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.tp_size, self.tp_rank = self.process_group.size(), self.process_group.rank()
        self.vocab_start_index, self.vocab_end_index = shard_range(
            self.num_embeddings, self.process_group, "VocabParallelEmbedding: num_embeddings")
        full = _from if _from is not None else Embedding(num_embeddings, embedding_dim, dtype=dtype, device=device)
        mesh = tp_device_mesh(process_group, full.weight.device)
        self.weight = _param(full.weight.data[self.vocab_start_index:self.vocab_end_index], full.weight, mesh,
                             Shard(0), full.weight.shape)
        self._tp_shard_dims = {"weight": 0}

    @classmethod
    def from_embedding(cls, embedding: Embedding, process_group=None) -> VocabParallelEmbedding:
        """Shard an existing ``nn.Embedding`` (its values are kept exactly)."""
        return cls(embedding.num_embeddings, embedding.embedding_dim, process_group, _from=embedding)

    def forward(self, indices):
        from neural_arch.backend import get_array_module as _xp

        raw = indices.data if isinstance(indices, Tensor) else indices
        raw = raw if hasattr(raw, "dtype") else np.asarray(raw)
        xp = _xp(raw)
        if raw.dtype.kind not in "iu":
            raise TypeError(f"VocabParallelEmbedding: indices must be integers, got dtype {raw.dtype}")
        eager = _eager_checks(xp)  # on a device, reading the range would wait for it every step
        if eager and raw.size and (int(raw.min()) < 0 or int(raw.max()) >= self.num_embeddings):
            raise IndexError(f"VocabParallelEmbedding: indices must be in [0, {self.num_embeddings}), got "
                             f"min {int(raw.min())}, max {int(raw.max())}")
        outside = (raw < self.vocab_start_index) | (raw >= self.vocab_end_index)
        local = xp.where(outside, 0, raw - self.vocab_start_index)
        rows = F.embedding(local, self.weight)
        if self.tp_size > 1:
            keep = (~outside).astype(self.weight.data.dtype)[..., None]
            rows = rows * Tensor._wrap(keep)
        if not eager:  # no host sync: an id outside [0, num) makes its output row NaN (visibly wrong)
            bad = (raw < 0) | (raw >= self.num_embeddings)
            rows = rows + Tensor._wrap(xp.where(bad, xp.nan, 0).astype(self.weight.data.dtype)[..., None])
        return reduce_from_tensor_model_parallel_region(rows, self.process_group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows [{self.vocab_start_index}, "
                f"{self.vocab_end_index}) on rank {self.tp_rank} of {self.tp_size}")
