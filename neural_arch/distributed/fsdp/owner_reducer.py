"""FSDP's gradient reducer: each gradient goes straight to the ranks that own its elements.

A unit's flat parameter is split into one contiguous shard per rank (see :mod:`neural_arch.distributed.flat_param`), so
every element of every parameter has one *owner* rank. As soon as a parameter's gradient is
final (a post-accumulate-grad hook) it is reduced (``ReduceOp.AVG``), piece by piece, to the
owners of the pieces: a piece of parameter ``k`` lying in rank ``r``'s shard is ``reduce``-d to
``r``, which adds the average into its shard accumulator. Element for element this is a
``reduce_scatter`` of the unit's flat gradient, but no flat gradient is ever built: a rank
holds the gradient of **one parameter** at a time (plus its shard accumulators, 1/N of the
unit each), where a bucketed reduce-scatter holds the unit's whole flat gradient (and, while it
is in flight, the next unit's too). That is the point: FSDP's peak is the sharded state plus
one gathered unit, and the unit's unsharded gradient must not add another unit to it.

The reductions are synchronous, in the order the gradients become final: a gradient is dead
the moment its hook returns (an asynchronous reduction would keep it alive while the next
ones are produced). Every rank runs the same graph, so the same reductions happen in the same
order everywhere (as for every FSDP: the model must use the same parameters on every rank).

``scatter=False`` (FSDP's ``NO_SHARD``, and any shard group of one rank) all-reduces each
gradient instead and accumulates it into the unit's full flat gradient. ``replicate_group``
(``HYBRID_SHARD``) averages each accumulated shard across the replicas at the end of backward.

Example::

    reducer = OwnerGradReducer([unit.params for unit in units], group,
                               on_shard=lambda i, shard: units[i].add_grad(shard, owned=True))
    loss.backward()    # reduces as gradients are final; on_shard(i, shard) at the end
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.distributed.bucketing import BucketSet, queue_outermost_callback
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.flat_param import FlatLayout

__all__ = ["OwnerGradReducer"]


def owner_pieces(layout: FlatLayout, k: int) -> list[tuple[int, int, int, int]]:
    """``(rank, start, stop, at)``: elements ``[start, stop)`` of tensor ``k`` (flattened) lie
    in ``rank``'s shard of ``layout``, from position ``at`` of that shard.

    >>> owner_pieces(FlatLayout([(3,), (4,)], world_size=2), 1)   # shards [0, 4) and [4, 8)
    [(0, 0, 1, 3), (1, 1, 4, 0)]
    """
    off, n, size = int(layout.offsets[k]), int(layout.sizes[k]), int(layout.shard_size)
    pieces = []
    for r in range(off // size, min(layout.world_size, -(-(off + n) // size))):
        lo, hi = max(off, r * size), min(off + n, (r + 1) * size)
        if hi > lo:
            pieces.append((r, lo - off, hi - off, lo - r * size))
    return pieces


class OwnerGradReducer:
    """Reduce each final gradient of ``buckets`` (one list of parameters per FSDP unit) to the
    owners of its elements over ``group``; same interface as
    :class:`~neural_arch.distributed.bucketing.ShardedGradReducer`, and the same
    :class:`~neural_arch.distributed.bucketing.BucketSet` (layouts, where each parameter sits,
    gradient hooks, pending counts), without its flat arrays.

    Args:
        buckets: lists of parameters (one per unit); every rank passes the same shapes in the same order.
        group: the shard group (a ProcessGroup: its ``backend`` runs the collectives).
        on_shard: ``on_shard(bucket_index, shard)`` once per bucket per backward, at its end, with
            this rank's averaged shard (a fresh array the callee may keep).
        reduce_dtype: dtype the reduction runs in (default: the parameters' dtype).
        scatter: False all-reduces instead (``on_shard`` then gets the full padded flat gradient).
        replicate_group: also average the shards over this group at the end (``HYBRID_SHARD``).
        on_ready: ``on_ready(bucket_index)`` when a bucket's gradients are all final (during backward).
        on_final: ``on_final(bucket_index, position)`` when a parameter's gradient is final for
            the first time in a backward, before it is reduced (FSDP frees the parameter's
            gathered values there: nothing in this backward reads them any more).

    Example::

        reducer = OwnerGradReducer([unit.params for unit in units], shard_group,
                                   on_shard=lambda i, shard: units[i].add_grad(shard, owned=True))
        loss.backward()     # each gradient goes to its owners; on_shard(i, shard) at the end
    """

    def __init__(self, buckets, group, on_shard, reduce_dtype=None, scatter: bool = True,
                 replicate_group=None, on_ready=None, on_final=None):
        self.group = group
        self.rank = group.rank()
        self.scatter = bool(scatter)
        self.replicate_group = replicate_group
        self.on_shard = on_shard
        self.on_ready = on_ready
        self.on_final = on_final
        self.reduce_dtype = reduce_dtype
        self.buckets = BucketSet(buckets, group.size() if self.scatter else 1, owner="OwnerGradReducer")
        # only the pieces a rank owns are added to its shard, but every rank joins every reduce
        self._pieces = [[owner_pieces(b.layout, k) for k in range(len(b.params))] for b in self.buckets]
        self.buckets.register_hooks(self._hook)
        self._reset()

    @property
    def layouts(self) -> list[FlatLayout]:
        return self.buckets.layouts

    def remove(self) -> None:
        """Unregister the gradient hooks."""
        self.buckets.remove_hooks()

    def _reset(self) -> None:
        self.buckets.reset()
        self._acc: dict = {}     # bucket -> this rank's shard (or full flat) accumulator
        self._seen: set = set()  # parameters whose gradient was final once this backward
        self._armed = False

    def _accumulator(self, i: int, like):
        acc = self._acc.get(i)
        if acc is None:
            lay = self.buckets[i].layout
            acc = self._acc[i] = _backend.get_array_module(like).zeros(
                lay.shard_size if self.scatter else lay.padded_numel, dtype=like.dtype)
        return acc

    def _hook(self, p) -> None:
        if not self._armed:
            self._armed = True
            queue_outermost_callback(self._finish)
        i, k = self.buckets.locate(p)
        first = id(p) not in self._seen
        if first and self.on_final is not None:
            self.on_final(i, k)
        if p.grad is not None:
            g = p.grad.data
            p.grad = None  # ours from here on: reduced in place, then dropped
            self._reduce(i, k, g)
        # A second final gradient in one backward (a parameter used in two activation-checkpointed
        # calls: each recomputation is a nested backward) was just reduced and added as well.
        if first:
            self._seen.add(id(p))
            bucket = self.buckets[i]
            bucket.pending -= 1
            if bucket.pending == 0 and self.on_ready is not None:
                self.on_ready(i)

    def _reduce(self, i: int, k: int, g) -> None:
        dtype = self.reduce_dtype or g.dtype
        flat = g.reshape(-1)
        if flat.dtype != dtype:
            flat = flat.astype(dtype)
        elif not flat.flags.c_contiguous:  # pragma: no cover - reshape(-1) of a gradient is contiguous
            flat = _backend.get_array_module(flat).ascontiguousarray(flat)
        acc = self._accumulator(i, flat)
        backend = self.group.backend
        if not self.scatter:
            backend.allreduce(flat, ReduceOp.AVG)
            off = self.buckets[i].layout.offsets[k]
            acc[off:off + flat.size] += flat
            return
        for r, a, b, at in self._pieces[i][k]:
            piece = flat[a:b]
            backend.reduce(piece, root=r, op=ReduceOp.AVG)
            if r == self.rank:
                acc[at:at + (b - a)] += piece

    def _finish(self) -> None:
        try:
            for i, bucket in enumerate(self.buckets):
                if not bucket.params or not bucket.expected:
                    continue  # an all-frozen unit keeps .grad None: a zero one would let weight decay move it
                acc = self._acc.pop(i, None)
                if acc is None:  # no gradient reached this unit: a zero shard, as torch's FSDP
                    lay, first = bucket.layout, bucket.params[0]
                    acc = _backend.get_array_module(first.data).zeros(
                        lay.shard_size if self.scatter else lay.padded_numel,
                        dtype=self.reduce_dtype or first.dtype)
                if self.replicate_group is not None:
                    self.replicate_group.backend.allreduce(acc, ReduceOp.AVG)
                self.on_shard(i, acc)
        finally:
            self._reset()

