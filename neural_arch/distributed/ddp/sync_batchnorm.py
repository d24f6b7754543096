"""``SyncBatchNorm``: batch normalisation whose statistics cover the whole process group (torch's).

Under DDP each rank normalises with the mean and variance of the **global** batch, so training on
N ranks with per-rank batches b_0..b_{N-1} (uneven sizes allowed) equals BatchNorm on the
concatenated batch of sum(b_r) rows. What travels, per forward and per backward, is one small
all-reduce of a (2C+1)-vector:

* forward: per-channel ``sum(x)``, ``sum(x*x)`` and the row count -> global mean and (biased)
  variance; the running variance takes the unbiased variance with the *global* count (torch);
* backward: per-channel ``sum(dy)`` and ``sum(dy * xhat)`` -> the input gradient of the global
  batch. The weight/bias gradients stay local (as in torch): DDP reduces them like any other.

In ``eval()`` mode (with running statistics) nothing is communicated. Without an initialised
process group (or in a world of one) it is plain BatchNorm. Example::

    model = SyncBatchNorm.convert_sync_batchnorm(model)        # every BatchNorm*d -> SyncBatchNorm
    ddp = DistributedDataParallel(model)

Input layout: ``(N, C, *)`` with the channel in dim 1 (BatchNorm1d/2d/3d alike). The layout of
parameters and buffers is torch's: ``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked``, and the attributes ``num_features``, ``eps``, ``momentum``, ``affine``,
``track_running_stats``, ``process_group``.
"""

from __future__ import annotations

from neural_arch.backend import get_array_module
from neural_arch.core.autograd import Node, is_grad_enabled
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


def _sync_batch_norm(x: Tensor, weight, bias, eps: float, process_group, reduce: bool):
    """The differentiable op: returns (y, global mean, global biased var, global count)."""
    data = x.data
    xp = get_array_module(data)
    channels = data.shape[1]
    axes = (0,) + tuple(range(2, data.ndim))
    shape = (1, channels) + (1,) * (data.ndim - 2)
    stats = xp.concatenate([data.sum(axis=axes), (data * data).sum(axis=axes),
                            xp.asarray([data.size // max(channels, 1)], dtype=data.dtype)])
    if reduce:
        _all_reduce(stats, process_group)
    count = float(stats[-1])
    if count == 0:
        raise ValueError("SyncBatchNorm: the whole batch (over every rank) is empty; feed at least one row")
    mean = stats[:channels] / count
    var = xp.maximum(stats[channels:2 * channels] / count - mean * mean, 0)
    invstd = 1.0 / xp.sqrt(var + eps)
    xhat = (data - mean.reshape(shape)) * invstd.reshape(shape)
    w = weight.data.reshape(shape) if weight is not None else None
    out = xhat * w + bias.data.reshape(shape) if weight is not None else xhat

    parents = (x if x.requires_grad else None,
               weight if weight is not None and weight.requires_grad else None,
               bias if bias is not None and bias.requires_grad else None)
    if not (is_grad_enabled() and any(p is not None for p in parents)):
        return Tensor(out), mean, var, count

    def backward(g):
        # Local sums first (they also give the weight/bias gradients, which stay local) ...
        sum_dy = g.sum(axis=axes)
        sum_dy_xhat = (g * xhat).sum(axis=axes)
        grad_w = sum_dy_xhat if parents[1] is not None else None
        grad_b = sum_dy if parents[2] is not None else None
        grad_x = None
        if parents[0] is not None:
            # ... then the global ones, for the input gradient of the concatenated batch.
            both = xp.concatenate([sum_dy, sum_dy_xhat])
            if reduce:
                _all_reduce(both, process_group)
            mean_dy = (both[:channels] / count).reshape(shape)
            mean_dy_xhat = (both[channels:] / count).reshape(shape)
            scale = invstd.reshape(shape) * (w if w is not None else 1.0)
            grad_x = scale * (g - mean_dy - xhat * mean_dy_xhat)
        return grad_x, grad_w, grad_b

    y = Tensor(out)
    y.grad_fn = Node(backward, parents, "SyncBatchNorm")
    y.requires_grad = True
    return y, mean, var, count


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
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return self._eval_forward(x)
        reduce = _group_size(self.process_group) > 1
        y, mean, var, count = _sync_batch_norm(x, self.weight, self.bias, self.eps, self.process_group, reduce)
        if self.training and self.track_running_stats:
            self._update_running(mean, var, count)
        return y

    def _update_running(self, mean, var, count: float) -> None:
        # In place, as torch: DDP's buffer broadcast and state_dict() keep seeing the same arrays.
        factor = self._update_factor()  # counts the batch; momentum or 1/num_batches_tracked
        unbiased = var * (count / (count - 1)) if count > 1 else var
        rm, rv = self.running_mean.data, self.running_var.data
        rm *= 1 - factor
        rm += factor * mean
        rv *= 1 - factor
        rv += factor * unbiased

    def _eval_forward(self, x: Tensor) -> Tensor:
        # Differentiable through the Tensor ops; the running statistics are constants here.
        shape = (1, self.num_features) + (1,) * (x.data.ndim - 2)
        xp = get_array_module(x.data)
        mean = Tensor(self.running_mean.data.reshape(shape))
        invstd = Tensor((1.0 / xp.sqrt(self.running_var.data + self.eps)).reshape(shape))
        y = (x - mean) * invstd
        if self.affine:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y

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
