"""A sharded gradient reducer (ZeRO-2): gradients are reduce-scattered, bucket by bucket, while
backward runs, so that no rank ever holds the full *averaged* gradient.

Parameters are grouped into buckets in reverse order (the order backward finishes them). Each
bucket is a :class:`~neural_arch.distributed.parallel.sharded.flat.FlatLayout`: when the last
gradient of a bucket is final (a post-accumulate-grad hook), the bucket's local gradients are
copied into one padded flat array, the parameters' ``.grad`` are dropped, and an asynchronous
``reduce_scatter(AVG)`` hands rank ``r`` the averaged slice ``r`` of that bucket. At the end of
backward (a callback queued in the outermost backward) the reducer waits for the outstanding
reductions, fills buckets whose parameters got no gradient with zeros (so every rank runs the
same collectives), and hands every averaged shard to ``on_shard(bucket_index, shard)``.

This reducer is independent of DDP's (one owner per concept: DDP all-reduces whole buckets,
this one reduce-scatters them). Constraints: every rank must build the same buckets (same model,
same order), and a model must not be wrapped by DDP at the same time (its gradients would be
reduced twice).

Example (what :class:`ZeroRedundancyOptimizer` with ``stage=2`` does)::

    reducer = ShardedGradReducer(buckets, group, on_shard=lambda i, g: shards[i].grad.data.__iadd__(g))
    loss.backward()          # reduce-scatters as buckets fill, hands over shards at the end
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core import autograd as _ag
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.parallel.sharded.flat import FlatLayout

__all__ = ["ShardedGradReducer", "queue_outermost_callback"]


def queue_outermost_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the *outermost* backward finishes.

    Activation checkpointing runs a nested backward inside the outer one; a plain
    ``queue_callback`` from a hook that fires inside it would run at the end of the nested pass,
    before the rest of the model has its gradients. (Uses the engine's callback stack: asked the
    core owner for a public ``queue_callback(fn, outermost=True)``.)
    """
    stack = _ag._callback_stack()
    if not stack:
        raise RuntimeError("queue_outermost_callback() may only be called while backward runs")
    stack[0].append(fn)


class ShardedGradReducer:
    """Reduce-scatter the gradients of ``buckets`` (lists of parameters) over ``group``.

    Args:
        buckets: lists of parameters; every rank must pass the same shapes in the same order.
        group: a ProcessGroup (its ``backend`` runs the collectives).
        on_shard: ``on_shard(bucket_index, averaged_shard_array)`` once per bucket per backward.
        reduce_dtype: dtype the reduction runs in (default: the parameters' dtype).
        scatter: False all-reduces each bucket instead (every rank gets the whole averaged flat
            bucket: FSDP's NO_SHARD); ``on_shard`` then receives the full padded flat array.
        replicate_group: after the reduce-scatter, average the shard over this group as well
            (FSDP's HYBRID_SHARD: sharded within a node, replicated across nodes).
    """

    def __init__(self, buckets: Sequence[Sequence], group, on_shard: Callable[[int, object], None],
                 reduce_dtype=None, scatter: bool = True, replicate_group=None):
        self.group = group
        self.scatter = bool(scatter)
        self.replicate_group = replicate_group
        self.world = group.size()
        self.rank = group.rank()
        self.buckets = [list(b) for b in buckets]
        lay_world = self.world if self.scatter else 1
        self.layouts = [FlatLayout([tuple(p.shape) for p in b], lay_world) for b in self.buckets]
        self.on_shard = on_shard
        self.reduce_dtype = reduce_dtype
        self._where = {}  # id(param) -> bucket index
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                if id(p) in self._where:
                    raise ValueError("ShardedGradReducer: a parameter appears in two buckets "
                                     "(tied weights must be passed once)")
                self._where[id(p)] = i
        self._handles = [p.register_post_accumulate_grad_hook(self._hook)
                         for b in self.buckets for p in b if p.requires_grad]
        self._reset()

    # -- per-backward state ---------------------------------------------------------------
    def _reset(self) -> None:
        self._pending = [sum(1 for p in b if p.requires_grad) for b in self.buckets]
        self._inflight: dict = {}  # bucket -> (work, shard output, flat input kept alive)
        self._armed = False

    def _hook(self, p) -> None:
        if not self._armed:
            self._armed = True
            queue_outermost_callback(self._finish)
        i = self._where[id(p)]
        self._pending[i] -= 1
        if self._pending[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        bucket, layout = self.buckets[i], self.layouts[i]
        grads = [p.grad.data if p.grad is not None else None for p in bucket]
        like = next((g for g in grads if g is not None), bucket[0].data)
        xp = _backend.get_array_module(like)
        dtype = self.reduce_dtype or bucket[0].dtype
        flat = layout.flatten(grads, xp, dtype=dtype)
        for p in bucket:
            p.grad = None  # the point of ZeRO-2: the full gradient does not outlive its bucket
        if self.scatter:
            out = xp.empty(layout.shard_size, dtype=dtype)
            work = self.group.backend.reduce_scatter(out, flat, ReduceOp.AVG, async_op=True)
        else:
            out = flat
            work = self.group.backend.allreduce(flat, ReduceOp.AVG, async_op=True)
        self._inflight[i] = (work, out, flat)

    def _finish(self) -> None:
        try:
            # Buckets some of whose parameters got no gradient: reduce them too (zeros), in
            # bucket order, so that every rank issues the same collectives.
            for i in range(len(self.buckets)):
                if i not in self._inflight and self.buckets[i]:  # empty buckets: nothing to reduce
                    self._launch(i)
            for i in sorted(self._inflight):
                work, out, _ = self._inflight[i]
                work.wait()
                if self.replicate_group is not None:
                    self.replicate_group.backend.allreduce(out, ReduceOp.AVG)
                self.on_shard(i, out)
        finally:
            self._reset()

    def remove(self) -> None:
        """Unregister the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []


def plan_buckets(params: Sequence, cap_bytes: float) -> list[list]:
    """Split ``params`` (in backward order already) into buckets of about ``cap_bytes`` each;
    a bucket never mixes dtypes (its flat buffer has one dtype)."""
    buckets: list[list] = []
    size = 0.0
    for p in params:
        nbytes = float(np.prod(p.shape)) * p.dtype.itemsize
        if buckets and buckets[-1] and buckets[-1][-1].dtype == p.dtype and size + nbytes <= cap_bytes:
            buckets[-1].append(p)
            size += nbytes
        else:
            buckets.append([p])
            size = nbytes
    return buckets
