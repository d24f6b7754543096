"""Keeping model replicas identical: broadcast a list of arrays from one rank, flat per dtype.

Used by DDP at construction (parameters and buffers from rank 0), before each forward
(buffers), and by ``join()`` (the parameters of the rank that trained longest).

Example::

    broadcast_arrays([p.data for p in model.parameters()], group.backend, root=0)
"""

from __future__ import annotations

from neural_arch import backend as _xpmod

__all__ = ["broadcast_arrays"]


def broadcast_arrays(arrays: list, backend, root: int) -> None:
    """Broadcast ``arrays`` from ``root`` in place: one flat array and one call per dtype.

    Example::

        params = [p.data for p in model.parameters()]
        broadcast_arrays(params, dist.group.WORLD.backend, root=0)   # every rank now holds rank 0's
    """
    by_dtype: dict = {}
    for a in arrays:
        by_dtype.setdefault(str(a.dtype), []).append(a)
    for group in by_dtype.values():
        xp = _xpmod.get_array_module(group[0])
        flat = xp.concatenate([a.reshape(-1) for a in group])
        backend.broadcast(flat, root)
        offset = 0
        for a in group:
            a[...] = flat[offset:offset + a.size].reshape(a.shape)
            offset += a.size
