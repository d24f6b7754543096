"""Top-K gradient sparsification with error feedback (seed 003's "compressed allreduce"), with Deep
Gradient Compression's warm-up and momentum correction (Lin et al., 2018).

Each rank sends only the ``k = ceil(ratio * n)`` largest-magnitude entries of its bucket
(indices and values, packed in one all-gather); everything it did not send stays in a local
**residual** that is added to the next step's gradient, so over steps nothing is lost::

    acc      = grad / world + residual          (this rank's share of the mean, plus what is owed)
    sent     = acc at its k largest |entries|   (zeros elsewhere)
    residual = acc - sent                       (exactly: sent + residual == acc)
    result   = sum over ranks of sent           (scattered back by index)

**Warm-up** (DGC's "sparsity warm-up"): a model's first steps move far and fast, and a residual
that holds 99% of them for many steps makes the early updates stale. So the density starts high
and shrinks geometrically to ``ratio`` (0.25, 0.0625, 0.0156, ... over ``warmup_iters``),
optionally after ``start_iter`` plain all-reduce steps (PowerSGD's ``start_powerSGD_iter``). The
schedule is plain data (:func:`topk_schedule`), printable and unit-tested. A step whose sparse
all-gather would move as many bytes as a ring all-reduce is sent dense instead.

**Spread delivery** (``spread=True``): error feedback delivers an entry rarely and large (the sum
of the ``T`` steps it waited). Adam divides each entry by the root of its own recent squares, so a
spike that arrives every ``T`` steps moves a weight about ``sqrt(T)`` learning rates where ``T`` dense
steps move it ``T``: Top-K 1% then trains markedly slower under Adam. With ``spread`` every rank
keeps the same ``pending`` array and hands each received entry to the optimizer in equal installments
over as many steps as it took to arrive (``rate = pending / T``; the last installment is the
remainder), so Adam sees a steady gradient instead of a spike. Nothing is lost: over steps
``delivered + pending == received`` (see :func:`spread_delivery`); a dense step flushes ``pending``.
Bytes on the wire do not change (the spreading happens after the all-gather, identically on
every rank). The price is lag: it pays off on long runs and costs early ones (see TopKState).

**Momentum correction** (``momentum > 0``, DGC; use it with ``SGD(momentum=0)``: the momentum
lives here): the residual accumulates the *velocity* ``u = momentum * u + grad / world`` instead
of the gradient, and the velocity of the entries just sent is cleared ("momentum factor masking",
so a delayed gradient does not keep pushing). Dense steps keep the velocity: with ``ratio=1`` this
is exactly SGD with momentum.

Example::

    state = TopKState(ratio=0.01, spread=True)     # 1% per step, spread over each entry's interval
    ddp.register_comm_hook(state, topk_hook)
    print(format_schedule(state.schedule))         # the warm-up stages, one line each
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from neural_arch import backend as _xpmod
from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import (
    GradBucket,
    check_process_group,
    comm_hook,
    hook_backend,
    then,
)
from neural_arch.distributed.comm.work import ReduceOp, Work

__all__ = ["Stage", "TopKState", "format_schedule", "spread_delivery", "topk_hook", "topk_schedule"]


@dataclass(frozen=True)
class Stage:
    """Iterations ``[start, stop)`` (``stop=None``: for ever) send the top ``ratio`` of each bucket
    (``ratio=1.0``: a plain all-reduce).

    Example:
        >>> TopKState(ratio=0.05, spread=True).schedule
        [Stage(start=0, stop=None, ratio=0.05)]
    """

    start: int
    stop: int | None
    ratio: float


def topk_schedule(ratio: float, start_iter: int = 0, warmup_iters: int = 0, warmup_start_ratio: float = 0.25,
                  warmup_factor: float = 4.0) -> list[Stage]:
    """The density per iteration as a list of stages: ``start_iter`` dense iterations, then
    ``warmup_iters`` split evenly over densities ``warmup_start_ratio``, ``/ warmup_factor``, ...
    (those above ``ratio``), then ``ratio`` for ever.

        >>> print(format_schedule(topk_schedule(0.01, start_iter=10, warmup_iters=30)))
        iterations 0-9: dense (all-reduce)
        iterations 10-19: top 25%
        iterations 20-29: top 6.25%
        iterations 30-39: top 1.562%
        iterations 40-: top 1%
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio={ratio}: must be in (0, 1], e.g. 0.01 sends 1% of entries")
    if start_iter < 0 or warmup_iters < 0:
        raise ValueError(f"start_iter={start_iter}, warmup_iters={warmup_iters}: must be >= 0")
    if warmup_factor <= 1.0:
        raise ValueError(f"warmup_factor={warmup_factor}: must be > 1 (the density is divided by it per stage)")
    stages = [Stage(0, start_iter, 1.0)] if start_iter else []
    densities = []
    d = float(warmup_start_ratio)
    while d > ratio and warmup_iters:
        densities.append(d)
        d /= warmup_factor
    at = start_iter
    for j, d in enumerate(densities):
        # the first stages take the remainder: every stage gets at least warmup_iters // stages
        length = warmup_iters // len(densities) + (1 if j < warmup_iters % len(densities) else 0)
        if length:
            stages.append(Stage(at, at + length, d))
            at += length
    stages.append(Stage(at, None, float(ratio)))
    return stages


