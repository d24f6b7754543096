"""Flat buffers: many parameters laid end to end in one 1-D array, padded to split evenly.

ZeRO-2 and FSDP both shard a *flat* buffer, not individual tensors: every rank owns the same
number of elements (the buffer is padded with zeros to a multiple of the world size), so one
``reduce_scatter`` hands each rank its gradient shard and one ``all_gather`` rebuilds the full
parameters. Elementwise optimizers (SGD, Adam, AdamW) give bit-for-bit the same update on a
slice of the flat buffer as on the original tensors, which is why sharding keeps training equal
to single-process training.

Example::

    >>> import numpy as np
    >>> lay = FlatLayout([(2, 3), (4,)], world_size=4)
    >>> lay.numel, lay.padded_numel, lay.shard_size
    (10, 12, 3)
    >>> flat = lay.flatten([np.ones((2, 3)), np.full(4, 2.0)], np)
    >>> [v.shape for v in lay.views(flat)]
    [(2, 3), (4,)]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["FlatLayout"]


class FlatLayout:
    """Offsets of tensors of ``shapes`` in a flat buffer padded to a multiple of ``world_size``."""

    def __init__(self, shapes: Sequence[tuple], world_size: int):
        if world_size < 1:
            raise ValueError(f"FlatLayout: world_size must be >= 1, got {world_size}")
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.sizes = [int(np.prod(s)) if s else 1 for s in self.shapes]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]).astype(int)) if self.sizes else []
        self.numel = int(sum(self.sizes))
        self.world_size = int(world_size)
        # at least one element per rank, so an all-empty unit still has a (zero) shard
        self.shard_size = max(1, -(-self.numel // self.world_size))
        self.padded_numel = self.shard_size * self.world_size

    def flatten(self, arrays, xp, dtype=None, out=None):
        """Copy ``arrays`` (matching ``shapes``; None means zeros) into one padded flat array."""
        if dtype is None:
            dtype = next((a.dtype for a in arrays if a is not None), np.float32)
        flat = xp.zeros(self.padded_numel, dtype=dtype) if out is None else out
        if out is not None:
            flat[self.numel:] = 0
        for a, off, n in zip(arrays, self.offsets, self.sizes):
            if a is None:
                flat[off:off + n] = 0
            else:
                flat[off:off + n] = a.reshape(-1)
        return flat

    def views(self, flat):
        """The tensors as reshaped views into ``flat`` (no copies)."""
        return [flat[off:off + n].reshape(s) for off, n, s in zip(self.offsets, self.sizes, self.shapes)]

    def shard_range(self, rank: int) -> tuple[int, int]:
        """``[start, stop)`` of ``rank``'s shard in the padded flat buffer."""
        return rank * self.shard_size, (rank + 1) * self.shard_size

    def __repr__(self) -> str:
        return (f"FlatLayout(tensors={len(self.shapes)}, numel={self.numel}, "
                f"shard_size={self.shard_size} x {self.world_size})")
