"""Seed 003's ``CommunicationOptimizer``: a thin facade over Top-K compression and hierarchical all-reduce.

Everything it does is available underneath: :mod:`.ddp_comm_hooks.topk_hook` (Top-K with error
feedback, as a DDP comm hook) and :mod:`.hierarchical` (reduce in the host, all-reduce among host
leaders, broadcast in the host). This class keeps the seed's spelling working::

    comm_opt = CommunicationOptimizer(compression_ratio=0.01, bucket_size_mb=25, enable_overlap=True)
    compressed_grad = comm_opt.all_reduce_compressed(gradient)        # Top 1%, error feedback
    optimized_grad = comm_opt.hierarchical_all_reduce(gradient, intra_node_group=intra_group,
                                                      inter_node_group=inter_group)
    ddp = comm_opt.wrap(model)            # DDP with the Top-K hook and the bucket size above

Both reductions return the **mean** over the ranks (they are for gradients), written into the
tensor given and returned, like ``all_reduce``. Top-K is lossy per step but loses nothing over
steps: what a rank did not send is kept (per ``key``) and added to its next call.
"""

from __future__ import annotations

from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import GradBucket, hook_backend
from neural_arch.distributed.comm.work import ReduceOp

__all__ = ["CommunicationOptimizer"]


class CommunicationOptimizer:
    """Gradient communication with Top-K compression and hierarchical all-reduce (seed 003).

    Args:
        compression_ratio: share of entries each rank sends in :meth:`all_reduce_compressed`
            (0.01: the top 1% by magnitude); ``None`` or ``1.0`` sends everything (plain mean).
        bucket_size_mb: DDP bucket size used by :meth:`wrap`.
        enable_overlap: :meth:`wrap` overlaps bucket reductions with backward (DDP's buckets);
            ``False`` reduces every gradient in one bucket at the end of backward.
        process_group: the group to reduce over (None: the world).

    Example (no process group: a world of one, where the mean is the tensor itself)::

        >>> import numpy as np
        >>> opt = CommunicationOptimizer(compression_ratio=0.5)
        >>> opt
        CommunicationOptimizer(compression_ratio=0.5, bucket_size_mb=25.0, enable_overlap=True)
        >>> opt.all_reduce_compressed(np.array([4.0, -1.0, 0.5, 3.0])).tolist()
        [4.0, -1.0, 0.5, 3.0]
    """

    def __init__(self, compression_ratio: float | None = 0.01, bucket_size_mb: float = 25.0,
                 enable_overlap: bool = True, process_group=None):
        from neural_arch.distributed.algorithms.ddp_comm_hooks.topk_hook import TopKState

        ratio = 1.0 if compression_ratio is None else float(compression_ratio)
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"CommunicationOptimizer(compression_ratio={compression_ratio}): use a share in (0, 1], "
                             "e.g. 0.01 to send the top 1% of entries, or None for no compression")
        if not float(bucket_size_mb) > 0:
            raise ValueError(f"CommunicationOptimizer(bucket_size_mb={bucket_size_mb}): must be > 0")
        self.compression_ratio = ratio
        self.bucket_size_mb = float(bucket_size_mb)
        self.enable_overlap = bool(enable_overlap)
        self.process_group = process_group
        self.topk_state = TopKState(ratio=ratio, process_group=process_group)
        self._keys: dict = {}  # key -> the bucket index its residual is filed under
        #: numbers sent by the last compressed call (indices + values) and the tensor's size
        self.last_sent = (0, 0)

    def all_reduce_compressed(self, tensor, key=None):
        """Average ``tensor`` over the ranks sending only its top ``compression_ratio`` entries.

        Written into ``tensor`` (a Tensor or a contiguous float array) and returned. The
        residual of what was not sent is kept per ``key`` (default: the tensor's shape and
        dtype; pass a name when several gradients share a shape) and added next time.
        """
        from neural_arch.distributed.algorithms.ddp_comm_hooks.topk_hook import topk_hook
        from neural_arch.distributed.resolve import _buf

        array = _buf(tensor)
        if array.dtype.kind != "f":
            raise TypeError(f"all_reduce_compressed: needs a floating tensor (a gradient), got {array.dtype}")
        from neural_arch.distributed import groups as _groups

        if self.process_group is None and not _groups.is_initialized():
            return tensor  # plain python: a world of one
        backend = hook_backend(self.process_group)
        if backend.size == 1:
            return tensor
        if self.compression_ratio >= 1.0:  # nothing to drop: a plain mean
            array *= array.dtype.type(1.0 / backend.size)
            backend.allreduce(array, ReduceOp.SUM)
            self.last_sent = (array.size, array.size)
            return tensor
        flat = array.reshape(-1)
        if key is None:
            key = (tuple(array.shape), str(array.dtype))
        index = self._keys.setdefault(key, len(self._keys))
        bucket = GradBucket(index, flat, [(0, flat.size, array.shape)], [key], last=True)
        result = topk_hook(self.topk_state, bucket).result()
        if result is not flat:
            flat[...] = result
        self.last_sent = self.topk_state.last_sent
        return tensor

    def hierarchical_all_reduce(self, tensor, intra_node_group=None, inter_node_group=None, op=ReduceOp.AVG,
                                algorithm: str = "auto", cross_node_group=None):
        """Average ``tensor`` (in place, returned) hierarchically: the leader form (reduce in the
        host, all-reduce among host leaders, broadcast) or the 2-D form (reduce-scatter in the host,
        all-reduce of each slice across hosts, all-gather), see :mod:`.hierarchical`; groups
        default to :func:`~.hierarchical.host_groups`'s."""
        from neural_arch.distributed.algorithms.hierarchical import hierarchical_all_reduce

        return hierarchical_all_reduce(tensor, op, intra_node_group=intra_node_group,
                                       inter_node_group=inter_node_group, algorithm=algorithm,
                                       cross_node_group=cross_node_group)

    def ddp_kwargs(self) -> dict:
        """Keyword arguments for ``DistributedDataParallel`` that follow this configuration."""
        if self.enable_overlap:
            return {"bucket_cap_mb": self.bucket_size_mb, "process_group": self.process_group}
        # one bucket holding everything, reduced when backward is over: no overlap
        return {"bucket_cap_mb": 1e6, "first_bucket_mb": 1e6, "process_group": self.process_group}

    def wrap(self, module, **ddp_kwargs):
        """``DistributedDataParallel(module)`` with this configuration's buckets and, when
        ``compression_ratio < 1``, the Top-K comm hook (error feedback per bucket)."""
        from neural_arch.distributed.algorithms.ddp_comm_hooks.topk_hook import TopKState, topk_hook
        from neural_arch.distributed.ddp.distributed_data_parallel import DistributedDataParallel

        ddp = DistributedDataParallel(module, **{**self.ddp_kwargs(), **ddp_kwargs})
        if self.compression_ratio < 1.0:
            ddp.register_comm_hook(TopKState(ratio=self.compression_ratio, process_group=self.process_group),
                                   topk_hook)
        return ddp

    def __repr__(self) -> str:
        return (f"CommunicationOptimizer(compression_ratio={self.compression_ratio}, "
                f"bucket_size_mb={self.bucket_size_mb}, enable_overlap={self.enable_overlap})")
