"""Keep a training step's temporaries in the heap: glibc's malloc thresholds, set once at import.

A training step allocates and frees the same activation-sized arrays every step. glibc gives a block
above its mmap threshold (128 KiB at first, raised dynamically up to 32 MiB) a mapping of its own and
returns the top of the heap to the operating system above its trim threshold, so every step the kernel
maps, page-faults and zeroes those arrays again: on the GPT step of ``benchmarks/bench_core.py`` that is
thousands of minor page faults a step and a large share of the gap to PyTorch at one thread (whose
allocator caches its blocks). Raising both thresholds once keeps freed arrays in the heap for the next
step (numbers in docs/benchmarks.md, "The core on a GPT step").

The cost: up to ``trim_threshold`` bytes of freed heap stay with the process instead of going back to the
operating system (arrays larger than ``mmap_threshold`` still get their own mappings). Importing
``neural_arch`` calls :func:`tune_malloc` on glibc Linux unless ``NEURAL_ARCH_MALLOC_TUNE=0``; glibc's
own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables, where set, rule
their threshold.

Example::

    >>> from neural_arch import allocator
    >>> allocator.tune_malloc() in (True, False)      # False where the C library is not glibc
    True
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["TUNED", "tune_malloc"]

#: glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20

#: whether this process's malloc thresholds were set by :func:`tune_malloc`
TUNED = False


def tune_malloc(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Raise glibc's mmap and trim thresholds (``mallopt``); True when both were set.

    Does nothing (False) where the C library is not glibc, and leaves a threshold alone when glibc's
    own environment variable for it is set.

    Example::

        >>> from neural_arch.allocator import tune_malloc
        >>> isinstance(tune_malloc(), bool)
        True
    """
    global TUNED
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = True
    for env, param, value in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, mmap_threshold),
                              ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, trim_threshold)):
        if env not in os.environ:
            ok = mallopt(param, int(value)) == 1 and ok
    TUNED = TUNED or ok
    return ok
