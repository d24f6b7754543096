"""What every sharding rule shares: the error for a layout without a rule, dimension
normalisation, and the "sum my Replicate operand's gradient" wrapper.

Example::

    from neural_arch.distributed.tensor._sharding_rules import no_rule
    no_rule("softmax(dim=1)", x)   # NotImplementedError naming the op and x's placements
"""

from __future__ import annotations

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.tensor.placement_types import Partial, Replicate, Shard


def describe(*operands) -> str:
    """``[Shard(dim=0), Replicate()] (5, 3)`` for each DTensor operand (other operands by type)."""
    parts = []
    for x in operands:
        if hasattr(x, "placements"):
            parts.append(f"{list(x.placements)} of shape {tuple(x.shape)}")
        elif x is not None:
            parts.append(type(x).__name__)
    return " and ".join(parts)


def no_rule(op: str, *operands, why: str = "") -> None:
    """Raise ``NotImplementedError`` naming ``op`` and the operands' placements (torch raises for an
    op without a sharding strategy too). Never gather silently: the caller decides what to move."""
    hint = f" ({why})" if why else ""
    raise NotImplementedError(
        f"DTensor {op}: no sharding rule for placements {describe(*operands)}{hint}; redistribute the "
        "operand(s) first (e.g. .redistribute(mesh, [Replicate(), ...])) or compute on .to_local()")


def norm_dim(dim: int, ndim: int, op: str) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"DTensor {op}: dim {dim} is out of range for a {ndim}-d tensor")
    return dim % max(ndim, 1)


def sharded_dims(placements) -> set[int]:
    return {p.dim for p in placements if isinstance(p, Shard)}


def has_partial(placements) -> bool:
    return any(isinstance(p, Partial) for p in placements)


def sum_gradient_over(local: Tensor, mesh, mesh_dims) -> Tensor:
    """``local`` unchanged, its gradient summed over ``mesh_dims`` (Megatron's "f").

    A Replicate operand combined with a sharded one gets, on each rank, only the gradient of the
    rows that rank computed: summing over the mesh dims that shard the other operand makes it the
    whole gradient again (and keeps it Replicate)."""
    from neural_arch.distributed.nn.functional import copy_to_tensor_model_parallel_region

    for k in sorted(set(mesh_dims)):
        if mesh.size(k) > 1:
            local = copy_to_tensor_model_parallel_region(local, group=mesh.get_group(k))
    return local


def replicate_placements(mesh) -> tuple:
    return tuple(Replicate() for _ in range(mesh.ndim))
