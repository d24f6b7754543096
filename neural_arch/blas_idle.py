"""Let OpenBLAS's idle worker threads sleep right after a GEMM instead of spinning, set once at import.

NumPy's OpenBLAS keeps its worker threads busy-waiting after every threaded call, for about 2**28 CPU
cycles (a tenth of a second) by default, in case another call follows at once. On a machine with few
cores that spin holds a core the rest of the step needs: the elementwise thread pool
(:mod:`neural_arch.core.thread_pool`) runs GELU, attention and AdamW between the GEMMs, and the ranks of
a job share the cores; with the spin the pool's second thread waited for a core held by a thread doing
nothing (docs/benchmarks.md, "The core on a GPT step"). OpenBLAS reads its spin length from
``OPENBLAS_THREAD_TIMEOUT`` (as a power of two, at least 4) when it starts its threads.

Importing ``neural_arch`` calls :func:`sleep_idle_blas_threads` unless ``NEURAL_ARCH_BLAS_IDLE_SLEEP=0``
or ``OPENBLAS_THREAD_TIMEOUT`` is already set (the user's value rules): it sets the variable (child
processes inherit it) and, when NumPy has loaded OpenBLAS already, has OpenBLAS re-read its environment
and stop its threads (``blas_thread_shutdown_``, what OpenBLAS does itself around ``fork``); the next
threaded call starts them again with the short spin. The cost: a GEMM right after another wakes its
workers from a futex instead of finding them spinning.

Example::

    >>> from neural_arch import blas_idle
    >>> blas_idle.sleep_idle_blas_threads() in (True, False)   # False: no OpenBLAS, or the user's setting
    True
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

__all__ = ["TIMEOUT_EXPONENT", "openblas_library", "sleep_idle_blas_threads"]

#: the spin's exponent, 2**4 cycles before sleeping (the smallest OpenBLAS accepts; it clamps the variable to 4..30)
TIMEOUT_EXPONENT = 4
_VAR = "OPENBLAS_THREAD_TIMEOUT"


def openblas_library():
    """NumPy's bundled OpenBLAS as a ``ctypes.CDLL`` (the handle of the already loaded library), or None.

    Only the OpenBLAS that pip's NumPy wheels ship in ``numpy.libs`` is looked for: a NumPy built
    against another BLAS (MKL, Accelerate) has no such spin to shorten.

    >>> lib = openblas_library()
    >>> lib is None or hasattr(lib, "openblas_thread_timeout")
    True
    """
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    folder = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "lib*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if all(hasattr(lib, name) for name in ("openblas_read_env", "blas_thread_shutdown_", "openblas_thread_timeout")):
            lib.openblas_thread_timeout.restype = ctypes.c_int
            return lib
    return None


def sleep_idle_blas_threads(exponent: int = TIMEOUT_EXPONENT) -> bool:
    """Make OpenBLAS's idle threads spin ``2**exponent`` cycles before sleeping; True when it took effect.

    Before NumPy is imported it only sets ``OPENBLAS_THREAD_TIMEOUT`` (OpenBLAS reads it when it loads);
    afterwards it also makes the loaded OpenBLAS re-read it and restart its threads. Does nothing
    (False) when the variable is already set or no bundled OpenBLAS is found.

    Example::

        >>> from neural_arch.blas_idle import sleep_idle_blas_threads
        >>> isinstance(sleep_idle_blas_threads(), bool)
        True
    """
    if os.environ.get(_VAR) not in (None, "", str(exponent)):
        return False                       # the user's setting rules
    os.environ[_VAR] = str(exponent)
    if "numpy" not in sys.modules:
        return True                        # OpenBLAS will read it when NumPy loads it
    lib = openblas_library()
    if lib is None:
        return False
    if lib.openblas_thread_timeout() != exponent:
        lib.openblas_read_env()
        lib.blas_thread_shutdown_()        # the next threaded call starts the threads with the new spin
    return lib.openblas_thread_timeout() == exponent
