"""Memory optimisations under seed 002's names.

Example::

    from neural_arch.optimization import gradient_checkpointing, memory_pool_scope
"""

from neural_arch.optimization import gradient_checkpointing
from neural_arch.optimization.memory_pool import memory_pool_scope

__all__ = ["gradient_checkpointing", "memory_pool_scope"]
