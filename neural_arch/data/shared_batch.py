"""A worker's batch through shared memory: its arrays in one ``/dev/shm`` file, the rest pickled.

:func:`pack` (in the worker) walks the collated batch (Tensors, arrays, tuples, lists, dicts),
copies every large enough NumPy array into one shared-memory file named ``shm_name`` and returns a
small picklable description; :func:`unpack` (in the main process) maps that file, **unlinks it at
once** and rebuilds the batch with arrays that are views onto the mapping. The mapping lives as
long as those arrays (no copy on the main side, nothing to close, nothing left in ``/dev/shm``
once the main process has mapped it). Why a file and not ``multiprocessing.shared_memory``: its
``SharedMemory`` registers every block with a resource tracker and cannot be closed while NumPy
views exist, so a batch that outlives its block would need a copy; a mapped, unlinked file has
exactly the lifetime of its arrays (torch's ``file_descriptor`` strategy does the same).

Small arrays (under :data:`MIN_SHARED_BYTES` in total) and platforms without ``/dev/shm`` are
pickled through the result queue instead: a file costs a few system calls, a tiny pickle less.

Example::

    >>> import numpy as np
    >>> from neural_arch.data.shared_batch import pack, unpack
    >>> batch = (np.arange(100000.0), "label")
    >>> out = unpack(pack(batch, "na-dl-doc-example"))
    >>> bool((out[0] == batch[0]).all()), out[1]
    (True, 'label')
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from neural_arch.core.tensor import Tensor

__all__ = ["MIN_SHARED_BYTES", "SHM_DIR", "discard", "pack", "unpack"]

SHM_DIR = "/dev/shm"
#: batches whose arrays hold fewer bytes than this are pickled (the file's system calls cost more)
MIN_SHARED_BYTES = 1 << 16
_ALIGN = 64


class _ArrayRef:
    """Where one array lies in the shared file."""

    __slots__ = ("dtype", "offset", "shape", "tensor")

    def __init__(self, offset, shape, dtype, tensor):
        self.offset, self.shape, self.dtype, self.tensor = offset, shape, dtype, tensor

    def __getstate__(self):
        return (self.offset, self.shape, self.dtype, self.tensor)

    def __setstate__(self, state):
        self.offset, self.shape, self.dtype, self.tensor = state


class SharedBatch:
    """A packed batch: its structure (arrays replaced by ``_ArrayRef``) and its file's name."""

    def __init__(self, structure, name: str | None, nbytes: int):
        self.structure, self.name, self.nbytes = structure, name, nbytes


def _arrays(obj, out: list) -> None:
    if isinstance(obj, Tensor) and isinstance(obj.data, np.ndarray):
        out.append(obj.data)
    elif isinstance(obj, np.ndarray) and obj.dtype != object:
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _arrays(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _arrays(item, out)


def _replace(obj, view_of):
    if isinstance(obj, Tensor) and isinstance(obj.data, np.ndarray):
        return view_of(obj.data, True)
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        return view_of(obj, False)
    if isinstance(obj, tuple):
        return tuple(_replace(item, view_of) for item in obj)
    if isinstance(obj, list):
        return [_replace(item, view_of) for item in obj]
    if isinstance(obj, dict):
        return {k: _replace(v, view_of) for k, v in obj.items()}
    return obj


def pack(batch, shm_name: str):
    """The batch ready for the result queue: arrays copied into ``/dev/shm/<shm_name>`` when large enough.

    Example::

        >>> import numpy as np
        >>> from neural_arch.data.shared_batch import pack, unpack
        >>> type(pack((np.zeros(4),), "na-dl-doc-small")).__name__      # small: pickled as it is
        'tuple'
        >>> packed = pack((np.zeros(1 << 14),), "na-dl-doc-pack")
        >>> type(packed).__name__, unpack(packed)[0].shape
        ('SharedBatch', (16384,))
    """
    arrays: list = []
    _arrays(batch, arrays)
    total = sum(-(-a.nbytes // _ALIGN) * _ALIGN for a in arrays)
    if total < MIN_SHARED_BYTES or not os.path.isdir(SHM_DIR):
        return batch
    path = os.path.join(SHM_DIR, shm_name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, total)
        with mmap.mmap(fd, total) as buf:
            offset = 0

            def place(array, is_tensor):
                nonlocal offset
                view = np.ndarray(array.shape, array.dtype, buffer=buf, offset=offset)
                view[...] = array
                ref = _ArrayRef(offset, array.shape, array.dtype.str, is_tensor)
                offset += -(-array.nbytes // _ALIGN) * _ALIGN
                del view  # the mapping closes only once no view exports it
                return ref

            structure = _replace(batch, place)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    os.close(fd)
    return SharedBatch(structure, shm_name, total)


def unpack(payload):
    """The batch a worker packed, its arrays viewing the (already unlinked) shared file.

    Example::

        >>> import os
        >>> import numpy as np
        >>> from neural_arch.data.shared_batch import pack, unpack
        >>> x = unpack(pack(np.ones(1 << 14), "na-dl-doc-unpack"))
        >>> float(x.sum()), os.path.exists("/dev/shm/na-dl-doc-unpack")
        (16384.0, False)
    """
    if not isinstance(payload, SharedBatch):
        return payload
    path = os.path.join(SHM_DIR, payload.name)
    fd = os.open(path, os.O_RDWR)
    try:
        buf = mmap.mmap(fd, payload.nbytes)
    finally:
        os.close(fd)
        os.unlink(path)  # the mapping keeps the memory; the name is gone from /dev/shm

    def rebuild(obj):
        if isinstance(obj, _ArrayRef):
            array = np.ndarray(obj.shape, np.dtype(obj.dtype), buffer=buf, offset=obj.offset)
            return Tensor(array) if obj.tensor else array
        if isinstance(obj, tuple):
            return tuple(rebuild(item) for item in obj)
        if isinstance(obj, list):
            return [rebuild(item) for item in obj]
        if isinstance(obj, dict):
            return {k: rebuild(v) for k, v in obj.items()}
        return obj

    return rebuild(payload.structure)


def discard(payload) -> None:
    """Remove the shared file of a batch nobody will read (a stale or abandoned result).

    Example::

        >>> import os
        >>> import numpy as np
        >>> from neural_arch.data.shared_batch import discard, pack
        >>> discard(pack(np.ones(1 << 14), "na-dl-doc-discard"))
        >>> os.path.exists("/dev/shm/na-dl-doc-discard")
        False
    """
    if isinstance(payload, SharedBatch):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, payload.name))
