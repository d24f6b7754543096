"""Shape ops on a DTensor (torch's ``_ops/_view_ops.py``): ``reshape`` / ``view``, ``transpose``,
``permute``.

* ``transpose`` / ``permute``: ``Shard(d)`` follows dim ``d`` to its new index; ``Replicate`` and
  ``Partial`` stay (both ops are linear and move no data between ranks).
* ``reshape``: the shapes are matched in groups of dims with equal element counts (a dim kept, a
  run of dims flattened into one, one dim split into several). A sharded dim must lead its group
  (the outer dim of a flatten or split) and every rank's rows must be the same elements before and
  after -- ``(B, T, C) -> (B, T, H, D)`` with any of B, T sharded, ``(B, T, V) -> (B*T, V)`` with B
  sharded into equal pieces; otherwise it raises (torch would redistribute).

Example::

    dt.reshape(B * T, V)     # dt Shard(0) of (B, T, V), B divisible by the mesh: Shard(0)
    dt.transpose(0, 1)       # Shard(0) -> Shard(1)
"""

from __future__ import annotations

import math

from neural_arch.distributed.tensor._api import DTensor, _chunk_range, compute_local_shape_and_global_offset
from neural_arch.distributed.tensor._sharding_rules import no_rule
from neural_arch.distributed.tensor.placement_types import Shard, _StridedShard

__all__ = ["permute", "reshape", "transpose", "view"]


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


def _groups(a, b) -> list[tuple[list[int], list[int]]]:
    """Consecutive (input dims, output dims) groups of equal element count; a size-1 dim joins the
    group after it (trailing ones stand alone)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b):  # trailing size-1 dims of one side
            groups.append(([i], []))
            i += 1
            continue
        if i >= len(a):
            groups.append(([], [j]))
            j += 1
            continue
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                gi.append(i)
                pa *= a[i]
                i += 1
            else:
                gj.append(j)
                pb *= b[j]
                j += 1
        groups.append((gi, gj))
    return groups


def _lead(dims: list[int], shape) -> int | None:
    """The outermost dim of a group that is not of size 1 (size-1 dims before it hold no rows)."""
    return next((d for d in dims if shape[d] != 1), dims[0] if dims else None)


def reshape(x: DTensor, *shape) -> DTensor:
    """The same global tensor in ``shape`` (one ``-1`` allowed), computed on the local pieces.

    Example::

        dt.reshape(2, 3, -1)     # keeps a sharded dim that stays whole or leads a flatten/split
    """
    shape = _shape_arg(shape)
    numel = math.prod(x.shape)
    if shape.count(-1) == 1:
        rest = math.prod(s for s in shape if s != -1)
        shape = tuple(numel // rest if s == -1 and rest else s for s in shape)
    op = f"reshape{shape}"
    if math.prod(shape) != numel or any(s < 0 for s in shape):
        raise RuntimeError(f"DTensor {op}: shape {list(shape)} is invalid for a global tensor of shape {x.shape}")
    if any(isinstance(p, _StridedShard) for p in x.placements):
        no_rule(op, x, why="a _StridedShard placement")
    mesh, out_pl = x.device_mesh, list(x.placements)
    if any(isinstance(p, Shard) for p in x.placements):
        if numel == 0 and tuple(shape) != tuple(x.shape):
            no_rule(op, x, why="an empty tensor changes shape")
        groups = _groups(list(x.shape), list(shape)) if numel else [([d], [d]) for d in range(x.ndim)]
        owner = {d: g for g in groups for d in g[0]}
        for k, p in enumerate(x.placements):
            if not isinstance(p, Shard):
                continue
            gi, gj = owner[p.dim]
            others = {q.dim for m, q in enumerate(x.placements) if m != k and isinstance(q, Shard)}
            lead_out = _lead(gj, shape)
            # only size-1 dims (they hold no rows) may come before the sharded dim in its group
            leads = all(x.shape[d] == 1 for d in gi[:gi.index(p.dim)])
            if lead_out is None or not leads or others & set(gi):
                no_rule(op, x, why=f"sharded dim {p.dim} does not lead its group of dims {gi} -> {gj}")
            inner_in = math.prod(x.shape[d] for d in gi[gi.index(p.dim) + 1:])
            inner_out = math.prod(shape[d] for d in gj[gj.index(lead_out) + 1:])
            n = mesh.size(k)
            for r in range(n):  # every rank's rows must be the same elements before and after
                a, b = _chunk_range(x.shape[p.dim], n, r), _chunk_range(shape[lead_out], n, r)
                if (a[0] * inner_in, a[1] * inner_in) != (b[0] * inner_out, b[1] * inner_out):
                    no_rule(op, x, why=f"the {n} torch.chunk pieces of dim {p.dim} are not pieces of "
                                       f"new dim {lead_out} (size {shape[lead_out]})")
            out_pl[k] = Shard(lead_out)
    local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, out_pl)
    return DTensor(x._local_tensor.reshape(local_shape), mesh, out_pl, shape=shape)


def view(x: DTensor, *shape) -> DTensor:
    """``reshape`` (a DTensor's local piece is always reshaped; torch's ``view`` rules apply).

    Example::

        dt.view(-1, V)
    """
    return reshape(x, *shape)


def permute(x: DTensor, *dims) -> DTensor:
    """Reorder all dims; a ``Shard`` follows its dim.

    Example::

        dt.permute(2, 0, 1)     # Shard(0) -> Shard(1)
    """
    perm = _shape_arg(dims)
    if len(perm) != x.ndim or sorted(d % max(x.ndim, 1) for d in perm) != list(range(x.ndim)):
        raise ValueError(f"DTensor permute: {perm} is not a permutation of the {x.ndim} dims")
    perm = tuple(d % x.ndim for d in perm)
    out_pl = []
    for p in x.placements:
        if isinstance(p, _StridedShard):
            out_pl.append(_StridedShard(perm.index(p.dim), split_factor=p.split_factor))
        elif isinstance(p, Shard):
            out_pl.append(Shard(perm.index(p.dim)))
        else:
            out_pl.append(p)
    shape = tuple(x.shape[d] for d in perm)
    return DTensor(x._local_tensor.permute(*perm), x.device_mesh, out_pl, shape=shape)


def transpose(x: DTensor, *dims) -> DTensor:
    """``Tensor.transpose`` on the global tensor: two dims swap them (torch), none reverse all,
    all of them permute (NumPy).

    Example::

        dt.transpose(0, 1)      # Shard(0) -> Shard(1)
    """
    dims = _shape_arg(dims)
    if len(dims) == 2 and x.ndim >= 2:
        perm = list(range(x.ndim))
        i, j = dims[0] % x.ndim, dims[1] % x.ndim
        perm[i], perm[j] = perm[j], perm[i]
        dims = tuple(perm)
    if not dims:
        dims = tuple(range(x.ndim))[::-1]
    return permute(x, *dims)


def bind(cls) -> None:
    cls.reshape, cls.view, cls.permute, cls.transpose = reshape, view, permute, transpose
    cls.T = property(lambda self: transpose(self), doc="All dims reversed (``transpose()``).")


