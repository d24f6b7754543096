"""Gradient buckets: the one bucketing concept of DDP, ZeRO-2 and FSDP.

Every gradient reducer of the package works on the same pieces, defined here once:

* :func:`plan_buckets` cuts the parameters into buckets (torch's rule: reverse registration
  order, one dtype per bucket, a bucket closes once it reaches its cap);
* :class:`Bucket` is one bucket: its parameters, their :class:`~neural_arch.distributed.flat_param.FlatLayout`,
  the flat gradient array with a view per parameter, how many gradients are still pending,
  and the reduction in flight;
* :class:`BucketSet` holds a reducer's buckets, where each parameter sits, the parameters'
  post-accumulate-grad hooks, and launches complete buckets **in plan order** (so every rank
  issues the same collectives in the same order even if gradient hooks fire in another order).

What differs between the reducers is only the collective a full bucket goes to: DDP's
:class:`~neural_arch.distributed.ddp.reducer.Reducer` hands it to the comm hook (an all-reduce by
default), :class:`ShardedGradReducer` (ZeRO-2) reduce-scatters it, and FSDP's
:class:`~neural_arch.distributed.fsdp.owner_reducer.OwnerGradReducer` reduces each gradient to
its owners as it arrives (no flat bucket, on purpose) but uses the same :class:`BucketSet` for
its layouts, parameter map, hooks and pending counts.

**ZeRO-2** (:class:`ShardedGradReducer`): as each gradient is final it is copied into its
bucket's padded flat array and the parameter's ``.grad`` is dropped at once (so a bucket costs
one copy of its gradients, not two); when a bucket is complete and every bucket before it has
gone, an asynchronous ``reduce_scatter(AVG)`` hands rank ``r`` the averaged slice ``r`` of that
bucket, ``on_ready(bucket_index)`` is called, and the flat array is dropped as soon as the
reduce-scatter completes. At the end of backward (a callback queued in the outermost backward)
the reducer reduces what is left (buckets whose parameters got no gradient are reduced as zeros,
so every rank runs the same collectives), waits, and hands every averaged shard to
``on_shard(bucket_index, shard)``. Constraints: every rank must build the same buckets (same
model, same order), and a model must not be wrapped by DDP at the same time (its gradients
would be reduced twice).

Example (what :class:`~neural_arch.distributed.optim.ZeroRedundancyOptimizer` with ``stage=2`` does)::

    plan = plan_buckets([(p.numel(), p.dtype) for p in params], cap=25 << 20)
    buckets = [[params[i] for i in b] for b in plan]
    reducer = ShardedGradReducer(buckets, group, on_shard=lambda i, g: shards[i].grad.data.__iadd__(g))
    loss.backward()          # reduce-scatters as buckets fill, hands over shards at the end
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core import autograd as _ag
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.flat_param import FlatLayout

__all__ = ["Bucket", "BucketSet", "ShardedGradReducer", "plan_buckets", "queue_outermost_callback"]


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
    returned in launch order; ``first_cap=None`` gives the first bucket the same cap as the rest.
    A cap below one byte (callers truncate a tiny ``bucket_cap_mb * 2**20`` to 0) puts every
    parameter in a bucket of its own; a negative cap is a caller's bug and raises ValueError.

        >>> plan_buckets([(100, "float32"), (1000, "float32"), (10, "float32")], cap=4096, first_cap=100)
        [[2, 1], [0]]
    """
    for name, value in (("cap", cap), ("first_cap", first_cap)):
        if value is not None and not value >= 0:   # (also NaN)
            raise ValueError(f"plan_buckets: {name}={value} must be a number of bytes >= 0")
    cap = max(int(cap), 1)
    first_cap = cap if first_cap is None else max(min(int(first_cap), cap), 1)
    open_buckets: dict = {}  # dtype -> [indices, bytes, order key]
    closed: list[tuple[int, list[int]]] = []  # (order key, indices)
    had_first: set = set()   # dtypes whose first bucket is closed (their limit is cap now)
    order = 0
    for i in reversed(range(len(sizes_dtypes))):
        numel, dtype = sizes_dtypes[i]
        dtype = np.dtype(dtype)
        cur = open_buckets.get(dtype)
        if cur is None:
            cur = open_buckets[dtype] = [[], 0, order]
            order += 1
        cur[0].append(i)
        cur[1] += int(numel) * dtype.itemsize
        if cur[1] >= (cap if dtype in had_first else first_cap):
            closed.append((cur[2], cur[0]))
            del open_buckets[dtype]
            had_first.add(dtype)
    for indices, _, key in open_buckets.values():
        closed.append((key, indices))
    closed.sort(key=lambda kv: kv[0])
    return [indices for _, indices in closed]