def format_schedule(stages: list[Stage]) -> str:
    """One line per stage (see :func:`topk_schedule`).

    Example:
        >>> print(format_schedule([Stage(0, 10, 1.0), Stage(10, None, 0.01)]))
        iterations 0-9: dense (all-reduce)
        iterations 10-: top 1%
    """
    lines = []
    for s in stages:
        span = f"{s.start}-{'' if s.stop is None else s.stop - 1}"
        what = "dense (all-reduce)" if s.ratio >= 1.0 else f"top {100 * s.ratio:.4g}%"
        lines.append(f"iterations {span}: {what}")
    return "\n".join(lines)


def spread_delivery(pending, rate, last, received, got, iteration: int):
    """One step of spread delivery (in place; returns what the optimizer gets this step).

    ``received``: the summed sparse values that arrived this step (zeros elsewhere), ``got``: a
    boolean mask of the entries that arrived; ``pending``/``rate``/``last``: per entry, what is
    still owed to the optimizer, the installment per step, and the iteration it last arrived
    (-1: never). An entry that arrives after waiting ``T = iteration - last`` steps is paid out as
    ``T`` equal installments of everything pending (the last one is the exact remainder), so
    ``delivered + pending`` after the step equals ``pending + received`` before it.

        >>> import numpy as np
        >>> p, r, last = np.zeros(2), np.zeros(2), np.array([-1.0, -1.0])
        >>> spread_delivery(p, r, last, np.array([0.0, 6.0]), np.array([False, True]), 2).tolist()
        [0.0, 2.0]
        >>> spread_delivery(p, r, last, np.zeros(2), np.zeros(2, bool), 3).tolist(), p.tolist()
        ([0.0, 2.0], [0.0, 2.0])
    """
    xp = _xpmod.get_array_module(pending)
    pending += received
    waited = iteration - last[got]
    rate[got] = pending[got] / xp.maximum(waited, 1)
    last[got] = iteration
    # never pay out more than is pending: the last installment is the remainder, exactly
    out = xp.where(xp.abs(rate) >= xp.abs(pending), pending, rate)
    pending -= out
    return out


