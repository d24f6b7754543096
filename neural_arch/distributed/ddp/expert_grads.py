"""DDP's treatment of expert parameters (mixture-of-experts under expert parallelism).

A parameter marked ``param.allreduce = False`` (Megatron's flag; set by
:func:`neural_arch.distributed.expert_parallel.parallelize_moe`) is not the same on every rank of
DDP's group: it belongs to an expert that only some ranks hold. DDP leaves such parameters out of
its verification, broadcast and buckets and hands them to :class:`ExpertGradReducer`, which

* broadcasts them at construction over ``param.expert_dp_group`` (the ranks holding the same
  expert; ``None`` when each expert lives on one rank only), from that group's first rank;
* at the end of each synchronised backward sums their gradients over ``expert_dp_group`` (one
  flat all-reduce per group and dtype) and divides by DDP's group size.

Why that scale: the replicated parameters get ``(1/W) sum_r grad_r`` (W = DDP's group size). An
expert's gradient on one rank already sums the contributions of every rank of its expert-parallel
group (the all-to-all's backward brings them home), so summing over the replicas of the expert and
dividing by W gives the same ``(1/W) sum_r`` over all ranks: training equals one process on the
global batch. It requires the expert-parallel and expert-data-parallel groups to lie inside DDP's.

``ZeroRedundancyOptimizer`` uses the same reducer, with the same scale (``world_size``: the size
of its data-parallel group): it keeps expert parameters out of its partition (torch's
``ignored_states``), has them reduced here at the end of backward
(:meth:`ExpertGradReducer.reduce_after_backward`) and steps them whole on every rank that holds
them (ZeRO-1/2 then shard the experts' optimizer state over their expert-data-parallel group).
``FullyShardedDataParallel`` shards each expert over its expert-data-parallel group instead, as
DeepSpeed-MoE does (:mod:`neural_arch.distributed.fsdp.expert_units`: a flat unit per expert,
its gradient reduce-scattered over that group with the same scale); an expert held by one rank
(``ep = world``) stays whole there, with nothing to shard.

Example::

    reducer = ExpertGradReducer(expert_params, world_size=4)
    reducer.broadcast()                      # at construction
    reducer.reduce()                         # end of a synchronised backward
    handles = reducer.reduce_after_backward(model.parameters())   # or: reduce() queued by hooks
"""

from __future__ import annotations

from neural_arch import backend as _xpmod
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.ddp.replicas import broadcast_arrays

__all__ = ["ExpertGradReducer", "is_expert_parameter", "split_expert_parameters"]


def split_expert_parameters(params) -> tuple[list, list]:
    """``(replicated, experts)``: ``params`` split by :func:`is_expert_parameter`, order kept.

    What the sharding wrappers (ZeRO, FSDP) do first: they shard the replicated parameters over
    the data-parallel group as usual and hand the experts to an :class:`ExpertGradReducer`.

    Example:
        >>> from neural_arch import nn
        >>> layer = nn.Linear(2, 2); layer.weight.allreduce = False
        >>> replicated, experts = split_expert_parameters(layer.parameters())
        >>> [tuple(p.shape) for p in replicated], [tuple(p.shape) for p in experts]
        ([(2,)], [(2, 2)])
    """
    replicated, experts = [], []
    for p in params:
        (experts if is_expert_parameter(p) else replicated).append(p)
    return replicated, experts


def is_expert_parameter(p) -> bool:
    """True for a parameter DDP must not average over its whole group (``p.allreduce is False``).

    Example:
        >>> from neural_arch import nn
        >>> layer = nn.Linear(2, 2)
        >>> is_expert_parameter(layer.weight)
        False
        >>> layer.weight.allreduce = False        # what parallelize_moe marks on expert weights
        >>> is_expert_parameter(layer.weight)
        True
    """
    return getattr(p, "allreduce", True) is False


class ExpertGradReducer:
    """Broadcasts and reduces the expert parameters of one DDP instance (see the module docstring).

    Example::

        experts = [p for p in model.parameters() if is_expert_parameter(p)]
        reducer = ExpertGradReducer(experts, world_size=dist.get_world_size())
    """

    def __init__(self, params: list, world_size: int):
        self.params = list(params)
        self.scale = 1.0 / world_size
        groups: dict[int, tuple] = {}
        for p in self.params:
            g = getattr(p, "expert_dp_group", None)
            groups.setdefault(id(g), (g, []))[1].append(p)
        self.groups = list(groups.values())       # [(group or None, params)], first-seen order
        self.pending = False      # a reduction is queued for the end of this backward
        self.unsynced = False     # gradients accumulated under no_sync() wait for the next sync

    def broadcast(self) -> None:
        """Make each expert identical on the ranks that hold it (from the group's first rank)."""
        for group, params in self.groups:
            if group is not None and group.size() > 1:
                broadcast_arrays([p.data for p in params], group.backend, root=0)

    def reduce_after_backward(self, watched) -> list:
        """Queue :meth:`reduce` once per backward, at the end of the outermost one, from a
        post-accumulate-grad hook on each of ``watched``. Returns the hook handles (``h.remove()``
        detaches). For wrappers that always synchronise (ZeRO-2, FSDP).

        Pass the wrapper's replicated parameters, and register after the wrapper's own reducer:
        their gradients reach every rank (a rank whose experts got no rows still joins the
        collective), and the wrapper's end-of-backward callback is then always queued before this
        one, so every rank runs the two groups' collectives in the same order (queued by an
        expert's hook, the order could differ between ranks and deadlock).

        Example::

            sharded = ShardedGradReducer(buckets, group, on_shard)      # its hooks first
            handles = reducer.reduce_after_backward(replicated_params)
        """
        from neural_arch.distributed.bucketing import reduce_once_after_backward

        return reduce_once_after_backward(self, watched) if self.params else []

    def reduce(self) -> None:
        """Sum over each expert-data-parallel group, divide by DDP's group size (in place on ``.grad``)."""
        self.pending = self.unsynced = False
        for group, params in self.groups:
            by_dtype: dict = {}
            for p in params:
                if p.grad is None:     # an expert that got no gradient anywhere still joins the sum
                    xp = _xpmod.get_array_module(p.data)
                    p.grad = _zeros_grad(p, xp)
                by_dtype.setdefault(str(p.grad.data.dtype), []).append(p)
            for same in by_dtype.values():
                xp = _xpmod.get_array_module(same[0].grad.data)
                flat = xp.concatenate([p.grad.data.reshape(-1) for p in same])
                if group is not None and group.size() > 1:
                    group.backend.allreduce(flat, ReduceOp.SUM)
                flat *= flat.dtype.type(self.scale)
                offset = 0
                for p in same:
                    g = p.grad.data
                    g[...] = flat[offset:offset + g.size].reshape(g.shape)
                    offset += g.size


def _zeros_grad(p, xp):
    from neural_arch.core.tensor import Tensor

    return Tensor(xp.zeros_like(p.data))
