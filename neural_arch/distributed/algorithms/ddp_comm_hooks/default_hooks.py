"""The basic DDP comm hooks: plain averaging and float16 / bfloat16 compression on the wire.

Each takes ``(process_group, bucket)``: ``process_group`` is the hook's state (None for the
default group) and ``bucket`` a :class:`~neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook.GradBucket`;
each returns a Work whose ``result()`` is the averaged flat gradient buffer.

Example::

    ddp.register_comm_hook(None, fp16_compress_hook)   # half the bytes, float16 rounding
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import (
    GradBucket,
    comm_hook,
    hook_backend,
    then,
)
from neural_arch.distributed.comm.work import ReduceOp, Work

__all__ = ["allreduce_hook", "bf16_compress_hook", "fp16_compress_hook"]


@comm_hook(accepts_prescaled=True, supports_inline=True)
def allreduce_hook(process_group, bucket: GradBucket, async_op: bool = True) -> Work:
    """DDP's default: the average of every rank's gradients (SUM all-reduce of gradients / world).

    The division is folded into the reducer's copy of the gradients into the bucket when the
    bucket says ``prescaled`` (it declares ``accepts_prescaled``): that pass over the data happens
    anyway, while a separate division after the all-reduce would sit on the critical path.
    ``process_group`` is the state argument: a ProcessGroup, a
    backend, or None for the default group. ``async_op=False`` runs the all-reduce on the
    calling thread (the reducer does so for buckets left at the end of backward, which it is
    about to wait for anyway: it saves two thread hand-offs).

    Example::

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)   # what DDP does by default
    """
    backend = hook_backend(process_group)
    buffer = bucket.buffer()
    if not bucket.prescaled:
        buffer *= buffer.dtype.type(1.0 / backend.size)
    return backend.allreduce(buffer, ReduceOp.SUM, async_op=async_op)


def _compress_hook(process_group, bucket: GradBucket, wire_dtype) -> Work:
    """Average ``bucket`` with ``wire_dtype`` on the wire: divide first (the mean cannot overflow
    where a float16 sum could), cast, SUM all-reduce, cast back into the bucket's buffer."""
    backend = hook_backend(process_group)
    buffer = bucket.buffer()
    scale = 1.0 if bucket.prescaled else 1.0 / backend.size
    compressed = (buffer * buffer.dtype.type(scale)).astype(wire_dtype)
    work = backend.allreduce(compressed, ReduceOp.SUM, async_op=True)

    def decompress(done: Work):
        buffer[...] = done.result().astype(buffer.dtype)
        return buffer
    return then(work, decompress)


@comm_hook()
def fp16_compress_hook(process_group, bucket: GradBucket) -> Work:
    """torch's ``fp16_compress_hook``: gradients travel as float16 (half the bytes of float32).

    Example::

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)   # None: the default group
    """
    return _compress_hook(process_group, bucket, np.float16)


@comm_hook()
def bf16_compress_hook(process_group, bucket: GradBucket) -> Work:
    """torch's ``bf16_compress_hook``: gradients travel as bfloat16 (``ml_dtypes.bfloat16`` on NumPy:
    float32's exponent range with an 8-bit mantissa, so no overflow where float16 would).

    Example::

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    """
    import ml_dtypes  # a dependency of neural_arch; imported here to keep importing hooks cheap

    return _compress_hook(process_group, bucket, ml_dtypes.bfloat16)
