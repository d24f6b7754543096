"""``embedding`` on DTensors (torch's ``_ops/_embedding_ops.py``).

Rules, per mesh dimension (weight ``(V, D)``, indices of any shape):

==================  ==============  ============================================================
weight              indices         output
==================  ==============  ============================================================
``Replicate``       ``Replicate``   ``Replicate``
``Replicate``       ``Shard(d)``    ``Shard(d)`` (the weight's gradient is summed over the dim)
``Shard(1)``        ``Replicate``   ``Shard(-1)`` (each rank its embedding columns)
``Shard(0)``        ``Replicate``   ``Partial()``: each rank looks up the ids it holds rows for and
                                    zeroes the others (torch's ``MaskPartial``), without a sync
``Partial``         ``Replicate``   ``Partial`` (a lookup is linear in the table)
==================  ==============  ============================================================

Indices may be a DTensor or a plain array / Tensor (then read as ``Replicate``: every rank holds
all of them). Ids outside ``[0, V)`` raise ``IndexError`` on NumPy; on a device (where checking
would wait for it) a row-sharded table gives them zero rows, like a masked lookup.

Example::

    out = embedding(idx, wte)       # wte Shard(0) over the vocabulary -> out Partial()
    out.redistribute(mesh, [Replicate()]).full_tensor()   # == F.embedding(idx, full wte)
"""

from __future__ import annotations

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.ops_loss import _eager_checks
from neural_arch.core.ops_nn import embedding as _embedding
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.tensor._api import DTensor, compute_local_shape_and_global_offset
from neural_arch.distributed.tensor._sharding_rules import no_rule, sum_gradient_over
from neural_arch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

__all__ = ["embedding"]


def embedding(indices, weight: DTensor) -> DTensor:
    """Rows of the DTensor ``weight`` ``(V, D)`` picked by integer ``indices`` (rules above).

    Example::

        out = embedding(idx, distribute_tensor(wte, mesh, [Shard(1)]))   # out Shard(-1)
    """
    if not isinstance(weight, DTensor) or weight.ndim != 2:
        raise TypeError(f"DTensor embedding: weight must be a 2-d DTensor, got {type(weight).__name__}")
    mesh = weight.device_mesh
    if isinstance(indices, DTensor):
        if indices.device_mesh != mesh:
            raise ValueError("DTensor embedding: indices and weight live on different meshes")
        idx_pl, idx_shape, idx = indices.placements, tuple(indices.shape), indices.to_local().data
    else:
        idx = indices.data if isinstance(indices, Tensor) else indices
        idx = _xp(weight.to_local().data).asarray(idx)
        idx_pl, idx_shape = tuple(Replicate() for _ in range(mesh.ndim)), tuple(idx.shape)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"DTensor embedding: indices must be integers, got dtype {idx.dtype}")
    out_ndim = len(idx_shape) + 1
    out_pl, row_sharded, sum_over = [], False, []
    for k, (wp, ip) in enumerate(zip(weight.placements, idx_pl)):
        if isinstance(wp, _StridedShard) or isinstance(ip, (Partial, _StridedShard)):
            no_rule("embedding", indices, weight)
        if isinstance(ip, Shard):
            if not isinstance(wp, Replicate):
                no_rule("embedding", indices, weight, why=f"mesh dim {k} shards both the ids and the table")
            out_pl.append(Shard(ip.dim))
            sum_over.append(k)
        elif isinstance(wp, Shard) and wp.dim == 1:
            out_pl.append(Shard(out_ndim - 1))
        elif isinstance(wp, Shard):
            out_pl.append(Partial())
            row_sharded = True
        else:
            out_pl.append(wp)  # Replicate or Partial
    xp = _xp(idx)
    vocab = weight.shape[0]
    if _eager_checks(xp) and idx.size and (int(idx.min()) < 0 or int(idx.max()) >= vocab):
        raise IndexError(f"DTensor embedding: indices must be in [0, {vocab}), got min {int(idx.min())}, "
                         f"max {int(idx.max())}")
    w = sum_gradient_over(weight.to_local(), mesh, sum_over)
    if not w.data.size:  # no rows or no columns here: zeros, tied to the empty piece (a defined gradient)
        local = w.sum() * 0.0 + Tensor._wrap(xp.zeros(tuple(idx.shape) + (w.shape[1],), dtype=w.dtype))
    elif row_sharded:
        (rows, _), (start, _) = compute_local_shape_and_global_offset(weight.shape, mesh, weight.placements)
        mine = (idx >= start) & (idx < start + rows)
        local = _embedding(xp.where(mine, idx - start, 0), w)
        local = local * Tensor._wrap(mine.astype(local.dtype)[..., None])
    else:
        local = _embedding(idx, w)
    return DTensor(local, mesh, out_pl, shape=idx_shape + (weight.shape[1],))