class TopKState:
    """What Top-K keeps between steps: the schedule, the iteration, and per bucket the residual
    (and, with momentum correction, the velocity; with spread delivery, what is pending).

    Args: ``ratio`` (0 < ratio <= 1: share of entries each rank sends per bucket, after warm-up),
    ``process_group`` (None: the default group), ``start_iter`` (plain all-reduce before it),
    ``warmup_iters`` (iterations over which the density shrinks from ``warmup_start_ratio`` to
    ``ratio``, dividing by ``warmup_factor`` per stage), ``momentum`` (DGC's momentum correction;
    0 turns it off), ``use_error_feedback`` (False drops what was not sent: for comparison only),
    ``spread`` (spread each received entry over the steps it waited, see the module docstring;
    recommended with Adam and other adaptive optimizers).
    ``warmup_iters=None``: 0 with ``spread`` (it trains best without warm-up), else 150 (25%,
    6.25%, 1.56%, 50 each). Measured on the digits MLP
    with Adam (``benchmarks/bench_compression.py``, 2 ranks, 30 epochs = 660 iterations, mean of 8
    seeds): 1% ends 0.9 points below plain all-reduce with them, 1.4 without warm-up, and 3.2 with
    a 64-iteration one (Adam's second moment meets the delayed, accumulated entries while still
    calibrated on denser steps). The gap is convergence speed: Adam divides each delayed,
    accumulated entry by a second moment those spikes inflate (in a one-process simulation 1% caught
    up with all-reduce at 60 epochs, or at 30 with a 3x learning rate). With SGD, 1% needs no warm-up.
    ``spread=True`` closes that gap at 1% with no warm-up and 2% of all-reduce's bytes over the
    whole run (mean of 8 seeds at 28 / 30 / 32 / 60 epochs: -0.42 / +0.21 / +0.07 / +0.49 points,
    vs -1.60 / -0.91 / -0.84 / -0.10 without), but it starts slower (5 / 10 / 20 epochs: -24 /
    -7.4 / -2.2, vs -1.5 / -2.7 / -1.9 without): hence off by default for now.

    Example:
        >>> print(format_schedule(TopKState(ratio=0.01).schedule))    # the default warm-up
        iterations 0-49: top 25%
        iterations 50-99: top 6.25%
        iterations 100-149: top 1.562%
        iterations 150-: top 1%
    """

    def __init__(self, ratio: float = 0.01, process_group=None, start_iter: int = 0, warmup_iters: int | None = None,
                 warmup_start_ratio: float = 0.25, warmup_factor: float = 4.0, momentum: float = 0.0,
                 use_error_feedback: bool = True, spread: bool = False):
        if not 0.0 < float(ratio) <= 1.0:
            raise ValueError(f"TopKState(ratio={ratio}): ratio must be in (0, 1], e.g. 0.01 sends 1% of entries")
        if not 0.0 <= float(momentum) < 1.0:
            raise ValueError(f"TopKState(momentum={momentum}): must be in [0, 1) (0: no momentum correction)")
        check_process_group(process_group, "TopKState")
        self.ratio = float(ratio)
        self.process_group = process_group
        self.momentum = float(momentum)
        self.use_error_feedback = bool(use_error_feedback)
        self.spread = bool(spread)
        if warmup_iters is None:
            warmup_iters = 0 if self.spread else 150
        self.schedule = topk_schedule(self.ratio, int(start_iter), int(warmup_iters), float(warmup_start_ratio),
                                      float(warmup_factor))
        self.iter = 0
        self.residuals: dict = {}   # bucket index -> residual array (what is owed)
        self.velocities: dict = {}  # bucket index -> momentum-corrected velocity (momentum > 0)
        #: bucket index -> (pending, rate, last arrival) of spread delivery (``spread=True``);
        #: the same on every rank
        self.pending: dict = {}
        #: numbers (indices + values) sent by the last bucket, and its size uncompressed
        self.last_sent = (0, 0)

    def ratio_at(self, iteration: int) -> float:
        """The density the schedule gives ``iteration``."""
        for s in self.schedule:
            if s.stop is None or iteration < s.stop:
                return s.ratio
        return self.ratio

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        if bucket.is_last():
            self.iter += 1

    def __repr__(self) -> str:
        return (f"TopKState(ratio={self.ratio}, iter={self.iter}, momentum={self.momentum}, spread={self.spread}, "
                f"schedule=[{'; '.join(format_schedule(self.schedule).splitlines())}])")


def _index_dtype(n: int):
    return np.int32 if n < 2 ** 31 else np.int64


def _sparse_pays(k: int, n: int, world: int, value_bytes: int) -> bool:
    """Whether all-gathering k (index, value) pairs moves fewer bytes than a ring all-reduce of n
    values: each rank receives (world - 1) * k pairs vs 2 (world - 1) / world * n values."""
    return world * k * (np.dtype(_index_dtype(n)).itemsize + value_bytes) < 2 * n * value_bytes


