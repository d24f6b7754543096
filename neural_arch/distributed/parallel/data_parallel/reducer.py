"""Gradient buckets for DistributedDataParallel: the plan (plain data) and the reducer.

**Plan** (:func:`plan_buckets`): parameters in *reverse* registration order (roughly the order
backward produces their gradients), cut into buckets of at most ``cap`` bytes, one dtype per
bucket, the first bucket small (``first_cap``, 1 MB like torch) so communication starts early.
The plan is a list of lists of parameter indices: printable and unit-testable without sockets::

    >>> plan_buckets([(100, "float32"), (1000, "float32"), (10, "float32")], cap=4096, first_cap=100)
    [[2], [1], [0]]

**Reducer** (:class:`Reducer`): each parameter's post-accumulate-grad hook copies its gradient,
divided by the group size, into its bucket's flat array; when every gradient of a bucket is in,
the bucket's all-reduce (SUM, hence the average) is started asynchronously on the backend's
progress thread while backward goes on (buckets still pending when backward ends run inline).
Buckets are launched strictly in plan order, so every rank issues the same collectives in
the same order even if hooks fire in a different order. An end-of-backward callback
(``queue_callback``) launches what is left, waits, and writes the averaged gradients back
(or, with ``gradient_as_bucket_view``, leaves ``.grad`` as views into the buckets: no copy).

The last bucket carries one extra element: the number of parameters that got no gradient on
this rank. Its all-reduced value tells **every** rank whether any rank had unused parameters,
so the error is raised everywhere instead of some ranks hanging.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from neural_arch import backend as _xpmod
from neural_arch.core.tensor import Tensor, queue_callback

from neural_arch.distributed.comm import ReduceOp

MB = 1024 * 1024

__all__ = ["Reducer", "UnusedParametersError", "plan_buckets"]


class UnusedParametersError(RuntimeError):
    """Some parameters got no gradient in a synchronised backward (find_unused_parameters=False)."""


def plan_buckets(sizes_dtypes: Sequence[tuple[int, str]], cap: int, first_cap: int | None = None) -> list[list[int]]:
    """Cut parameters ``[(numel, dtype), ...]`` (registration order) into buckets of indices.

    Walks the parameters in reverse order; a bucket is closed when adding the next parameter of
    its dtype would pass ``cap`` bytes (``first_cap`` for the very first bucket). A parameter
    larger than the cap gets a bucket of its own. Buckets are returned in launch order.
    """
    cap = max(int(cap), 1)
    first_cap = cap if first_cap is None else max(min(int(first_cap), cap), 1)
    open_buckets: dict = {}  # dtype -> (indices, bytes)
    closed: list[tuple[int, list[int]]] = []  # (order key, indices)
    order = 0
    for i in reversed(range(len(sizes_dtypes))):
        numel, dtype = sizes_dtypes[i]
        nbytes = int(numel) * np.dtype(dtype).itemsize
        limit = first_cap if not closed else cap
        cur = open_buckets.get(dtype)
        if cur is not None and cur[1] + nbytes > limit and cur[0]:
            closed.append((cur[2], cur[0]))
            cur = None
            limit = cap
        if cur is None:
            cur = ([], 0, order)
            order += 1
        cur = (cur[0] + [i], cur[1] + nbytes, cur[2])
        open_buckets[dtype] = cur
    for indices, _, key in open_buckets.values():
        closed.append((key, indices))
    closed.sort(key=lambda kv: kv[0])
    return [indices for _, indices in closed]


def _to_host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.get()  # CuPy -> NumPy


class _Bucket:
    __slots__ = ("buffer", "extra", "index", "numels", "offsets", "params", "pending", "t_done", "t_launch",
                 "views", "work")

    def __init__(self, index, params, numels, shapes, dtype, xp, extra: bool):
        self.index = index
        self.params = params
        self.numels = numels
        self.offsets = np.concatenate([[0], np.cumsum(numels)]).astype(np.int64).tolist()
        self.extra = extra  # the last bucket carries the "unused parameters" count
        self.buffer = xp.zeros(self.offsets[-1] + (1 if extra else 0), dtype=dtype)
        # One view object per slot, made once: ``grad.data is view`` then tells whether a
        # gradient already lives in the bucket (gradient_as_bucket_view), with no copy needed.
        self.views = [self.buffer[self.offsets[k]:self.offsets[k + 1]].reshape(shape)
                      for k, shape in enumerate(shapes)]
        self.pending = len(params)
        self.work = None
        self.t_launch = 0.0
        self.t_done = 0.0

    def view(self, k: int, shape=None):
        return self.views[k]


class Reducer:
    """Owns the buckets and the per-backward state of one DDP instance (see the module docstring)."""

    def __init__(self, params: Sequence[Tensor], names: Sequence[str], backend, bucket_cap_mb: float,
                 first_bucket_mb: float, find_unused_parameters: bool, gradient_as_bucket_view: bool):
        self.params = list(params)
        self.names = list(names)
        self.backend = backend
        self.find_unused = bool(find_unused_parameters)
        self.scale = 1.0 / backend.size  # gradients are pre-divided: see _copy_in
        self.as_view = bool(gradient_as_bucket_view)
        sizes = [(int(p.data.size), str(p.data.dtype)) for p in self.params]
        self.plan = plan_buckets(sizes, int(bucket_cap_mb * MB), int(first_bucket_mb * MB))
        self.buckets: list[_Bucket] = []
        self.where: list[tuple[int, int]] = [(0, 0)] * len(self.params)  # param -> (bucket, slot)
        for b, idx in enumerate(self.plan):
            xp = _xpmod.get_array_module(self.params[idx[0]].data)
            bucket = _Bucket(b, idx, [sizes[i][0] for i in idx], [self.params[i].data.shape for i in idx],
                             sizes[idx[0]][1], xp,
                             extra=(b == len(self.plan) - 1))
            self.buckets.append(bucket)
            for k, i in enumerate(idx):
                self.where[i] = (b, k)
        # Small control arrays live where the buckets live (NCCL moves device arrays only).
        self.xp = _xpmod.get_array_module(self.params[0].data)
        self.used_since_sync = np.zeros(len(self.params), dtype=bool)
        self.seen = np.zeros(len(self.params), dtype=bool)
        self.in_backward = False
        self.syncing = False
        self.next_launch = 0
        self.ready = [False] * len(self.buckets)
        #: True when every .grad already holds the global average (sync_gradients() is then a no-op)
        self.grads_are_global = True
        # Overlap statistics, summed over synchronised backwards (see DDP.comm_stats()).
        self.stats = {"backwards": 0, "comm_s": 0.0, "exposed_s": 0.0, "launched_before_end": 0, "buckets": 0}
        #: [(event, bucket or None, perf_counter time)] of the latest synchronised backward
        self.timeline: list = []

    # -- hooks ----------------------------------------------------------------------------------
    def on_grad_ready(self, i: int, sync: bool) -> None:
        """Post-accumulate-grad hook body for parameter ``i`` (``.grad`` is final for this backward)."""
        if not self.in_backward:
            self._begin_backward(sync)
        self.used_since_sync[i] = True
        if not self.syncing:
            self.grads_are_global = False  # local accumulation (no_sync): not averaged yet
            return
        self.seen[i] = True
        b, k = self.where[i]
        bucket = self.buckets[b]
        self._copy_in(bucket, k, self.params[i])
        bucket.pending -= 1
        if bucket.pending == 0:
            self._mark_ready(b)

    def _begin_backward(self, sync: bool) -> None:
        self.in_backward = True
        self.syncing = sync
        if sync:
            self._reset_iteration()
            self.timeline = [("backward_start", None, time.perf_counter())]
        queue_callback(self._end_backward)

    def abandon_backward(self) -> None:
        """Forget a backward that raised midway: wait for what it launched, keep the local grads."""
        try:
            self._wait_all()
        finally:
            self.in_backward = False
            self.syncing = False
            self.grads_are_global = False

    def _reset_iteration(self) -> None:
        self.seen[:] = False
        self.next_launch = 0
        self.ready = [False] * len(self.buckets)
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.work = None

    def _copy_in(self, bucket: _Bucket, k: int, p: Tensor) -> None:
        # Gradients enter the bucket already divided by the group size (torch's default comm
        # hook does the same), so the bucket is all-reduced with SUM: the division rides on the
        # copy we make anyway instead of costing a pass of its own after the all-reduce, where
        # it is exposed (0.8 ms per step for 7.4 MB measured on the development machine).
        view = bucket.views[k]
        g = p.grad
        if g is None:
            view[...] = 0
        elif g.data is not view:
            self.xp.multiply(g.data, self.scale, out=view)
            if self.as_view:
                # From now on .grad *is* the bucket slot: backward accumulates straight into it
                # and the averaged result needs no copy back.
                g.data = view
        else:
            view *= self.scale  # accumulated in place in the bucket (gradient_as_bucket_view)

    def _mark_ready(self, b: int) -> None:
        self.ready[b] = True
        while self.next_launch < len(self.buckets) and self.ready[self.next_launch]:
            self._launch(self.buckets[self.next_launch])
            self.next_launch += 1

    def _launch(self, bucket: _Bucket, unused_count: int = 0, inline: bool = False) -> None:
        """Start ``bucket``'s all-reduce: on the progress thread, or with ``inline=True`` on this
        thread (the caller is about to wait for it anyway: that saves two thread hand-offs, and
        lets the transport busy-poll on the main thread). Backends keep collectives in order
        either way: an inline call queues behind earlier asynchronous ones."""
        if bucket.extra:
            bucket.buffer[-1] = unused_count
        bucket.t_launch = time.perf_counter()
        self.timeline.append(("launch", bucket.index, bucket.t_launch))
        if inline:
            bucket.work = self.backend.allreduce(bucket.buffer, ReduceOp.SUM, async_op=False)
            bucket.t_done = time.perf_counter()
            return
        bucket.work = self.backend.allreduce(bucket.buffer, ReduceOp.SUM, async_op=True)
        # t_done comes from the Work itself (completed_at) once it is waited for: a done-callback
        # could run after the waiter already read the bucket's timing.

    # -- end of backward --------------------------------------------------------------------------
    def _end_backward(self) -> None:
        self.in_backward = False
        if not self.syncing:
            return
        t_end = time.perf_counter()
        self.timeline.append(("backward_end", None, t_end))
        launched_before_end = self.next_launch
        missing = np.flatnonzero(~self.seen)
        for i in missing:  # unused in this backward: their slot holds the local grad or zeros
            b, k = self.where[i]
            self._copy_in(self.buckets[b], k, self.params[i])
        unused_here = 0 if self.find_unused else len(missing)
        for b in range(self.next_launch, len(self.buckets)):
            # backward is over: nothing left to overlap with, so run what is left on this thread
            self._launch(self.buckets[b], unused_here, inline=True)
        self.next_launch = len(self.buckets)
        used_global = self._allreduce_used_map() if self.find_unused else None
        self._wait_all()
        t_waited = time.perf_counter()
        self.timeline.append(("waited", None, t_waited))
        self._record_stats(t_end, t_waited, launched_before_end)
        self._check_unused(missing)
        self._write_back(used_global)

    def _allreduce_used_map(self):
        return self._any_rank(self.used_since_sync)

    def _any_rank(self, flags: np.ndarray) -> np.ndarray:
        """Element-wise OR of a boolean array over the ranks (one small SUM all-reduce)."""
        arr = self.xp.asarray(flags.astype(np.float32))
        self.backend.allreduce(arr, ReduceOp.SUM, async_op=True).wait()
        return _to_host(arr) > 0

    def _wait_all(self) -> None:
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
                bucket.t_done = bucket.work.completed_at or time.perf_counter()

    def _check_unused(self, missing) -> None:
        unused_anywhere = float(self.buckets[-1].buffer[-1]) > 0
        if not unused_anywhere:
            return
        self._finish_sync()  # leave a clean state: the next iteration may still run
        names = [self.names[i] for i in missing]
        here = (f"on this rank ({self.backend.rank}) these parameters got no gradient: {names}"
                if names else "another rank had parameters that got no gradient")
        raise UnusedParametersError(
            f"DistributedDataParallel: {here}. Every parameter must take part in the loss on every "
            "rank for the gradient all-reduce to line up. Pass find_unused_parameters=True to "
            "DistributedDataParallel(...) if some parameters are legitimately unused in some iterations "
            "(they are then reduced as zeros), or remove them from the model.")

    def _write_back(self, used_global) -> None:
        for bucket in self.buckets:
            for k, i in enumerate(bucket.params):
                if used_global is not None and not used_global[i]:
                    continue  # unused on every rank: leave .grad alone (torch semantics)
                p = self.params[i]
                view = bucket.view(k, p.data.shape)
                g = p.grad
                if self.as_view:
                    if g is None:
                        p.grad = Tensor._wrap(view)
                    elif g.data is not view:
                        g.data = view
                elif g is None:
                    p.grad = Tensor._wrap(view.copy())
                else:
                    g.data[...] = view
        self._finish_sync()

    def _finish_sync(self) -> None:
        self.used_since_sync[:] = False
        self.grads_are_global = True
        self.syncing = False

    def _record_stats(self, t_end: float, t_waited: float, launched_before_end: int) -> None:
        # Communication runs one bucket after another on the progress thread: each bucket is busy
        # from max(its launch, the previous one's end) to its end. "Exposed" is the time backward's
        # end had to wait for it; the rest was hidden behind backward.
        busy, prev_done = 0.0, 0.0
        for bucket in self.buckets:
            start = max(bucket.t_launch, prev_done)
            done = max(bucket.t_done, start)
            busy += done - start
            prev_done = done
        s = self.stats
        s["backwards"] += 1
        s["comm_s"] += busy
        s["exposed_s"] += min(max(t_waited - t_end, 0.0), busy)
        s["launched_before_end"] += launched_before_end
        s["buckets"] += len(self.buckets)

    # -- manual and shadow reductions ------------------------------------------------------------
    def sync_now(self) -> None:
        """Average every gradient now (seed 001's ``sync_gradients()``); no-op if already global."""
        if self.grads_are_global:
            return
        self._reset_iteration()
        self.timeline = [("manual_sync", None, time.perf_counter())]
        for i in range(len(self.params)):
            b, k = self.where[i]
            self._copy_in(self.buckets[b], k, self.params[i])
        for bucket in self.buckets:
            self._launch(bucket, 0)
        # Which parameters had a gradient on some rank: the others keep .grad = None.
        used = self._any_rank(np.array([p.grad is not None for p in self.params]))
        self._wait_all()
        self._write_back(used)

    def shadow_backward(self) -> None:
        """Join support: issue the collectives of one synchronised backward with zeros."""
        self._reset_iteration()
        for bucket in self.buckets:
            bucket.buffer[...] = 0
            self._launch(bucket, 0)
        if self.find_unused:
            self._any_rank(np.zeros(len(self.params), dtype=bool))
        self._wait_all()
        if float(self.buckets[-1].buffer[-1]) > 0:
            raise UnusedParametersError(
                "DistributedDataParallel: another rank had parameters that got no gradient while this rank "
                "had joined; pass find_unused_parameters=True to DistributedDataParallel(...)")
