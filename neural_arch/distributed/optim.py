"""``neural_arch.distributed.optim``: torch's ``torch.distributed.optim`` names.

Example::

    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optim.Adam, lr=1e-3)
"""

from neural_arch.distributed.parallel.sharded.zero import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
