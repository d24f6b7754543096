"""DistributedDataParallel: data-parallel training as a readable pipeline.

``DistributedDataParallel(module)`` does, in this order:

1. **verify** that every rank holds the same parameters (name, shape, dtype), raising on
   *every* rank with the offending names when they differ;
2. **broadcast** parameters and buffers from rank 0 (one flat array per dtype: few calls);
3. **bucket** the gradients in reverse registration order (:mod:`.reducer`): gradient hooks
   fill the buckets during backward and each full bucket's all-reduce starts at once, on the
   backend's progress thread, while backward goes on; an end-of-backward callback waits for
   the rest and writes the averaged gradients back. ``optimizer.step()`` needs no extra call.
   How well communication hid behind backward is measured per bucket (:meth:`~neural_arch.distributed.ddp.distributed_data_parallel.DistributedDataParallel.bucket_stats`,
   ``comm_stats()["bucket_hidden_fraction"]``) and reported to :mod:`neural_arch.profiler` as one
   span per bucket (category ``"bucket"``, ready -> done) when a profiler listens.

Example (any backend; also a world of one under plain ``python``)::

    init_process_group()
    model = DistributedDataParallel(nn.Linear(4, 2))
    opt = SGD(model.parameters(), lr=0.1)
    loss = F.mse_loss(model(x), y)      # x, y: this rank's share of the batch
    loss.backward()                     # gradients are now averaged over ranks
    opt.step()

Gradient accumulation: ``with model.no_sync(): loss.backward()`` accumulates locally; the next
synchronised backward reduces the accumulated sum. Uneven inputs: ``with model.join(): ...``.

Warnings (constraints, as in torch):

* every rank must run forward/backward the same number of times (use ``join()`` otherwise) and
  every parameter must get a gradient in each synchronised backward, unless
  ``find_unused_parameters=True``;
* gradients are **averaged** (divided by the group size), so the loss should be a per-rank mean;
* do not change the set or shapes of parameters after wrapping;
* ``state_dict()`` returns the **inner module's** keys (no ``"module."`` prefix, unlike torch),
  so checkpoints load into the bare model; ``load_state_dict`` accepts both spellings.
  ``named_parameters()`` keeps torch's ``"module."`` prefix (it is the Module tree);
* ``no_sync`` is decided per backward: a backward skips the all-reduce when its forward ran under
  ``no_sync()`` (torch's rule) or when ``no_sync()`` is active while it runs;
* a world of one has nothing to synchronise: DDP then installs no hooks and adds no work;
* expert parameters (``param.allreduce = False``, set by ``parallelize_moe``) are not averaged
  over the group: they are summed over ``param.expert_dp_group`` (the ranks holding the same
  expert) and divided by the group size, which equals one process on the global batch
  (:mod:`.expert_grads`); they are left out of ``bucket_plan`` and of the rank-0 broadcast.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from neural_arch.core.autograd import is_grad_enabled, queue_callback
from neural_arch.distributed.ddp.expert_grads import ExpertGradReducer, is_expert_parameter
from neural_arch.distributed.ddp.join import Join
from neural_arch.distributed.ddp.reducer import Reducer
from neural_arch.distributed.ddp.replicas import broadcast_arrays
from neural_arch.distributed.errors import UnusedParametersError
from neural_arch.nn.module import Module

__all__ = ["DistributedDataParallel", "UnusedParametersError", "no_sync"]

# Depth of the seeds' module-level ``no_sync()``: while > 0, every DDP instance skips its sync.
_GLOBAL_NO_SYNC = [0]


@contextlib.contextmanager
def no_sync():
    """Seed-002 spelling: skip gradient synchronisation in **every** live DDP instance.

    Inside the block, backward passes accumulate gradients locally; the first synchronised
    backward after it reduces the accumulated gradients (same result, fewer all-reduces).

    Example::

        with no_sync():
            for mb in micro_batches[:-1]:
                loss_fn(model(mb)).backward()
        loss_fn(model(micro_batches[-1])).backward()     # averaged over ranks here

    Prefer ``model.no_sync()`` when several DDP models live in one process.
    """
    _GLOBAL_NO_SYNC[0] += 1
    try:
        yield
    finally:
        _GLOBAL_NO_SYNC[0] -= 1


def _expert_hook(ref) -> None:
    """Post-accumulate-grad hook body of an expert parameter (``ref``: a weakref to the DDP)."""
    ddp = ref()
    if ddp is not None:
        ddp._expert_grad_ready()


def _process_group_backend(process_group):
    """The backend to use, or a world of one when nothing was initialised (plain ``python``)."""
    from neural_arch.distributed.groups import backend_or_world_of_one

    return backend_or_world_of_one(process_group, "DistributedDataParallel")


def _group_of_mesh(process_group, device_mesh):
    """torch 2.x's ``device_mesh=`` argument -> the process group (a 1-d mesh's only group)."""
    if device_mesh is None:
        return process_group
    from neural_arch.distributed.device_mesh import DeviceMesh

    if process_group is not None:
        raise ValueError("DistributedDataParallel: pass process_group or device_mesh, not both "
                         "(device_mesh=mesh['dp'] means process_group=mesh['dp'].get_group())")
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"DistributedDataParallel: device_mesh must be a DeviceMesh (init_device_mesh), "
                        f"got {type(device_mesh).__name__}")
    if device_mesh.ndim != 1:
        names = getattr(device_mesh, "mesh_dim_names", None)
        hint = f" such as mesh[{names[0]!r}]" if names else ""
        raise ValueError(f"DistributedDataParallel: device_mesh must be 1-d (the data-parallel dimension{hint}), "
                         f"got a {device_mesh.ndim}-d mesh {device_mesh!r}")
    return device_mesh.get_group()


def _check_not_sharded_over(module, process_group) -> None:
    """Refuse flat shards (FullyShardedDataParallel's) whose shard group shares ranks with DDP's group:
    each such rank holds *another* slice, so DDP's broadcast from rank 0 would overwrite them with rank
    0's slice and its all-reduce would average unrelated elements. DDP across the replicas of one
    shard index (an orthogonal group) is fine."""
    for name, p in module.named_parameters():
        shard_group = getattr(getattr(p, "_flat_shard", None), "group", None)
        if shard_group is None or not hasattr(shard_group, "ranks"):
            continue
        if process_group is None:
            from neural_arch.distributed.resolve import _resolve_group

            process_group = _resolve_group(None, "DistributedDataParallel")
        ddp_ranks = getattr(process_group, "ranks", None)
        if ddp_ranks is not None and len(set(shard_group.ranks) & set(ddp_ranks)) > 1:
            raise ValueError(
                f"DistributedDataParallel: parameter {name!r} is a flat shard of FullyShardedDataParallel over "
                f"ranks {list(shard_group.ranks)}, which DDP's group {list(ddp_ranks)} shares; every rank holds a "
                "different slice, so DDP would overwrite them with rank 0's and average unrelated elements. FSDP "
                "already reduces its gradients: drop DDP, or use ShardingStrategy.HYBRID_SHARD for replicas")


class DistributedDataParallel(Module):
    """Wrap ``module`` so that backward averages gradients over the ranks of ``process_group``.

    Args:
        module: the model (same architecture on every rank).
        bucket_cap_mb: bucket size in MB (``bucket_size_mb``, seed 003's spelling, also works); as in
            torch a bucket closes once it holds that much, so a large parameter ends the bucket it joins.
            Smaller buckets start communicating earlier; larger ones make fewer calls.
        find_unused_parameters: allow parameters that get no gradient in some iterations (they
            are reduced as zeros; parameters unused on every rank keep their ``.grad``). Costs one
            small extra all-reduce per iteration.
        broadcast_buffers: broadcast buffers from rank 0 at every forward (no-op without buffers).
        gradient_as_bucket_view: make ``.grad.data`` views into the buckets (saves a copy and memory).
        process_group: the group to average over (default: the world).
        device_mesh: torch 2.x's alternative to ``process_group``: a 1-d
            :class:`~neural_arch.distributed.device_mesh.DeviceMesh` (e.g. ``mesh["dp"]``) whose group is
            the one to average over. Give one of the two, not both.
        first_bucket_mb: the first bucket closes at this size (1 MB, like torch): starts the first
            all-reduce early.
        device_ids, output_device: accepted for torch compatibility and ignored.
        static_graph: torch's promise that every iteration uses the same parameters; accepted and kept
            as ``ddp.static_graph`` (the reducer needs no such promise: results are the same either way).

    Example::

        >>> from neural_arch import nn
        >>> ddp = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
        >>> ddp.bucket_plan          # reverse registration order; all in the small first bucket
        [['2.bias', '2.weight', '0.bias', '0.weight']]
    """

    def __init__(self, module: Module, device_ids=None, output_device=None, broadcast_buffers: bool = True,
                 process_group=None, bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, *, bucket_size_mb: float | None = None,
                 first_bucket_mb: float = 1.0, device_mesh=None, static_graph: bool = False):
        super().__init__()
        process_group = _group_of_mesh(process_group, device_mesh)
        self.device_mesh = device_mesh      # as in torch 2.x: the 1-d mesh given, else None
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps an nn.Module, got {type(module).__name__}")
        if bucket_cap_mb is not None and bucket_size_mb is not None and bucket_cap_mb != bucket_size_mb:
            raise ValueError("pass only one of bucket_cap_mb and bucket_size_mb (they are the same setting)")
        cap = bucket_cap_mb if bucket_cap_mb is not None else (bucket_size_mb if bucket_size_mb is not None else 25.0)
        if not (cap > 0 and math.isfinite(cap)):
            raise ValueError(f"bucket_cap_mb must be > 0 and finite, got {cap}")
        self.module = module
        self.bucket_cap_mb = float(cap)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.broadcast_buffers = bool(broadcast_buffers)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.process_group = process_group
        self.static_graph = bool(static_graph)
        self._backend = _process_group_backend(process_group)
        _check_not_sharded_over(module, process_group)
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not trainable:
            raise ValueError("DistributedDataParallel: the module has no parameter that requires a gradient; "
                             "there is nothing to synchronise (use the module directly)")
        # Expert parameters (MoE under expert parallelism) differ between ranks by design: they
        # get their own broadcast and reduction (expert_grads.py), not the buckets.
        named = [(n, p) for n, p in trainable if not is_expert_parameter(p)]
        self._expert_param_names = [n for n, p in trainable if is_expert_parameter(p)]
        self.expert_reducer = ExpertGradReducer([p for _, p in trainable if is_expert_parameter(p)],
                                                self._backend.size)
        if not named:
            raise ValueError("DistributedDataParallel: every trainable parameter is an expert parameter "
                             "(allreduce=False); wrap a model that also has replicated parameters, or "
                             "leave DDP out")
        self._param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._no_sync_depth = 0
        self._forward_no_sync = False
        #: torch's switch, which nanoGPT sets instead of using ``no_sync()``. False skips the gradient
        #: all-reduce of the backward passes that follow, exactly like ``with ddp.no_sync():``.
        self.require_backward_grad_sync = True
        self._join = None
        self._hooks: list = []
        self._verify_and_broadcast()
        self.reducer = Reducer(self._params, self._param_names, self._backend, self.bucket_cap_mb,
                               float(first_bucket_mb), self.find_unused_parameters, self.gradient_as_bucket_view)
        if self._backend.size > 1:
            self._install_hooks()

    # -- construction ---------------------------------------------------------------------------
    def _verify_and_broadcast(self) -> None:
        backend = self._backend
        if backend.size == 1:
            return
        buffers = [(n, b) for n, b in self.module.named_buffers() if b is not None]
        mine = [(n, tuple(p.data.shape), str(p.data.dtype)) for n, p in zip(self._param_names, self._params)]
        mine += [("frozen " + n, tuple(p.data.shape), str(p.data.dtype)) for n, p in self.module.named_parameters()
                 if not p.requires_grad and not is_expert_parameter(p)]
        mine += [("buffer " + n, tuple(b.data.shape), str(b.data.dtype)) for n, b in buffers]
        everyone = backend.allgather_object(mine)
        problems = []
        for r, theirs in enumerate(everyone):
            if theirs == everyone[0]:
                continue
            if len(theirs) != len(everyone[0]):
                problems.append(f"rank {r} has {len(theirs)} parameters/buffers, rank 0 has {len(everyone[0])}")
            for a, b in zip(everyone[0], theirs):
                if a != b:
                    problems.append(f"rank 0 has {a[0]} {a[1]} {a[2]} but rank {r} has {b[0]} {b[1]} {b[2]}")
                    break
        if problems:
            raise ValueError("DistributedDataParallel: the model differs between ranks: " + "; ".join(problems)
                             + ". Build the same model (same layers, sizes and dtype) on every rank.")
        # Every replicated parameter, frozen ones too (torch syncs all module states): a frozen layer
        # initialised differently per rank would otherwise give each rank another model, silently.
        frozen = [p for _, p in self.module.named_parameters() if not p.requires_grad and not is_expert_parameter(p)]
        broadcast_arrays([p.data for p in self._params + frozen], backend, root=0)
        broadcast_arrays([b.data for _, b in buffers], backend, root=0)
        self.expert_reducer.broadcast()

    def _install_hooks(self) -> None:
        ref = weakref.ref(self)
        for i, p in enumerate(self._params):
            def hook(param, i=i):
                ddp = ref()
                if ddp is not None:
                    ddp.reducer.on_grad_ready(i, ddp._sync_wanted())
            self._hooks.append(p.register_post_accumulate_grad_hook(hook))
        for p in self.expert_reducer.params:
            self._hooks.append(p.register_post_accumulate_grad_hook(lambda param: _expert_hook(ref)))

    def _expert_grad_ready(self) -> None:
        # The first expert gradient of a synchronised backward queues one end-of-backward
        # reduction of all of them (after every expert's gradient is final).
        reducer = self.expert_reducer
        if not self._sync_wanted():
            reducer.unsynced = True              # reduced by the next synchronised backward
        elif not reducer.pending:
            reducer.pending = True
            queue_callback(reducer.reduce)

    def _sync_wanted(self) -> bool:
        # torch decides at forward time; we also honour a no_sync() active at backward time.
        return not (self._forward_no_sync or self._no_sync_active())

    def _no_sync_active(self) -> bool:
        return self._no_sync_depth > 0 or _GLOBAL_NO_SYNC[0] > 0 or not self.require_backward_grad_sync

    def remove_hooks(self) -> None:
        """Detach DDP from the parameters (afterwards backward no longer synchronises)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __del__(self):
        try:
            self.remove_hooks()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing useful to do
            pass

    # -- the module face -------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.reducer.in_backward:
            # The previous backward raised before its end-of-backward callback ran.
            self.reducer.abandon_backward()
        self._forward_no_sync = self._no_sync_active()
        self.expert_reducer.pending = False  # a backward that raised never ran its queued reduction
        if self._join is not None:
            self._join.before_forward(will_sync=self.training and is_grad_enabled() and not self._forward_no_sync)
        elif self.broadcast_buffers and self._backend.size > 1:
            self._broadcast_buffers()
        return self.module(*args, **kwargs)

    def _broadcast_buffers(self) -> None:
        buffers = [b.data for _, b in self.module.named_buffers() if b is not None]
        if buffers:
            broadcast_arrays(buffers, self._backend, root=0)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            if modules is not None and modules.get("module") is not None:
                return getattr(modules["module"], name)  # behave like the wrapped module
            raise

    def state_dict(self, prefix: str = "") -> OrderedDict[str, np.ndarray]:
        """The inner module's state dict (no ``"module."`` prefix; see the module docstring)."""
        return self.module.state_dict(prefix)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Load a state dict saved from the bare module or from a torch-style ``"module."``-prefixed one."""
        if state_dict and all(k.startswith("module.") for k in state_dict):
            state_dict = OrderedDict((k[len("module."):], v) for k, v in state_dict.items())
        return self.module.load_state_dict(state_dict, strict=strict)

    def extra_repr(self) -> str:
        return (f"world_size={self._backend.size}, buckets={len(self.reducer.buckets)}, "
                f"bucket_cap_mb={self.bucket_cap_mb}, find_unused_parameters={self.find_unused_parameters}")

    def _set_static_graph(self) -> None:
        """torch's older spelling of ``static_graph=True`` (nothing else to do here)."""
        self.static_graph = True

    # -- gradient synchronisation control ----------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally inside the block; the next synchronised backward reduces them."""
        self._no_sync_depth += 1
        try:
            yield
        finally:
            self._no_sync_depth -= 1

    def sync_gradients(self) -> None:
        """Average gradients now (seed 001's manual style).

        A no-op when the last backward already synchronised them automatically (no double
        averaging); after backward passes under ``no_sync()`` it reduces the accumulated gradients.
        Every rank must call it when one does.
        """
        if self._backend.size > 1:
            self.reducer.sync_now()
            if self.expert_reducer.unsynced:
                self.expert_reducer.reduce()

    def join(self, enable: bool = True, throw_on_early_termination: bool = False):
        """Context manager for uneven inputs: ranks that run out of batches shadow the others.

        ::

            with model.join():
                for x, y in loader:          # loaders of different lengths on different ranks
                    loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

        Inside the block every forward first all-reduces a "still training?" flag. A rank that
        left its loop keeps answering that flag and runs the gradient all-reduces with zeros
        while others still train (gradients are divided by the full group size, like torch's
        default). At the end all ranks take the parameters and buffers of the rank that trained
        longest (optimizer state, e.g. momentum, stays per rank, as in torch). Per-forward buffer broadcasts are skipped inside the block, and manual
        ``sync_gradients()`` is not shadowed. ``throw_on_early_termination=True`` raises on every
        rank as soon as one rank runs out instead.
        """
        return Join(self, enable=enable, throw_on_early_termination=throw_on_early_termination)

    def register_comm_hook(self, state, hook) -> None:
        """Replace how gradient buckets are reduced (torch's contract; see :mod:`neural_arch.distributed.algorithms.ddp_comm_hooks`).

        ``hook(state, bucket) -> Work``: ``bucket`` is a :class:`~neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook.GradBucket` of this
        rank's local gradients; the returned Work's ``result()`` must be the flat buffer of
        averaged gradients. Call once, before the first backward. ``state`` is passed through
        (a process group for the built-in hooks, or the hook's own state object)::

            from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)

        A built-in hook communicates over the group its state names (None: the default group, as
        in torch); registering one whose group is not this DDP's ``process_group`` is an error: its
        buckets would be averaged over other ranks than the ones this DDP keeps in step.
        """
        self._check_hook_group(state, hook)
        self.reducer.register_comm_hook(state, hook)
        if self._backend.size == 1 and not self._hooks:
            # a world of one reduces nothing, so no gradient hooks were installed; a hook the user
            # registers must still see every bucket, as in torch (one that scales or compresses
            # gradients would otherwise do nothing without a word)
            self._install_hooks()

    def _check_hook_group(self, state, hook) -> None:
        """Refuse a built-in hook (one made with ``comm_hook``: it declares how it takes buckets)
        whose state's group holds other ranks than this DDP's; a plain function's state is its own."""
        from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import CommHook, hook_backend
        from neural_arch.distributed.process_group import ProcessGroup

        if not isinstance(hook, CommHook) or self._backend.size == 1:
            return
        group = getattr(state, "process_group", state)      # PowerSGDState / TopKState carry it
        if not (group is None or isinstance(group, ProcessGroup) or hasattr(group, "group_ranks")):
            return      # a hook's own state object (a user's @comm_hook): not a group to check
        theirs = getattr(hook_backend(group), "group_ranks", None)
        ours = getattr(self._backend, "group_ranks", None)
        if theirs is not None and ours is not None and list(theirs) != list(ours):
            raise ValueError(
                f"register_comm_hook: the hook's state communicates over ranks {list(theirs)} "
                f"({'None: the default group' if group is None else 'its process_group'}), but this "
                f"DistributedDataParallel reduces over ranks {list(ours)}; pass this DDP's process group "
                f"as the state (register_comm_hook(ddp.process_group, hook)), or build the hook's state with it")

    # -- introspection -----------------------------------------------------------------------------
    def bucket_timeline(self) -> list[tuple[str, int | None, float]]:
        """Events of the latest synchronised backward in time order: ``(event, bucket index or None,
        perf_counter)`` with events ``backward_start``, ``ready`` (a bucket's last gradient arrived),
        ``launch`` (handed to the comm hook), ``backward_end``, ``done`` (its reduction finished)
        and ``waited`` (backward's end had every result). A ``launch`` before ``backward_end``
        overlapped backward; :meth:`bucket_stats` gives the same per bucket as numbers."""
        return list(self.reducer.observer.timeline)

    def bucket_stats(self) -> list[dict]:
        """Per bucket of the latest synchronised backward (launch order): ``index``, ``bytes``,
        ``ready``/``launched``/``started``/``done`` (``time.perf_counter()`` values), ``comm_s``
        (started -> done), ``hidden_s`` (the part of it before backward's end) and
        ``hidden_fraction``. ``started`` is estimated as max(launch, previous bucket's done) when
        the backend does not report it (a group's collectives run one after another)."""
        return [dict(r) for r in self.reducer.observer.records]

    @property
    def bucket_plan(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order (reverse registration order)."""
        return [[self._param_names[i] for i in b] for b in self.reducer.plan]

    def comm_stats(self) -> dict:
        """Communication totals over all synchronised backwards so far.

        ``comm_s`` is the time the buckets' reductions ran (started -> done, summed over buckets),
        ``exposed_s`` the part of it after backward's end (what backward's end had to wait for),
        ``hidden_fraction`` ``1 - exposed_s / comm_s``: the share of communication overlapped with
        backward; ``bucket_hidden_fraction`` the same per bucket, in launch order.
        """
        return self.reducer.observer.comm_stats()

    def reset_comm_stats(self) -> None:
        """Zero the totals of :meth:`comm_stats` (e.g. after warm-up iterations)."""
        self.reducer.observer.reset()
