"""``ShardedArray``: one rank's piece of a bigger (global) array, and how pieces overlap.

A piece is one of two kinds (see the package docstring for the contract):

* a **box**: ``ShardedArray(local, global_shape, offsets=(o0, o1, ...))``: ``local`` holds
  ``global[o0:o0+local.shape[0], o1:o1+local.shape[1], ...]`` (tensor parallel row/column shards);
* a **flat range**: ``ShardedArray(local_1d, global_shape, flat_offset=k)``: ``local`` holds the
  elements ``k .. k+local.size-1`` of ``global.reshape(-1)`` in C order (FSDP/ZeRO flat shards).

Example::

    >>> import numpy as np
    >>> full = np.arange(12.0).reshape(4, 3)
    >>> rows = ShardedArray(full[2:], (4, 3), offsets=(2, 0))
    >>> flat = ShardedArray(full.reshape(-1)[4:9], (4, 3), flat_offset=4)
    >>> out = np.zeros(5)
    >>> copy_overlap(Region.of(rows), rows.local, Region.of(flat), out)   # elements 6, 7, 8
    3
    >>> out.tolist()
    [0.0, 0.0, 6.0, 7.0, 8.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Region", "ShardedArray", "copy_overlap", "overlap_runs"]


class ShardedArray:
    """This rank's piece ``local`` of an array of shape ``global_shape`` (a box or a flat range).

    Args:
        local: the piece (NumPy or anything ``np.asarray`` accepts; CuPy arrays are copied to host
            when saved).
        global_shape: the whole array's shape.
        offsets: where the box starts in every dimension (``len(offsets) == len(global_shape)``,
            ``local.ndim == len(global_shape)``).
        flat_offset: instead of ``offsets``: ``local`` is 1-D and holds the C-order flattened
            global elements ``[flat_offset, flat_offset + local.size)``.

    A plain array in a state dict means *replicated*: every rank that has it holds the whole array.

    Example:
        >>> import numpy as np
        >>> ShardedArray(np.ones((2, 4)), global_shape=(4, 4), offsets=(2, 0))   # rows 2..3
        ShardedArray(local shape (2, 4), global_shape=(4, 4), offsets=(2, 0), dtype=float64)
        >>> flat = ShardedArray(np.arange(3.0), global_shape=(2, 3), flat_offset=2)   # elements 2..4
    """

    __slots__ = ("flat_offset", "global_shape", "local", "offsets")

    def __init__(self, local, global_shape, offsets=None, flat_offset=None):
        self.local = local
        self.global_shape = tuple(int(s) for s in global_shape)
        if (offsets is None) == (flat_offset is None):
            raise ValueError("ShardedArray: pass exactly one of offsets=(...) (a box piece) or "
                             "flat_offset=k (a range of the flattened array)")
        shape = tuple(int(s) for s in np.shape(local))
        if offsets is not None:
            offsets = tuple(int(o) for o in offsets)
            if len(offsets) != len(self.global_shape) or len(shape) != len(self.global_shape):
                raise ValueError(f"ShardedArray: offsets {offsets}, local shape {shape} and global_shape "
                                 f"{self.global_shape} must have the same number of dimensions")
            for d, (o, n, g) in enumerate(zip(offsets, shape, self.global_shape)):
                if o < 0 or o + n > g:
                    raise ValueError(f"ShardedArray: dimension {d}: [{o}, {o + n}) is outside [0, {g}) "
                                     f"(offsets {offsets}, local shape {shape}, global_shape {self.global_shape})")
            self.offsets, self.flat_offset = offsets, None
        else:
            flat_offset = int(flat_offset)
            total = math.prod(self.global_shape)
            if len(shape) != 1:
                raise ValueError(f"ShardedArray: a flat piece must be 1-D, got local shape {shape}")
            if flat_offset < 0 or flat_offset + shape[0] > total:
                raise ValueError(f"ShardedArray: flat range [{flat_offset}, {flat_offset + shape[0]}) is outside "
                                 f"[0, {total}) for global_shape {self.global_shape}")
            self.offsets, self.flat_offset = None, flat_offset

    @property
    def dtype(self):
        return np.dtype(self.local.dtype)

    def __repr__(self) -> str:
        where = f"offsets={self.offsets}" if self.offsets is not None else f"flat_offset={self.flat_offset}"
        return (f"ShardedArray(local shape {tuple(np.shape(self.local))}, global_shape={self.global_shape}, "
                f"{where}, dtype={self.dtype})")


@dataclass(frozen=True)
class Region:
    """Where a piece lies in its global array: a box (``offsets``, ``sizes``) or a flat range.

    Example:
        >>> import numpy as np
        >>> Region.of(ShardedArray(np.ones((2, 4)), (4, 4), offsets=(2, 0)))
        Region(global_shape=(4, 4), offsets=(2, 0), sizes=(2, 4), flat_offset=None, flat_size=None)
        >>> Region.of(ShardedArray(np.arange(3.0), (2, 3), flat_offset=2)).flat_size
        3
    """

    global_shape: tuple
    offsets: tuple | None = None       # box
    sizes: tuple | None = None         # box
    flat_offset: int | None = None     # flat range
    flat_size: int | None = None       # flat range

    @staticmethod
    def of(piece) -> Region:
        """The region of a ``ShardedArray`` or of a whole (replicated) array."""
        if isinstance(piece, ShardedArray):
            if piece.offsets is not None:
                return Region(piece.global_shape, piece.offsets, tuple(np.shape(piece.local)))
            return Region(piece.global_shape, flat_offset=piece.flat_offset, flat_size=int(np.size(piece.local)))
        shape = tuple(int(s) for s in np.shape(piece))
        return Region(shape, (0,) * len(shape), shape)

    @staticmethod
    def from_json(global_shape, item: dict) -> Region:
        if "flat_offset" in item:
            return Region(tuple(global_shape), flat_offset=item["flat_offset"], flat_size=item["flat_size"])
        return Region(tuple(global_shape), tuple(item["offsets"]), tuple(item["sizes"]))

    def to_json(self) -> dict:
        if self.is_flat:
            return {"flat_offset": self.flat_offset, "flat_size": self.flat_size}
        return {"offsets": list(self.offsets), "sizes": list(self.sizes)}

    @property
    def is_flat(self) -> bool:
        return self.flat_offset is not None

    @property
    def numel(self) -> int:
        return self.flat_size if self.is_flat else math.prod(self.sizes)

    def key(self) -> tuple:
        return ("flat", self.flat_offset, self.flat_size) if self.is_flat else ("box", self.offsets, self.sizes)

    def runs(self) -> tuple[np.ndarray, int]:
        """(global flat start of every contiguous run, run length); runs follow the local C order.

        A box whose trailing dimensions are whole is one long run per index of its leading
        dimensions (a row shard is a single run); a column shard is one run per row.
        """
        if self.is_flat:
            return np.array([self.flat_offset], dtype=np.int64), self.flat_size
        shape, off, size = self.global_shape, self.offsets, self.sizes
        nd = len(shape)
        # k: the last dimension that is partial; dims after k are whole, so they fuse into the run.
        k = nd - 1
        while k >= 0 and off[k] == 0 and size[k] == shape[k]:
            k -= 1
        if k < 0:
            return np.array([0], dtype=np.int64), math.prod(shape)
        run = size[k] * math.prod(shape[k + 1:])
        strides = [math.prod(shape[d + 1:]) for d in range(nd)]
        starts = np.array([off[k] * strides[k]], dtype=np.int64)
        for d in range(k - 1, -1, -1):  # outer dims: each adds a grid of starts
            idx = (off[d] + np.arange(size[d], dtype=np.int64)) * strides[d]
            starts = (idx[:, None] + starts[None, :]).reshape(-1)
        return starts, run


def _box_overlap(a: Region, b: Region):
    lo = tuple(max(x, y) for x, y in zip(a.offsets, b.offsets))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a.offsets, a.sizes, b.offsets, b.sizes))
    if any(h <= low for low, h in zip(lo, hi)) and lo:
        return None
    return lo, hi


def copy_overlap(src_region: Region, src: np.ndarray, dst_region: Region, dst: np.ndarray) -> int:
    """Copy the elements where ``src_region`` and ``dst_region`` overlap from ``src`` into ``dst``.

    ``src``/``dst`` are the pieces' local arrays. Returns the number of elements copied.

    Example:
        >>> import numpy as np
        >>> piece = ShardedArray(np.ones((2, 4)), (4, 4), offsets=(2, 0))
        >>> whole = np.zeros((4, 4))
        >>> copy_overlap(Region.of(piece), piece.local, Region.of(whole), whole)
        8
        >>> float(whole[2:].sum()), float(whole[:2].sum())
        (8.0, 0.0)
    """
    if not src_region.is_flat and not dst_region.is_flat:
        found = _box_overlap(src_region, dst_region)
        if found is None:
            return 0
        lo, hi = found
        s = tuple(slice(low - o, h - o) for low, h, o in zip(lo, hi, src_region.offsets))
        d = tuple(slice(low - o, h - o) for low, h, o in zip(lo, hi, dst_region.offsets))
        dst[d] = src[s]
        return math.prod(h - low for low, h in zip(lo, hi))
    # At least one flat side: intersect the two sorted lists of contiguous runs.
    s_starts, s_len = src_region.runs()
    d_starts, d_len = dst_region.runs()
    if s_len == 0 or d_len == 0 or not len(s_starts) or not len(d_starts):
        return 0  # an empty piece (its reshape would not share memory, so test before)
    src_flat, dst_flat = src.reshape(-1), dst.reshape(-1)
    if not np.shares_memory(dst_flat, dst):  # reshape copied: dst is not contiguous
        raise ValueError("copy_overlap: the destination must be C-contiguous")
    copied = 0
    i = j = 0
    while i < len(s_starts) and j < len(d_starts):
        a0, a1 = int(s_starts[i]), int(s_starts[i]) + s_len
        b0, b1 = int(d_starts[j]), int(d_starts[j]) + d_len
        lo, hi = max(a0, b0), min(a1, b1)
        if lo < hi:
            dst_flat[j * d_len + lo - b0: j * d_len + hi - b0] = src_flat[i * s_len + lo - a0: i * s_len + hi - a0]
            copied += hi - lo
        if a1 <= b1:
            i += 1
        else:
            j += 1
    return copied


def overlap_runs(src_region: Region, dst_region: Region, limit: int = 4096) -> list[tuple[int, int, int]] | None:
    """Where two pieces overlap, as contiguous runs ``(src local offset, dst local offset, length)``.

    Offsets and lengths count elements of the pieces' C-order flattened local arrays; the runs
    come in increasing order on both sides. Returns None when either piece has more than
    ``limit`` runs (e.g. a column shard of a tall matrix): the caller then copies with
    :func:`copy_overlap` instead of run by run.

    >>> rows = Region((4, 3), (2, 0), (2, 3))                  # rows 2-3 of a 4x3 array
    >>> overlap_runs(Region((4, 3), flat_offset=4, flat_size=5), rows)   # elements 6, 7, 8
    [(2, 0, 3)]
    """
    s_starts, s_len = src_region.runs()
    d_starts, d_len = dst_region.runs()
    if len(s_starts) > limit or len(d_starts) > limit:
        return None
    out: list[tuple[int, int, int]] = []
    if s_len == 0 or d_len == 0:
        return out
    i = j = 0
    while i < len(s_starts) and j < len(d_starts):
        a0 = int(s_starts[i])
        b0 = int(d_starts[j])
        a1, b1 = a0 + s_len, b0 + d_len
        lo, hi = max(a0, b0), min(a1, b1)
        if lo < hi:
            src_at, dst_at = i * s_len + lo - a0, j * d_len + lo - b0
            last = out[-1] if out else None
            if last and last[0] + last[2] == src_at and last[1] + last[2] == dst_at:
                out[-1] = (last[0], last[1], last[2] + hi - lo)  # adjacent on both sides: one run
            else:
                out.append((src_at, dst_at, hi - lo))
        if a1 <= b1:
            i += 1
        else:
            j += 1
    return out
