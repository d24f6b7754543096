"""``neural_arch.distributed.nn``: torch's ``torch.distributed.nn`` path (differentiable collectives).

Example::

    from neural_arch.distributed.nn.functional import all_gather
"""

from neural_arch.distributed.nn import functional

__all__ = ["functional"]
