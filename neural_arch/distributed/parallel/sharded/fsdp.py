"""``FullyShardedDataParallel``: parameters, gradients and optimizer state sharded over the ranks.

The model is cut into *units* by ``auto_wrap_policy`` (e.g. one per transformer block, plus
the root for everything left over). Each unit's parameters become one flat array, padded to a
multiple of the shard-group size; every rank keeps only its slice (a ``flat_param`` Parameter:
``fsdp.parameters()`` yields these, so the optimizer's state is sharded too). Per step:

1. **forward**: before a unit runs (a forward pre-hook) its slices are all-gathered, in
   ``mixed_precision.param_dtype``; after it ran they are freed (``FULL_SHARD``) or kept until
   backward is over (``SHARD_GRAD_OP``);
2. **backward**: as soon as the last gradient of a unit is final (post-accumulate-grad hooks) the
   unit's gradients are flattened (in ``reduce_dtype``) and **reduce-scattered**, asynchronously,
   while backward continues; the full gradients are dropped; ``HYBRID_SHARD`` then averages the
   shard over the replicate group; ``NO_SHARD`` all-reduces instead;
3. **step**: the optimizer updates each rank's slice in the master dtype.

Training is equal to single-process training on the global batch (tests: float64 <= 1e-10).

Differences from torch, stated plainly:

* ``backward_prefetch``/``forward_prefetch``/``limit_all_gathers`` are accepted and ignored:
  backward here never re-gathers (see :mod:`.unit`), except under activation checkpointing,
  where the recomputation re-gathers the unit on demand.
* ``cpu_offload=CPUOffload(offload_params=True)`` keeps shards and their gradients in host
  memory; on CPU-only runs it is the identity.
* Shared (tied) parameters must belong to one unit: wrap their common ancestor.
* ``HYBRID_SHARD`` needs ``process_group=(shard_group, replicate_group)`` (torch's order:
  intra-node, inter-node), or ``NEURAL_ARCH_FSDP_SHARD_SIZE``/``LOCAL_WORLD_SIZE`` ranks per shard group.
* ``no_sync()`` is not implemented (raises ``NotImplementedError``).

Example::

    from neural_arch.distributed.fsdp import FullyShardedDataParallel as FSDP, ModuleWrapPolicy
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerBlock}))
    opt = optim.Adam(fsdp.parameters(), lr=1e-3)
    loss = F.cross_entropy(fsdp(x), y); loss.backward()
    fsdp.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()
    full = fsdp.state_dict()     # a collective: original parameter names, full values
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import OrderedDict

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor, no_grad
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.groups import _resolve_group, new_group
from neural_arch.distributed.parallel.sharded.api import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
    StateDictType,
    resolve_policy,
)
from neural_arch.distributed.parallel.sharded.flat import FlatLayout
from neural_arch.distributed.parallel.sharded.reducer import ShardedGradReducer
from neural_arch.distributed.parallel.sharded.unit import FlatParamUnit
from neural_arch.nn.module import Module

__all__ = ["FullyShardedDataParallel"]


def _plan_units(root, policy):
    """Post-order list of ``(name, module)`` units (root last) and each unit's own parameters."""
    units: list = []
    claimed: set = set()

    def own_params(module):
        out, seen = [], set()
        for _, p in module.named_parameters():
            if id(p) not in claimed and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def visit(name, module):
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            nonwrapped = sum(p.numel() for p in own_params(child))
            if policy is not None and policy(module=child, recurse=True, nonwrapped_numel=nonwrapped):
                visit(full, child)
            nonwrapped = sum(p.numel() for p in own_params(child))
            if policy is not None and policy(module=child, recurse=False, nonwrapped_numel=nonwrapped):
                params = own_params(child)
                claimed.update(id(p) for p in params)
                units.append((full, child, params))

    visit("", root)
    params = own_params(root)
    units.append(("", root, params))
    return units


def _hybrid_groups(world_group, shard_size: int):
    """(shard_group, replicate_group) for consecutive blocks of ``shard_size`` ranks (a collective)."""
    world = world_group.size()
    if shard_size < 1 or world % shard_size:
        raise ValueError(f"HYBRID_SHARD: shard group size {shard_size} does not divide the world size {world}")
    me = world_group.rank()
    shard_group = replicate_group = None
    for start in range(0, world, shard_size):
        g = new_group(list(range(start, start + shard_size)))
        if start <= me < start + shard_size:
            shard_group = g
    for offset in range(shard_size):
        g = new_group(list(range(offset, world, shard_size)))
        if me % shard_size == offset:
            replicate_group = g
    return shard_group, replicate_group


