"""Expert parallelism for :class:`neural_arch.nn.MoE`: experts split over ranks, tokens moved by all-to-all.

``parallelize_moe(moe, ep_group)`` keeps on each rank only its experts (expert ``e`` lives on
expert-parallel rank ``e // (E / ep)``; ``moe.experts`` then holds those ``E / ep`` experts and
``moe.placement.expert_ids`` their global indices) and replaces the layer's placement so that:

* every forward first **all-gathers the choice counts** (rank x choice level x expert, a few
  integers) over the data-parallel group. From that table every rank knows the batch-wide token
  counts, the capacity decisions (computed on the global batch, see ``nn.MoE``) and every split
  size of the exchange, so no further count exchange is needed;
* the kept rows travel to their experts' ranks and back with the backend's native uneven
  all-to-all (``Backend.alltoallv``: no padding, no staging copy; zero-length splits allowed),
  differentiable; a rank runs each of its experts once on the rows
  it received, ordered by source rank then token position: the order one process uses on the
  batch made of rank 0's tokens, then rank 1's, ..., so the result does not depend on where the
  experts live;
* the auxiliary losses use the statistics of the whole data-parallel batch: the sum of router
  probabilities (and of the squared log-partition for the z-loss) goes through a differentiable
  all-reduce, the counts come from the table. ``local_aux_loss=True`` keeps Megatron's per-rank
  statistics instead;
* with a capacity, the assignments an expert drops are those one process would drop on the
  whole batch (``nn.MoE``'s rule: by choice level, then by the token's global index). Under
  context parallelism (``context_parallel_group``: a rank holds chunks of each sequence, e.g. the
  head-tail layout) the placement gives ``nn.MoE`` the global position of every local token
  (:meth:`ExpertParallelPlacement.token_segments`), and the per-chunk choice counts of every rank
  are all-gathered once more, so the rule does not depend on the layout.

Groups (Megatron's layout, ``ep`` inside ``dp``): a device mesh ``("dp", "ep")`` of shape
``(world // ep, ep)`` over the data-parallel ranks. ``mesh["ep"]`` (consecutive ranks) is the
expert-parallel group that shares out the experts; ``mesh["dp"]`` (the ranks with the same
position in their ep group) is the **expert-data-parallel** group that holds the same experts;
the whole mesh is the data-parallel group of the replicated parameters (router, attention, ...).
:func:`expert_parallel_mesh` builds it.

Gradients (with :class:`~neural_arch.distributed.DistributedDataParallel` over the data-parallel
group): the expert parameters are marked ``param.allreduce = False`` (Megatron's flag) and
``param.expert_dp_group``; DDP leaves them out of its buckets and, at the end of backward, sums
them over the expert-data-parallel group and divides by the data-parallel size. That is the
average the replicated parameters get, because an expert's gradient on one rank already sums
the contributions of every rank of its ep group (the all-to-all's backward brings them home):
training equals one process on the global batch. ZeRO (stage 1 under DDP, stage 2 alone) keeps
the expert parameters whole and out of its partition and reduces them the same way
(:mod:`neural_arch.distributed.ddp.expert_grads`); FSDP shards each expert over its
expert-data-parallel group (:mod:`neural_arch.distributed.fsdp.expert_units`).

Gradient norms (``clip_grad_norm_``, ``opt.clip_grad_norm_``, ``fsdp.clip_grad_norm_``): each
expert parameter carries ``_norm_shard`` (:class:`ExpertNorm`), so its part of the global norm is
summed over the expert-parallel group (every expert once; its replicas in the expert-data-parallel
group hold the same gradient): every rank gets the norm of one process's gradients, and the same
clip coefficient.

Checkpoints (``checkpoint.state_dict.get_state_dict`` / ``dcp.save``): ``moe.experts`` carries the
global indices of its experts, so each expert is saved under its global name (``moe.experts.3...``),
once, by one rank of the expert-data-parallel group holding it, and a checkpoint saved at one ep size
loads at another, or into the plain model in one process.

Example (4 ranks, 2 experts per rank, experts replicated twice)::

    mesh = expert_parallel_mesh(ep_size=2)              # ("dp", "ep") = (2, 2)
    moe = parallelize_moe(nn.MoE(64, num_experts=4), device_mesh=mesh)
    model = DistributedDataParallel(model)               # router averaged over 4, experts over 2
    loss = F.cross_entropy(model(x), y) + moe.aux_loss
"""