def queue_outermost_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the *outermost* backward finishes.

    Activation checkpointing runs a nested backward inside the outer one; a plain
    ``queue_callback`` from a hook that fires inside it would run at the end of the nested pass,
    before the rest of the model has its gradients. (Uses the engine's callback stack: asked the
    core owner for a public ``queue_callback(fn, outermost=True)``.)

    Example::

        def on_grad(param):                      # a post-accumulate-grad hook
            queue_outermost_callback(wait_for_buckets)   # once, after the whole backward
    """
    stack = _ag._callback_stack()
    if not stack:
        raise RuntimeError("queue_outermost_callback() may only be called while backward runs")
    stack[0].append(fn)


def reduce_once_after_backward(owner, watched) -> list:
    """Hooks that queue ``owner.reduce`` once, at the end of the outermost backward, from a
    post-accumulate-grad hook on each parameter of ``watched`` that requires a gradient; ``owner.pending``
    (a bool the owner's ``reduce`` clears) marks it queued. Returns the handles (``h.remove()`` detaches).
    The end-of-backward reducers of expert parameters (DDP/ZeRO's and FSDP's) share it.

    Example::

        handles = reduce_once_after_backward(reducer, replicated_params)   # reducer.reduce() once per backward
    """
    def hook(_param) -> None:
        if not owner.pending:
            owner.pending = True
            queue_outermost_callback(owner.reduce)

    handles, seen = [], set()
    for p in watched:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


class Bucket:
    """One gradient bucket: its parameters laid end to end in a flat array (a view per
    parameter), how many of their gradients are still pending in this backward, and the
    reduction in flight (``work``).

    The flat array is made by :meth:`allocate`, once (DDP keeps it) or per backward and dropped
    with :meth:`release` (ZeRO-2: a bucket's gradients must not outlive their reduction). A
    ``tail`` of extra elements may follow the gradients in the same array (``wire``), so that one
    collective reduces both (DDP's control vector).

    Example::

        >>> import numpy as np
        >>> b = Bucket(0, [np.zeros((2, 2)), np.zeros(3)], FlatLayout([(2, 2), (3,)], world_size=2))
        >>> b.pending, b.allocate(np, np.float64, tail=1).size, [v.shape for v in b.views]
        (2, 9, [(2, 2), (3,)])
    """

    __slots__ = ("expected", "flat", "index", "layout", "params", "pending", "tail", "views", "wire", "work")

    def __init__(self, index: int, params: Sequence, layout: FlatLayout):
        self.index = index
        self.params = list(params)
        self.layout = layout
        #: gradients this bucket waits for in a backward (parameters that require one)
        self.expected = sum(1 for p in self.params if getattr(p, "requires_grad", True))
        self.pending = self.expected
        self.work = None
        self.wire = self.flat = self.tail = None
        self.views: list = []

    def allocate(self, xp, dtype, tail: int = 0):
        """Make the zeroed flat array (padded like the layout) followed by ``tail`` extra elements;
        returns the whole array (``wire``)."""
        n = self.layout.padded_numel
        self.wire = xp.zeros(n + int(tail), dtype=dtype)
        self.flat = self.wire[:n]
        self.tail = self.wire[n:]
        # one view object per slot, made once: ``grad.data is view`` then tells whether a
        # gradient already lives in the bucket (DDP's gradient_as_bucket_view)
        self.views = self.layout.views(self.flat)
        return self.wire

    def release(self) -> None:
        """Drop the flat array (whoever still holds it, e.g. a collective in flight, keeps it alive)."""
        self.wire = self.flat = self.tail = None
        self.views = []

    def put(self, k: int, grad, add: bool = False) -> None:
        """Write (or add) parameter ``k``'s gradient array into its slot of the flat array."""
        lay = self.layout
        off, n = lay.offsets[k], lay.sizes[k]
        if add:
            self.flat[off:off + n] += grad.reshape(-1)
        else:
            self.flat[off:off + n] = grad.reshape(-1)

    def reset(self) -> None:
        """Start a new backward: every gradient pending again, nothing in flight."""
        self.pending = self.expected
        self.work = None

    def __repr__(self) -> str:
        return f"Bucket({self.index}, params={len(self.params)}, pending={self.pending}, numel={self.layout.numel})"


class BucketSet:
    """A reducer's buckets (lists of parameters), where each parameter sits, its gradient hooks,
    and in-order launching.

    Args:
        buckets: lists of parameters; every rank passes the same shapes in the same order.
        world_size: the layouts are padded to split evenly over this many ranks (1: no padding).
        owner: the reducer's name, for error messages.

    Example::

        >>> import numpy as np
        >>> from neural_arch.nn.parameter import Parameter
        >>> w, b = Parameter(np.zeros((2, 2))), Parameter(np.zeros(2))
        >>> buckets = BucketSet([[b], [w]])
        >>> buckets.locate(w), len(buckets)
        ((1, 0), 2)
        >>> buckets[0].pending = 0
        >>> launched = []; buckets.launch_ready(launched.append); [x.index for x in launched]
        [0]
    """

    def __init__(self, buckets: Sequence[Sequence], world_size: int = 1, owner: str = "BucketSet"):
        self.buckets = [Bucket(i, b, FlatLayout([tuple(p.shape) for p in b], world_size))
                        for i, b in enumerate(buckets)]
        self._where: dict = {}  # id(param) -> (bucket index, position in the bucket)
        for bucket in self.buckets:
            for k, p in enumerate(bucket.params):
                if id(p) in self._where:
                    raise ValueError(f"{owner}: a parameter appears in two buckets (tied weights must be passed once)")
                self._where[id(p)] = (bucket.index, k)
        self._handles: list = []
        #: the first bucket not yet launched in this backward (buckets launch in plan order)
        self.next_launch = 0

    def __len__(self) -> int:
        return len(self.buckets)

    def __iter__(self) -> Iterator[Bucket]:
        return iter(self.buckets)

    def __getitem__(self, i: int) -> Bucket:
        return self.buckets[i]

    @property
    def layouts(self) -> list[FlatLayout]:
        return [b.layout for b in self.buckets]

    def locate(self, param) -> tuple[int, int]:
        """``(bucket index, position in the bucket)`` of ``param``."""
        return self._where[id(param)]

    def register_hooks(self, hook: Callable) -> None:
        """Register ``hook(param)`` as the post-accumulate-grad hook of every parameter that requires a gradient."""
        self._handles += [p.register_post_accumulate_grad_hook(hook)
                          for b in self.buckets for p in b.params if p.requires_grad]

    def remove_hooks(self) -> None:
        """Unregister the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def reset(self) -> None:
        """Start a new backward (every bucket pending again, none launched)."""
        for b in self.buckets:
            b.reset()
        self.next_launch = 0

    def launch_ready(self, launch: Callable[[Bucket], None]) -> None:
        """``launch(bucket)`` for every complete bucket that is next in plan order.

        Called when a bucket completes: it launches that bucket and the complete ones queued
        behind it, at once, so the backend's progress lane runs them back to back."""
        buckets, n = self.buckets, len(self.buckets)
        while self.next_launch < n and buckets[self.next_launch].pending == 0:
            bucket = buckets[self.next_launch]
            self.next_launch += 1
            launch(bucket)

    def launch_rest(self, launch: Callable[[Bucket], None]) -> None:
        """``launch(bucket)`` for every bucket not launched yet, complete or not, in plan order
        (the end of backward: gradients that never arrived are reduced as what the bucket holds)."""
        while self.next_launch < len(self.buckets):
            bucket = self.buckets[self.next_launch]
            self.next_launch += 1
            launch(bucket)

    def launched(self, i: int) -> bool:
        """Whether bucket ``i`` was launched in this backward."""
        return i < self.next_launch


class ShardedGradReducer:
    """Reduce-scatter the gradients of ``buckets`` (lists of parameters) over ``group`` (ZeRO-2;
    see the module docstring).

    Args:
        buckets: lists of parameters; every rank must pass the same shapes in the same order.
        group: a ProcessGroup (its ``backend`` runs the collectives).
        on_shard: ``on_shard(bucket_index, averaged_shard_array)`` once per bucket per backward.
        reduce_dtype: dtype the reduction runs in (default: the parameters' dtype).
        scatter: False all-reduces each bucket instead (every rank gets the whole averaged flat
            bucket); ``on_shard`` then receives the full padded flat array.
        replicate_group: after the reduce-scatter, average the shard over this group as well
            (sharded within a node, replicated across nodes).
        on_ready: ``on_ready(bucket_index)`` right after a bucket's gradients are all final and
            its reduction was started (during backward).

    Example::

        reducer = ShardedGradReducer([[w2, b2], [w1, b1]], group, on_shard=keep_shard)
        loss.backward()
        reducer.remove()          # unregister the gradient hooks
    """

    def __init__(self, buckets: Sequence[Sequence], group, on_shard: Callable[[int, object], None],
                 reduce_dtype=None, scatter: bool = True, replicate_group=None,
                 on_ready: Callable[[int], None] | None = None):
        self.group = group
        self.world = group.size()
        self.rank = group.rank()
        self.scatter = bool(scatter)
        self.replicate_group = replicate_group
        self.on_shard = on_shard
        self.on_ready = on_ready
        self.reduce_dtype = reduce_dtype
        self.buckets = BucketSet(buckets, self.world if self.scatter else 1, owner="ShardedGradReducer")
        self.buckets.register_hooks(self._hook)
        self._reset()

    @property
    def layouts(self) -> list[FlatLayout]:
        return self.buckets.layouts

    def remove(self) -> None:
        """Unregister the gradient hooks."""
        self.buckets.remove_hooks()

    # -- per-backward state ---------------------------------------------------------------
    def _reset(self) -> None:
        self.buckets.reset()
        for bucket in self.buckets:
            bucket.release()
        self._inflight: dict = {}  # bucket -> (work, shard output, [flat input until completion])
        self._late: dict = {}      # bucket -> gradients final after the bucket launched (see _hook)
        self._seen: set = set()    # parameters whose gradient was final once in this backward
        self._armed = False

    def _flat(self, bucket: Bucket, like):
        if bucket.flat is None:
            bucket.allocate(_backend.get_array_module(like), self.reduce_dtype or bucket.params[0].dtype)
        return bucket.flat

    def _hook(self, p) -> None:
        if not self._armed:
            self._armed = True
            queue_outermost_callback(self._finish)
        i, k = self.buckets.locate(p)
        bucket = self.buckets[i]
        if id(p) in self._seen:
            # A second final gradient in one backward: the parameter is used inside two
            # activation-checkpointed calls (each recomputation is a nested backward). Added to
            # the bucket if it has not gone yet, else kept aside: _finish reduces it in one more
            # collective (every rank runs the same graph).
            if p.grad is not None:
                if not self.buckets.launched(i):
                    self._flat(bucket, p.grad.data)
                    bucket.put(k, p.grad.data, add=True)
                else:
                    lay = bucket.layout
                    late = self._late.get(i)
                    if late is None:
                        xp = _backend.get_array_module(p.grad.data)
                        late = self._late[i] = xp.zeros(lay.padded_numel, dtype=self.reduce_dtype or p.dtype)
                    late[lay.offsets[k]:lay.offsets[k] + lay.sizes[k]] += p.grad.data.reshape(-1)
                p.grad = None
            return
        self._seen.add(id(p))
        if p.grad is not None:
            # Copy into the bucket now and drop .grad: the full gradient of a parameter never
            # outlives the moment it is final (the point of ZeRO-2), and a bucket is one copy.
            self._flat(bucket, p.grad.data)
            bucket.put(k, p.grad.data)
            p.grad = None
        bucket.pending -= 1
        if bucket.pending == 0:
            self.buckets.launch_ready(self._launch)

    def _launch(self, bucket: Bucket) -> None:
        if not bucket.params:  # an empty bucket: nothing to reduce
            return
        i, layout = bucket.index, bucket.layout
        for k, p in enumerate(bucket.params):
            if p.grad is not None:  # only a bucket launched at the end (some grads missing)
                self._flat(bucket, p.grad.data)
                bucket.put(k, p.grad.data)
                p.grad = None
        flat = self._flat(bucket, bucket.params[0].data)
        bucket.release()
        xp = _backend.get_array_module(flat)
        if self.scatter:
            out = xp.empty(layout.shard_size, dtype=flat.dtype)
            work = self.group.backend.reduce_scatter(out, flat, ReduceOp.AVG, async_op=True)
            keep = [flat]
            del flat
            # drop the flat input the moment the reduce-scatter is done, not at the end of backward
            work.add_done_callback(lambda _w, keep=keep: keep.clear())
        else:
            out = flat
            work = self.group.backend.allreduce(flat, ReduceOp.AVG, async_op=True)
            keep = []
        bucket.work = work
        self._inflight[i] = (work, out, keep)
        if self.on_ready is not None:
            self.on_ready(i)

    def _finish(self) -> None:
        try:
            # Buckets some of whose parameters got no gradient: reduce them too (zeros), in
            # bucket order, so that every rank issues the same collectives.
            self.buckets.launch_rest(self._launch)
            for i in sorted(self._inflight):
                work, out, _ = self._inflight[i]
                work.wait()
                if self.replicate_group is not None:
                    self.replicate_group.backend.allreduce(out, ReduceOp.AVG)
                self.on_shard(i, out)
            for i in sorted(self._late):
                late = self._late[i]
                if self.scatter:
                    out = _backend.get_array_module(late).empty(self.layouts[i].shard_size, dtype=late.dtype)
                    self.group.backend.reduce_scatter(out, late, ReduceOp.AVG)
                else:
                    out = late
                    self.group.backend.allreduce(late, ReduceOp.AVG)
                if self.replicate_group is not None:
                    self.replicate_group.backend.allreduce(out, ReduceOp.AVG)
                self.on_shard(i, out)
        finally:
            self._reset()
