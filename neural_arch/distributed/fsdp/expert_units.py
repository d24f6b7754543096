"""FSDP's expert units: a mixture-of-experts model's experts sharded over their expert-data-parallel group.

Under expert parallelism (``parallelize_moe``) an expert lives on the ranks of one
expert-data-parallel (edp) group, not on every rank, so it cannot join the replicated units (sharded
over the data-parallel group). Each expert held by an edp group of more than one rank becomes a
unit of its own (:func:`~neural_arch.distributed.fsdp.plan.plan_expert_units`), sharded over that
group: its flat shard is what the optimizer steps (the expert's parameters *and* its optimizer
state are ``1 / edp`` per rank), all-gathered over the edp group when the expert runs (every rank
runs every expert it holds, also on zero rows, so the gathers line up), freed after its forward
(the graph keeps the arrays it saved for backward, as FSDP's non-pooled units).

Gradients: :class:`ExpertShardReducer`, at the end of backward, reduce-scatters each expert unit's
flat gradient over its edp group (``SUM``) and divides by the data-parallel size: the scale DDP's
:class:`~neural_arch.distributed.ddp.expert_grads.ExpertGradReducer` uses (an expert's gradient
already sums its ep group's tokens: the all-to-all's backward brings them home), so training
equals one process on the global batch. At the end of backward, not as gradients become final:
the ranks then issue these collectives in the same order whatever their tokens were.

Norm: :class:`ExpertFlatShard` (the unit's ``flat_param._flat_shard``) sums a partial norm over the
edp group (this expert's elements) and then over the expert-parallel group (the other experts):
each expert counts once in the global gradient norm.

Example::

    fsdp = FullyShardedDataParallel(moe_model)           # after parallelize_moe(moe_model, device_mesh=mesh)
    [u.name for u in fsdp._expert_units]                  # ['moe.experts.2', 'moe.experts.3'] on some ranks
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.flat_param import FlatShard

__all__ = ["ExpertFlatShard", "ExpertShardReducer"]


class ExpertFlatShard(FlatShard):
    """The ``_flat_shard`` of an expert unit's flat parameter: a
    :class:`~neural_arch.distributed.flat_param.FlatShard` over the expert's edp group whose
    ``group`` (what :func:`neural_arch.optim.clip_grad_norm_` totals a partial norm over) is
    ``(edp group, ep group)``: the expert's elements, then the other experts.

    Example::

        fs = fsdp._expert_units[0].flat_param._flat_shard
        fs.group          # (expert-data-parallel group, expert-parallel group)
    """

    __slots__ = ()

    def __init__(self, params: list, layout, rank: int, edp_group, ep_group) -> None:
        super().__init__(params, layout, rank, edp_group)
        groups = tuple(g for g in (edp_group, ep_group) if g is not None and g.size() > 1)
        self.group = groups or None

    def all_reduce_norm(self, value, op: str):
        """``value`` summed (``op="sum"``) or maxed (``"max"``) over each group in turn: a collective."""
        scalar = isinstance(value, (int, float))
        buf = np.array([value], dtype=np.float64) if scalar else value
        for g in self.group or ():
            g.backend.allreduce(buf, ReduceOp.SUM if op == "sum" else ReduceOp.MAX)
        return float(buf[0]) if scalar else buf


class ExpertShardReducer:
    """Reduce the expert units' gradients at the end of each backward (see the module docstring).

    Args:
        units: the expert :class:`~neural_arch.distributed.fsdp.unit.FlatParamUnit` s (their ``group``:
            the edp group); every rank of a group holds the same units in the same order.
        world_size: the data-parallel size (FSDP's shard group times its replicate group).

    Example::

        reducer = ExpertShardReducer(fsdp._expert_units, world_size=4)
        handles = reducer.reduce_after_backward(replicated_params)   # reduce() queued once per backward
    """

    def __init__(self, units: list, world_size: int):
        self.units = list(units)
        self.scale = 1.0 / world_size
        self.pending = False

    def reduce_after_backward(self, watched) -> list:
        """Queue :meth:`reduce` at the end of the outermost backward, from a post-accumulate-grad
        hook on each of ``watched`` (register after FSDP's own reducer: its callback runs first on
        every rank, so the groups' collectives come in the same order everywhere). Returns the handles."""
        from neural_arch.distributed.bucketing import reduce_once_after_backward

        return reduce_once_after_backward(self, watched) if self.units else []

    def reduce(self) -> None:
        """Each unit's flat gradient reduce-scattered (summed) over its edp group, divided by the
        data-parallel size, added to the unit's ``flat_param.grad``; the parameters' ``.grad`` dropped."""
        self.pending = False
        for unit in self.units:
            # an expert that got no gradient (None: zeros) still joins the sum
            grads = [p.grad.data if p.grad is not None else None for p in unit.params]
            xp = _backend.get_array_module(next((g for g in grads if g is not None), unit.flat_param.data))
            flat = unit.layout.flatten(grads, xp, dtype=unit.master_dtype)
            shard = xp.empty(unit.layout.shard_size, dtype=flat.dtype)
            unit.group.backend.reduce_scatter(shard, flat, ReduceOp.SUM)
            shard *= shard.dtype.type(self.scale)
            unit.add_grad(shard, owned=True)
            for p in unit.params:
                p.grad = None
