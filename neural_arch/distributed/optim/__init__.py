"""``neural_arch.distributed.optim``: torch's ``torch.distributed.optim`` home.

Example::

    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optim.Adam, lr=1e-3)
"""

from neural_arch.distributed.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
