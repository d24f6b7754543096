"""Gradient buckets for DistributedDataParallel: the plan (plain data) and the reducer.

**Plan** (:func:`plan_buckets`): parameters in *reverse* registration order (roughly the order
backward produces their gradients), cut like torch: a bucket closes once it holds ``cap`` bytes
(the first one ``first_cap``, 1 MB like torch, so communication starts early), one dtype per
bucket. The plan is a list of lists of parameter indices: printable and unit-testable without
sockets::

    >>> plan_buckets([(100, "float32"), (1000, "float32"), (10, "float32")], cap=4096, first_cap=100)
    [[2, 1], [0]]

**Reducer** (:class:`Reducer`): each parameter's post-accumulate-grad hook copies its gradient
into its bucket's flat array; when every gradient of a bucket is in, the bucket goes to the
**comm hook** (:mod:`.comm_hooks`; the default all-reduces the average) while backward goes on.
Buckets are handed to the hook strictly in plan order, so every rank issues the same
collectives in the same order even if gradient hooks fire in a different order. An
end-of-backward callback (``queue_callback``) reduces what is left, waits, and writes the
averaged gradients back (or, with ``gradient_as_bucket_view``, leaves ``.grad`` as views into
the buckets: no copy).

With the buckets goes one **control** vector: per parameter, 1 if it got a gradient on this rank.
Summed over ranks it tells every rank whether any rank had unused parameters (so the error is
raised everywhere instead of some ranks hanging) and, with ``find_unused_parameters``, which
parameters no rank used (their ``.grad`` is left alone, as torch does). With the default hook the
control vector travels in a named slot after the last bucket's gradients (``_Bucket.control``,
outside the ``GradBucket`` a hook sees: no extra collective); with a custom comm hook it is a
small all-reduce of its own after the buckets.

The per-iteration state is one :class:`Phase`; everything else is derived from it.

**Overlap, measured per bucket**: each bucket records when its last gradient arrived (ready), when
it went to the hook (launched), when its reduction started (the Work's ``started_at`` if the
backend sets it, else the end of the previous bucket's: a group's collectives run in order) and
when it was done; the part of started -> done before backward's end is "hidden". The same four
instants are emitted to :mod:`neural_arch.profiler.events` as one span per bucket
(``"bucket i"``, category ``"bucket"``, ready -> done) when something subscribes.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence

import numpy as np

from neural_arch import backend as _xpmod
from neural_arch.core.tensor import Tensor, queue_callback
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.errors import UnusedParametersError
from neural_arch.distributed.ddp.comm_hooks import GradBucket, allreduce_hook
from neural_arch.profiler import events

MB = 1024 * 1024

__all__ = ["Phase", "Reducer", "UnusedParametersError", "plan_buckets"]


def plan_buckets(sizes_dtypes: Sequence[tuple[int, str]], cap: int, first_cap: int | None = None) -> list[list[int]]:
    """Cut parameters ``[(numel, dtype), ...]`` (registration order) into buckets of indices.

    torch's rule (``compute_bucket_assignment_by_size``): walk the parameters in reverse order,
    add each to the open bucket of its dtype, and close that bucket as soon as it holds at least
    ``first_cap`` bytes (its dtype's first bucket) or ``cap`` bytes (every later one). So a large
    parameter *closes* the bucket it joins instead of opening the next one: the parameter whose
    gradient arrives early in backward travels early, not held back until the next (later) ones
    fill a bucket behind it -- in an MLP 784-1024-1024-10 the 4 MB middle weight goes out while
    the first layer's gradient is computed (the old "close before passing the cap" rule held it
    back with the first layer's, so the default 25 MB cap hid almost nothing). Buckets are
    returned in launch order.
    """
    cap = max(int(cap), 1)
    first_cap = cap if first_cap is None else max(min(int(first_cap), cap), 1)
    open_buckets: dict = {}  # dtype -> [indices, bytes, order key]
    closed: list[tuple[int, list[int]]] = []  # (order key, indices)
    had_first: set = set()   # dtypes whose first bucket is closed (their limit is cap now)
    order = 0
    for i in reversed(range(len(sizes_dtypes))):
        numel, dtype = sizes_dtypes[i]
        cur = open_buckets.get(dtype)
        if cur is None:
            cur = open_buckets[dtype] = [[], 0, order]
            order += 1
        cur[0].append(i)
        cur[1] += int(numel) * np.dtype(dtype).itemsize
        if cur[1] >= (cap if dtype in had_first else first_cap):
            closed.append((cur[2], cur[0]))
            del open_buckets[dtype]
            had_first.add(dtype)
    for indices, _, key in open_buckets.values():
        closed.append((key, indices))
    closed.sort(key=lambda kv: kv[0])
    return [indices for _, indices in closed]


class Phase(enum.Enum):
    """Where the reducer is in an iteration (the only per-iteration state it keeps)."""

    SYNCED = "synced"          # idle; every .grad holds the global average (sync_gradients() is a no-op)
    LOCAL = "local"            # idle; .grad holds local accumulations (after no_sync backward passes)
    ACCUMULATING = "accumulating"  # a backward without synchronisation is running (no_sync)
    REDUCING = "reducing"      # a synchronised backward is running: buckets fill and go to the hook


class _Bucket:
    """A flat gradient buffer, the parameters it holds, and its in-flight reduction."""

    __slots__ = ("buffer", "control", "grad_bucket", "index", "nbytes", "params", "pending", "t_done", "t_launch",
                 "t_ready", "t_start", "views", "wire", "wire_bucket", "work")

    def __init__(self, index: int, params: list[int], tensors: list[Tensor], xp, last: bool, n_control: int = 0):
        self.index = index
        self.params = params  # parameter indices, in buffer order
        numels = [int(t.data.size) for t in tensors]
        offsets = np.concatenate([[0], np.cumsum(numels)]).astype(np.int64).tolist()
        #: what the default hook reduces: the gradients, then (last bucket only) the control vector
        self.wire = xp.zeros(offsets[-1] + n_control, dtype=tensors[0].data.dtype)
        self.buffer = self.wire[:offsets[-1]]
        self.control = self.wire[offsets[-1]:]
        slots = [(offsets[k], offsets[k + 1], t.data.shape) for k, t in enumerate(tensors)]
        self.grad_bucket = GradBucket(index, self.buffer, slots, tensors, last)
        self.wire_bucket = GradBucket(index, self.wire, slots, tensors, last) if n_control else self.grad_bucket
        # One view object per slot, made once: ``grad.data is view`` then tells whether a
        # gradient already lives in the bucket (gradient_as_bucket_view), with no copy needed.
        self.views = self.grad_bucket.gradients()
        self.pending = len(params)
        self.work = None
        self.nbytes = int(self.buffer.nbytes)
        # perf_counter times of this backward: last gradient in, handed to the hook, reduced
        self.t_ready = self.t_launch = self.t_start = self.t_done = 0.0

    def reset(self) -> None:
        self.pending = len(self.params)
        self.work = None
        self.t_ready = self.t_launch = self.t_start = self.t_done = 0.0


class Reducer:
    """Owns the buckets and the per-iteration state of one DDP instance (see the module docstring)."""

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
        last = len(self.plan) - 1
        self.buckets = [_Bucket(b, idx, [self.params[i] for i in idx], self.xp, last=(b == last),
                                n_control=len(self.params) if b == last else 0)
                        for b, idx in enumerate(self.plan)]
        self.where = [(0, 0)] * len(self.params)  # param -> (bucket, slot)
        for bucket in self.buckets:
            for k, i in enumerate(bucket.params):
                self.where[i] = (bucket.index, k)
        self.hook_state, self.hook = None, None
        self._set_hook(backend, allreduce_hook)  # state, hook(state, bucket) -> Work
        self._scale = 1.0 / backend.size
        self.phase = Phase.SYNCED
        self.arrived = np.zeros(len(self.params), dtype=bool)       # got a gradient in this backward
        self.used_since_sync = np.zeros(len(self.params), dtype=bool)  # ... in any backward since the last sync
        self.next_launch = 0
        # Overlap statistics, summed over synchronised backwards (see DDP.comm_stats()).
        self.stats = {"backwards": 0, "comm_s": 0.0, "exposed_s": 0.0, "launched_before_end": 0, "buckets": 0}
        #: per bucket, summed like ``stats``: seconds of communication, and the part of it before backward's end
        self.bucket_comm_s = np.zeros(len(self.buckets))
        self.bucket_hidden_s = np.zeros(len(self.buckets))
        #: [(event, bucket index or None, perf_counter time)] of the latest synchronised backward
        self.timeline: list = []
        #: one dict per bucket of the latest synchronised backward (see :meth:`_bucket_records`)
        self.records: list[dict] = []

    # -- the comm hook ------------------------------------------------------------------------------
    def register_comm_hook(self, state, hook) -> None:
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be callable as hook(state, bucket) -> Work, got {hook!r}")
        if self.hook is not allreduce_hook:
            raise RuntimeError("register_comm_hook can only be called once per DistributedDataParallel (as in torch)")
        if self.phase in (Phase.REDUCING, Phase.ACCUMULATING):
            raise RuntimeError("register_comm_hook: call it before the first backward, not during one")
        self._set_hook(state, hook)

    def _set_hook(self, state, hook) -> None:
        """Install the hook; whether buckets reach it pre-scaled by 1/world is decided here, once."""
        self.hook_state, self.hook = state, hook
        self._prescale = bool(getattr(hook, "accepts_prescaled", False))
        for bucket in self.buckets:
            bucket.grad_bucket.prescaled = self._prescale
            bucket.wire_bucket.prescaled = self._prescale

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
        bucket.t_ready = time.perf_counter()
        # Launch every bucket that is complete and next in plan order, at once: the hook only
        # queues the bucket on the backend's progress lane, so backward goes on immediately and
        # the lane runs bucket after bucket with no wait on this thread in between.
        buckets, n = self.buckets, len(self.buckets)
        while self.next_launch < n and buckets[self.next_launch].pending == 0:
            self._launch(buckets[self.next_launch])
            self.next_launch += 1

    def _begin_backward(self, sync: bool) -> None:
        if sync:
            self._start_iteration()
            self.phase = Phase.REDUCING
            self.timeline = [("backward_start", None, time.perf_counter())]
        else:
            self.phase = Phase.ACCUMULATING
        queue_callback(self._end_backward)

    def _start_iteration(self) -> None:
        self.arrived[:] = False
        self.next_launch = 0
        for bucket in self.buckets:
            bucket.reset()

    def abandon_backward(self) -> None:
        """Forget a backward that raised midway: wait for what it launched, keep the local grads."""
        try:
            self._wait_all()
        finally:
            self.phase = Phase.LOCAL

    def _copy_in(self, bucket: _Bucket, k: int, p: Tensor) -> None:
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

    def _launch(self, bucket: _Bucket, inline: bool = False) -> None:
        """Hand ``bucket`` to the comm hook. ``inline=True`` (buckets left at the end of backward,
        about to be waited for) lets a hook that supports it run on this thread: that saves two
        thread hand-offs. Backends keep collectives in order either way."""
        bucket.t_launch = time.perf_counter()
        if not bucket.t_ready:
            bucket.t_ready = bucket.t_launch  # filled at backward's end (gradients that never arrived)
        self.timeline.append(("launch", bucket.index, bucket.t_launch))
        grad_bucket = bucket.grad_bucket
        if bucket.control.size and self._piggyback():
            bucket.control[...] = self._control_flags()  # counts are not scaled: the wire is SUM-reduced
            grad_bucket = bucket.wire_bucket
        if inline and getattr(self.hook, "supports_inline", False):
            bucket.work = self.hook(self.hook_state, grad_bucket, async_op=False)
        else:
            bucket.work = self.hook(self.hook_state, grad_bucket)
        if bucket.work is None or not hasattr(bucket.work, "result"):
            raise TypeError(f"the DDP comm hook {getattr(self.hook, '__name__', self.hook)!r} returned "
                            f"{bucket.work!r}; it must return a Work whose result() is the reduced flat buffer")

    # -- one synchronisation, shared by backward's end, sync_gradients() and join's shadow ------------
    def _reduce_and_write_back(self, launched_before_end: int, t_end: float, shadow: bool = False) -> None:
        """Launch the buckets not yet launched, run the control all-reduce, wait, check, write back."""
        for b in range(self.next_launch, len(self.buckets)):
            # nothing left to overlap with: run what is left on this thread
            self._launch(self.buckets[b], inline=True)
        self.next_launch = len(self.buckets)
        # Per parameter: on how many ranks it got a gradient (in this backward, or since the last
        # sync for find_unused_parameters' "leave .grad alone if no rank used it").
        if self._piggyback():
            self._wait_all()
            used_count = self.buckets[-1].control
        else:
            used_count = self.xp.asarray(self._control_flags().astype(np.float32))
            control = self.backend.allreduce(used_count, ReduceOp.SUM, async_op=True)
            self._wait_all()
            control.wait()
        t_waited = time.perf_counter()
        self.timeline.append(("waited", None, t_waited))
        if not shadow:
            self._record_stats(t_end, t_waited, launched_before_end)
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
        t_end = time.perf_counter()
        self.timeline.append(("backward_end", None, t_end))
        launched_before_end = self.next_launch
        for i in np.flatnonzero(~self.arrived):  # no gradient in this backward: local grad or zeros
            b, k = self.where[i]
            self._copy_in(self.buckets[b], k, self.params[i])
        self._reduce_and_write_back(launched_before_end, t_end)

    def sync_now(self) -> None:
        """Average every gradient now (seed 001's ``sync_gradients()``); no-op if already global."""
        if self.grads_are_global:
            return
        self._start_iteration()
        self.timeline = [("manual_sync", None, time.perf_counter())]
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
            bucket.buffer[...] = 0
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
            if result is not None and result is not bucket.buffer and result is not bucket.wire:
                bucket.buffer[...] = result  # a hook that reduced into a new array (compression)
            bucket.t_done = getattr(work, "completed_at", None) or time.perf_counter()
            # when the backend started it, if it says (else estimated from the serial lane)
            bucket.t_start = getattr(work, "started_at", None) or 0.0
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
            for k, i in enumerate(bucket.params):
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

    def _bucket_records(self, t_end: float) -> list[dict]:
        """Per bucket of this backward: when it was ready, launched, started, done (perf_counter),
        its bytes, and how much of its communication ran before backward's end (hidden).

        A backend runs a group's collectives one after another on its progress lane, so a bucket
        starts at max(its launch, the previous bucket's end) unless the Work says when it started."""
        records, prev_done = [], 0.0
        for bucket in self.buckets:
            start = bucket.t_start or max(bucket.t_launch, prev_done)
            done = max(bucket.t_done, start)
            comm = done - start
            hidden = min(max(t_end - start, 0.0), comm)
            records.append({"index": bucket.index, "bytes": bucket.nbytes, "ready": bucket.t_ready,
                            "launched": bucket.t_launch, "started": start, "done": done, "comm_s": comm,
                            "hidden_s": hidden, "hidden_fraction": hidden / comm if comm > 0 else 1.0})
            prev_done = done
        return records

    def _record_stats(self, t_end: float, t_waited: float, launched_before_end: int) -> None:
        # "Hidden" communication ran while backward still computed; the rest is "exposed": the
        # end of backward had to wait for it.
        records = self.records = self._bucket_records(t_end)
        for r in records:
            self.timeline.append(("ready", r["index"], r["ready"]))
            self.timeline.append(("done", r["index"], r["done"]))
        self.timeline.sort(key=lambda e: e[2])  # stable: events at the same instant keep their order
        comm = sum(r["comm_s"] for r in records)
        hidden = sum(r["hidden_s"] for r in records)
        self.bucket_comm_s += [r["comm_s"] for r in records]
        self.bucket_hidden_s += [r["hidden_s"] for r in records]
        s = self.stats
        s["backwards"] += 1
        s["comm_s"] += comm
        s["exposed_s"] += comm - hidden
        s["launched_before_end"] += launched_before_end
        s["buckets"] += len(self.buckets)
        if events.OBSERVERS:
            # One span per bucket, ready -> done (it overlaps backward when communication was hidden).
            for r in records:
                events.emit(events.Span(f"bucket {r['index']}", "bucket", r["ready"], r["done"], lane="ddp buckets",
                                        args={"index": r["index"], "bytes": r["bytes"], "ready": r["ready"],
                                              "launched": r["launched"], "started": r["started"], "done": r["done"],
                                              "hidden_fraction": round(r["hidden_fraction"], 4)}))
