"""``ZeroRedundancyOptimizer``: ZeRO stage 1 (torch's semantics) and stage 2 (sharded gradients).

**Stage 1** (the default, torch's ``ZeroRedundancyOptimizer``): whole parameters are partitioned
over the ranks (largest first, each to the rank holding the fewest elements so far: torch's
greedy rule). Every rank keeps optimizer state (Adam's two moments...) only for its own
partition and steps only those parameters; afterwards each rank broadcasts its updated
parameters (one flat broadcast per owner). Gradients must already be averaged over the ranks:
wrap the model in ``DistributedDataParallel`` as with torch.

**Stage 2** (``stage=2``, DeepSpeed's ZeRO-2): the optimizer also owns the gradient reduction.
Parameters are laid out in flat buckets planned like DDP's
(:func:`~neural_arch.distributed.bucketing.plan_buckets`: reverse order, closed at the cap); a
:class:`~neural_arch.distributed.bucketing.ShardedGradReducer` reduce-scatters
each bucket during backward, so rank ``r`` only ever holds the averaged gradient of its slice
of every bucket. The rank keeps a master copy of its slices as flat shard parameters, steps
them with the inner optimizer, and all-gathers the updated slices into the model's parameters.
Do **not** also wrap the model in DDP with ``stage=2``. Only elementwise optimizers (SGD, Adam,
AdamW, ...) give single-process results on flat slices; LAMB/LARS-style per-tensor norms do not.
A parameter that gets no gradient on any rank in a step (a branch not taken) is skipped by a plain
optimizer (no momentum, no weight decay, no Adam step): stage 2 counts, per step, on how many ranks
each bucket parameter got a gradient (one small all-reduce) and leaves a bucket's shard without a
gradient when none of its parameters got one, so the inner optimizer skips it too. A bucket only
*partly* unused everywhere cannot be stepped like that (its slice is stepped as a whole): ``step()``
raises on every rank, naming the parameters; a small ``bucket_cap_mb`` (e.g. ``1e-6``: one
parameter per bucket) gives conditionally used parameters buckets of their own. (Not with
``replicate_group``: there the shards are stepped as before, unused parameters as zeros.)

Both stages produce parameters equal to single-process training on the global batch.

**Expert parameters** (mixture-of-experts under expert parallelism: ``parallelize_moe`` marks
them ``param.allreduce = False`` with ``param.expert_dp_group``) differ between ranks by design,
so they are kept out of the partition (stage 1) and out of the flat buckets (stage 2). Their
gradients are reduced as DDP reduces them (summed over the expert-data-parallel group, divided
by the data-parallel size: :mod:`neural_arch.distributed.ddp.expert_grads`): by DDP in stage 1,
by this optimizer at the end of backward in stage 2. Their optimizer state is sharded over their
**expert-data-parallel group** (DeepSpeed-MoE's layout): the ranks holding the same experts share
them out whole with torch's greedy rule, each steps its share with the replicated parameters'
hyper-parameters and broadcasts the updated experts to the group (one flat broadcast per owner),
so each expert's state lives once instead of ``world / ep`` times (with ``ep = world`` every expert
lives once anyway and is stepped where it is). A consolidated state dict holds the expert state of
rank ``to``'s own experts, gathered from their owners in its group (as a plain optimizer on that
rank would); the other ranks' experts are not in it, and loading it gives every rank's owned experts
of those indices that state: checkpoint experts per expert-parallel rank.

Example::

    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    ddp = DistributedDataParallel(model)                                   # stage 1: DDP averages
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optim.Adam, lr=1e-3)
    ...
    opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=2, lr=1e-3)   # no DDP
    loss.backward(); opt.step(); opt.zero_grad()
    opt.consolidate_state_dict(to=0)
    if rank == 0: save(opt.state_dict())
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor, no_grad
from neural_arch.distributed.bucketing import ShardedGradReducer, plan_buckets
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.ddp.expert_grads import ExpertGradReducer, split_expert_parameters
from neural_arch.distributed.flat_param import FlatLayout, FlatShard
from neural_arch.distributed.resolve import _resolve_group
from neural_arch.nn.parameter import Parameter
from neural_arch.optim.optimizer import Optimizer, _check_state_shapes

__all__ = ["ZeroRedundancyOptimizer"]


def _partition_experts(experts: list, index: dict) -> list:
    """``[(expert-data-parallel group or None, [params of its group rank 0, of rank 1, ...]), ...]``: the
    expert parameters of each group shared out over its ranks with torch's greedy rule (largest first,
    to the rank holding the fewest elements so far). The ranks of one group hold the same experts in
    the same order, so each computes the same partition. ``None``: experts held once (ep = dp), stepped
    where they are.

    >>> from neural_arch.nn.parameter import Parameter
    >>> w = Parameter(np.zeros(3))                       # no expert_dp_group: held once
    >>> _partition_experts([w], {id(w): 0})[0][0] is None
    True
    """
    by_group: dict = {}
    for p in experts:
        group = getattr(p, "expert_dp_group", None)
        if group is not None and group.size() == 1:
            group = None
        by_group.setdefault(id(group), (group, []))[1].append(p)
    out = []
    for group, params in by_group.values():
        size = 1 if group is None else group.size()
        parts: list = [[] for _ in range(size)]
        owner, load = {}, [0] * size
        for p in sorted(params, key=lambda t: (-int(np.prod(t.shape)), index[id(t)])):
            r = int(np.argmin(load))
            owner[id(p)] = r
            load[r] += int(np.prod(p.shape))
        for p in params:                                 # model order inside each rank's part
            parts[owner[id(p)]].append(p)
        out.append((group, parts))
    return out


def _broadcast_owned(backend, rank: int, partition: list) -> None:
    """``partition[r]`` (parameters) from rank ``r`` of ``backend``'s group to the others: one flat
    broadcast per owner."""
    for r, params in enumerate(partition):
        if not params:
            continue
        lay = FlatLayout([tuple(p.shape) for p in params], 1)
        xp = _backend.get_array_module(params[0].data)
        dtypes = {p.dtype for p in params}
        dtype = params[0].dtype if len(dtypes) == 1 else np.float64
        flat = lay.flatten([p.data for p in params] if r == rank else [None] * len(params), xp, dtype)
        backend.broadcast(flat, root=r)
        if r != rank:
            for p, v in zip(params, lay.views(flat)):
                p.data[...] = v


def _copy_state(value):
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return _backend.to_device(value, "cpu").copy()
    return value


class ZeroRedundancyOptimizer(Optimizer):
    """ZeRO: optimizer state (stage 1) and gradients (stage 2) sharded over ``process_group``.

    Args:
        params: parameters or param-group dicts, as for any optimizer (the *full* model).
        optimizer_class: the inner optimizer, e.g. ``optim.Adam``.
        process_group: the group to shard over (default: the world).
        parameters_as_bucket_view: accepted for torch compatibility (no effect here).
        overlap_with_ddp: not supported (raises ``NotImplementedError``).
        stage: 1 (torch's ZeRO-1) or 2 (gradients reduce-scattered in flat buckets).
        bucket_cap_mb: stage 2 bucket size.
        replicate_group: stage 2 only: after the reduce-scatter over ``process_group``, average each
            shard over this group as well (ZeRO inside each data-parallel replica, replicated across
            the replicas: HSDP's layout). Anything whose ``backend.allreduce(array, ReduceOp.AVG)``
            averages in place, e.g. a ProcessGroup of the ranks holding the same shard index, or
            :class:`~neural_arch.distributed.ft.managed_group.ManagedProcessGroup` for fault-tolerant
            replicas. None (the default): ``process_group`` is the whole data-parallel world.
        **defaults: the inner optimizer's hyper-parameters (``lr=...``).

    Example::

        opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=2, lr=1e-3)
        loss_fn(model(x), y).backward()
        opt.step()                      # each rank steps its shard, then parameters are all-gathered
        opt.consolidate_state_dict(to=0); state = opt.state_dict()    # on rank 0
    """

    def __init__(self, params, optimizer_class, process_group=None, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, *, stage: int = 1, bucket_cap_mb: float = 25.0,
                 replicate_group=None, **defaults):
        if overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer(overlap_with_ddp=True) is not implemented; "
                                      "use stage=2, which overlaps the gradient reduce-scatter with backward")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"ZeroRedundancyOptimizer: optimizer_class must be an Optimizer subclass "
                            f"(e.g. optim.Adam), got {optimizer_class!r}")
        if stage not in (1, 2):
            raise ValueError(f"ZeroRedundancyOptimizer: stage must be 1 or 2, got {stage!r} "
                             "(stage 3 is FullyShardedDataParallel)")
        if replicate_group is not None and stage != 2:
            raise ValueError("ZeroRedundancyOptimizer(replicate_group=...) needs stage=2 (the optimizer then owns "
                             "the gradient reduction); with stage 1 the gradients come averaged from DDP")
        #: the group each gradient shard is also averaged over after the reduce-scatter (stage 2), or None
        self.replicate_group = replicate_group
        # The inner optimizer's own defaults too (Adam's betas, eps...): the groups then hold every
        # hyper-parameter, as a plain optimizer's do, and a state dict saved from them loads into one.
        probe = optimizer_class([Parameter(np.zeros(1))], **defaults)
        super().__init__(params, dict(probe.defaults))
        self.optimizer_class = optimizer_class
        self.stage = stage
        self.process_group = _resolve_group(process_group, "ZeroRedundancyOptimizer")
        self.world_size = self.process_group.size()
        self.rank = self.process_group.rank()
        self._all_params = [p for g in self.param_groups for p in g["params"]]
        self._index = {id(p): i for i, p in enumerate(self._all_params)}
        # Expert parameters (see the module docstring): outside the partition, stepped on every rank.
        self._experts = split_expert_parameters(self._all_params)[1]
        self._expert_ids = {id(p) for p in self._experts}
        self.expert_reducer = None
        self._expert_hooks: list = []
        # each expert's optimizer state on one rank of its expert-data-parallel group (module docstring)
        self._expert_partitions = _partition_experts(self._experts, self._index)
        self._owned_experts = {id(p) for group, parts in self._expert_partitions
                               for p in parts[0 if group is None else group.rank()]}
        self._consolidated = None
        if stage == 1:
            self._build_stage1()
        else:
            self._build_stage2(bucket_cap_mb)

    # ------------------------------------------------------------------ stage 1
    def _build_stage1(self) -> None:
        # torch's greedy partition: per group, largest parameter first to the lightest rank.
        self.partition: list[list] = [[] for _ in range(self.world_size)]  # rank -> params (model order)
        owner: dict = {}
        load = [0] * self.world_size
        experts = self._expert_ids
        for group in self.param_groups:
            replicated = [p for p in group["params"] if id(p) not in experts]
            for p in sorted(replicated, key=lambda t: -int(np.prod(t.shape))):
                r = int(np.argmin(load))
                owner[id(p)] = r
                load[r] += int(np.prod(p.shape))
        for p in self._all_params:
            if id(p) in owner:
                self.partition[owner[id(p)]].append(p)
        self._owner = owner
        local_groups = []
        for group in self.param_groups:
            # this rank's partition and the experts it steps for its expert-data-parallel group
            mine = [p for p in group["params"]
                    if (id(p) in self._owned_experts if id(p) in experts else owner[id(p)] == self.rank)]
            local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine})
        self._local_groups = local_groups
        nonempty = [g for g in local_groups if g["params"]]
        self.optim = self.optimizer_class(nonempty, **self.defaults) if nonempty else None
        self._adopt_inner_groups()

    def _broadcast_partitions(self) -> None:
        _broadcast_owned(self.process_group.backend, self.rank, self.partition)

    def _broadcast_experts(self) -> None:
        """Each expert-data-parallel group's experts, updated by their owners, to the group's other ranks."""
        for group, parts in self._expert_partitions:
            if group is not None:
                _broadcast_owned(group.backend, group.rank(), parts)

    # ------------------------------------------------------------------ stage 2
    def _build_stage2(self, bucket_cap_mb: float) -> None:
        if not bucket_cap_mb > 0:   # NaN too
            raise ValueError(f"ZeroRedundancyOptimizer: bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self._buckets, self._bucket_group = [], []
        for gi, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if id(p) not in self._expert_ids]
            # DDP's rule (torch's): reverse order, one dtype per bucket, closed once at the cap
            sizes = [(int(np.prod(p.shape)), p.dtype) for p in params]
            for b in plan_buckets(sizes, int(bucket_cap_mb * 2**20)):
                self._buckets.append([params[i] for i in b])
                self._bucket_group.append(gi)
        self._shards = []
        for b in self._buckets:
            lay = FlatLayout([tuple(p.shape) for p in b], self.world_size)
            xp = _backend.get_array_module(b[0].data)
            lo, hi = lay.shard_range(self.rank)
            shard = Parameter(lay.flatten([p.data for p in b], xp)[lo:hi].copy())
            # what the shard holds (state dicts by parameter name; clip_grad_norm_'s global norm)
            shard._flat_shard = FlatShard(b, lay, self.rank, self.process_group)
            for p in b:
                p._grad_elsewhere = ("ZeroRedundancyOptimizer(stage=2) reduce-scatters its gradient into flat "
                                     "shards (its .grad stays None); clip with opt.clip_grad_norm_(max_norm)")
            self._shards.append(shard)
        self._layouts = [FlatLayout([tuple(p.shape) for p in b], self.world_size) for b in self._buckets]
        local_groups = []
        for gi, group in enumerate(self.param_groups):
            shards = [s for s, g in zip(self._shards, self._bucket_group) if g == gi]
            shards += [p for p in group["params"] if id(p) in self._owned_experts]   # stepped whole
            local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": shards})
        self._local_groups = local_groups
        nonempty = [g for g in local_groups if g["params"]]
        self.optim = self.optimizer_class(nonempty, **self.defaults) if nonempty else None
        self._adopt_inner_groups()
        self.reducer = ShardedGradReducer(self._buckets, self.process_group, self._accumulate_shard,
                                          replicate_group=self.replicate_group)
        # which bucket parameters got a gradient on this rank since the last step (see the module docstring)
        self._bucket_params = [p for b in self._buckets for p in b]
        self._got_grad = np.zeros(len(self._bucket_params), dtype=np.float64)
        self._grad_hooks = []
        if self.replicate_group is None:
            for j, p in enumerate(self._bucket_params):
                if p.requires_grad:
                    self._grad_hooks.append(p.register_post_accumulate_grad_hook(
                        lambda _p, j=j, flags=self._got_grad: flags.__setitem__(j, 1.0)))
        if self._experts:
            # DDP's reduction of expert gradients (summed over each expert-data-parallel group,
            # divided by the data-parallel size), queued behind the reducer's end of backward
            self.expert_reducer = ExpertGradReducer(self._experts, self.world_size)
            replicated = [p for b in self._buckets for p in b]       # after the reducer's hooks
            self._expert_hooks = self.expert_reducer.reduce_after_backward(replicated or self._experts)

    def _accumulate_shard(self, i: int, g) -> None:
        shard = self._shards[i]
        g = g.astype(shard.dtype, copy=False)
        if shard.grad is None:
            shard.grad = Tensor._wrap(g.copy())
        else:
            shard.grad.data += g

    def _skip_unused_buckets(self) -> None:
        """Stage 2: a bucket none of whose parameters got a gradient on any rank since the last step
        keeps no shard gradient (the inner optimizer skips it, as a plain one skips ``grad=None``); a
        bucket partly unused everywhere raises on every rank (the counts are the same everywhere)."""
        if not self._grad_hooks:
            return
        backend = self.process_group.backend
        if "cpu" in getattr(backend, "devices", ("cpu",)):
            counts = self._got_grad.copy()     # host flags on a backend that moves host arrays: no device copy
            backend.allreduce(counts, ReduceOp.SUM)
        else:                                  # NCCL moves device arrays only
            xp = _backend.get_array_module(self._shards[0].data)
            counts = xp.asarray(self._got_grad)
            backend.allreduce(counts, ReduceOp.SUM)
            counts = _backend.to_host(counts)
        used = counts > 0
        self._got_grad[:] = 0
        at = 0
        for bi, (b, shard) in enumerate(zip(self._buckets, self._shards)):
            mine = used[at:at + len(b)]
            at += len(b)
            trainable = np.array([p.requires_grad for p in b])
            if not mine[trainable].any():
                shard.grad = None
            elif not mine[trainable].all():
                missing = [f"#{self._index[id(p)]} {tuple(p.shape)}" for p, u, t in zip(b, mine, trainable)
                           if t and not u]
                raise RuntimeError(
                    f"ZeroRedundancyOptimizer(stage=2): parameters {missing} (index in the optimizer, shape) got no "
                    f"gradient on any rank since the last step, but share flat bucket {bi} with parameters that "
                    "did; a plain optimizer would skip them (no momentum, weight decay or Adam step) while the "
                    "bucket's shard is stepped as a whole. Pass a smaller bucket_cap_mb (1e-6: one parameter per "
                    "bucket) so conditionally used parameters get buckets of their own, or use every parameter")

    def _refresh_shards(self) -> None:
        """Copy the model's parameters into this rank's master shards: equal to them after every
        step, unless the parameters were loaded since (``model.load_state_dict``,
        ``set_model_state_dict``), which must not be undone by the next step."""
        for shard in self._shards:
            data = shard.data
            for p, start, at, n in shard._flat_shard.pieces:
                data[at:at + n] = p.data.reshape(-1)[start:start + n]

    def _gather_shards(self) -> None:
        backend = self.process_group.backend
        for b, lay, shard in zip(self._buckets, self._layouts, self._shards):
            xp = _backend.get_array_module(shard.data)
            full = xp.empty((self.world_size, lay.shard_size), dtype=shard.dtype)
            backend.allgather(full, shard.data)
            for p, v in zip(b, lay.views(full.reshape(-1))):
                p.data[...] = v

    def _adopt_inner_groups(self) -> None:
        """Point ``_local_groups`` at the inner optimizer's own group dicts (its constructor copies the
        dicts it is given), so hyper-parameters synced into them reach the real step."""
        if self.optim is None:
            return
        inner = iter(self.optim.param_groups)
        self._local_groups = [next(inner) if g["params"] else g for g in self._local_groups]

    # ------------------------------------------------------------------ Optimizer API
    def _sync_hyperparameters(self) -> None:
        # LR schedulers edit self.param_groups; the inner optimizer must see the same values.
        for full, local in zip(self.param_groups, self._local_groups):
            for k, v in full.items():
                if k != "params":
                    local[k] = v

    @no_grad()
    def step(self, closure=None):
        """Step the local shard, then bring every rank's parameters up to date."""
        loss = closure() if closure is not None else None
        self._sync_hyperparameters()
        if self.stage == 2:
            self._skip_unused_buckets()
            self._refresh_shards()
        if self.optim is not None:
            self.optim.step()
        if self.stage == 1:
            self._broadcast_partitions()
        else:
            self._gather_shards()
        self._broadcast_experts()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.expert_reducer is not None:
            self.expert_reducer.pending = False   # a backward that raised never ran its reduction
        if self.stage == 2:
            self._got_grad[:] = 0      # the gradients counted so far are gone
            for s in self._shards:
                if s.grad is not None:
                    if set_to_none:
                        s.grad = None
                    else:
                        s.grad.data[...] = 0

    @no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip every gradient by the *global* norm (a collective: every rank calls it); returns the norm.

        Stage 2: the gradients are this rank's flat shards, totalled over the group; stage 1: the
        model's (already averaged, whole) gradients. Call it between ``backward`` and ``step``::

            loss.backward(); opt.clip_grad_norm_(1.0); opt.step()
        """
        from neural_arch.optim.clip import clip_grad_norm_

        params = self._shards + self._experts if self.stage == 2 else self._all_params
        return float(clip_grad_norm_(params, max_norm, norm_type))

    # ------------------------------------------------------------------ checkpoints
    def _local_state(self) -> dict:
        """This rank's state as {global param index: {...}} (stage 1) or {bucket: {...}} (stage 2),
        and its experts' as {("expert", global param index): {...}}."""
        if self.optim is None:
            return {}
        experts = {("expert", self._index[id(p)]): {k: _copy_state(v) for k, v in self.optim.state[p].items()}
                   for p in self._experts if p in self.optim.state}
        if self.stage == 1:
            return {self._index[id(p)]: {k: _copy_state(v) for k, v in self.optim.state[p].items()}
                    for g in self._local_groups for p in g["params"]
                    if p in self.optim.state and id(p) not in self._expert_ids} | experts
        return {i: {k: _copy_state(v) for k, v in self.optim.state[s].items()}
                for i, s in enumerate(self._shards) if s in self.optim.state} | experts

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's optimizer state on global rank ``to`` (a collective: all ranks call it).

        Afterwards ``state_dict()`` on rank ``to`` returns the full state in the plain optimizer's
        format (parameter indices of the full model), loadable by ``load_state_dict`` on any
        world size and by the plain inner optimizer.
        """
        from neural_arch.distributed.collectives import gather_object

        root = self.process_group.group_rank(to, "to")
        pieces = [None] * self.world_size if self.rank == root else None
        gather_object(self._local_state(), pieces, dst=to, group=self.process_group)
        if self.rank != root:
            self._consolidated = None
            return
        state: dict = {}
        if self.stage == 1:
            for piece in pieces:
                state.update({i: v for i, v in piece.items() if not isinstance(i, tuple)})
        else:
            for i, (b, lay) in enumerate(zip(self._buckets, self._layouts)):
                per_rank = [piece.get(i, {}) for piece in pieces]
                if not per_rank[0]:
                    continue
                for k, v0 in per_rank[0].items():
                    if hasattr(v0, "shape") and tuple(v0.shape) == (lay.shard_size,):
                        flat = np.concatenate([pr[k] for pr in per_rank])
                        for p, view in zip(b, lay.views(flat)):
                            state.setdefault(self._index[id(p)], {})[k] = view.copy()
                    else:
                        for p in b:
                            state.setdefault(self._index[id(p)], {})[k] = v0
        # the experts: this rank's own, whose state its expert-data-parallel group holds (a rank of another
        # group has other experts under the same indices)
        for member in self._expert_group_members(root):
            state.update({key[1]: v for key, v in pieces[member].items() if isinstance(key, tuple)})
        groups = []
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = [self._index[id(p)] for p in g["params"]]
            groups.append(entry)
        self._consolidated = {"state": state, "param_groups": groups}

    def _expert_group_members(self, root: int) -> list:
        """The group ranks (in ``process_group``) that hold ``root``'s experts' state: ``root`` and the
        rest of its expert-data-parallel group (read on ``root``)."""
        members = {root}
        for group, _parts in self._expert_partitions:
            if group is not None:
                members.update(self.process_group.group_rank(r, "expert_dp_group") for r in group.ranks)
        return sorted(members)

    def state_dict(self) -> dict[str, Any]:
        """The consolidated state (on the rank given to :meth:`consolidate_state_dict` only)."""
        if self._consolidated is None:
            raise RuntimeError(f"ZeroRedundancyOptimizer.state_dict() on rank {self.rank}: the optimizer "
                               "state has not been consolidated on this rank; call "
                               "consolidate_state_dict(to=this_rank) on every rank first")
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full (consolidated or plain-optimizer) state dict; every rank keeps its share.

        Raises ``ValueError`` (before changing anything) when a state array's shape is not its
        parameter's; for a sharded checkpoint use ``checkpoint.state_dict.set_optimizer_state_dict``.
        """
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"load_state_dict: the checkpoint has {len(saved)} parameter groups, this "
                             f"optimizer has {len(self.param_groups)}")
        state = {int(k): v for k, v in state_dict["state"].items()}
        for i, values in state.items():
            if not 0 <= i < len(self._all_params):
                raise ValueError(f"load_state_dict: the state dict has state for parameter {i}, this optimizer has "
                                 f"{len(self._all_params)} parameters")
            _check_state_shapes(i, self._all_params[i], values)  # whole parameters' state, as saved
        for full, sg in zip(self.param_groups, saved):
            for k, v in sg.items():
                if k != "params":
                    full[k] = v
        self._sync_hyperparameters()
        if self.optim is None:
            return
        for p in (self._experts if self.stage == 2 else []):
            if id(p) not in self._owned_experts:
                continue
            s = state.get(self._index[id(p)])
            if s is not None:
                xp = _backend.get_array_module(p.data)
                self.optim.state[p] = {k: (xp.asarray(v).copy() if hasattr(v, "shape") else v) for k, v in s.items()}
        if self.stage == 1:
            for g in self._local_groups:
                for p in g["params"]:
                    s = state.get(self._index[id(p)])
                    if s is not None:
                        xp = _backend.get_array_module(p.data)
                        self.optim.state[p] = {k: (xp.asarray(v).copy() if hasattr(v, "shape") else v)
                                               for k, v in s.items()}
            return
        for b, lay, shard in zip(self._buckets, self._layouts, self._shards):
            per_param = [state.get(self._index[id(p)]) for p in b]
            if per_param[0] is None:
                continue
            xp = _backend.get_array_module(shard.data)
            lo_hi = lay.shard_range(self.rank)
            entry = {}
            for k, v0 in per_param[0].items():
                if hasattr(v0, "shape") and tuple(v0.shape) == tuple(b[0].shape):
                    flat = lay.flatten([xp.asarray(s[k]) for s in per_param], xp, dtype=shard.dtype)
                    entry[k] = flat[lo_hi[0]:lo_hi[1]].copy()
                else:
                    entry[k] = v0
            self.optim.state[shard] = entry

    def __repr__(self) -> str:
        inner = self.optimizer_class.__name__
        return f"ZeroRedundancyOptimizer(stage={self.stage}, optimizer_class={inner}, world_size={self.world_size})"
