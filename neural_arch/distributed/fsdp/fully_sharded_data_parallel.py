"""``FullyShardedDataParallel``: parameters, gradients and optimizer state sharded over the ranks.

The model is cut into *units* by ``auto_wrap_policy`` (e.g. one per transformer block, plus
the root for everything left over). Each unit's parameters become one flat array, padded to a
multiple of the shard-group size; every rank keeps only its slice (a ``flat_param`` Parameter:
``fsdp.parameters()`` yields these, so the optimizer's state is sharded too). Per step:

1. **forward**: before a unit runs (a forward pre-hook) its slices are all-gathered, in
   ``mixed_precision.param_dtype``; after it ran they are freed (``FULL_SHARD``,
   ``HYBRID_SHARD``) or kept until the unit's backward is over (``SHARD_GRAD_OP``);
2. **backward**: ``FULL_SHARD`` re-gathers a unit just before its backward (a hook on the
   gradient of the unit's outputs: torch's pre-backward hook), into the very buffer its forward
   used, which the graph's saved views read (see :mod:`.unit`: that is how a freed unit costs
   no memory here); each gradient, once final, is reduced (``ReduceOp.AVG``, in
   ``reduce_dtype``) straight to the ranks owning its elements and dropped (see
   :mod:`.owner_reducer`: element for element a reduce-scatter, without a unit-sized flat
   gradient); when the unit's last gradient is final its parameters are freed (torch's
   post-backward hook), and while a block's backward runs the root's are dropped too if no
   saved view reads them any more. At the end of backward each rank's averaged shard becomes
   ``flat_param.grad``; ``HYBRID_SHARD`` then averages it over the replicate group; ``NO_SHARD``
   all-reduces instead. A shard group of one rank behaves as ``NO_SHARD`` (the parameters are
   views of the shard: no gathered copy, as torch);
3. **step**: the optimizer updates each rank's slice in the master dtype.

Memory of gathered parameters (host arrays, see :mod:`neural_arch.distributed.fsdp.storage`): after forward every gather
buffer gives its memory back while the graph's views of it live on (torch's resharding,
``storage.resize_(0)``; the root's too: it is re-gathered at its pre-backward like any unit),
and during a unit's backward the pages under each parameter go as soon as its gradient is final
(a unit that ran once: nothing in this backward reads that parameter again). Peak memory per
rank is then about the sharded state (parameters, gradients, optimizer state over N), plus in
forward the root and one block (the root's forward encloses the blocks'), in backward one unit
(two with ``BACKWARD_PRE``: the prefetched one), one parameter's gradient, and the activations.

Prefetching (``FULL_SHARD``/``HYBRID_SHARD``):

* ``backward_prefetch=BackwardPrefetch.BACKWARD_PRE`` (default, as torch): when a unit's
  backward starts, the unit that ran before it in forward is all-gathered asynchronously, so the
  gather overlaps this unit's backward; costs one more unit of gathered parameters (a staging
  buffer under ``limit_all_gathers``, copied into the unit's own buffer when its backward starts).
  ``BACKWARD_POST``: the same gather is issued when the unit's gradients are final (less
  overlap, the two units' gathered parameters barely coexist). ``None``: gather on demand.
* ``forward_prefetch=True``: when a unit's forward starts, the unit that ran after it in the
  previous iteration's forward is all-gathered asynchronously (the order is recorded each
  iteration, so the first iteration prefetches nothing).
* ``limit_all_gathers=True`` (default, as torch): at most two units' parameters are gathered at
  once; a prefetch that would make three is skipped (that unit is gathered on demand), and
  consecutive units share one buffer in forward. ``False``: consecutive units alternate two
  buffers so a backward prefetch needs no staging copy (one more unit alive in forward).

Training is equal to single-process training on the global batch (tests: float64 <= 1e-10).

Differences from torch, stated plainly:

* A unit must be all trainable or all frozen (``requires_grad=False``), as torch's rule with
  ``use_orig_params=False``: a partly frozen unit raises ``ValueError`` at construction (the
  optimizer steps the whole flat shard, so weight decay or momentum would move the frozen
  elements). Give frozen layers units of their own (``auto_wrap_policy``), or use ``fully_shard``.
  An all-frozen unit is not resharded after forward (it has no gradients to say when its
  backward is over): it keeps its gathered parameters, like ``SHARD_GRAD_OP``.
* Unit buffers are shared (see :mod:`.unit`): a unit's parameters must be used only inside its
  own ``forward`` (true of ordinary modules). A parameter, or a view of it, that escapes the
  unit's forward and is used by later ops reads placeholder zeros in forward and possibly
  another unit's values in backward: that is *not* detected. Units whose calls interleave so
  that two would need one buffer at once are detected (a ``RuntimeError`` naming both).
* ``cpu_offload=CPUOffload(offload_params=True)`` keeps shards and their gradients in host
  memory; on CPU-only runs it is the identity.
* Shared (tied) parameters must belong to one unit: wrap their common ancestor.
* ``HYBRID_SHARD`` needs ``process_group=(shard_group, replicate_group)`` (torch's order:
  intra-node, inter-node), or ``NEURAL_ARCH_FSDP_SHARD_SIZE``/``LOCAL_WORLD_SIZE`` ranks per shard group.
* ``no_sync()`` is not implemented (raises ``NotImplementedError``).

Expert parameters (a mixture-of-experts model under expert parallelism: ``parallelize_moe``
marks them ``param.allreduce = False`` with ``param.expert_dp_group``) differ between ranks by
design, so they are left out of the replicated units (torch's ``ignored_states``). An expert that
an expert-data-parallel (edp) group of several ranks holds (``ep`` < the data-parallel size) gets a
flat unit of its own, sharded over that group (:mod:`.expert_units`; registered as
``expert_flat_param_<j>``): its parameters and optimizer state take ``1 / edp`` per rank, it is
all-gathered over the group when it runs (every rank runs each expert it holds, also on zero
rows) and freed after (the graph keeps what backward reads: such a unit is not pooled), and at the
end of backward its flat gradient is reduce-scattered (summed) over the group and divided by the
data-parallel size (the shard group's, times the replicate group's for ``HYBRID_SHARD``), the scale
DDP uses (:mod:`neural_arch.distributed.ddp.expert_grads`): training equals one process on the
global batch. In the global gradient norm each expert counts once (its shards are summed over the
edp group, then over the expert-parallel group). An expert held by one rank only (``ep`` = the
data-parallel size), and every expert under ``NO_SHARD``, has nothing to shard: it stays a whole,
ordinary parameter (``expert_param_<j>``), stepped where it lives, its gradient reduced as DDP
reduces it. ``sync_module_states`` broadcasts each expert over its edp group, not from rank 0.
State dicts name experts by their **global** index (``moe.experts.3.fc1.weight`` on the ranks
holding expert 3: :mod:`neural_arch.distributed.checkpoint.expert_names`), so a full state dict
has one process's keys; a sharded one holds an expert unit's shard as
``moe.experts.3.flat_param``. ``mixed_precision`` and ``cpu_offload`` do not apply to experts (they
compute and stay in their own dtype, on their own device).

Example::

    from neural_arch.distributed.fsdp import FullyShardedDataParallel as FSDP, ModuleWrapPolicy
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerBlock}))
    opt = optim.Adam(fsdp.parameters(), lr=1e-3)
    loss = F.cross_entropy(fsdp(x), y); loss.backward()
    fsdp.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()
    full = fsdp.state_dict()     # a collective: original parameter names, full values
    # checkpoint and resume on any world size (opt.state_dict() holds this rank's shards only):
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(fsdp, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id="ckpt/step_100")
"""

