"""A sharded gradient reducer (ZeRO-2): gradients are reduce-scattered, bucket by bucket, while
backward runs, so that no rank ever holds the full *averaged* gradient.

Parameters are grouped into buckets in reverse order (the order backward finishes them). Each
bucket is a :class:`~neural_arch.distributed.flat_param.FlatLayout`: as each
gradient is final (a post-accumulate-grad hook) it is copied into the bucket's padded flat
array and the parameter's ``.grad`` is dropped at once (so a bucket costs one copy of its
gradients, not two); when the last one is in, an asynchronous ``reduce_scatter(AVG)`` hands
rank ``r`` the averaged slice ``r`` of that bucket, ``on_ready(bucket_index)`` is called (FSDP
frees the unit's gathered parameters there), and the flat array is dropped as soon as the
reduce-scatter completes. At the end of
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
from neural_arch.distributed.flat_param import FlatLayout

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


class BucketGradHooks:
    """What both sharded gradient reducers share: the buckets (one list of parameters each), their
    flat layouts, where each parameter sits, and one post-accumulate-grad hook per parameter.
    Subclasses define ``_hook(param)`` and ``_reset()`` (the per-backward state).

    Args: see :class:`ShardedGradReducer`.
    """

    def __init__(self, buckets: Sequence[Sequence], group, on_shard: Callable[[int, object], None],
                 reduce_dtype=None, scatter: bool = True, replicate_group=None,
                 on_ready: Callable[[int], None] | None = None):
        self.group = group
        self.scatter = bool(scatter)
        self.replicate_group = replicate_group
        self.rank = group.rank()
        self.buckets = [list(b) for b in buckets]
        lay_world = group.size() if self.scatter else 1
        self.layouts = [FlatLayout([tuple(p.shape) for p in b], lay_world) for b in self.buckets]
        self.on_shard = on_shard
        self.on_ready = on_ready
        self.reduce_dtype = reduce_dtype
        self._where = {}  # id(param) -> (bucket index, position in the bucket)
        for i, bucket in enumerate(self.buckets):
            for k, p in enumerate(bucket):
                if id(p) in self._where:
                    raise ValueError(f"{type(self).__name__}: a parameter appears in two buckets "
                                     "(tied weights must be passed once)")
                self._where[id(p)] = (i, k)
        self._handles = [p.register_post_accumulate_grad_hook(self._hook)
                         for b in self.buckets for p in b if p.requires_grad]
        self._reset()

    def remove(self) -> None:
        """Unregister the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []


class ShardedGradReducer(BucketGradHooks):
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
        on_ready: ``on_ready(bucket_index)`` right after a bucket's gradients are all final and
            its reduction was started (during backward).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.world = self.group.size()

    # -- per-backward state ---------------------------------------------------------------
    def _reset(self) -> None:
        self._pending = [sum(1 for p in b if p.requires_grad) for b in self.buckets]
        self._inflight: dict = {}  # bucket -> (work, shard output, [flat input until completion])
        self._flats: dict = {}  # bucket -> flat gradient array being filled
        self._late: dict = {}   # bucket -> gradients final after the bucket launched (see _hook)
        self._armed = False

    def _flat(self, i: int, like):
        flat = self._flats.get(i)
        if flat is None:
            xp = _backend.get_array_module(like)
            flat = self._flats[i] = xp.zeros(self.layouts[i].padded_numel,
                                             dtype=self.reduce_dtype or self.buckets[i][0].dtype)
        return flat

    def _hook(self, p) -> None:
        if not self._armed:
            self._armed = True
            queue_outermost_callback(self._finish)
        i, k = self._where[id(p)]
        if i in self._inflight:
            # A second final gradient in one backward: the parameter is used inside two
            # activation-checkpointed calls (each recomputation is a nested backward). Keep it
            # aside; _finish reduces it in one more collective (every rank runs the same graph).
            if p.grad is not None:
                lay = self.layouts[i]
                late = self._late.get(i)
                if late is None:
                    xp = _backend.get_array_module(p.grad.data)
                    late = self._late[i] = xp.zeros(lay.padded_numel, dtype=self.reduce_dtype or p.dtype)
                late[lay.offsets[k]:lay.offsets[k] + lay.sizes[k]] += p.grad.data.reshape(-1)
                p.grad = None
            return
        if p.grad is not None:
            # Copy into the bucket now and drop .grad: the full gradient of a parameter never
            # outlives the moment it is final (the point of ZeRO-2), and a bucket is one copy.
            lay = self.layouts[i]
            off, n = lay.offsets[k], lay.sizes[k]
            self._flat(i, p.grad.data)[off:off + n] = p.grad.data.reshape(-1)
            p.grad = None
        self._pending[i] -= 1
        if self._pending[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        bucket, layout = self.buckets[i], self.layouts[i]
        for k, p in enumerate(bucket):
            if p.grad is not None:  # only a bucket launched at the end (some grads missing)
                off, n = layout.offsets[k], layout.sizes[k]
                self._flat(i, p.grad.data)[off:off + n] = p.grad.data.reshape(-1)
                p.grad = None
        flat = self._flat(i, bucket[0].data)
        del self._flats[i]
        xp = _backend.get_array_module(flat)
        if self.scatter:
            out = xp.empty(layout.shard_size, dtype=flat.dtype)
            work = self.group.backend.reduce_scatter(out, flat, ReduceOp.AVG, async_op=True)
            keep = [flat]
            del flat
            # drop the flat input the moment the reduce-scatter is done, not at the end of backward
            work.add_done_callback(lambda _w, keep=keep: keep.clear())
        else:
            out = flat
            work = self.group.backend.allreduce(flat, ReduceOp.AVG, async_op=True)
            keep = []
        self._inflight[i] = (work, out, keep)
        if self.on_ready is not None:
            self.on_ready(i)

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
            for i in sorted(self._late):
                late = self._late[i]
                if self.scatter:
                    out = _backend.get_array_module(late).empty(self.layouts[i].shard_size, dtype=late.dtype)
                    self.group.backend.reduce_scatter(out, late, ReduceOp.AVG)
                else:
                    out = late
                    self.group.backend.allreduce(late, ReduceOp.AVG)
                if self.replicate_group is not None:
                    self.replicate_group.backend.allreduce(out, ReduceOp.AVG)
                self.on_shard(i, out)
        finally:
            self._reset()

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