class FullyShardedDataParallel(Module):
    """Shard ``module``'s parameters, gradients and optimizer state (see the module docstring).

    Args:
        module: the model (every rank builds the same one).
        process_group: the group to shard over (default: the world); for ``HYBRID_SHARD`` a pair
            ``(shard_group, replicate_group)``.
        sharding_strategy: a :class:`ShardingStrategy` (default ``FULL_SHARD``).
        cpu_offload: :class:`CPUOffload`.
        auto_wrap_policy: which submodules become units (``ModuleWrapPolicy({Block})``, a set of
            classes, or torch's callable policies). Default: one unit for the whole model.
        backward_prefetch, forward_prefetch, limit_all_gathers: accepted, no effect (see above).
        mixed_precision: :class:`MixedPrecision`.
        sync_module_states: broadcast rank 0's parameters and buffers first (ranks may init differently).
        device_mesh: a 2-D mesh ``(replicate, shard)`` for ``HYBRID_SHARD``, if it has
            ``get_group(dim)``; a 1-D mesh for the other strategies.
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
        self.backward_prefetch = backward_prefetch
        self._state_dict_type = StateDictType.FULL_STATE_DICT

        shard_group, replicate_group = self._groups(process_group, device_mesh, strategy)
        self.process_group = shard_group
        self.replicate_group = replicate_group
        world = _resolve_group(None, "FullyShardedDataParallel")
        if sync_module_states:
            self._broadcast_module(world)
        if mp.buffer_dtype is not None:
            for b in module.buffers():
                if b.data.dtype.kind == "f":
                    b.data = b.data.astype(mp.buffer_dtype)

        sharded = strategy is not ShardingStrategy.NO_SHARD
        shard_world = shard_group.size() if sharded else 1
        shard_rank = shard_group.rank() if sharded else 0
        plan = _plan_units(module, resolve_policy(auto_wrap_policy))
        self._units: list[FlatParamUnit] = []
        reshard = strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)
        for i, (name, sub, params) in enumerate(plan):
            lay = FlatLayout([tuple(p.shape) for p in params], shard_world)
            unit = FlatParamUnit(name, sub, params, lay, shard_rank, shard_group if sharded else None,
                                 mp.param_dtype, cpu_offload.offload_params, reshard)
            self._units.append(unit)
            self.register_parameter(f"flat_param_{i}", unit.flat_param)
            if sub is not module:
                sub.register_forward_pre_hook(self._make_pre_hook(unit))
                sub.register_forward_hook(self._make_post_hook(unit))
        reduce_dtype = mp.reduce_dtype or mp.param_dtype
        self._reducer = ShardedGradReducer(
            [u.params for u in self._units], shard_group, self._on_grad_shard,
            reduce_dtype=None if reduce_dtype is None else np.dtype(reduce_dtype),
            scatter=sharded, replicate_group=replicate_group)
        if self._reducer.layouts and any(a.padded_numel != u.layout.padded_numel
                                         for a, u in zip(self._reducer.layouts, self._units)):
            raise AssertionError("FSDP: reducer and unit layouts disagree")  # pragma: no cover

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _groups(process_group, device_mesh, strategy):
        if device_mesh is not None:
            get = getattr(device_mesh, "get_group", None)
            if get is None:
                raise TypeError("device_mesh must have get_group(dim)")
            if strategy is ShardingStrategy.HYBRID_SHARD:
                return get(1), get(0)
            return get(0), None
        if strategy is ShardingStrategy.HYBRID_SHARD:
            if isinstance(process_group, tuple):
                if len(process_group) != 2:
                    raise ValueError("HYBRID_SHARD: process_group must be a pair (shard_group, replicate_group)")
                return _resolve_group(process_group[0], "FSDP"), _resolve_group(process_group[1], "FSDP")
            world = _resolve_group(process_group, "FullyShardedDataParallel")
            size = int(os.environ.get("NEURAL_ARCH_FSDP_SHARD_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 0)
            if not size:
                raise ValueError("HYBRID_SHARD needs process_group=(shard_group, replicate_group), a 2-D "
                                 "device_mesh, or NEURAL_ARCH_FSDP_SHARD_SIZE / LOCAL_WORLD_SIZE set")
            return _hybrid_groups(world, size)
        if isinstance(process_group, tuple):
            raise TypeError(f"a (shard_group, replicate_group) pair is only for HYBRID_SHARD, not {strategy.name}")
        return _resolve_group(process_group, "FullyShardedDataParallel"), None

    def _broadcast_module(self, world) -> None:
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if hasattr(t.data, "flags") and not t.data.flags.c_contiguous:
                t.data = t.data.copy()
            world.backend.broadcast(t.data, root=0)

    def _make_pre_hook(self, unit):
        def hook(module, args):
            unit.gather()
            if self.mixed_precision.cast_forward_inputs:
                return self._cast_inputs(args)
            return None
        return hook

    def _make_post_hook(self, unit):
        def hook(module, args, out):
            if unit.reshard_after_forward:
                unit.free()
        return hook

    def _cast_inputs(self, args):
        dt = self.mixed_precision.param_dtype
        if dt is None:
            return None
        return tuple(a.astype(dt) if isinstance(a, Tensor) and a.is_floating_point() and a.dtype != dt else a
                     for a in args)

    def _on_grad_shard(self, i: int, flat_grad) -> None:
        unit = self._units[i]
        unit.add_grad(flat_grad)
        if not unit.reshard_after_forward:
            unit.free()  # SHARD_GRAD_OP / NO_SHARD keep parameters gathered until backward is done

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        root = self._units[-1]
        root.gather()
        if self.mixed_precision.cast_root_forward_inputs:
            args = self._cast_inputs(args) or args
        try:
            return self.module(*args, **kwargs)
        finally:
            if root.reshard_after_forward:
                root.free()

    def train(self, mode: bool = True) -> FullyShardedDataParallel:
        super().train(mode)
        self.module.train(mode)
        return self

    # ------------------------------------------------------------------ gradients
    @no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip the gradients of all shards by their *global* norm (a collective); returns the norm."""
        max_norm, norm_type = float(max_norm), float(norm_type)
        grads = [u.flat_param.grad.data for u in self._units if u.flat_param.grad is not None]
        sharded = self.sharding_strategy is not ShardingStrategy.NO_SHARD
        if math.isinf(norm_type):
            local = max([float(abs(g).max()) for g in grads if g.size] or [0.0])
            op = ReduceOp.MAX
        else:
            local = sum(float((abs(g.astype(np.float64)) ** norm_type).sum()) for g in grads)
            op = ReduceOp.SUM
        if sharded:
            buf = np.array([local], dtype=np.float64)
            self.process_group.backend.allreduce(buf, op)
            local = float(buf[0])
        total = local if math.isinf(norm_type) else local ** (1.0 / norm_type)
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g *= coef
        return total

    def no_sync(self):
        raise NotImplementedError("FullyShardedDataParallel.no_sync() is not implemented: call backward on "
                                  "every micro-batch (gradients accumulate into the shards) instead")

    # ------------------------------------------------------------------ state dicts
    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type, state_dict_config=None, optim_state_dict_config=None):
        """``with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT): sd = model.state_dict()``."""
        if not isinstance(state_dict_type, StateDictType):
            raise TypeError(f"state_dict_type must be a StateDictType, got {state_dict_type!r}")
        fsdps = [m for m in ([module] + list(module.modules())) if isinstance(m, FullyShardedDataParallel)]
        prev = [m._state_dict_type for m in fsdps]
        for m in fsdps:
            m._state_dict_type = state_dict_type
        try:
            yield
        finally:
            for m, p in zip(fsdps, prev):
                m._state_dict_type = p

    def _names(self):
        names = {}
        for mod_prefix, sub in self.module.named_modules():
            for n, p in sub._parameters.items():
                if p is not None and id(p) not in names:
                    names[id(p)] = f"{mod_prefix}.{n}" if mod_prefix else n
        return names

    @no_grad()
    def state_dict(self, prefix: str = "") -> OrderedDict[str, np.ndarray]:
        """FULL: original names, full values in the master dtype, on every rank (a collective).
        SHARDED/LOCAL: this rank's flat shards, ``{prefix + "flat_param_<i>": array}``."""
        out: OrderedDict = OrderedDict()
        if self._state_dict_type is not StateDictType.FULL_STATE_DICT:
            for i, u in enumerate(self._units):
                out[f"{prefix}flat_param_{i}"] = _backend.to_device(u.flat_param.data, "cpu").copy()
            return out
        names = self._names()
        values = {}
        for u in self._units:
            flat = _backend.to_device(u.full_flat(u.master_dtype), "cpu")
            for p, v in zip(u.params, u.layout.views(flat)):
                values[names[id(p)]] = v.copy()
        for key in self.module.state_dict():
            if key in values:
                out[prefix + key] = values[key]
        for mod_prefix, sub in self.module.named_modules():
            for n, b in sub._buffers.items():
                if b is not None and n not in sub._non_persistent:
                    out[prefix + (f"{mod_prefix}.{n}" if mod_prefix else n)] = _backend.to_device(b.data, "cpu").copy()
        return out

    @no_grad()
    def load_state_dict(self, state_dict, strict: bool = True):
        """Load what :meth:`state_dict` gave under the same state-dict type."""
        if self._state_dict_type is not StateDictType.FULL_STATE_DICT:
            for i, u in enumerate(self._units):
                key = f"flat_param_{i}"
                if key not in state_dict:
                    raise RuntimeError(f"FSDP.load_state_dict: missing {key!r} in a sharded state dict")
                arr = np.asarray(state_dict[key])
                if arr.shape != u.flat_param.shape:
                    raise RuntimeError(f"FSDP.load_state_dict: {key} has shape {arr.shape}, this rank's shard "
                                       f"is {u.flat_param.shape} (was it saved with another world size?)")
                u.flat_param.data[...] = _backend.to_device(arr, _backend.device_of(u.flat_param.data))
            return
        names = self._names()
        expected = set(names.values())
        missing = [k for k in expected if k not in state_dict]
        if strict and missing:
            raise RuntimeError(f"FSDP.load_state_dict(strict=True): missing keys {sorted(missing)}")
        for u in self._units:
            arrays = [np.asarray(state_dict[names[id(p)]]) if names[id(p)] in state_dict else None
                      for p in u.params]
            if any(a is None for a in arrays):
                old = _backend.to_device(u.full_flat(u.master_dtype), "cpu")
                arrays = [a if a is not None else v for a, v in zip(arrays, u.layout.views(old))]
            flat = u.layout.flatten(arrays, np, dtype=u.master_dtype)
            lo, hi = u.layout.shard_range(u.group.rank() if u.group is not None else 0)
            u.flat_param.data[...] = _backend.to_device(flat[lo:hi], _backend.device_of(u.flat_param.data))
        for mod_prefix, sub in self.module.named_modules():
            for n, b in sub._buffers.items():
                key = f"{mod_prefix}.{n}" if mod_prefix else n
                if b is not None and key in state_dict:
                    b.data[...] = np.asarray(state_dict[key])
        return

    @contextlib.contextmanager
    def summon_full_params(self, writeback: bool = True):
        """Gather every unit's full parameters (master dtype) into the module; write edits back on exit."""
        with no_grad():
            for u in self._units:
                full = u.full_flat(u.master_dtype).copy()
                for p, v in zip(u.params, u.layout.views(full)):
                    p.data = v
        try:
            yield self.module
        finally:
            with no_grad():
                for u in self._units:
                    if writeback and u.params:
                        xp = _backend.get_array_module(u.params[0].data)
                        flat = u.layout.flatten([p.data for p in u.params], xp, dtype=u.master_dtype)
                        lo, hi = u.layout.shard_range(u.group.rank() if u.group is not None else 0)
                        u.flat_param.data[...] = _backend.to_device(flat[lo:hi], _backend.device_of(u.flat_param.data))
                    u.free()

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{u.name or '<root>'}:{u.layout.numel}" for u in self._units)
        return f"strategy={self.sharding_strategy.name}, units=[{sizes}]"

    def __repr__(self) -> str:
        return f"FullyShardedDataParallel({self.extra_repr()})\n  (module): " + repr(self.module).replace("\n", "\n  ")
