"""A :class:`~neural_arch.distributed.tensor.DTensor` in a checkpoint: this rank's piece as a box.

Under ``Shard``/``Replicate`` placements every rank's local piece is one box of the global tensor
(``torch.chunk`` rows along each sharded dimension, the whole extent elsewhere), so a DTensor leaf
is saved exactly like a tensor-parallel :class:`~neural_arch.distributed.checkpoint.ShardedArray`:
no communication, each distinct box written once (ranks that ``Replicate`` it hold the same box;
``save`` checks they agree), and ``load`` fills each rank's box of *its* layout from whichever
saved boxes overlap it -- any mesh, any placements. The box's ``local`` is the DTensor's own local
array, so a load writes into the DTensor in place.

``Partial`` placements are pending sums, not pieces: redistribute them (e.g. to ``Replicate()``)
before saving.

Example::

    box = as_sharded_array(model.fc1.weight)        # Shard(0) on a tp mesh of 2, weight (4, 3)
    box.global_shape, box.offsets                    # ((4, 3), (2, 0)) on tp rank 1
"""

from __future__ import annotations

from neural_arch.distributed.checkpoint.sharded import ShardedArray
from neural_arch.distributed.tensor._api import DTensor, compute_local_shape_and_global_offset
from neural_arch.distributed.tensor.placement_types import Partial

__all__ = ["as_sharded_array", "global_shape_of", "is_dtensor"]


def is_dtensor(value) -> bool:
    """Whether ``value`` is a DTensor (a DTensor parameter or gradient included).

    Example:
        >>> import numpy as np
        >>> is_dtensor(np.zeros(2))
        False
    """
    return isinstance(value, DTensor)


def global_shape_of(dt) -> tuple[int, ...]:
    """The global shape of a DTensor: for a DTensor parameter ``.shape`` is its local piece's.

    Example::

        global_shape_of(model.fc1.weight)          # (4, 3) while .shape is (2, 3)
    """
    return tuple(dt._shape)


def as_sharded_array(dt, key: str = "a DTensor") -> ShardedArray:
    """This rank's piece of ``dt`` as a box ``ShardedArray`` sharing the DTensor's local array.

    Raises ``ValueError`` for ``Partial`` placements (``key`` names the leaf in the message).

    Example::

        as_sharded_array(model.fc2.weight).offsets       # (0, 2): Shard(1) columns of tp rank 1
    """
    if any(isinstance(p, Partial) for p in dt.placements):
        raise ValueError(f"{key} has placements {list(dt.placements)}: a Partial DTensor is a sum still to be "
                         "reduced, not a piece; redistribute it to Replicate() (or Shard) before saving")
    shape = global_shape_of(dt)
    local_shape, offsets = compute_local_shape_and_global_offset(shape, dt.device_mesh, dt.placements)
    local = dt._local_tensor.data
    if tuple(local.shape) != tuple(local_shape):
        raise ValueError(f"{key}: this rank's local piece has shape {tuple(local.shape)} but placements "
                         f"{list(dt.placements)} of global shape {shape} give it {local_shape}")
    return ShardedArray(local, shape, offsets=offsets)
