# ruff: noqa: N999 - torch's module name (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook)
"""PowerSGD gradient compression (Vogels et al., 2019) as a DDP comm hook, under torch's names.

Each gradient matrix ``M`` (n x m; higher-rank gradients are viewed as ``(shape[0], -1)``) is
replaced on the wire by two thin factors of rank ``r``::

    P = M Q            all-reduce P (mean), orthonormalise its columns
    Q = M^T P          all-reduce Q (mean)
    M ~ P Q^T          n*r + m*r numbers sent instead of n*m

``Q`` starts from the same seeded random matrix on every rank and is reused next step
(``warm_start``). With ``use_error_feedback`` the part a step could not send
(``M - P Q^T``) is added to the next step's gradient, so nothing is lost over time. Vectors
(biases) and matrices too small to gain are all-reduced uncompressed; so is everything before
``start_powerSGD_iter``. With ``r = min(n, m)`` the approximation is exact (plain averaging).

The all-reduces of the uncompressed part and of ``P`` are queued when the bucket is handed over
and run while backward goes on; the ``Q`` all-reduce depends on the averaged ``P``, so it is issued
when DDP waits for the bucket at the end of backward (in bucket order on every rank: see
:func:`~neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook.deferred`).

Example::

    state = PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=10)
    ddp.register_comm_hook(state, powerSGD_hook)
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _xpmod
from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import (
    GradBucket,
    check_process_group,
    comm_hook,
    deferred,
    hook_backend,
)
from neural_arch.distributed.comm.work import ReduceOp, Work

__all__ = ["PowerSGDState", "powerSGD_hook"]


class PowerSGDState:
    """What PowerSGD keeps between steps: the warm-started ``Q`` factors and the error residuals.

    Args (torch's names): ``process_group`` (None: the default group),
    ``matrix_approximation_rank`` (``r``), ``start_powerSGD_iter`` (plain all-reduce before it),
    ``min_compression_rate`` (compress a matrix only if ``n*m / ((n+m)*r)`` is at least this),
    ``use_error_feedback``, ``warm_start``, ``random_seed``.

    Example:
        >>> state = PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10)
        >>> state.matrix_approximation_rank
        2
    """

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1_000,
                 min_compression_rate: float = 2.0, use_error_feedback: bool = True, warm_start: bool = True,
                 random_seed: int = 0):
        if int(matrix_approximation_rank) < 1:
            raise ValueError(f"matrix_approximation_rank must be >= 1, got {matrix_approximation_rank}")
        check_process_group(process_group, "PowerSGDState")
        self.process_group = process_group
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.rng = np.random.default_rng(random_seed)  # same seed on every rank: same initial Q
        self.iter = 0
        self.q_memory: dict = {}          # (bucket index, slot) -> Q of the previous step
        self.error_dict: dict = {}        # bucket index -> residual of the flat buffer
        #: numbers sent by the last compressed bucket, and what plain all-reduce would have sent
        self.last_sent = (0, 0)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        if bucket.is_last():
            self.iter += 1


def _orthonormalize(xp, p):
    """Columns of ``p`` made orthonormal (reduced QR; a column of zeros stays zero)."""
    q, _ = xp.linalg.qr(p)
    return q


@comm_hook()
def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> Work:
    """Compress each gradient matrix of ``bucket`` to rank ``state.matrix_approximation_rank``.

    Example::

        from neural_arch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=10)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    """
    backend = hook_backend(state.process_group)
    world = backend.size
    buffer = bucket.buffer()
    if not bucket.prescaled:
        buffer *= buffer.dtype.type(1.0 / world)  # average = SUM of pre-divided gradients
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return backend.allreduce(buffer, ReduceOp.SUM, async_op=True)

    xp = _xpmod.get_array_module(buffer)
    idx = bucket.index()
    before = None
    if state.use_error_feedback:
        residual = state.error_dict.get(idx)
        if residual is not None:
            buffer += residual
        before = buffer.copy()
    r = state.matrix_approximation_rank
    matrices, rest = [], []
    for slot, grad in enumerate(bucket.gradients()):
        if grad.ndim >= 2 and grad.size:   # (an empty parameter has nothing to compress)
            n, m = grad.shape[0], grad.size // grad.shape[0]
            rank = min(r, n, m)
            if n * m >= state.min_compression_rate * (n + m) * rank:
                matrices.append((slot, grad.reshape(n, m), rank))
                continue
        rest.append(grad.reshape(-1))
    # Phase 1, now (during backward): queue the all-reduce of what is not compressed and of
    # every P = M Q; both run on the progress lane while backward goes on.
    flat = xp.concatenate(rest) if rest else None
    rest_work = backend.allreduce(flat, ReduceOp.SUM, async_op=True) if rest else None
    ps, flat_p, p_work = [], None, None
    if matrices:
        qs = []
        for slot, mat, rank in matrices:
            q = state.q_memory.get((idx, slot)) if state.warm_start else None
            if q is None or q.shape != (mat.shape[1], rank):
                q = xp.asarray(state.rng.standard_normal((mat.shape[1], rank)).astype(mat.dtype))
            qs.append(_orthonormalize(xp, q))
        ps = [mat @ q for (_, mat, _), q in zip(matrices, qs)]
        flat_p = xp.concatenate([p.reshape(-1) for p in ps])
        p_work = backend.allreduce(flat_p, ReduceOp.SUM, async_op=True)  # pre-divided: SUM is the mean
    state.maybe_increase_iter(bucket)

    def phase2(_done: Work):
        """Q = M^T P from the averaged P needs another all-reduce: issued by whoever waits (DDP's
        end of backward, in bucket order on every rank; see ``deferred``)."""
        sent = 0
        if rest_work is not None:
            rest_work.wait()
            offset = 0
            for part in rest:
                part[...] = flat[offset:offset + part.size]
                offset += part.size
            sent += flat.size
        if matrices:
            p_work.wait()
            offset = 0
            for k, p in enumerate(ps):
                ps[k] = _orthonormalize(xp, flat_p[offset:offset + p.size].reshape(p.shape))
                offset += p.size
            qs = [mat.T @ p for (_, mat, _), p in zip(matrices, ps)]
            flat_q = xp.concatenate([q.reshape(-1) for q in qs])
            backend.allreduce(flat_q, ReduceOp.SUM)
            offset = 0
            for k, q in enumerate(qs):
                qs[k] = flat_q[offset:offset + q.size].reshape(q.shape)
                offset += q.size
            for (slot, mat, _), p, q in zip(matrices, ps, qs):
                mat[...] = p @ q.T
                state.q_memory[(idx, slot)] = q.copy()
            sent += flat_p.size + flat_q.size
        if before is not None:
            # This rank's share (its gradient / world, plus what it owed) minus its share of what
            # was delivered (the approximated mean / world): carried into the next step. Summed
            # over ranks the residuals vanish wherever the approximation was exact.
            state.error_dict[idx] = before - buffer * buffer.dtype.type(1.0 / world)
        state.last_sent = (sent, buffer.size)
        return buffer
    first = p_work if p_work is not None else (rest_work if rest_work is not None else Work.completed(buffer))
    return deferred(first, phase2)
