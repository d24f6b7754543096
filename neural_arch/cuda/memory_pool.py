"""``memory_pool_scope``: a private CuPy memory pool for a block of GPU work; a no-op on CPU.

Inside the scope CuPy allocates from a fresh ``cupy.cuda.MemoryPool``, whose blocks are all
returned to the device when the scope ends (so a burst of temporaries does not stay cached in
the default pool). NumPy has no pool to manage: on CPU the scope does nothing.

Example::

    from neural_arch.cuda.memory_pool import memory_pool_scope
    with memory_pool_scope():
        loss = model(x).sum(); loss.backward()
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["memory_pool_scope"]


@contextlib.contextmanager
def memory_pool_scope(enabled: bool = True):
    """Allocate GPU arrays from a private CuPy pool inside the block and free it at the end; yields the pool (``None`` on CPU, without CuPy, or with ``enabled=False``).

    Example::

        >>> from neural_arch.cuda.memory_pool import memory_pool_scope
        >>> with memory_pool_scope() as pool:      # on CPU (or without CuPy) there is no pool to scope
        ...     pool is None
        True
    """
    cp = sys.modules.get("cupy")  # only when someone already uses the GPU
    if not enabled or cp is None:
        yield None
        return
    try:
        pool = cp.cuda.MemoryPool()
        ctx = cp.cuda.using_allocator(pool.malloc)
    except Exception:  # noqa: BLE001  (CuPy installed without a usable GPU: nothing to scope)
        yield None
        return
    with ctx:
        try:
            yield pool
        finally:
            cp.cuda.Device().synchronize()
    pool.free_all_blocks()
