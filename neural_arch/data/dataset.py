"""Datasets: the map-style ``Dataset`` protocol, ``IterableDataset`` and ``TensorDataset``.

A dataset is anything with ``__len__`` and ``__getitem__(i)``. ``TensorDataset`` also answers
``get_batch(index_array)`` with one fancy-indexing call per array, which ``DataLoader`` uses
instead of fetching and stacking items one by one.

Example::

    >>> import numpy as np
    >>> from neural_arch.data import TensorDataset
    >>> ds = TensorDataset(np.arange(10).reshape(5, 2), np.arange(5))
    >>> len(ds), ds[1]
    (5, (array([2, 3]), np.int64(1)))
    >>> [a.shape for a in ds.get_batch(np.array([0, 4]))]
    [(2, 2), (2,)]
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "Subset", "TensorDataset"]


class Dataset:
    """Base class for map-style datasets: implement ``__getitem__(index)`` and ``__len__``.

    Example::

        >>> from neural_arch.data import Dataset
        >>> class Squares(Dataset):
        ...     def __len__(self):
        ...         return 4
        ...     def __getitem__(self, index):
        ...         return index * index
        >>> [Squares()[i] for i in range(len(Squares()))]
        [0, 1, 4, 9]
    """

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")


class IterableDataset:
    """Base class for stream-style datasets: implement ``__iter__`` (torch's ``IterableDataset``).

    With ``num_workers > 0`` every worker iterates its own copy, so shard the stream yourself with
    :func:`~neural_arch.data.worker.get_worker_info` (each worker yields a disjoint part), and
    across ranks with the process group's rank and size, as in torch. The DataLoader batches
    what the stream yields; ``shuffle`` and ``sampler`` do not apply.

    Example::

        >>> from neural_arch.data import DataLoader, IterableDataset
        >>> class Countdown(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(5, 0, -1))
        >>> [b.tolist() for b in DataLoader(Countdown(), batch_size=2)]
        [[5, 4], [3, 2], [1]]
    """

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class TensorDataset(Dataset):
    """Rows of several equally long arrays: item ``i`` is ``tuple(a[i] for a in arrays)``.

    Accepts NumPy arrays, CuPy arrays or Tensors (their raw arrays are used; no copy).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import TensorDataset
        >>> data = TensorDataset(np.arange(6).reshape(3, 2), np.array([7, 8, 9]))
        >>> len(data), data[1][0].tolist(), int(data[1][1])
        (3, [2, 3], 8)
    """

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        raw = [a.data if isinstance(a, Tensor) else a for a in arrays]
        raw = [a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a) for a in raw]
        lengths = [a.shape[0] if a.ndim else None for a in raw]
        if None in lengths or len(set(lengths)) != 1:
            raise ValueError(
                f"TensorDataset: all arrays must have the same (non-zero-dim) first dimension, "
                f"got shapes {[tuple(a.shape) for a in raw]}"
            )
        self.arrays = tuple(raw)

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self) -> int:
        return int(self.arrays[0].shape[0])

    def get_batch(self, indices) -> tuple:
        """All rows at ``indices`` at once (one gather per array): the DataLoader fast path."""
        indices = np.asarray(indices, dtype=np.int64)
        out = []
        for a in self.arrays:
            # CuPy arrays want CuPy index arrays; move the (small) index array, not the data.
            idx = indices if isinstance(a, np.ndarray) else _backend.to_device(indices, _backend.device_of(a))
            out.append(a[idx])
        return tuple(out)


class Subset(Dataset):
    """The items of ``dataset`` at ``indices`` (keeps the fast path when the parent has one).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import Subset, TensorDataset
        >>> part = Subset(TensorDataset(np.arange(10)), [7, 2])
        >>> len(part), int(part[0][0])
        (2, 7)
    """

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)

    def __getitem__(self, index):
        return self.dataset[int(self.indices[index])]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def supports_batch(self) -> bool:
        """True when the parent dataset can gather many rows at once."""
        parent = self.dataset
        return callable(getattr(parent, "get_batch", None)) and getattr(parent, "supports_batch", True)

    def get_batch(self, indices) -> tuple:
        return self.dataset.get_batch(self.indices[np.asarray(indices, dtype=np.int64)])
