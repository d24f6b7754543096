"""Host arrays whose memory can be given back while views of them live on (torch's ``storage.resize_(0)``).

FSDP re-gathers a unit into the very array its forward used, because the autograd graph saved
views of it (see :mod:`.unit`). Between the forward and the re-gather that array holds nothing
anyone reads, yet NumPy cannot free memory that views point at. torch frees the storage under
its views (to its caching allocator) and re-allocates it before backward; here the array lives
in a private anonymous ``mmap`` whose pages :func:`release` hands back to the kernel with
``madvise``: ``MADV_FREE`` where the kernel has it (the kernel takes the pages whenever it needs
memory, without writing them anywhere; until then they stay mapped, as ``free()``-d heap memory
stays in a process, so a re-gather costs no page faults), else ``MADV_DONTNEED`` (taken at
once; every page faults back in when written). The address and the
views stay valid; only their *values* are undefined (old or zeros) until the re-gather, which is
exactly when nobody reads them.

The bytes are reported to :mod:`tracemalloc` (as NumPy reports its own buffers), in a domain of
their own, while they are in use, so :mod:`neural_arch.memory` sees them come and go as it sees
any array freed. A mapping whose array is gone is kept for the next :func:`empty` of the same
size (a few, released: a cache, like torch's allocator's), since fresh pages cost faults.

Without ``mmap.madvise`` (non-POSIX hosts) arrays are plain ``np.empty`` and :func:`release`
does nothing (returns False). CuPy arrays are left alone (the caller decides).

Example::

    >>> import numpy as np
    >>> a = empty(1 << 20, np.float32)
    >>> a[:] = 1.0
    >>> release(a)               # the 4 MiB are given back; a (and its views) stay valid
    True
    >>> restore(a); a[:] = 2.0   # in use again: the writes define the values
"""

from __future__ import annotations

import ctypes
import mmap
import weakref

import numpy as np

__all__ = ["empty", "is_releasable", "is_resident", "release", "release_range", "resident_nbytes", "restore"]

# Our own tracemalloc domain (NumPy uses 389047): an address our finalizer untracks can then
# never be one NumPy has meanwhile allocated and tracked.
_DOMAIN = 0x4E41F5D9
MIN_BYTES = 1 << 16   # smaller arrays are plain np.empty: not worth a mapping of their own

try:
    _track = ctypes.pythonapi.PyTraceMalloc_Track
    _track.argtypes = (ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t)
    _track.restype = ctypes.c_int
    _untrack = ctypes.pythonapi.PyTraceMalloc_Untrack
    _untrack.argtypes = (ctypes.c_uint, ctypes.c_size_t)
    _untrack.restype = ctypes.c_int
except AttributeError:  # pragma: no cover - a Python built without tracemalloc
    _track = _untrack = None

_ADVICE = getattr(mmap, "MADV_FREE", getattr(mmap, "MADV_DONTNEED", None))
_SPARE_MAX = 8         # released mappings kept for reuse (see empty)
_CAN_RELEASE = (hasattr(mmap.mmap, "madvise") and _ADVICE is not None and hasattr(mmap, "MAP_PRIVATE")
                and hasattr(mmap, "MAP_ANONYMOUS") and _track is not None)


class _Mapping:
    """The mmap behind one array, and whether its pages are resident (reported to tracemalloc)."""

    __slots__ = ("__weakref__", "addr", "mm", "nbytes", "resident")

    # ``resident``: bytes reported to tracemalloc (0 after release, less than nbytes after
    # release_range); re-reporting one address replaces its size in tracemalloc

    def __init__(self, nbytes: int):
        # private: madvise then really frees the pages (a shared mapping keeps them in shmem)
        self.mm = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.nbytes = nbytes
        self.addr = 0
        self.resident = 0

    def track(self, nbytes: int) -> None:
        if nbytes != self.resident:
            if nbytes:
                _track(_DOMAIN, self.addr, nbytes)
            else:
                _untrack(_DOMAIN, self.addr)
            self.resident = nbytes

    def untrack(self) -> None:
        self.track(0)


_mappings: dict = {}   # id(base array) -> _Mapping (weakly tied to the array's life)
_spare: dict = {}      # nbytes -> released _Mappings whose arrays are gone