@comm_hook()
def topk_hook(state: TopKState, bucket: GradBucket) -> Work:
    """Average ``bucket`` sending only its top entries per rank (see the module docstring).

    Example::

        from neural_arch.distributed.algorithms.ddp_comm_hooks import topk_hook
        state = topk_hook.TopKState(ratio=0.01, spread=True)
        ddp.register_comm_hook(state, topk_hook.topk_hook)
    """
    backend = hook_backend(state.process_group)
    world = backend.size
    buffer = bucket.buffer()
    xp = _xpmod.get_array_module(buffer)
    b = bucket.index()
    n = buffer.size
    grad = buffer * buffer.dtype.type(1.0 / world) if not bucket.prescaled else buffer.copy()
    if state.momentum:
        velocity = state.velocities.get(b)
        if velocity is None:
            velocity = state.velocities[b] = xp.zeros_like(buffer)
        velocity *= buffer.dtype.type(state.momentum)
        velocity += grad
        grad = velocity.copy()
    acc = grad
    residual = state.residuals.get(b)
    if residual is not None:
        acc += residual
    iteration = state.iter
    ratio = state.ratio_at(iteration)
    k = max(1, math.ceil(ratio * n))
    state.maybe_increase_iter(bucket)
    spread = None
    if state.spread:
        spread = state.pending.get(b)
        if spread is None:
            spread = state.pending[b] = (xp.zeros_like(buffer), xp.zeros_like(buffer), xp.full(n, -1.0))
    if k >= n or not _sparse_pays(k, n, world, buffer.dtype.itemsize):
        # Dense: everything owed goes out; the velocity is kept (no entry was delayed).
        state.residuals[b] = xp.zeros_like(buffer)
        buffer[...] = acc
        state.last_sent = (n, n)
        work = backend.allreduce(buffer, ReduceOp.SUM, async_op=True)
        if spread is None:
            return work

        def flush(_done: Work):  # every entry arrived: everything pending is delivered now
            pending, rate, last = spread
            buffer[...] += pending
            pending[...] = 0
            rate[...] = 0
            last[...] = iteration
            return buffer
        return then(work, flush)

    idx = xp.argpartition(xp.abs(acc), n - k)[n - k:].astype(_index_dtype(n))
    values = acc[idx]
    acc[idx] = 0
    # what was not sent: exactly acc - sent (or dropped without error feedback)
    state.residuals[b] = acc if state.use_error_feedback else xp.zeros_like(acc)
    if state.momentum:
        state.velocities[b][idx] = 0  # momentum factor masking: a sent entry starts afresh
    # Values then indices, packed as bytes into one all-gather (one collective per bucket, not
    # two); the row is padded to 8 bytes so every rank's values and indices stay aligned.
    vb = values.nbytes
    packed = xp.zeros(-(-(vb + idx.nbytes) // 8) * 8, dtype=np.uint8)
    packed[:vb] = values.view(np.uint8)
    packed[vb:vb + idx.nbytes] = idx.view(np.uint8)
    gathered = xp.empty((world, packed.size), dtype=np.uint8)
    # Queued from the caller's thread (every rank queues its collectives in the same order); it
    # runs on the backend's progress lane while backward goes on.
    work = backend.allgather(gathered, packed, async_op=True)
    state.last_sent = (2 * k, n)

    def scatter(_done: Work):
        buffer[...] = 0
        for r in range(world):  # a rank's indices are distinct: a fancy-index add is exact
            row = gathered[r]
            buffer[row[vb:vb + idx.nbytes].view(idx.dtype)] += row[:vb].view(buffer.dtype)
        if spread is not None:
            got = xp.zeros(n, dtype=bool)
            for r in range(world):
                got[gathered[r][vb:vb + idx.nbytes].view(idx.dtype)] = True
            buffer[...] = spread_delivery(*spread, buffer, got, iteration)
        return buffer
    return then(work, scatter)
