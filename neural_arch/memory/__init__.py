"""Memory: what a process holds now and what a training step will hold per rank.

The modules are not named after the functions (``stats``, ``estimate``) that the package exports:
an attribute must not hide a submodule (``tests/architecture/test_names.py``).

=====================  ==========================================================================
module                 what
=====================  ==========================================================================
``allocation``         current and peak bytes (torch's ``torch.cuda.memory_*`` names: :func:`stats`,
                       :func:`max_memory_allocated`...): tracemalloc on NumPy, CuPy's pool on the GPU
``estimator``          :func:`estimate`: bytes per rank by category for DDP, ZeRO-1/2, FSDP,
                       ``fully_shard``, TP and PP, each formula in its docstring
``result``             :class:`MemoryEstimate`, what :func:`estimate` returns
``gpt_activations``    what ``nn.GPT``'s forward keeps alive for the backward
=====================  ==========================================================================

Example::

    >>> from neural_arch import memory, nn
    >>> memory.reset_peak_memory_stats()
    >>> memory.max_memory_allocated() >= memory.memory_allocated()
    True
    >>> memory.stop()
    >>> model = nn.GPT(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16)
    >>> memory.estimate(model, strategy="fsdp", world_size=2, batch=2).peak_phase
    'backward'
"""

from neural_arch.memory.allocation import (
    max_memory_allocated,
    memory_allocated,
    reset_peak_memory_stats,
    start,
    stats,
    stop,
)
from neural_arch.memory.estimator import STRATEGIES, estimate
from neural_arch.memory.result import MemoryEstimate

__all__ = ["STRATEGIES", "MemoryEstimate", "estimate", "max_memory_allocated", "memory_allocated",
           "reset_peak_memory_stats", "start", "stats", "stop"]
