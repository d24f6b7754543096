"""torch's DTensor placements: how a global tensor lives on one dimension of a ``DeviceMesh``.

* ``Shard(dim)``: split along tensor dimension ``dim`` like ``torch.chunk`` (chunks of
  ``ceil(size / n)`` rows; the last ranks may hold fewer rows, or none).
* ``Replicate()``: every rank of that mesh dimension holds the whole tensor.
* ``Partial(reduce_op="sum")``: every rank holds a term; the global tensor is their sum
  (``"avg"``: their mean) -- e.g. the output of a row-parallel matmul before its all-reduce.
* ``_StridedShard(dim, split_factor=k)`` (torch's private placement): a ``Shard`` taken *inside*
  the ``k`` pieces another mesh dimension already cut along ``dim`` -- what ``fully_shard`` over
  ``dp`` makes of a column-parallel weight on a ``(dp, tp)`` mesh: ``(_StridedShard(0,
  split_factor=tp), Shard(0))``; every rank still holds one box (tp chunk, then its dp chunk).

Example::

    from neural_arch.distributed.tensor import Shard, Replicate, Partial
    placements = (Shard(0), Replicate())        # one per mesh dimension
    Shard(0).is_shard(), Partial().reduce_op    # (True, 'sum')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Partial", "Placement", "Replicate", "Shard"]  # and torch's private _StridedShard


class Placement:
    """Base of the placements (torch's ``Placement``): the ``is_*`` queries.

    Example::

        >>> [p.is_shard() for p in (Shard(0), Replicate(), Partial())]
        [True, False, False]
    """

    def is_shard(self, dim: int | None = None) -> bool:
        return isinstance(self, Shard) and (dim is None or self.dim == dim)

    def is_replicate(self) -> bool:
        return isinstance(self, Replicate)

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return isinstance(self, Partial) and (reduce_op is None or self.reduce_op == reduce_op)


@dataclass(frozen=True)
class Shard(Placement):
    """Split along tensor dimension ``dim`` (``torch.chunk`` sizes: uneven tails allowed).

    Example::

        >>> Shard(1), Shard(1).is_shard(dim=1), Shard(1) == Shard(1)
        (Shard(dim=1), True, True)
    """

    dim: int = -1

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise TypeError(f"Shard(dim={self.dim!r}): dim must be an int tensor dimension")

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"


@dataclass(frozen=True, kw_only=True)
class _StridedShard(Shard):
    """Split along ``dim`` *within* each of the ``split_factor`` pieces that the mesh dimensions
    sharding ``dim`` as plain ``Shard`` cut first (torch's ``_StridedShard``, as FSDP2 over the
    ``dp`` dimension of a tensor-parallel mesh makes it). The product of the sizes of those mesh
    dimensions must be ``split_factor``. On the ``(dp, tp)`` mesh, ``(_StridedShard(0,
    split_factor=tp), Shard(0))`` gives rank ``(d, t)`` the ``torch.chunk`` chunk ``d`` of the
    ``torch.chunk`` chunk ``t`` of the rows: one box at offset ``tp offset + dp chunk start``.

    Example::

        >>> _StridedShard(0, split_factor=2), _StridedShard(0, split_factor=2).is_shard(0)
        (_StridedShard(dim=0, sf=2), True)
    """

    split_factor: int

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.split_factor, bool) or not isinstance(self.split_factor, int) or self.split_factor < 1:
            raise TypeError(f"_StridedShard(split_factor={self.split_factor!r}): split_factor must be an int >= 1")

    def __repr__(self) -> str:
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"


@dataclass(frozen=True)
class Replicate(Placement):
    """Every rank of the mesh dimension holds the whole tensor.

    Example::

        >>> Replicate().is_replicate()
        True
    """

    def __repr__(self) -> str:
        return "Replicate()"


_PARTIAL_OPS = ("sum", "avg")


@dataclass(frozen=True)
class Partial(Placement):
    """Every rank holds a term of the global tensor: their ``reduce_op`` ("sum" or "avg").

    Example::

        >>> Partial(), Partial("avg").reduce_op, Partial().is_partial()
        (Partial(sum), 'avg', True)
    """

    reduce_op: str = "sum"

    def __post_init__(self):
        op = str(getattr(self.reduce_op, "name", self.reduce_op)).lower()
        if op not in _PARTIAL_OPS:
            raise ValueError(f"Partial(reduce_op={self.reduce_op!r}): only {_PARTIAL_OPS} are supported "
                             "(they are linear, so they have a gradient)")
        object.__setattr__(self, "reduce_op", op)

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"