from __future__ import annotations

import numpy as np

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.nn.functional import _wrap
from neural_arch.distributed.nn.functional import all_reduce as _all_reduce
from neural_arch.distributed.resolve import _resolve_group
from neural_arch.nn.container import ModuleList
from neural_arch.nn.module import Module
from neural_arch.nn.moe import MoE, apply_experts

__all__ = ["ExpertNorm", "ExpertParallelPlacement", "expert_parallel_mesh", "parallelize_moe"]


def expert_parallel_mesh(ep_size: int, device_type: str = "cpu"):
    """The ``("dp", "ep")`` device mesh of shape ``(world // ep_size, ep_size)`` (every rank calls it).

    Example (on 4 ranks: ep groups [0, 1] and [2, 3], expert-data-parallel groups [0, 2] and [1, 3])::

        mesh = expert_parallel_mesh(2)
        parallelize_moe(model, device_mesh=mesh)
    """
    from neural_arch.distributed.device_mesh import init_device_mesh

    world = _resolve_group(None, "expert_parallel_mesh").size()
    if ep_size <= 0 or world % ep_size:
        raise ValueError(f"expert_parallel_mesh: ep_size={ep_size} must divide the world size {world}")
    return init_device_mesh(device_type, (world // ep_size, ep_size), mesh_dim_names=("dp", "ep"))


def _exchange_rows(x: Tensor, sends, receives, group) -> Tensor:
    """Differentiable uneven all-to-all whose split sizes are already known on every rank.

    ``sends[d]`` rows of ``x`` (in rank order) go to ep rank d and ``receives[s]`` rows arrive from
    rank s. The rows move with the backend's native uneven exchange (``Backend.alltoallv``: MPI's
    ``Ialltoallv``, gloo's pairwise blocks) straight from ``x``'s array into the output: no padding,
    no staging copy, and no count exchange (the splits come from the count table). The output is a
    fresh array, as the graph keeps it; the backward is the reverse exchange of the gradient.

    >>> y = _exchange_rows(rows, sends=[2, 1], receives=[2, 0], group=ep_group)   # doctest: +SKIP
    """
    def move(array, out_rows, in_rows):
        xp = _xp(array)
        out = xp.empty((sum(in_rows),) + tuple(array.shape[1:]), dtype=array.dtype)
        # contiguous already in the MoE (gathered rows, a gradient): then no copy here either
        group.backend.alltoallv(out, xp.ascontiguousarray(array), in_rows, out_rows)
        return out

    return _wrap("AllToAllExperts", x, move(x.data, sends, receives), lambda g: move(g, receives, sends))


class ExpertNorm:
    """How an expert parameter's gradient counts in the global gradient norm (``param._norm_shard``).

    The interface :func:`neural_arch.optim.clip_grad_norm_` duck-types (FSDP's ``FlatShard``):
    ``group``, the expert-parallel group over which the experts are different (None when it is one
    rank: every rank holds every expert), and ``all_reduce_norm(value, op)``, the partial norm summed
    (or maxed) over it.

    Example::

        moe.experts[0].fc1.weight._norm_shard.group      # the expert-parallel group
    """

    __slots__ = ("group",)

    def __init__(self, ep_group):
        self.group = ep_group if ep_group is not None and ep_group.size() > 1 else None

    def all_reduce_norm(self, value, op: str):
        """``value`` summed (``op="sum"``) or maxed (``"max"``) over ``group``: a collective. A float
        gives a float; a 1-element array is reduced in place and returned."""
        scalar = isinstance(value, (int, float))
        buf = np.array([value], dtype=np.float64) if scalar else value
        if self.group is not None:
            self.group.backend.allreduce(buf, ReduceOp.SUM if op == "sum" else ReduceOp.MAX)
        return float(buf[0]) if scalar else buf

    def __repr__(self) -> str:
        return f"ExpertNorm(ranks={None if self.group is None else list(self.group.ranks)})"


class ExpertParallelPlacement:
    """An ``nn.MoE`` placement: this rank's experts, statistics over ``dp_group`` (see the module doc).

    Example::

        # what parallelize_moe does for each MoE layer (4 ranks, ep groups of 2)
        placement = ExpertParallelPlacement(mesh.get_group("ep"), mesh.get_group("dp"), num_experts=4)
        placement.expert_ids          # (0, 1) on ep rank 0, (2, 3) on ep rank 1
    """

    def __init__(self, ep_group, dp_group, num_experts: int, local_aux_loss: bool = False,
                 context_parallel_group=None, load_balance: bool = True):
        self.ep, self.dp = ep_group, dp_group
        cp = context_parallel_group
        self.cp = cp if cp is not None and cp.size() > 1 else None
        self.load_balance = bool(load_balance)
        if self.cp is not None:
            outside = [r for r in self.cp.ranks if r not in dp_group.ranks]
            if outside:
                raise ValueError(f"parallelize_moe: ranks {outside} of the context-parallel group "
                                 f"{list(self.cp.ranks)} are not in the data-parallel group {list(dp_group.ranks)}; "
                                 "the MoE statistics cover every sequence chunk: pass a dp_group over dp x cp")
        size = ep_group.size()
        if num_experts % size:
            raise ValueError(f"parallelize_moe: num_experts={num_experts} is not divisible by the expert-"
                             f"parallel group size {size}; use a multiple of {size} experts or a smaller group")
        missing = [r for r in ep_group.ranks if r not in dp_group.ranks]
        if missing:
            raise ValueError(f"parallelize_moe: ranks {missing} of the expert-parallel group {list(ep_group.ranks)} "
                             f"are not in the data-parallel group {list(dp_group.ranks)}; ep must lie inside dp")
        self.per_rank = num_experts // size
        first = ep_group.rank() * self.per_rank
        self.expert_ids = tuple(range(first, first + self.per_rank))
        self.ep_rows = [dp_group.group_rank(r) for r in ep_group.ranks]     # ep member -> table row
        self.local_aux_loss = bool(local_aux_loss)

    def count_table(self, local_counts: np.ndarray):
        n = self.dp.size()
        local_counts = np.ascontiguousarray(local_counts, dtype=np.int64)
        if n == 1:
            return local_counts[None], 0
        table = np.empty((n,) + local_counts.shape, dtype=np.int64)
        self.dp.backend.allgather(table, local_counts)
        return table, self.dp.rank()

    def sum_stats(self, t: Tensor, local: bool) -> Tensor:
        if local or self.local_aux_loss or self.dp.size() == 1:
            return t
        return _all_reduce(t, group=self.dp)

    def token_segments(self, lead_shape: tuple):
        """None without context parallelism; else ``(starts, keys)``: the runs of this rank's flat
        tokens that are consecutive in the batch's global order, and each run's sort key
        ``(replica, sequence, first global position)``. The tokens must be ``(batch, local
        sequence)`` (the sequence sharded by ``shard_sequence`` over the context-parallel group).
        The replica is the data-parallel rank of the context-parallel group's first rank, so
        sequences are ordered as the data-parallel ranks hold them."""
        if self.cp is None:
            return None
        from neural_arch.distributed.tensor.experimental._attention import sequence_positions

        if len(lead_shape) != 2:
            raise ValueError(f"MoE under context parallelism: expected tokens of shape (batch, local sequence, "
                             f"embed_dim), got leading shape {tuple(lead_shape)}")
        b, t = (int(d) for d in lead_shape)
        if b * t == 0:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 3), dtype=np.int64)
        pos = sequence_positions(t, self.cp.rank(), self.cp.size(), self.load_balance)
        run_starts = np.flatnonzero(np.diff(pos, prepend=pos[0] - 2) != 1)         # local offsets
        replica = self.dp.group_rank(self.cp.ranks[0])
        seq = np.repeat(np.arange(b), len(run_starts))
        starts = seq * t + np.tile(run_starts, b)
        keys = np.stack([np.full(len(starts), replica), seq, np.tile(pos[run_starts], b)], axis=1)
        return starts.astype(np.int64), keys.astype(np.int64)

    def gather_segments(self, counts: np.ndarray, keys: np.ndarray):
        """Every rank's runs (collective over the data-parallel group): ``(counts, keys, owners,
        first, ranks)``, the concatenation in rank order, each run's rank, the index of this rank's
        first run and the group size (see ``nn.moe.route_segments``)."""
        parts = self.dp.backend.allgather_object((counts, keys))
        owners = np.concatenate([np.full(len(c), r, dtype=np.int64) for r, (c, _) in enumerate(parts)])
        me = self.dp.rank()
        first = sum(len(c) for c, _ in parts[:me])
        return (np.concatenate([c for c, _ in parts]), np.concatenate([key for _, key in parts]), owners, first,
                len(parts))

    def run_experts(self, moe: MoE, rows: Tensor, kept: np.ndarray, rank: int) -> Tensor:
        size, me, per = self.ep.size(), self.ep.rank(), self.per_rank
        # flows[s, d, l]: rows ep rank s sends to ep rank d for d's l-th expert (known everywhere)
        flows = kept[self.ep_rows].reshape(size, size, per)
        sends, receives = flows[me].sum(axis=1).tolist(), flows[:, me].sum(axis=1).tolist()
        arrived = _exchange_rows(rows, sends, receives, self.ep)
        # Arrived in (source, expert) blocks; the experts want (expert, source): a permutation,
        # except with one expert per rank (or one source sending), where the two orders are one.
        block = flows[:, me]                                               # (source, local expert)
        if per == 1 or np.count_nonzero(block.sum(axis=1)) <= 1:
            return _exchange_rows(apply_experts(moe.experts, arrived, block.sum(axis=0).tolist()),
                                  receives, sends, self.ep)
        starts = np.concatenate([[0], np.cumsum(block.reshape(-1))])[:-1].reshape(size, per)
        perm = np.concatenate([np.arange(starts[s, l], starts[s, l] + block[s, l])
                               for l in range(per) for s in range(size)] + [np.zeros(0, dtype=np.int64)])
        perm = perm.astype(np.int64)
        out = apply_experts(moe.experts, arrived[perm], block.sum(axis=0).tolist())
        back = out[np.argsort(perm, kind="stable")]
        return _exchange_rows(back, receives, sends, self.ep)


