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

from neural_arch.distributed.comm.work import ReduceOp

__all__ = ["FlatLayout", "FlatShard"]


class FlatLayout:
    """Offsets of tensors of ``shapes`` in a flat buffer padded to a multiple of ``world_size``.

    Example:
        >>> import numpy as np
        >>> layout = FlatLayout([(2, 3), (4,)], world_size=4)
        >>> layout.numel, layout.padded_numel, layout.shard_range(1)
        (10, 12, (3, 6))
        >>> flat = layout.flatten([np.ones((2, 3)), np.arange(4.0)], np)
        >>> [v.shape for v in layout.views(flat)]
        [(2, 3), (4,)]
    """

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

    def shard_pieces(self, rank: int) -> list[tuple[int, int, int, int]]:
        """What ``rank``'s shard holds: ``[(k, start, at, length)]``: elements ``[start, start+length)``
        of tensor ``k`` (C-order flattened) are elements ``[at, at+length)`` of the shard. Padding
        is in no piece; a tensor the shard does not touch is left out.

        >>> FlatLayout([(2, 3), (4,)], world_size=4).shard_pieces(1)   # shard = flat[3:6]
        [(0, 3, 0, 3)]
        >>> FlatLayout([(2, 3), (4,)], world_size=4).shard_pieces(2)   # flat[6:9]
        [(1, 0, 0, 3)]
        """
        lo, hi = self.shard_range(rank)
        out = []
        for k, (off, n) in enumerate(zip(self.offsets, self.sizes)):
            a, b = max(lo, int(off)), min(hi, int(off) + n)
            if a < b:
                out.append((k, a - int(off), a - lo, b - a))
        return out

    def __repr__(self) -> str:
        return (f"FlatLayout(tensors={len(self.shapes)}, numel={self.numel}, "
                f"shard_size={self.shard_size} x {self.world_size})")


class FlatShard:
    """What a flat shard Parameter (FSDP's ``flat_param``, ZeRO-2's bucket shard) stands for.

    Attached to the shard as ``shard._flat_shard``; read, without importing ``distributed``, by
    :func:`neural_arch.optim.clip_grad_norm_` (the norm of sharded gradients is a sum over the
    ranks) and by :mod:`neural_arch.distributed.checkpoint.state_dict` (each original parameter's
    part of the shard, so optimizer state is saved under the parameters' own names).

    * ``params``: the original parameters laid end to end in the flat buffer (the same list on every rank);
    * ``pieces``: ``[(param, start, at, length)]``: elements ``[start, start+length)`` of
      ``param.reshape(-1)`` are elements ``[at, at+length)`` of this rank's shard;
    * ``group``: the process group the buffer is split over (None: this rank holds all of it).

    Example::

        fs = fsdp.parameters().__next__()._flat_shard
        [(p.shape, start, length) for p, start, _, length in fs.pieces]
    """

    __slots__ = ("group", "params", "pieces")

    def __init__(self, params: list, layout: FlatLayout, rank: int, group) -> None:
        self.params = list(params)
        self.pieces = [(self.params[k], start, at, n) for k, start, at, n in layout.shard_pieces(rank)]
        self.group = group if group is not None and group.size() > 1 else None

    def all_reduce_norm(self, value, op: str):
        """``value`` summed (``op="sum"``) or maxed (``"max"``) over ``group``: a collective. A float
        gives a float; a 1-element array (a device buffer: no host synchronisation) is reduced in
        place and returned."""
        if not isinstance(value, (int, float)):
            if self.group is not None:
                self.group.backend.allreduce(value, ReduceOp.SUM if op == "sum" else ReduceOp.MAX)
            return value
        if self.group is None:
            return float(value)
        buf = np.array([value], dtype=np.float64)
        self.group.backend.allreduce(buf, ReduceOp.SUM if op == "sum" else ReduceOp.MAX)
        return float(buf[0])

    def __repr__(self) -> str:
        return f"FlatShard({len(self.pieces)} of {len(self.params)} parameters, split={self.group is not None})"
