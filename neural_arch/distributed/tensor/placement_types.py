"""torch's DTensor placements: how a global tensor lives on one dimension of a ``DeviceMesh``.

* ``Shard(dim)``: split along tensor dimension ``dim`` like ``torch.chunk`` (chunks of
  ``ceil(size / n)`` rows; the last ranks may hold fewer rows, or none).
* ``Replicate()``: every rank of that mesh dimension holds the whole tensor.
* ``Partial(reduce_op="sum")``: every rank holds a term; the global tensor is their sum
  (``"avg"``: their mean) -- e.g. the output of a row-parallel matmul before its all-reduce.

Example::

    from neural_arch.distributed.tensor import Shard, Replicate, Partial
    placements = (Shard(0), Replicate())        # one per mesh dimension
    Shard(0).is_shard(), Partial().reduce_op    # (True, 'sum')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Partial", "Placement", "Replicate", "Shard"]


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
