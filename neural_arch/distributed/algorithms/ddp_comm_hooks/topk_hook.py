"""Top-K gradient sparsification with error feedback (seed 003's "compressed allreduce").

Each rank sends only the ``k = ceil(ratio * n)`` largest-magnitude entries of its bucket
(indices and values, all-gathered); everything it did not send stays in a local **residual**
that is added to the next step's gradient, so over steps nothing is lost::

    acc      = grad / world + residual          (this rank's share of the mean, plus what is owed)
    sent     = acc at its k largest |entries|   (zeros elsewhere)
    residual = acc - sent                       (exactly: sent + residual == acc)
    result   = sum over ranks of sent           (scattered back by index)

Example::

    state = TopKState(ratio=0.01)
    ddp.register_comm_hook(state, topk_hook)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch import backend as _xpmod
from neural_arch.distributed.comm.work import Work
from neural_arch.distributed.parallel.data_parallel.comm_hooks import GradBucket, hook_backend, then

__all__ = ["TopKState", "topk_hook"]


class TopKState:
    """``ratio`` of entries sent per bucket (0 < ratio <= 1) and the residual kept per bucket."""

    def __init__(self, ratio: float = 0.01, process_group=None):
        if not 0.0 < float(ratio) <= 1.0:
            raise ValueError(f"TopKState(ratio={ratio}): ratio must be in (0, 1], e.g. 0.01 sends 1% of entries")
        self.ratio = float(ratio)
        self.process_group = process_group
        self.residuals: dict = {}   # bucket index -> residual array
        #: numbers (indices + values) sent by the last bucket, and its size uncompressed
        self.last_sent = (0, 0)


def topk_hook(state: TopKState, bucket: GradBucket) -> Work:
    """Average ``bucket`` sending only its top-``ratio`` entries per rank (see the module docstring)."""
    backend = hook_backend(state.process_group)
    buffer = bucket.buffer()
    xp = _xpmod.get_array_module(buffer)
    acc = buffer * buffer.dtype.type(1.0 / backend.size) if not bucket.prescaled else buffer.copy()
    residual = state.residuals.get(bucket.index())
    if residual is not None:
        acc += residual
    n = acc.size
    k = max(1, math.ceil(state.ratio * n))
    idx = xp.argpartition(xp.abs(acc), n - k)[n - k:].astype(np.int64) if k < n else xp.arange(n, dtype=np.int64)
    values = acc[idx]
    acc[idx] = 0
    state.residuals[bucket.index()] = acc  # what was not sent: exactly acc - sent
    all_idx = xp.empty((backend.size, k), dtype=np.int64)
    all_val = xp.empty((backend.size, k), dtype=buffer.dtype)
    # Both all-gathers are queued now, from the caller's thread (so every rank queues its
    # collectives in the same order) and run on the backend's progress lane while backward goes
    # on; the lane runs them in order, so the values' completion means the indices are in too.
    got_idx = backend.allgather(all_idx, idx, async_op=True)
    got_val = backend.allgather(all_val, values, async_op=True)
    state.last_sent = (2 * k, n)

    def scatter(_done: Work):
        if got_idx.exception() is not None:
            raise got_idx.exception()
        buffer[...] = 0
        for r in range(backend.size):  # a rank's indices are distinct: a fancy-index add is exact
            buffer[all_idx[r]] += all_val[r]
        return buffer
    return then(got_val, scatter)
