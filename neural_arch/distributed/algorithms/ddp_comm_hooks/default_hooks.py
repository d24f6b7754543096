"""The basic DDP comm hooks: plain averaging and float16 / bfloat16 compression on the wire.

Each takes ``(process_group, bucket)``: ``process_group`` is the hook's state (None for the
default group) and ``bucket`` a :class:`~neural_arch.distributed.ddp.comm_hooks.GradBucket`;
each returns a Work whose ``result()`` is the averaged flat gradient buffer.

Example::

    ddp.register_comm_hook(None, fp16_compress_hook)   # half the bytes, float16 rounding
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.comm.work import ReduceOp, Work
from neural_arch.distributed.ddp.comm_hooks import (
    GradBucket,
    allreduce_hook,
    hook_backend,
    then,
)

__all__ = ["allreduce_hook", "bf16_compress_hook", "fp16_compress_hook"]


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


def fp16_compress_hook(process_group, bucket: GradBucket) -> Work:
    """torch's ``fp16_compress_hook``: gradients travel as float16 (half the bytes of float32)."""
    return _compress_hook(process_group, bucket, np.float16)


def bf16_compress_hook(process_group, bucket: GradBucket) -> Work:
    """torch's ``bf16_compress_hook``: gradients travel as bfloat16 (``ml_dtypes.bfloat16`` on NumPy:
    float32's exponent range with an 8-bit mantissa, so no overflow where float16 would)."""
    import ml_dtypes  # a dependency of neural_arch; imported here to keep importing hooks cheap

    return _compress_hook(process_group, bucket, ml_dtypes.bfloat16)