def parallelize_moe(moe: Module, ep_group=None, *, dp_group=None, expert_dp_group=None, device_mesh=None,
                    local_aux_loss: bool = False, context_parallel_group=None, load_balance: bool = True) -> Module:
    """Split the experts of ``moe`` (an ``nn.MoE``, or any module: every MoE inside it) over ``ep_group``.

    Args:
        moe: the layer, built identically (same seed) on every rank.
        ep_group: the expert-parallel group (default: the world, one expert slice per rank).
        dp_group: the data-parallel group whose whole batch the statistics cover (default: the world).
        expert_dp_group: the group of ranks holding the same experts (the ranks of ``dp_group`` with
            this rank's position in their ep group); derived when ``dp_group`` is the world.
        device_mesh: a ``("dp", "ep")`` mesh (:func:`expert_parallel_mesh`) instead of the groups.
        local_aux_loss: per-rank auxiliary-loss statistics (Megatron) instead of the global batch's.
        context_parallel_group: the group over which the sequence is sharded (``shard_sequence``),
            inside ``dp_group``; with a capacity, the dropped assignments are then chosen by the
            tokens' global positions (layout ``load_balance``, as given to ``shard_sequence``).

    Returns ``moe`` (changed in place). Every rank of ``dp_group`` must run the layer's forward and
    backward the same number of times (the exchange is collective).

    >>> moe = parallelize_moe(nn.MoE(16, num_experts=4))      # doctest: +SKIP
    """
    if device_mesh is not None:
        if ep_group is not None or dp_group is not None or expert_dp_group is not None:
            raise ValueError("parallelize_moe: pass device_mesh or the groups, not both")
        if device_mesh.mesh_dim_names != ("dp", "ep"):
            raise ValueError(f"parallelize_moe: device_mesh must have mesh_dim_names ('dp', 'ep'), got "
                             f"{device_mesh.mesh_dim_names}; build it with expert_parallel_mesh(ep_size)")
        ep_group, expert_dp_group = device_mesh.get_group("ep"), device_mesh.get_group("dp")
    ep = _resolve_group(ep_group, "parallelize_moe")
    dp = _resolve_group(dp_group, "parallelize_moe")
    layers = [moe] if isinstance(moe, MoE) else [m for m in moe.modules() if isinstance(m, MoE)]
    if not layers:
        raise TypeError(f"parallelize_moe: {type(moe).__name__} is not an nn.MoE and contains none")
    done = [layer for layer in layers if isinstance(layer.placement, ExpertParallelPlacement)]
    if done:
        raise ValueError(f"parallelize_moe: {len(done)} MoE layer(s) are already expert-parallel; call it once "
                         "per model")
    if ep.size() == dp.size():
        edp = None                                   # every expert lives once: nothing to share
    elif expert_dp_group is not None:
        edp = _resolve_group(expert_dp_group, "parallelize_moe")
    else:
        edp = _expert_dp_group(ep, dp)
    for layer in layers:
        placement = ExpertParallelPlacement(ep, dp, layer.num_experts, local_aux_loss,
                                            context_parallel_group=context_parallel_group, load_balance=load_balance)
        layer.placement = placement
        layer.local_aux_loss = bool(local_aux_loss)
        layer.experts = ModuleList([layer.experts[e] for e in placement.expert_ids])
        # checkpoints name each expert by its global index (checkpoint.expert_names): a save at one
        # ep size loads at any other, and the ranks holding the same expert hold the same key
        layer.experts._global_indices, layer.experts._global_size = placement.expert_ids, layer.num_experts
        for p in layer.experts.parameters():
            p.allreduce = False                      # Megatron's flag: not a replicated parameter
            p.expert_dp_group = edp                  # reduced over these ranks (None: held once)
            if not hasattr(type(p), "_norm_shard"):  # a DTensor parameter says it itself
                p._norm_shard = ExpertNorm(ep)       # the global gradient norm counts each expert once
    return moe


def _expert_dp_group(ep, dp):
    """The ranks of ``dp`` at this rank's position in their ep group (collective over the world)."""
    from neural_arch.distributed.subgroups import new_subgroups_by_enumeration

    world = _resolve_group(None, "parallelize_moe")
    if dp.size() != world.size():
        raise ValueError("parallelize_moe: with a dp_group smaller than the world, pass expert_dp_group "
                         "(or a device_mesh) too: it cannot be derived on the other ranks")
    layouts = world.backend.allgather_object(list(ep.ranks))
    if any(len(lay) != ep.size() for lay in layouts):
        raise ValueError("parallelize_moe: the expert-parallel groups have different sizes on different ranks")
    groups = sorted({tuple(lay) for lay in layouts})
    by_position = [[g[q] for g in groups] for q in range(ep.size())]
    mine, _ = new_subgroups_by_enumeration(by_position)
    return mine
