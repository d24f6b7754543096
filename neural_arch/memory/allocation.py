"""Memory statistics for arrays: current and peak bytes (torch's ``torch.cuda.memory_*`` names).

On NumPy the numbers come from :mod:`tracemalloc`, which NumPy reports its array buffers to:
tracing starts on the first call here (or :func:`start`), and everything allocated from Python
while tracing is counted (array buffers dominate in training; small Python objects are counted
too). Tracing slows every Python allocation, in all of the program (2-3x for allocation-heavy
code: the test suite measured a 2.7x slowdown of unrelated tests after one call), until :func:`stop`:
call it when done measuring. FSDP's gather buffers
(memory-mapped so that their memory can be given back under live views) report themselves to
``tracemalloc`` while resident (:mod:`neural_arch.distributed.fsdp.storage`). On the GPU (``device``
``"cuda"``) the numbers are CuPy's default memory pool: bytes in use, and the peak of that
seen by calls to these functions and by :func:`reset_peak_memory_stats`.

Example::

    >>> import numpy as np
    >>> from neural_arch import memory
    >>> memory.reset_peak_memory_stats()
    >>> a = np.ones(1_000_000)
    >>> memory.max_memory_allocated() >= 8_000_000
    True
    >>> del a
"""

from __future__ import annotations

import sys
import tracemalloc

__all__ = ["max_memory_allocated", "memory_allocated", "reset_peak_memory_stats", "start", "stats", "stop"]

_gpu_peak = 0


def _is_gpu(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def start() -> None:
    """Start tracing host allocations (idempotent).

    Example::

        >>> from neural_arch import memory
        >>> memory.start()
        >>> memory.stats()["backend"]
        'tracemalloc'
        >>> memory.stop()
    """
    if not tracemalloc.is_tracing():
        tracemalloc.start()


def stop() -> None:
    """Stop tracing host allocations (the numbers reset).

    Example::

        >>> import tracemalloc
        >>> from neural_arch import memory
        >>> memory.start()
        >>> memory.stop()
        >>> tracemalloc.is_tracing()
        False
    """
    if tracemalloc.is_tracing():
        tracemalloc.stop()


def _gpu_used() -> int:
    global _gpu_peak
    cp = sys.modules.get("cupy")
    if cp is None:
        return 0
    used = int(cp.get_default_memory_pool().used_bytes())
    _gpu_peak = max(_gpu_peak, used)
    return used


def memory_allocated(device=None) -> int:
    """Bytes held now.

    Example::

        >>> import numpy as np
        >>> from neural_arch import memory
        >>> before = memory.memory_allocated()
        >>> a = np.ones(1_000_000)
        >>> memory.memory_allocated() - before >= 8_000_000
        True
        >>> memory.stop()
    """
    if _is_gpu(device):
        return _gpu_used()
    start()
    return tracemalloc.get_traced_memory()[0]


def max_memory_allocated(device=None) -> int:
    """Peak bytes held since the last :func:`reset_peak_memory_stats` (or the start of tracing).

    Example::

        >>> import numpy as np
        >>> from neural_arch import memory
        >>> memory.reset_peak_memory_stats()
        >>> a = np.ones(1_000_000)
        >>> del a
        >>> memory.max_memory_allocated() >= 8_000_000 > memory.memory_allocated()
        True
        >>> memory.stop()
    """
    if _is_gpu(device):
        _gpu_used()
        return _gpu_peak
    start()
    return tracemalloc.get_traced_memory()[1]


def reset_peak_memory_stats(device=None) -> None:
    """Make the peak equal to the current amount.

    Example::

        >>> from neural_arch import memory
        >>> memory.reset_peak_memory_stats()
        >>> memory.max_memory_allocated() - memory.memory_allocated() < 100_000
        True
        >>> memory.stop()
    """
    global _gpu_peak
    if _is_gpu(device):
        _gpu_peak = 0
        _gpu_used()
        return
    start()
    tracemalloc.reset_peak()


def stats(device=None) -> dict:
    """``{"allocated_bytes.all.current": ..., "allocated_bytes.all.peak": ..., "backend": ...}``.

    Example::

        >>> from neural_arch import memory
        >>> sorted(memory.stats())
        ['allocated_bytes.all.current', 'allocated_bytes.all.peak', 'backend']
        >>> memory.stop()
    """
    if _is_gpu(device):
        cur = _gpu_used()
        cp = sys.modules.get("cupy")
        reserved = int(cp.get_default_memory_pool().total_bytes()) if cp is not None else 0
        return {"allocated_bytes.all.current": cur, "allocated_bytes.all.peak": _gpu_peak,
                "reserved_bytes.all.current": reserved, "backend": "cupy-pool"}
    start()
    cur, peak = tracemalloc.get_traced_memory()
    return {"allocated_bytes.all.current": cur, "allocated_bytes.all.peak": peak, "backend": "tracemalloc"}
