"""Reductions and normalisations on a DTensor (torch's ``_ops/_math_ops.py``): ``sum`` / ``mean``,
``softmax`` / ``log_softmax``, ``layer_norm``.

Rules, per mesh dimension:

* ``sum`` / ``mean`` over dims ``D``: ``Shard(d)`` with ``d`` in ``D`` -> ``Partial("sum")`` (each
  rank sums its rows; ``mean`` divides by the *global* count, so uneven shards stay exact);
  ``Shard(d)`` elsewhere -> ``Shard`` of ``d``'s new index; ``Replicate`` stays; ``Partial`` stays
  (both are linear).
* ``softmax`` / ``log_softmax`` over ``dim``: ``dim`` must not be sharded and the input must not be
  ``Partial``; the placements are kept.
* ``layer_norm`` over the trailing ``normalized_shape``: those dims unsharded, no ``Partial``;
  ``weight`` / ``bias`` are Replicate DTensors whose gradients are summed over the mesh dims that
  shard the input (each rank saw only its rows).

Example::

    dt.sum(dim=0)          # dt Shard(0) -> Partial(); .full_tensor() == x.sum(0)
    dt.softmax(dim=-1)     # dt Shard(0) -> Shard(0)
"""

from __future__ import annotations

import builtins
import math

from neural_arch.core import ops_activation as _act
from neural_arch.core.ops_nn import layer_norm as _layer_norm
from neural_arch.distributed.tensor._api import DTensor
from neural_arch.distributed.tensor._sharding_rules import (
    has_partial,
    no_rule,
    norm_dim,
    sharded_dims,
    sum_gradient_over,
)
from neural_arch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

__all__ = ["layer_norm", "log_softmax", "mean", "softmax", "sum"]


def _reduce_dims(dim, ndim: int, op: str) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    normed = [norm_dim(d, ndim, op) for d in dims]
    if len(set(normed)) != len(normed):  # torch and NumPy refuse it; a silent dedup would hide a typo
        raise ValueError(f"DTensor {op}(dim={dim}): a dim appears more than once in the list of dims")
    return tuple(sorted(normed))


def _reduction(x: DTensor, dim, keepdim: bool, op: str, mean: bool) -> DTensor:
    dims = _reduce_dims(dim, x.ndim, op)
    if any(isinstance(p, _StridedShard) and p.dim in dims for p in x.placements):
        no_rule(f"{op}(dim={dim})", x, why="reducing over a _StridedShard dim")
    out_pl = []
    for p in x.placements:
        if isinstance(p, Shard) and p.dim in dims:
            out_pl.append(Partial("sum"))
        elif isinstance(p, Shard) and not keepdim:
            shift = builtins.sum(1 for d in dims if d < p.dim)
            out_pl.append(type(p)(p.dim - shift, split_factor=p.split_factor) if isinstance(p, _StridedShard)
                          else Shard(p.dim - shift))
        else:
            out_pl.append(p)
    shape = [1 if d in dims else s for d, s in enumerate(x.shape)] if keepdim else \
        [s for d, s in enumerate(x.shape) if d not in dims]
    local = x._local_tensor.sum(dim=dims, keepdim=keepdim) if dims else x._local_tensor * 1.0
    if mean:
        count = math.prod(x.shape[d] for d in dims)
        # the global count, not the local one: the Partial terms then add up to the global mean
        local = local * (1.0 / count if count else math.nan)
    return DTensor(local, x.device_mesh, out_pl, shape=tuple(shape))


def sum(x: DTensor, dim=None, keepdim: bool = False) -> DTensor:
    """Sum over ``dim`` (None: all); a sharded reduced dim makes the output ``Partial``.

    Example::

        dt.sum(dim=1, keepdim=True).full_tensor()   # == x.sum(1, keepdim=True)
    """
    return _reduction(x, dim, keepdim, "sum", mean=False)


def mean(x: DTensor, dim=None, keepdim: bool = False) -> DTensor:
    """Mean over ``dim`` (None: all); a sharded reduced dim makes the output ``Partial``.

    Example::

        dt.mean().full_tensor()   # == x.mean(), exact for uneven shards
    """
    return _reduction(x, dim, keepdim, "mean", mean=True)


def _along(x: DTensor, dim, op: str, fn) -> DTensor:
    d = norm_dim(dim, x.ndim, op)
    if d in sharded_dims(x.placements) or has_partial(x.placements):
        no_rule(f"{op}(dim={dim})", x, why=f"{op} needs the whole of dim {d} and no Partial sum on each rank")
    return DTensor(fn(x._local_tensor, axis=d), x.device_mesh, x.placements, shape=x.shape)


def softmax(x: DTensor, dim: int = -1) -> DTensor:
    """Softmax over an unsharded ``dim``; placements kept.

    Example::

        dt.softmax(dim=-1)   # dt Shard(0) -> Shard(0)
    """
    return _along(x, dim, "softmax", _act.softmax)


def log_softmax(x: DTensor, dim: int = -1) -> DTensor:
    """Log-softmax over an unsharded ``dim``; placements kept.

    Example::

        dt.log_softmax(dim=1)
    """
    return _along(x, dim, "log_softmax", _act.log_softmax)


def layer_norm(x: DTensor, normalized_shape, weight: DTensor | None = None, bias: DTensor | None = None,
               eps: float = 1e-5) -> DTensor:
    """``F.layer_norm`` of a DTensor whose trailing ``normalized_shape`` dims are unsharded.

    ``weight`` / ``bias`` (or None) are DTensors on the same mesh, ``Replicate`` everywhere (torch's
    rule for a norm's parameters); their gradients come out whole on every rank.

    Example::

        y = layer_norm(dt, (C,), w, b)   # dt Shard(0) (B, T, C) -> Shard(0); w, b Replicate
    """
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    tail = tuple(range(x.ndim - len(ns), x.ndim))
    op = f"layer_norm(normalized_shape={ns})"
    if tuple(x.shape[x.ndim - len(ns):]) != ns:
        raise ValueError(f"DTensor {op}: the input's trailing dims {tuple(x.shape)} are not {ns}")
    if sharded_dims(x.placements) & set(tail) or has_partial(x.placements):
        no_rule(op, x, why="the normalized dims must be whole on each rank and the input not Partial")
    params = []
    along = [k for k, p in enumerate(x.placements) if isinstance(p, Shard)]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            params.append(None)
            continue
        if not isinstance(t, DTensor) or t.device_mesh != x.device_mesh:
            raise TypeError(f"DTensor {op}: {name} must be a DTensor on the input's mesh (got "
                            f"{type(t).__name__}); distribute_tensor(..., [Replicate()] * mesh.ndim)")
        if any(not isinstance(p, Replicate) for p in t.placements):
            no_rule(op, x, t, why=f"{name} must be Replicate on every mesh dim")
        params.append(sum_gradient_over(t._local_tensor, x.device_mesh, along))
    local = _layer_norm(x._local_tensor, ns, params[0], params[1], eps)
    return DTensor(local, x.device_mesh, x.placements, shape=x.shape)


def bind(cls) -> None:
    cls.sum, cls.mean, cls.softmax, cls.log_softmax = sum, mean, softmax, log_softmax