def empty(numel: int, dtype) -> np.ndarray:
    """An uninitialised 1-D host array of ``numel`` elements whose memory :func:`release` can return.

    Example:
        >>> import numpy as np
        >>> a = empty(1 << 20, np.float32)
        >>> a.shape, a.dtype
        ((1048576,), dtype('float32'))
    """
    dtype = np.dtype(dtype)
    nbytes = int(numel) * dtype.itemsize
    if not _CAN_RELEASE or nbytes < MIN_BYTES:
        return np.empty(numel, dtype=dtype)
    spare = _spare.get(nbytes)
    m = spare.pop() if spare else _Mapping(nbytes)
    arr = np.frombuffer(m.mm, dtype=dtype, count=int(numel))
    m.addr = arr.ctypes.data
    m.track(nbytes)   # fresh anonymous pages fault in as they are written: count them as allocated
    key = id(arr)
    _mappings[key] = m
    # when the array and every view of it are gone: stop reporting it, keep it for reuse
    weakref.finalize(arr, _forget, key)
    return arr


def _forget(key: int) -> None:
    m = _mappings.pop(key, None)
    if m is None:
        return
    if m.resident:
        m.mm.madvise(_ADVICE)
        m.untrack()
    if sum(map(len, _spare.values())) < _SPARE_MAX:
        _spare.setdefault(m.nbytes, []).append(m)


def _mapping(arr):
    return _mappings.get(id(arr)) if type(arr) is np.ndarray else None


def is_releasable(arr) -> bool:
    """Whether ``arr`` came from :func:`empty` with a mapping of its own.

    Example:
        >>> import numpy as np
        >>> is_releasable(np.zeros(4))
        False
    """
    return _mapping(arr) is not None


def is_resident(arr) -> bool:
    """False only for an array from :func:`empty` whose memory :func:`release` gave back.

    Example:
        >>> import numpy as np
        >>> a = empty(1 << 20, np.float32)
        >>> release(a), is_resident(a)
        (True, False)
        >>> restore(a); is_resident(a)
        True
    """
    m = _mapping(arr)
    return True if m is None else m.resident == m.nbytes


def resident_nbytes(arr) -> int:
    """Bytes of ``arr`` counted as allocated now (``arr.nbytes`` for an ordinary array).

    Example:
        >>> import numpy as np
        >>> a = empty(1 << 20, np.float32)
        >>> resident_nbytes(a) == a.nbytes
        True
        >>> release(a); resident_nbytes(a)
        True
        0
    """
    m = _mapping(arr)
    return int(arr.nbytes) if m is None else m.resident


def release(arr) -> bool:
    """Give ``arr``'s memory back; its values become undefined. False if it cannot.

    Example:
        >>> import numpy as np
        >>> release(np.zeros(4))      # an ordinary array: nothing to give back
        False
    """
    m = _mapping(arr)
    if m is None:
        return False
    if m.resident:
        m.mm.madvise(_ADVICE)
        m.untrack()
    return True


def release_range(arr, start: int, stop: int) -> int:
    """Give back the whole pages inside elements ``[start, stop)`` of ``arr`` (from :func:`empty`);
    their values are undefined until rewritten. Returns the bytes given back (0 if it cannot).

    Example:
        >>> import mmap
        >>> import numpy as np
        >>> a = empty(1 << 20, np.float32)
        >>> release_range(a, 0, a.size) == a.nbytes // mmap.PAGESIZE * mmap.PAGESIZE
        True
    """
    m = _mapping(arr)
    if m is None or not m.resident:
        return 0
    page = mmap.PAGESIZE
    lo = -(-start * arr.itemsize // page) * page           # first whole page inside the range
    hi = min(stop * arr.itemsize, m.nbytes) // page * page  # end of the last whole page inside
    if hi <= lo:
        return 0
    m.mm.madvise(_ADVICE, lo, hi - lo)
    m.track(max(0, m.resident - (hi - lo)))
    return hi - lo


def restore(arr) -> None:
    """Count ``arr``'s memory as allocated again, before writing into all of it (the writes fault it in).

    Example:
        >>> import numpy as np
        >>> a = empty(1 << 20, np.float32)
        >>> release(a)
        True
        >>> restore(a); a[:] = 0.0   # allocated again, then rewritten before anyone reads it
    """
    m = _mapping(arr)
    if m is not None:
        m.track(m.nbytes)
