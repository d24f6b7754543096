"""Seed 002's path ``neural_arch.optimization``: a face over the homes of its names.

``gradient_checkpointing`` is :mod:`neural_arch.utils.checkpoint` (torch's ``torch.utils.checkpoint``,
with seed 002's ``checkpoint_scope``), and ``memory_pool_scope`` lives in
:mod:`neural_arch.cuda.memory_pool` (GPU memory: ``torch.cuda``'s package).

Example (seed 002)::

    from neural_arch.optimization import gradient_checkpointing, memory_pool_scope
    with gradient_checkpointing.checkpoint_scope(model):
        with memory_pool_scope():
            loss = criterion(ddp_model(batch), targets)
            loss.backward()
"""

from neural_arch.cuda.memory_pool import memory_pool_scope
from neural_arch.utils import checkpoint as gradient_checkpointing
from neural_arch.utils.checkpoint import checkpoint_scope

__all__ = ["checkpoint_scope", "gradient_checkpointing", "memory_pool_scope"]
