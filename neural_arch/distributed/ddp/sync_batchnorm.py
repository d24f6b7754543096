"""``SyncBatchNorm``: batch normalisation whose statistics cover the whole process group (torch's).

Under DDP each rank normalises with the mean and variance of the **global** batch, so training on
N ranks with per-rank batches b_0..b_{N-1} (uneven sizes allowed, an empty one included) equals
BatchNorm on the concatenated batch of sum(b_r) rows. It is built from the seam of
:mod:`neural_arch.core.ops_norm`, as torch builds its own:

* forward: each rank's per-channel ``(count, mean, biased var)`` (two passes, so no
  ``E[x^2] - E[x]^2`` cancellation: data far from zero keeps its digits) is all-gathered, one
  ``(2C+1)``-vector per rank in float64, and merged exactly (Chan's formula); the running variance
  takes the unbiased variance with the *global* count (torch);
* backward: per-channel ``sum(dy)`` and ``sum(dy * xhat)`` are all-reduced -> the input gradient of
  the global batch. The weight/bias gradients stay local (as in torch): DDP reduces them like any
  other.

In ``eval()`` mode nothing is communicated (torch): running statistics when tracked, else this
rank's own batch statistics. Without an initialised process group (or in a world of one) it is
plain BatchNorm, with its error for a training batch of one value per channel. Example::

    model = SyncBatchNorm.convert_sync_batchnorm(model)        # every BatchNorm*d -> SyncBatchNorm
    ddp = DistributedDataParallel(model)

Input layout: ``(N, C, *)`` with the channel in dim 1 (BatchNorm1d/2d/3d alike). The layout of
parameters and buffers is torch's: ``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked``, and the attributes ``num_features``, ``eps``, ``momentum``, ``affine``,
``track_running_stats``, ``process_group``.
"""

from __future__ import annotations

import numpy as np

from neural_arch.backend import get_array_module
from neural_arch.core.ops_norm import (
    batch_norm,
    batch_norm_elemt,
    batch_norm_gather_stats,
    batch_norm_stats,
    update_running_stats,
)
from neural_arch.core.tensor import Tensor
from neural_arch.nn.batchnorm import _BatchNorm
from neural_arch.nn.module import Module

__all__ = ["SyncBatchNorm"]


def _group_size(process_group) -> int:
    """World size of the group the statistics are reduced over (1: nothing to reduce)."""
    from neural_arch.distributed.groups import backend_or_world_of_one

    return backend_or_world_of_one(process_group, "SyncBatchNorm").size


def _all_reduce(array, process_group) -> None:
    from neural_arch.distributed.collectives import all_reduce

    all_reduce(array, group=process_group)


def _global_stats(data, process_group) -> tuple:
    """``(count, mean, var)`` per channel of the union of every rank's batch (biased variance)."""
    from neural_arch.distributed.collectives import all_gather

    xp = get_array_module(data)
    channels = data.shape[1]
    if data.size:
        count, mean, var = batch_norm_stats(data)
    else:  # an empty local batch adds nothing (its mean would be NaN)
        count, mean, var = 0, xp.zeros(channels), xp.zeros(channels)
    # float64 on the wire: the counts stay exact and the merge loses nothing for float32 data
    mine = xp.concatenate([xp.asarray([count], dtype=np.float64), mean.astype(np.float64),
                           var.astype(np.float64)])
    table = xp.stack(all_gather(mine, group=process_group))
    total, mean, var = batch_norm_gather_stats(table[:, 0], table[:, 1:1 + channels], table[:, 1 + channels:])
    return total, mean, var


def _sync_batch_norm(module, x: Tensor) -> Tensor:
    """The training forward over the group: global statistics, running-statistics update, and a
    normalisation whose backward all-reduces the two per-channel gradient sums."""
    pg = module.process_group
    count, mean, var = _global_stats(x.data, pg)
    if count <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got {count} over the whole group "
            f"(this rank's input has shape {list(x.shape)})"
        )
    if module.track_running_stats:
        factor = module._update_factor()  # counts the batch; momentum or 1/num_batches_tracked
        update_running_stats(module.running_mean, module.running_var, mean, var, count, factor)

    def reduce_grad(sum_dy, sum_dy_xhat):
        both = get_array_module(sum_dy).concatenate([sum_dy, sum_dy_xhat])
        _all_reduce(both, pg)
        return both[:len(sum_dy)], both[len(sum_dy):]

    return batch_norm_elemt(x, mean, var, module.weight, module.bias, module.eps,
                            count=count, reduce_grad=reduce_grad)


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over ``(N, C, *)`` inputs with statistics of the whole process group (torch's API).

    Args match ``torch.nn.SyncBatchNorm``: ``num_features``, ``eps=1e-5``, ``momentum=0.1``
    (None: cumulative average), ``affine=True``, ``track_running_stats=True``,
    ``process_group=None`` (the world), ``device``, ``dtype``. Parameters and buffers are
    :class:`neural_arch.nn.BatchNorm2d`'s (this class shares its base).

    Example::

        bn = SyncBatchNorm(16)                                  # statistics over every rank's batch
        model = SyncBatchNorm.convert_sync_batchnorm(model)     # or convert a model's BatchNorms
        ddp = DistributedDataParallel(model)
    """

    _expected_dims = (2, 3, 4, 5)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        if x.data.ndim not in self._expected_dims or x.data.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm expects input (N, {self.num_features}, *), got shape "
                             f"{tuple(x.data.shape)}")
        if self.training and _group_size(self.process_group) > 1:
            return _sync_batch_norm(self, x)
        # A world of one, or eval (torch never communicates in eval): plain BatchNorm.
        factor = self._update_factor()
        use_batch = self.training or not self.track_running_stats
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_batch,
                          factor, self.eps)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group=None) -> Module:
        """Replace every BatchNorm1d/2d/3d in ``module`` by a SyncBatchNorm sharing its parameters.

        Returns the converted module (``module`` itself, changed in place, unless it *is* a
        BatchNorm). Parameters are the same objects, buffers are copied over, train/eval mode is
        kept (torch semantics). Example::

            net = SyncBatchNorm.convert_sync_batchnorm(net, process_group=new_group([0, 1]))
        """
        out = module
        if _is_batchnorm(module):
            dtype = module.weight.data.dtype if module.affine else None
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group, dtype=dtype)
            if module.affine:
                out.weight, out.bias = module.weight, module.bias  # the same Parameters: optimizers keep them
            if module.track_running_stats:
                out.running_mean = module.running_mean
                out.running_var = module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in list(module.named_children()):
            converted = cls.convert_sync_batchnorm(child, process_group)
            if converted is not child:
                out._modules[name] = converted  # in place: add_module would move it to the end (order matters)
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


def _is_batchnorm(module) -> bool:
    """A BatchNorm1d/2d/3d (neural_arch.nn's, or any module with torch's BatchNorm layout)."""
    if isinstance(module, SyncBatchNorm):
        return False
    if isinstance(module, _BatchNorm):
        return True
    names = {c.__name__ for c in type(module).__mro__}
    if not names & {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "_BatchNorm", "_NormBase"}:
        return False
    return all(hasattr(module, a) for a in ("num_features", "eps", "momentum", "affine", "track_running_stats"))