from __future__ import annotations

import collections
import itertools

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core import autograd as _ag
from neural_arch.core.tensor import Tensor, is_backward_running, no_grad
from neural_arch.distributed.bucketing import queue_outermost_callback
from neural_arch.distributed.ddp.expert_grads import ExpertGradReducer, split_expert_parameters
from neural_arch.distributed.flat_param import FlatLayout
from neural_arch.distributed.fsdp.api import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from neural_arch.distributed.fsdp.expert_units import ExpertFlatShard, ExpertShardReducer
from neural_arch.distributed.fsdp.owner_reducer import OwnerGradReducer
from neural_arch.distributed.fsdp.plan import _follows_a_quorum, plan_expert_units, plan_units, shard_groups
from neural_arch.distributed.fsdp.state_dict import (
    FSDPStateDicts,
    optim_state_dict,
    optim_state_dict_to_load,
    state_dict_type,
)
from neural_arch.distributed.fsdp.unit import FlatParamUnit, GatherBuffer, GatherPool
from neural_arch.distributed.fsdp.wrap import resolve_policy
from neural_arch.nn.module import Module

__all__ = ["FullyShardedDataParallel"]


class _UnitCall:
    """One forward call of a pooled unit: its buffer, and the creation-order numbers (autograd
    node ``seq``) bracketing the nodes it recorded (the engine runs nodes newest first, so once
    backward reaches ``end`` every node of a call that *started* after it has run)."""

    __slots__ = ("buf", "end", "index", "start", "unit")

    def __init__(self, unit, buf, start: int, index: int):
        self.unit, self.buf, self.start, self.end, self.index = unit, buf, start, None, index


