"""``DistributedDataParallel`` across fault-tolerant replicas (torchft's ``DistributedDataParallel``).

Each parameter's gradient is averaged across the current quorum through the
:class:`~neural_arch.distributed.ft.manager.Manager` as soon as backward has finished it (a
post-accumulate-grad hook), so a failure mid-backward only voids the step. One backward per
step: a second backward before the optimizer step would all-reduce accumulated gradients again.
Parameters are not broadcast at construction: a replica that joins late heals in its first
``start_quorum`` instead.
"""

from __future__ import annotations

from neural_arch.nn.module import Module

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(Module):
    """Wrap ``module``; gradients are averaged across the quorum during backward.

    Example::

        model = DistributedDataParallel(manager, nn.Linear(4, 2))
        manager.start_quorum()
        loss_fn(model(x)).backward()      # every .grad is now the quorum's average
    """

    def __init__(self, manager, module: Module):
        super().__init__()
        self.module = module
        object.__setattr__(self, "manager", manager)
        self._handles = [p.register_post_accumulate_grad_hook(self._reduce) for p in module.parameters()
                         if p.requires_grad]

    def _reduce(self, param) -> None:
        if param.grad is not None:
            self.manager.allreduce(param.grad.data)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
