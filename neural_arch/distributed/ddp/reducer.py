"""Gradient buckets for DistributedDataParallel: the plan (plain data) and the reducer.

**Plan**: :func:`neural_arch.distributed.bucketing.plan_buckets`, the one rule of every
reducer (torch's: reverse registration order, a bucket closes once it holds ``cap`` bytes, the
first one ``first_cap``, 1 MB like torch, so communication starts early; one dtype per bucket).
The plan is a list of lists of parameter indices: printable and unit-testable without sockets::

    >>> plan_buckets([(100, "float32"), (1000, "float32"), (10, "float32")], cap=4096, first_cap=100)
    [[2, 1], [0]]

**Reducer** (:class:`Reducer`): each parameter's post-accumulate-grad hook copies its gradient
into its bucket's flat array; when every gradient of a bucket is in, the bucket goes to the
**comm hook** (:mod:`neural_arch.distributed.algorithms.ddp_comm_hooks`; the default all-reduces the average) while backward goes on.
Buckets are handed to the hook strictly in plan order, so every rank issues the same
collectives in the same order even if gradient hooks fire in a different order. An
end-of-backward callback (``queue_callback``) reduces what is left, waits, and writes the
averaged gradients back (or, with ``gradient_as_bucket_view``, leaves ``.grad`` as views into
the buckets: no copy).

With the buckets goes one **control** vector: per parameter, 1 if it got a gradient on this rank.
Summed over ranks it tells every rank whether any rank had unused parameters (so the error is
raised everywhere instead of some ranks hanging) and, with ``find_unused_parameters``, which
parameters no rank used (their ``.grad`` is left alone, as torch does). With the default hook the
control vector travels in the last bucket's ``tail``, right after its gradients in the same array
(outside the ``GradBucket`` a hook sees: no extra collective); with a custom comm hook it is a
small all-reduce of its own after the buckets.

The per-iteration state is one :class:`Phase`; everything else is derived from it.

The buckets are :class:`~neural_arch.distributed.bucketing.Bucket` objects of a
:class:`~neural_arch.distributed.bucketing.BucketSet` (the same as ZeRO-2's): flat views, pending
counts and in-order launch; what this reducer adds is the comm hook and the control vector.
**Overlap** is measured by a :class:`~neural_arch.distributed.ddp.overlap_stats.BucketTimingObserver`
the reducer tells when each bucket is ready, launched and done.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence

import numpy as np

from neural_arch import backend as _xpmod
from neural_arch.core.tensor import Tensor, queue_callback
from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import CommHook, GradBucket
from neural_arch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from neural_arch.distributed.bucketing import Bucket, BucketSet, plan_buckets
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.ddp.overlap_stats import BucketTimingObserver
from neural_arch.distributed.errors import UnusedParametersError

MB = 1024 * 1024

__all__ = ["Phase", "Reducer"]


class Phase(enum.Enum):
    """Where the reducer is in an iteration (the only per-iteration state it keeps).

    Example:
        >>> [phase.value for phase in Phase]
        ['synced', 'local', 'accumulating', 'reducing']
    """

    SYNCED = "synced"          # idle; every .grad holds the global average (sync_gradients() is a no-op)
    LOCAL = "local"            # idle; .grad holds local accumulations (after no_sync backward passes)
    ACCUMULATING = "accumulating"  # a backward without synchronisation is running (no_sync)
    REDUCING = "reducing"      # a synchronised backward is running: buckets fill and go to the hook


class Reducer:
    """Owns the buckets and the per-iteration state of one DDP instance (see the module docstring).

    Example::

        reducer = Reducer(params, names, backend, bucket_cap_mb=25, first_bucket_mb=1,
                          find_unused_parameters=False, gradient_as_bucket_view=False)
        reducer.plan                       # [[5, 4, 3, 2], [1, 0]]: parameter indices per bucket
    """

    def __init__(self, params: Sequence[Tensor], names: Sequence[str], backend, bucket_cap_mb: float,
                 first_bucket_mb: float, find_unused_parameters: bool, gradient_as_bucket_view: bool):
        self.params = list(params)
        self.names = list(names)
        self.backend = backend
        self.find_unused = bool(find_unused_parameters)
        self.as_view = bool(gradient_as_bucket_view)
        sizes = [(int(p.data.size), str(p.data.dtype)) for p in self.params]
        self.plan = plan_buckets(sizes, int(bucket_cap_mb * MB), int(first_bucket_mb * MB))
        self.xp = _xpmod.get_array_module(self.params[0].data)  # buckets live where the parameters live
        self.buckets = BucketSet([[self.params[i] for i in idx] for idx in self.plan], owner="DistributedDataParallel")
        last = len(self.plan) - 1
        #: per bucket, what a comm hook sees (the gradients) and what the default hook reduces (the
        #: gradients, then in the last bucket the control vector: the bucket's ``tail``)
        self.grad_buckets: list[GradBucket] = []
        self.wire_buckets: list[GradBucket] = []
        for bucket in self.buckets:
            is_last = bucket.index == last
            bucket.allocate(self.xp, bucket.params[0].data.dtype, tail=len(self.params) if is_last else 0)
            lay = bucket.layout
            slots = [(off, off + n, shape) for off, n, shape in zip(lay.offsets, lay.sizes, lay.shapes)]
            grad_bucket = GradBucket(bucket.index, bucket.flat, slots, bucket.params, is_last)
            self.grad_buckets.append(grad_bucket)
            self.wire_buckets.append(GradBucket(bucket.index, bucket.wire, slots, bucket.params, is_last)
                                     if bucket.tail.size else grad_bucket)
        self.where = [self.buckets.locate(p) for p in self.params]  # param -> (bucket, slot)
        self.hook_state, self.hook = None, None
        self._hook_registered = False
        self._set_hook(backend, allreduce_hook)  # state, hook(state, bucket) -> Work
        self._scale = 1.0 / backend.size
        self.phase = Phase.SYNCED
        self.arrived = np.zeros(len(self.params), dtype=bool)       # got a gradient in this backward
        self.used_since_sync = np.zeros(len(self.params), dtype=bool)  # ... in any backward since the last sync
        #: overlap statistics and the timeline (see DDP.comm_stats(), bucket_stats(), bucket_timeline())
        self.observer = BucketTimingObserver([int(b.flat.nbytes) for b in self.buckets])

    # -- the comm hook ------------------------------------------------------------------------------
    def register_comm_hook(self, state, hook) -> None:
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be callable as hook(state, bucket) -> Work, got {hook!r}")
        if self._hook_registered:  # (registering the default hook counts too: torch raises on any second call)
            raise RuntimeError("register_comm_hook can only be called once per DistributedDataParallel (as in torch)")
        if self.phase in (Phase.REDUCING, Phase.ACCUMULATING):
            raise RuntimeError("register_comm_hook: call it before the first backward, not during one")
        self._set_hook(state, hook)
        self._hook_registered = True

    def _set_hook(self, state, hook) -> None:
        """Install the hook; whether buckets reach it pre-scaled by 1/world is decided here, once,
        from what it declares (:class:`~neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook.CommHook`; a plain function declares nothing)."""
        self.hook_state, self.hook = state, CommHook.of(hook)
        self._prescale = self.hook.accepts_prescaled
        for grad_bucket, wire_bucket in zip(self.grad_buckets, self.wire_buckets):
            grad_bucket.prescaled = self._prescale
            wire_bucket.prescaled = self._prescale

    @property
    def in_backward(self) -> bool:
        return self.phase in (Phase.REDUCING, Phase.ACCUMULATING)

    @property
    def grads_are_global(self) -> bool:
        return self.phase is Phase.SYNCED

    # -- gradient hooks -----------------------------------------------------------------------------
    def on_grad_ready(self, i: int, sync: bool) -> None:
        """Post-accumulate-grad hook body for parameter ``i`` (``.grad`` is final for this backward)."""
        if not self.in_backward:
            self._begin_backward(sync)
        self.used_since_sync[i] = True
        if self.phase is Phase.ACCUMULATING:
            return
        self.arrived[i] = True
        b, k = self.where[i]
        bucket = self.buckets[b]
        self._copy_in(bucket, k, self.params[i])
        bucket.pending -= 1
        if bucket.pending:
            return
        self.observer.bucket_ready(b)
        # Launch every bucket that is complete and next in plan order, at once: the hook only
        # queues the bucket on the backend's progress lane, so backward goes on immediately and
        # the lane runs bucket after bucket with no wait on this thread in between.
        self.buckets.launch_ready(self._launch)

    def _begin_backward(self, sync: bool) -> None:
        if sync:
            self._start_iteration("backward_start")
            self.phase = Phase.REDUCING
        else:
            self.phase = Phase.ACCUMULATING
        queue_callback(self._end_backward)

    def _start_iteration(self, event: str | None = None) -> None:
        self.arrived[:] = False
        self.buckets.reset()
        self.observer.iteration_started(event)

    def abandon_backward(self) -> None:
        """Forget a backward that raised midway: wait for what it launched, keep the local grads."""
        try:
            self._wait_all()
        finally:
            self.phase = Phase.LOCAL

    def _copy_in(self, bucket: Bucket, k: int, p: Tensor) -> None:
        """Put parameter ``p``'s gradient (or zeros) into slot ``k`` of ``bucket``, pre-scaled by
        1/world when the hook takes pre-scaled buckets (the default one: see allreduce_hook)."""
        view = bucket.views[k]
        prescale = self._prescale
        g = p.grad
        if g is None:
            view[...] = 0
        elif g.data is not view:
            if prescale:
                self.xp.multiply(g.data, self._scale, out=view)
            else:
                view[...] = g.data
            if self.as_view:
                # From now on .grad *is* the bucket slot: backward accumulates straight into it
                # and the averaged result needs no copy back.
                g.data = view
        elif prescale:
            view *= self._scale  # accumulated in place in the bucket (gradient_as_bucket_view)

    def _control_flags(self) -> np.ndarray:
        """This rank's control vector: which parameters count as "used" (see the module docstring).

        Read when the last bucket launches. If that happens during backward, every bucket before
        it launched too, so every parameter already arrived: the flags are final either way."""
        return self.used_since_sync | self.arrived if self.find_unused else self.arrived

    def _piggyback(self) -> bool:
        return self.hook is allreduce_hook

    def _launch(self, bucket: Bucket, inline: bool = False) -> None:
        """Hand ``bucket`` to the comm hook. ``inline=True`` (buckets left at the end of backward,
        about to be waited for) lets a hook that supports it run on this thread: that saves two
        thread hand-offs. Backends keep collectives in order either way."""
        self.observer.bucket_launched(bucket.index)
        grad_bucket = self.grad_buckets[bucket.index]
        if bucket.tail.size and self._piggyback():
            # counts are not scaled: the wire is SUM-reduced; the flags live on the host, the tail may not
            bucket.tail[...] = self.xp.asarray(self._control_flags(), dtype=bucket.tail.dtype)
            grad_bucket = self.wire_buckets[bucket.index]
        if inline and self.hook.supports_inline:
            bucket.work = self.hook(self.hook_state, grad_bucket, async_op=False)
        else:
            bucket.work = self.hook(self.hook_state, grad_bucket)
        if bucket.work is None or not hasattr(bucket.work, "result"):
            raise TypeError(f"the DDP comm hook {getattr(self.hook, '__name__', self.hook)!r} returned "
                            f"{bucket.work!r}; it must return a Work whose result() is the reduced flat buffer")

    def _launch_inline(self, bucket: Bucket) -> None:
        self._launch(bucket, inline=True)

    # -- one synchronisation, shared by backward's end, sync_gradients() and join's shadow ------------
    def _reduce_and_write_back(self, launched_before_end: int, t_end: float, shadow: bool = False) -> None:
        """Launch the buckets not yet launched, run the control all-reduce, wait, check, write back."""
        # nothing left to overlap with: run what is left on this thread
        self.buckets.launch_rest(self._launch_inline)
        # Per parameter: on how many ranks it got a gradient (in this backward, or since the last
        # sync for find_unused_parameters' "leave .grad alone if no rank used it").
        if self._piggyback():
            self._wait_all()
            used_count = self.buckets[-1].tail
        else:
            used_count = self.xp.asarray(self._control_flags().astype(np.float32))
            control = self.backend.allreduce(used_count, ReduceOp.SUM, async_op=True)
            self._wait_all()
            control.wait()
        self.observer.waited(t_end, launched_before_end, record=not shadow)
        counts = _xpmod.to_host(used_count)
        if not self.find_unused:
            self._check_unused(counts, shadow)
        if not shadow:
            self._write_back(counts > 0 if self.find_unused else None)
        self.used_since_sync[:] = False
        if not shadow:
            self.phase = Phase.SYNCED

    def _end_backward(self) -> None:
        if self.phase is Phase.ACCUMULATING:
            self.phase = Phase.LOCAL  # local accumulation (no_sync): not averaged yet
            return
        t_end = self.observer.backward_ended()
        launched_before_end = self.buckets.next_launch
        for i in np.flatnonzero(~self.arrived):  # no gradient in this backward: local grad or zeros
            b, k = self.where[i]
            self._copy_in(self.buckets[b], k, self.params[i])
        self._reduce_and_write_back(launched_before_end, t_end)

    def sync_now(self) -> None:
        """Average every gradient now (seed 001's ``sync_gradients()``); no-op if already global."""
        if self.grads_are_global:
            return
        self._start_iteration("manual_sync")
        for i, p in enumerate(self.params):
            b, k = self.where[i]
            self._copy_in(self.buckets[b], k, p)
            if p.grad is not None:
                self.arrived[i] = self.used_since_sync[i] = True
        find_unused, self.find_unused = self.find_unused, True  # a manual sync tolerates unused parameters
        try:
            self._reduce_and_write_back(0, time.perf_counter())
        finally:
            self.find_unused = find_unused

    def shadow_backward(self) -> None:
        """Join support: issue the collectives of one synchronised backward with zero gradients."""
        self._start_iteration()
        for bucket in self.buckets:
            bucket.flat[...] = 0
        # A joined rank counts as having used everything (only ranks that train can miss a gradient),
        # but with find_unused_parameters as having used nothing (it must not keep .grad alive).
        self.arrived[:] = not self.find_unused
        self.used_since_sync[:] = False
        self._reduce_and_write_back(0, time.perf_counter(), shadow=True)

    # -- helpers ----------------------------------------------------------------------------------
    def _wait_all(self) -> None:
        for bucket in self.buckets:
            work = bucket.work
            if work is None:
                continue
            result = work.result()
            if result is not None and result is not bucket.flat and result is not bucket.wire:
                bucket.flat[...] = result  # a hook that reduced into a new array (compression)
            self.observer.bucket_done(bucket.index, work)
            bucket.work = None

    def _check_unused(self, counts: np.ndarray, shadow: bool) -> None:
        if bool((counts >= self.backend.size).all()):
            return
        self.used_since_sync[:] = False
        self.phase = Phase.SYNCED if shadow else Phase.LOCAL  # leave a usable state for the next iteration
        names = [self.names[i] for i in np.flatnonzero(~self.arrived)]
        here = (f"on this rank ({self.backend.rank}) these parameters got no gradient: {names}"
                if names else "another rank had parameters that got no gradient")
        raise UnusedParametersError(
            f"DistributedDataParallel: {here}. Every parameter must take part in the loss on every "
            "rank for the gradient all-reduce to line up. Pass find_unused_parameters=True to "
            "DistributedDataParallel(...) if some parameters are legitimately unused in some iterations "
            "(they are then reduced as zeros), or remove them from the model.")

    def _write_back(self, used_anywhere) -> None:
        for bucket in self.buckets:
            for k, i in enumerate(self.plan[bucket.index]):
                if used_anywhere is not None and not used_anywhere[i]:
                    continue  # unused on every rank: leave .grad alone (torch semantics)
                p = self.params[i]
                view = bucket.views[k]
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