def _seq_mark() -> int:
    # A number from the engine's node counter: nodes created later have larger ones.
    return _ag.next_seq()


def _grad_outputs(out) -> list:
    if isinstance(out, Tensor):
        return [out] if out.requires_grad and out.grad_fn is not None else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _grad_outputs(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _grad_outputs(o)]
    return []


class FullyShardedDataParallel(Module):
    """Shard ``module``'s parameters, gradients and optimizer state (see the module docstring).

    Args:
        module: the model (every rank builds the same one).
        process_group: the group to shard over (default: the world); for ``HYBRID_SHARD`` a pair
            ``(shard_group, replicate_group)``.
        sharding_strategy: a :class:`~neural_arch.distributed.fsdp.api.ShardingStrategy` (default ``FULL_SHARD``).
        cpu_offload: :class:`~neural_arch.distributed.fsdp.api.CPUOffload`.
        auto_wrap_policy: which submodules become units (``ModuleWrapPolicy({Block})``, a set of
            classes, or torch's callable policies). Default: one unit for the whole model.
        backward_prefetch: ``BackwardPrefetch.BACKWARD_PRE`` (default), ``BACKWARD_POST`` or None.
        forward_prefetch: gather the next unit (last iteration's order) while one runs.
        limit_all_gathers: at most two units gathered at once (see the module docstring).
        mixed_precision: :class:`~neural_arch.distributed.fsdp.api.MixedPrecision`.
        sync_module_states: broadcast the group's first rank's parameters and buffers first (ranks may init
            differently); within ``process_group`` (and the replicate group), as torch.
        device_mesh: a 2-D mesh ``(replicate, shard)`` for ``HYBRID_SHARD``, if it has
            ``get_group(dim)``; a 1-D mesh for the other strategies.

    Example::

        model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
                                         mixed_precision=MixedPrecision(param_dtype=np.float16))
        opt = Adam(model.parameters(), lr=1e-3)     # steps this rank's shards only
        loss_fn(model(x), y).backward(); opt.step()
    """

    def __init__(self, module, process_group=None, sharding_strategy=None, cpu_offload=None,
                 auto_wrap_policy=None, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                 mixed_precision=None, ignored_modules=None, param_init_fn=None, device_id=None,
                 sync_module_states: bool = False, forward_prefetch: bool = False,
                 limit_all_gathers: bool = True, use_orig_params: bool = False, device_mesh=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"FullyShardedDataParallel(module): expected an nn.Module, got {type(module).__name__}")
        if ignored_modules:
            raise NotImplementedError("FullyShardedDataParallel(ignored_modules=...) is not implemented")
        strategy = sharding_strategy or ShardingStrategy.FULL_SHARD
        if not isinstance(strategy, ShardingStrategy):
            raise TypeError(f"sharding_strategy must be a ShardingStrategy (e.g. ShardingStrategy.FULL_SHARD), "
                            f"got {sharding_strategy!r}")
        if strategy is ShardingStrategy._HYBRID_SHARD_ZERO2:
            raise NotImplementedError("_HYBRID_SHARD_ZERO2 is not implemented; use HYBRID_SHARD")
        cpu_offload = cpu_offload or CPUOffload()
        if not isinstance(cpu_offload, CPUOffload):
            raise TypeError(f"cpu_offload must be CPUOffload(offload_params=...), got {cpu_offload!r}")
        mp = mixed_precision or MixedPrecision()
        if not isinstance(mp, MixedPrecision):
            raise TypeError(f"mixed_precision must be a MixedPrecision(...), got {mixed_precision!r}")
        object.__setattr__(self, "module", module)
        self.sharding_strategy = strategy
        self.cpu_offload = cpu_offload
        self.mixed_precision = mp
        if backward_prefetch is not None and not isinstance(backward_prefetch, BackwardPrefetch):
            raise TypeError(f"backward_prefetch must be a BackwardPrefetch or None, got {backward_prefetch!r}")
        self.backward_prefetch = backward_prefetch
        self.forward_prefetch = bool(forward_prefetch)
        self.limit_all_gathers = bool(limit_all_gathers)
        self._pool = GatherPool()
        self._order: list[_UnitCall] = []      # pooled unit calls since the last backward
        self._next_fwd: dict = {}              # unit -> unit that ran after it last iteration
        self._prefetched: dict = {}            # id(unit) -> GatherBuffer (forward prefetch)
        self._last_released = None             # buffer released last in forward
        self._staged: dict = {}                # id(_UnitCall) -> staging GatherBuffer (backward prefetch)
        self._bwd_armed = False
        #: full / sharded state dicts (a component: see :mod:`.state_dict`)
        self._state_dicts = FSDPStateDicts(self)

        shard_group, replicate_group = shard_groups(process_group, device_mesh, strategy)
        self.process_group = shard_group
        self.replicate_group = replicate_group
        # Expert parameters stay out of the replicated units (see the module docstring): those an
        # expert-data-parallel group of several ranks holds get units of their own over that group
        # (expert_units); the others (held once) stay whole, ordinary parameters.
        all_experts = split_expert_parameters(module.parameters())[1]
        expert_plan, self._experts = ([], all_experts) if strategy is ShardingStrategy.NO_SHARD else \
            plan_expert_units(module, all_experts)
        managed = replicate_group is not None and _follows_a_quorum(replicate_group)
        if managed and all_experts:
            raise NotImplementedError("FullyShardedDataParallel: expert parameters with a replicate group that "
                                      "follows a quorum (ft.ManagedProcessGroup) are not supported")
        # a quorum's size changes every step and is unknown before the first: the experts' scale needs none
        dp_size = shard_group.size() * (replicate_group.size() if replicate_group is not None and not managed else 1)
        self.expert_reducer = ExpertGradReducer(self._experts, dp_size)
        if sync_module_states:
            # within this FSDP's own groups (torch's rule), never the world: ranks outside them run
            # another model (or no FSDP at all) and would either hang or receive these values
            groups = [shard_group] + ([replicate_group] if replicate_group is not None and not managed else [])
            self._broadcast_module(groups, all_experts)
        if mp.buffer_dtype is not None:
            for b in module.buffers():
                if b.data.dtype.kind == "f":
                    b.data = b.data.astype(mp.buffer_dtype)

        # A shard group of one rank holds every element anyway: its units keep their parameters as
        # views of the shard itself (no gathered copy, as torch switches to NO_SHARD at world size 1).
        sharded = strategy is not ShardingStrategy.NO_SHARD and shard_group.size() > 1
        shard_world = shard_group.size() if sharded else 1
        shard_rank = shard_group.rank() if sharded else 0
        plan = plan_units(module, resolve_policy(auto_wrap_policy), ignored=all_experts)
        self._units: list[FlatParamUnit] = []
        reshard = sharded and strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)
        like = next(iter(module.parameters()), None)
        for name, _sub, params in plan:
            frozen = [p for p in params if not p.requires_grad]
            if frozen and len(frozen) < len(params):
                names = {id(p): n for n, p in module.named_parameters()}
                raise ValueError(
                    f"FullyShardedDataParallel: the unit {name or '<root>'!r} mixes frozen parameters "
                    f"{[names.get(id(p), '?') for p in frozen]} with trainable ones; its flat parameter is "
                    "stepped as a whole, so weight decay or momentum would change the frozen ones (torch "
                    "raises the same with use_orig_params=False). Wrap the frozen modules in units of their "
                    "own (auto_wrap_policy) so each unit is all frozen or all trainable, or use fully_shard")
        for i, (name, sub, params) in enumerate(plan):
            lay = FlatLayout([tuple(p.shape) for p in params], shard_world)
            unit = FlatParamUnit(name, sub, params, lay, shard_rank, shard_group if sharded else None,
                                 mp.param_dtype, cpu_offload.offload_params, reshard, like=like)
            unit.pooled = reshard and sharded and bool(params) and all(p.requires_grad for p in params)
            unit.index = i
            self._units.append(unit)
            self.register_parameter(f"flat_param_{i}", unit.flat_param)
            if sub is not module:
                sub.register_forward_pre_hook(self._make_pre_hook(unit))
                sub.register_forward_hook(self._make_post_hook(unit))
        self._expert_units: list[FlatParamUnit] = []
        for j, (name, sub, params, edp) in enumerate(expert_plan):
            lay = FlatLayout([tuple(p.shape) for p in params], edp.size())
            unit = FlatParamUnit(name, sub, params, lay, edp.rank(), edp, like=params[0])
            ep_group = getattr(getattr(params[0], "_norm_shard", None), "group", None)
            unit.flat_param._flat_shard = ExpertFlatShard(params, lay, edp.rank(), edp, ep_group)
            unit.pooled = False
            unit.index = j
            self._expert_units.append(unit)
            self.register_parameter(f"expert_flat_param_{j}", unit.flat_param)
            # every rank of the group runs every expert it holds (also on zero rows): the gathers line
            # up; freed after forward, the graph keeps the gathered arrays it saved for backward
            sub.register_forward_pre_hook(lambda _m, _args, unit=unit: unit.gather())
            sub.register_forward_hook(lambda _m, _args, _out, unit=unit: unit.free())
        for j, p in enumerate(self._experts):
            self.register_parameter(f"expert_param_{j}", p)    # whole: the optimizer steps them
        self.expert_shard_reducer = ExpertShardReducer(self._expert_units, dp_size)
        reduce_dtype = mp.reduce_dtype or mp.param_dtype
        self._reducer = OwnerGradReducer(
            [u.params for u in self._units], shard_group, self._on_grad_shard,
            reduce_dtype=None if reduce_dtype is None else np.dtype(reduce_dtype),
            scatter=sharded, replicate_group=replicate_group, on_ready=self._on_unit_grads_ready,
            on_final=self._on_param_final)
        # after the reducer's hooks, on the units' parameters: queued behind its end-of-backward
        # callback on every rank (see ExpertGradReducer.reduce_after_backward)
        unit_params = [p for u in self._units for p in u.params]
        self._expert_hooks = self.expert_reducer.reduce_after_backward(unit_params or self._experts)
        self._expert_hooks += self.expert_shard_reducer.reduce_after_backward(
            unit_params or [p for u in self._expert_units for p in u.params])
        if self._reducer.layouts and any(a.padded_numel != u.layout.padded_numel
                                         for a, u in zip(self._reducer.layouts, self._units)):
            raise AssertionError("FSDP: reducer and unit layouts disagree")  # pragma: no cover

    # ------------------------------------------------------------------ construction helpers
    def _broadcast_module(self, groups, all_experts) -> None:
        experts = {id(p) for p in all_experts}
        tensors = [t for t in self.module.parameters() if id(t) not in experts] + list(self.module.buffers())
        for t in tensors + all_experts:
            if hasattr(t.data, "flags") and not t.data.flags.c_contiguous:
                t.data = t.data.copy()
        for group in groups:   # shard group, then replicate group: every rank ends with global rank 0's values
            for t in tensors:
                group.backend.broadcast(t.data, root=0)
        # each expert from the first rank of the ranks holding it (before any is sharded)
        ExpertGradReducer(all_experts, 1).broadcast()

    def _make_pre_hook(self, unit):
        def hook(module, args):
            module.__dict__["_fsdp_call"] = self._forward_gather(unit)
            if self.mixed_precision.cast_forward_inputs:
                return self._cast_inputs(args)
            return None
        return hook

    def _make_post_hook(self, unit):
        def hook(module, args, out):
            self._forward_release(unit, module.__dict__.pop("_fsdp_call", None), out)
        return hook

    # ------------------------------------------------------------------ gather / free schedule
    def _acquire(self, unit, exclude=(), after_release: bool = True) -> GatherBuffer:
        xp = _backend.get_array_module(unit.flat_param.data) if not unit.offload else \
            _backend.get_array_module(unit._shard_on_device())
        if (after_release and self.backward_prefetch is not None and not self.limit_all_gathers
                and self._last_released is not None):
            # consecutive units alternate buffers, so backward can prefetch into the other one; with
            # limit_all_gathers they share one, and a prefetch lands in a staging buffer instead
            exclude = tuple(exclude) + (self._last_released,)
        return self._pool.acquire(unit.layout.padded_numel, unit.compute_dtype, xp, exclude)

    def _forward_gather(self, unit):
        """Gather ``unit`` for a forward call; returns its :class:`_UnitCall` (pooled units)."""
        if not unit.pooled:
            unit.gather()
            return None
        if is_backward_running():
            # a recomputation (activation checkpointing) inside backward: the pre-backward hook
            # usually re-gathered the unit already; otherwise gather into a private buffer,
            # released when the unit's gradients are final
            if unit.bound is None or unit.bound.holder is not unit:
                xp = _backend.get_array_module(unit._shard_on_device())
                buf = GatherBuffer(xp.empty(unit.layout.padded_numel, dtype=unit.compute_dtype))
                unit.gather_into(buf)
                unit.bind(buf)
            return None
        buf = self._prefetched.pop(id(unit), None)
        if buf is None or buf.holder is not unit:
            buf = self._acquire(unit)
            unit.gather_into(buf)
        call = _UnitCall(unit, buf, _seq_mark(), len(self._order))
        buf.call = call
        unit.bind(buf)
        self._order.append(call)
        if self.forward_prefetch:
            nxt = self._next_fwd.get(unit)
            if (nxt is not None and nxt.pooled and id(nxt) not in self._prefetched and not nxt.gathered
                    and not (self.limit_all_gathers and self._gathered_units() >= 2)):
                # nxt follows this unit: only this unit's buffer must differ from its own
                b = self._acquire(nxt, exclude=(buf,), after_release=False)
                b.call = None
                nxt.gather_into(b, async_op=True)
                self._prefetched[id(nxt)] = b
        return call

    def _forward_release(self, unit, call, out) -> None:
        if call is None:
            if not unit.pooled and unit.reshard_after_forward and not is_backward_running():
                unit.free()  # the graph keeps the gathered arrays it saved (see the docstring)
            return
        call.end = _seq_mark()
        for t in _grad_outputs(out):
            t.register_hook(lambda g, call=call: self._pre_backward(call))
        unit.release(call.buf)
        unit.unbind()
        self._last_released = call.buf

    def _evict_for(self, buf: GatherBuffer, now) -> bool:
        """Make ``buf`` free for a gather at backward position ``now`` (a _UnitCall); False if
        its holder may still read it (a call that started before ``now`` ended)."""
        holder = buf.holder
        if holder is None:
            return True
        if buf.call is not None and buf.call.start > now.end:  # all of its nodes already ran
            holder.release(buf)
            if holder.bound is buf:
                holder.unbind()
            return True
        return False

    def _pre_backward(self, call) -> None:
        """Re-gather ``call.unit`` into the buffer its forward used, before its backward."""
        if not self._bwd_armed:
            self._bwd_armed = True
            queue_outermost_callback(self._end_backward)
        unit, buf = call.unit, call.buf
        self._release_enclosing(call)  # first: the parent's buffer goes before this one is filled
        if buf.holder is not unit:
            if not self._evict_for(buf, call):
                who = buf.holder.name or "<root>"
                raise RuntimeError(
                    f"FSDP: unit {unit.name or '<root>'} must be re-gathered for its backward into the "
                    f"buffer its forward used, but unit {who} still needs it (its parameters are read by "
                    f"ops outside its own backward, or the units' forwards interleave). Use "
                    f"sharding_strategy=ShardingStrategy.SHARD_GRAD_OP for this model.")
            stage = self._staged.pop(id(call), None)
            if stage is not None:
                unit.take_staged(stage, buf)
            else:
                unit.gather_into(buf)
        buf.call = call
        unit.bind(buf)  # a recomputation (activation checkpointing) reads the parameters
        if self.backward_prefetch is BackwardPrefetch.BACKWARD_PRE:
            self._prefetch_after(call)

    def _release_enclosing(self, call) -> None:
        """Free the gathered parameters of the calls around ``call`` (the root, around every
        block) while ``call``'s backward runs, when nothing will read them any more.

        A parent's nodes recorded after ``call`` ended have all run (the engine runs nodes newest
        first); its nodes recorded before ``call`` started run later and read its parameters only
        through views they saved. So the parent's buffer is dropped when no view of it is left
        (e.g. the head's matmul is done and the embedding saved none), which torch gets by
        resharding the root after forward; if a view is left, the parent keeps its buffer."""
        for p in self._order:
            if p is call or p.end is None or not (p.start < call.start and call.end < p.end):
                continue
            buf = p.buf
            if buf.holder is not p.unit or buf.work is not None:
                continue
            p.unit.release(buf)
            p.unit.unbind()
            if not buf.drop_if_unviewed():   # a saved view still reads it: keep holding it
                buf.holder, buf.call = p.unit, p
                p.unit._held.append(buf)

    def _gathered_units(self) -> int:
        return len({id(b.holder) for b in self._pool.buffers() if b.holder is not None}) + len(self._staged)

    def _prefetch_after(self, now) -> None:
        """Start gathering the call whose backward comes next after ``now``'s: pre-backward hooks
        fire in decreasing order of the calls' ``end`` (a nested call ends before its parent)."""
        nxt = None
        for c in self._order:
            if c.end is not None and c.end < now.end and (nxt is None or c.end > nxt.end):
                nxt = c
        if nxt is None or nxt.buf.holder is nxt.unit or nxt.buf.work is not None:
            return
        if self.limit_all_gathers and self._gathered_units() >= 2:
            return  # torch's rate limiter: at most two units gathered at once; gather on demand
        if self._evict_for(nxt.buf, now):  # else: its holder still reads it; gather on demand
            nxt.unit.gather_into(nxt.buf, async_op=True)
            nxt.buf.call = nxt
        elif self.limit_all_gathers and id(nxt) not in self._staged:
            # nxt's own buffer is still read by ``now`` (they share it): gather into a staging
            # buffer, copied into nxt's own at nxt's pre-backward (one memcpy) and dropped
            xp = _backend.get_array_module(nxt.unit._shard_on_device())
            stage = GatherBuffer(xp.empty(nxt.unit.layout.padded_numel, dtype=nxt.unit.compute_dtype))
            nxt.unit.gather_into(stage, async_op=True)
            nxt.unit.release(stage)   # the unit holds its own buffer, not the staging one
            self._staged[id(nxt)] = stage

    def _on_unit_grads_ready(self, i: int) -> None:
        """All of unit ``i``'s gradients are final (its backward is over): free its parameters."""
        unit = self._units[i]
        if unit.pooled:
            unit.release_all()
            calls = [c for c in self._order if c.unit is unit and c.end is not None]
            if self.backward_prefetch is BackwardPrefetch.BACKWARD_POST and calls:
                self._prefetch_after(min(calls, key=lambda c: c.end))  # the call backward did last
        elif not unit.reshard_after_forward:
            unit.free()  # SHARD_GRAD_OP / NO_SHARD keep parameters gathered until their backward is over

    def _on_param_final(self, i: int, k: int) -> None:
        """Parameter ``k`` of unit ``i`` has its final gradient: if the unit ran once this
        iteration, no node of this backward reads that parameter again, so the pages of the
        gathered buffer under it are given back now, before its gradient is reduced (the
        buffer shrinks as the unit's backward proceeds; see :mod:`neural_arch.distributed.fsdp.storage`). A unit called
        twice keeps its values: the other call's backward (or recomputation) reads them."""
        unit = self._units[i]
        buf = unit.bound
        if not unit.pooled or buf is None or buf.holder is not unit or buf.work is not None:
            return
        if sum(1 for c in self._order if c.unit is unit) != 1:
            return
        off = int(unit.layout.offsets[k])
        buf.release_range(off, off + int(unit.layout.sizes[k]))

    def _end_backward(self) -> None:
        self._bwd_armed = False
        self._reset_generation()

    def _reset_generation(self) -> None:
        """Forget this iteration's buffers (the graph keeps alive whatever it still reads)."""
        for u in self._units:
            if u.pooled:
                u.release_all()
        for b in self._pool.buffers():
            b.wait()
        if self._order:
            seq = [c.unit for c in self._order]
            self._next_fwd = {}
            for a, b in itertools.pairwise(seq):
                self._next_fwd.setdefault(a, b)
        self._order = []
        self._prefetched = {}
        for stage in self._staged.values():
            stage.wait()
        self._staged = {}
        self._last_released = None
        self._pool.clear()

    def _cast_inputs(self, args):
        dt = self.mixed_precision.param_dtype
        if dt is None:
            return None
        return tuple(a.astype(dt) if isinstance(a, Tensor) and a.is_floating_point() and a.dtype != dt else a
                     for a in args)

    def _on_grad_shard(self, i: int, flat_grad) -> None:
        unit = self._units[i]
        unit.add_grad(flat_grad, owned=True)  # the reducer's fresh accumulator: kept, not copied
        if not unit.reshard_after_forward:
            unit.free()  # (a unit whose bucket never launched during backward: no gradients)

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        self.expert_reducer.pending = False   # a backward that raised never ran its expert reduction
        self.expert_shard_reducer.pending = False
        root = self._units[-1]
        call = self._forward_gather(root)
        if self.mixed_precision.cast_root_forward_inputs:
            args = self._cast_inputs(args) or args
        out = None
        try:
            out = self.module(*args, **kwargs)
            return out
        finally:
            self._forward_release(root, call, out)
            if not is_backward_running() and not self._bwd_armed and not _grad_outputs(out):
                self._reset_generation()  # no backward will follow (eval, no_grad): drop buffers
            else:
                for b in self._pool.buffers():
                    # nobody holds a buffer now, and every unit re-gathers into its buffer before
                    # its backward reads it: free it (every unit checkpointed: no view is left) or
                    # give its memory back under the graph's views (torch's resharding)
                    if not b.drop_if_unviewed():
                        b.release_storage()

    def train(self, mode: bool = True) -> FullyShardedDataParallel:
        super().train(mode)
        self.module.train(mode)
        return self

    # ------------------------------------------------------------------ gradients
    @no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """Clip the gradients of all shards by their *global* norm (a collective); returns the norm.

        The same as ``nn.utils.clip_grad_norm_(fsdp.parameters(), max_norm, norm_type)``, which
        totals the sharded gradients over the shard group (each flat shard says how: ``_flat_shard``):
        a Python float on NumPy, a 0-d device Tensor on a device (reading it would synchronise).
        """
        from neural_arch.optim.clip import clip_grad_norm_

        return clip_grad_norm_(list(self.parameters()), max_norm, norm_type)

    def no_sync(self):
        raise NotImplementedError("FullyShardedDataParallel.no_sync() is not implemented: call backward on "
                                  "every micro-batch (gradients accumulate into the shards) instead")

    # ------------------------------------------------------------------ state dicts (the _state_dicts component)
    #: ``with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT): sd = model.state_dict()``
    state_dict_type = staticmethod(state_dict_type)
    #: torch's ``FSDP.optim_state_dict(model, optim)``
    optim_state_dict = staticmethod(optim_state_dict)
    #: torch's ``FSDP.optim_state_dict_to_load(model, optim, optim_state_dict)``
    optim_state_dict_to_load = staticmethod(optim_state_dict_to_load)

    def state_dict(self, prefix: str = "") -> collections.OrderedDict[str, np.ndarray]:
        """FULL: original names, full values in the master dtype, on every rank (a collective).
        SHARDED/LOCAL: this rank's flat shards, ``{prefix + "flat_param_<i>": array}`` (an expert's:
        ``"moe.experts.<e>.flat_param"``). Experts go by their global index ``e``.

        Example::

            full = fsdp.state_dict()        # every rank calls it
        """
        return self._state_dicts.state_dict(prefix)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Load what :meth:`state_dict` gave under the same state-dict type.

        Example::

            fsdp.load_state_dict(full)
        """
        return self._state_dicts.load_state_dict(state_dict, strict)

    def summon_full_params(self, writeback: bool = True):
        """Gather every unit's full parameters (master dtype) into the module; write edits back on exit.

        Example::

            with fsdp.summon_full_params():
                print(fsdp.module.weight.shape)
        """
        return self._state_dicts.summon_full_params(writeback)

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{u.name or '<root>'}:{u.layout.numel}" for u in self._units + self._expert_units)
        return f"strategy={self.sharding_strategy.name}, units=[{sizes}]"

    def __repr__(self) -> str:
        return f"FullyShardedDataParallel({self.extra_repr()})\n  (module): " + repr(self.module).replace("\n", "\n  ")
