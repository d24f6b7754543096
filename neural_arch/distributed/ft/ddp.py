"""``DistributedDataParallel`` across fault-tolerant replicas (torchft's ``DistributedDataParallel``).

Gradients are averaged across the current quorum in **buckets**, the package's one bucketing
concept (:mod:`neural_arch.distributed.bucketing`, the same plan and :class:`~neural_arch.distributed.bucketing.BucketSet`
as DDP and ZeRO-2): torch's rule (reverse registration order, one dtype per bucket, a bucket
closes once it holds ``bucket_cap_mb``, the first one ``first_bucket_mb``). A parameter's
post-accumulate-grad hook copies its gradient into its bucket; a complete bucket is averaged
through :meth:`~neural_arch.distributed.ft.manager.Manager.allreduce` at once (in plan order, so
every replica issues the same collectives), and the averages are written back to ``.grad``. So a
step costs one collective per bucket, not one per parameter, and it is still one transaction: a
failure in any bucket is recorded by the manager, the remaining buckets are skipped, and
``should_commit()`` is False on every member.

At the end of backward, buckets whose parameters got no gradient here are reduced too (with zeros
in those slots): every replica runs the same collectives whatever its data. Such a parameter's
``.grad`` is set to the quorum's average when some replica had a gradient for it (the average is
nonzero), and left ``None`` otherwise -- the same decision on every replica.

Inside a tensor-parallel replica (each rank runs ``Manager(shard=(tp_rank, tp_size))``) it wraps
the rank's tensor-parallel model as is: the parameters' Tensor faces are the rank's local pieces, so
each rank averages its own slices (and its copies of the replicated parameters) over its lane, with
the ranks holding the same slices in the other replicas (docs/fault_tolerance.md, "Sharded
replicas").

One backward per step: a second backward before the optimizer step would all-reduce accumulated
gradients again. Parameters are not broadcast at construction: a replica that joins late heals in
its first ``start_quorum`` instead.
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.bucketing import BucketSet, plan_buckets, queue_outermost_callback
from neural_arch.nn.module import Module

__all__ = ["DistributedDataParallel"]

MB = 1024 * 1024


class DistributedDataParallel(Module):
    """Wrap ``module``; gradients are averaged across the quorum during backward, bucket by bucket.

    Args:
        manager: the replica's :class:`~neural_arch.distributed.ft.manager.Manager`.
        module: the model.
        bucket_cap_mb: a bucket closes once it holds this many MB (DDP's default, 25).
        first_bucket_mb: the first bucket closes at this size (1 MB, like DDP), so the first
            collective starts early in backward.

    Example::

        model = DistributedDataParallel(manager, nn.Linear(4, 2))
        manager.start_quorum()
        loss_fn(model(x)).backward()      # every .grad is now the quorum's average
        model.bucket_plan                 # [[1, 0]]: parameter indices per bucket (one collective each)
    """

    def __init__(self, manager, module: Module, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0):
        super().__init__()
        self.module = module
        object.__setattr__(self, "manager", manager)
        params = [p for p in module.parameters() if p.requires_grad]
        plan = plan_buckets([(p.numel(), p.dtype) for p in params], int(float(bucket_cap_mb) * MB),
                            int(float(first_bucket_mb) * MB))
        #: parameter indices (among those that require a gradient) per bucket, in launch order
        self.bucket_plan = plan
        buckets = BucketSet([[params[i] for i in idx] for idx in plan], owner="ft.DistributedDataParallel")
        object.__setattr__(self, "_buckets", buckets)
        buckets.register_hooks(self._on_grad)
        self._armed = False

    def _on_grad(self, param) -> None:
        if not self._armed:
            self._armed = True
            queue_outermost_callback(self._finish)
        i, k = self._buckets.locate(param)
        bucket = self._buckets[i]
        if param.grad is not None:
            self._flat(bucket, param.grad.data)
            bucket.put(k, param.grad.data)
        bucket.pending -= 1
        if bucket.pending == 0:
            self._buckets.launch_ready(self._reduce)

    def _flat(self, bucket, like):
        if bucket.flat is None:
            bucket.allocate(_backend.get_array_module(like), bucket.params[0].dtype)
        return bucket.flat

    def _reduce(self, bucket) -> None:
        flat = self._flat(bucket, bucket.params[0].data)
        self.manager.allreduce(flat)          # in place; after a failure in this step: a no-op
        for p, view in zip(bucket.params, bucket.views):
            if p.grad is not None:
                p.grad.data[...] = view
            elif view.any():                  # another replica had a gradient for it
                p.grad = Tensor(view.copy())
        bucket.release()

    def _finish(self) -> None:
        try:
            self._buckets.launch_rest(self._reduce)
        finally:
            self._buckets.reset()
            for bucket in self._buckets:
                bucket.release()
            self._armed = False

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
