"""Datasets: the map-style ``Dataset`` protocol, ``IterableDataset``, ``TensorDataset``, ``Subset``,
``ConcatDataset`` and :func:`random_split` (torch's ``torch.utils.data.dataset``).

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

import bisect
import itertools
import math
import operator
import warnings

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.rng import numpy_generator
from neural_arch.core.tensor import Tensor

__all__ = ["ConcatDataset", "Dataset", "IterableDataset", "Subset", "TensorDataset", "as_index",
           "gathers_like_getitem", "random_split"]


def _defining_class(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def gathers_like_getitem(dataset) -> bool:
    """True when ``dataset.get_batch(idx)`` may stand in for ``[dataset[i] for i in idx]``.

    That holds when the class that defines ``get_batch`` is the one that defines ``__getitem__`` or
    a subclass of it. A subclass that overrides only ``__getitem__`` (a transform on a
    ``TensorDataset``, say) would otherwise have its ``__getitem__`` skipped by the DataLoader's
    fast path, and train on untransformed rows without a word.

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import TensorDataset
        >>> from neural_arch.data.dataset import gathers_like_getitem
        >>> class Doubled(TensorDataset):
        ...     def __getitem__(self, i):
        ...         return tuple(2 * a[i] for a in self.arrays)
        >>> gathers_like_getitem(TensorDataset(np.arange(3))), gathers_like_getitem(Doubled(np.arange(3)))
        (True, False)
    """
    if not callable(getattr(dataset, "get_batch", None)) or not getattr(dataset, "supports_batch", True):
        return False
    cls = type(dataset)
    gather, getitem = _defining_class(cls, "get_batch"), _defining_class(cls, "__getitem__")
    return gather is None or getitem is None or issubclass(gather, getitem)


def as_index(value, what: str = "index") -> int:
    """``value`` as a Python int, refusing floats and booleans (``int(1.7)`` would quietly be ``1``).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data.dataset import as_index
        >>> as_index(np.int64(3)), as_index(-1)
        (3, -1)
        >>> as_index(1.5)
        Traceback (most recent call last):
        ...
        TypeError: index must be an integer, got 1.5 (float)
    """
    if type(value) is int:
        return value
    raw = value.data if isinstance(value, Tensor) else value
    if not isinstance(raw, (bool, np.bool_)) and getattr(raw, "dtype", np.dtype(np.int64)).kind != "b":
        try:
            return operator.index(raw)
        except TypeError:
            pass
    raise TypeError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")


def _index_array(indices, what: str) -> np.ndarray:
    """``indices`` as an int64 array; floats and boolean masks are errors, not truncated or read as 0/1."""
    raw = indices.data if isinstance(indices, Tensor) else indices
    arr = _backend.to_device(raw, "cpu") if _backend.is_device_array(raw) else np.asarray(raw)
    if arr.size == 0:
        return np.zeros(arr.shape, dtype=np.int64)
    if arr.dtype.kind == "O":
        arr = np.array([as_index(i, what) for i in arr.ravel()], dtype=np.int64).reshape(arr.shape)
    if arr.dtype.kind == "b":
        raise TypeError(f"{what} are booleans; pass the positions of the True entries (np.flatnonzero(mask))")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


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

    def __add__(self, other) -> ConcatDataset:
        """``a + b`` is ``ConcatDataset([a, b])``, as in torch."""
        return ConcatDataset([self, other])


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
        self.indices = _index_array(indices, "Subset: indices")
        if self.indices.ndim != 1:
            raise ValueError(f"Subset: indices must be one-dimensional, got shape {self.indices.shape}")

    def __getitem__(self, index):
        return self.dataset[int(self.indices[index])]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def supports_batch(self) -> bool:
        """True when the parent dataset can gather many rows at once, as its ``__getitem__`` would."""
        return gathers_like_getitem(self.dataset)

    def get_batch(self, indices) -> tuple:
        return self.dataset.get_batch(self.indices[np.asarray(indices, dtype=np.int64)])


class ConcatDataset(Dataset):
    """The items of several datasets one after another (torch's ``ConcatDataset``; also ``a + b``).

    ``cumulative_sizes[k]`` is the number of items in the first ``k + 1`` datasets; empty members
    are allowed. Negative indices count from the end; an index ``>= len`` is an ``IndexError``,
    one ``< -len`` a ``ValueError`` (torch's errors). IterableDatasets cannot be concatenated this
    way (they have no indices).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import ConcatDataset, TensorDataset
        >>> both = ConcatDataset([TensorDataset(np.arange(3)), TensorDataset(np.arange(10, 12))])
        >>> len(both), both.cumulative_sizes, int(both[3][0]), int(both[-1][0])
        (5, [3, 5], 10, 11)
    """

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset (chain the streams instead)")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1])

    def __getitem__(self, index):
        index = as_index(index, "ConcatDataset: index")
        n = len(self)
        if index < 0:
            if -index > n:  # torch's error for this side (IndexError past the end, as a sequence's)
                raise ValueError(f"ConcatDataset: absolute value of index {index} exceeds the length {n}")
            index += n
        if index >= n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for {n} items")
        # bisect_right skips empty members: their cumulative size equals the previous one's
        k = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[k][index - (self.cumulative_sizes[k - 1] if k else 0)]


def random_split(dataset, lengths, generator=None) -> list[Subset]:
    """Split ``dataset`` into non-overlapping random :class:`Subset` s of the given lengths (torch's).

    ``lengths`` are item counts summing to ``len(dataset)``, or fractions summing to 1: then each
    split gets ``floor(len * fraction)`` items and the remainder is handed out one by one, round-robin
    from the first split (torch's rule). The permutation is drawn from ``generator`` (a
    ``neural_arch.Generator``; default: the global generator, so it follows ``manual_seed``).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.data import TensorDataset, random_split
        >>> g = na.Generator().manual_seed(0)
        >>> train, val = random_split(TensorDataset(np.arange(10)), [0.75, 0.25], generator=g)
        >>> len(train), len(val), sorted(train.indices.tolist() + val.indices.tolist()) == list(range(10))
        (8, 2, True)
    """
    n = len(dataset)
    lengths = list(lengths)
    if not lengths:
        raise ValueError("random_split: lengths is empty")
    if any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating))
           for x in lengths):
        raise TypeError(f"random_split: lengths must be numbers, got {lengths!r}")
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:  # fractions (torch's test, [1] included)
        for i, frac in enumerate(lengths):
            if not 0 <= frac <= 1:
                raise ValueError(f"random_split: fraction at index {i} is not between 0 and 1: {frac}")
        counts = [math.floor(n * frac) for frac in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"random_split: length of split at index {i} is 0; that split is empty",
                              stacklevel=2)
        lengths = counts
    for i, length in enumerate(lengths):
        # torch would slice with a negative length (a split of the wrong items) or fail on a float inside
        if int(length) != length or length < 0:
            raise ValueError(f"random_split: lengths must be non-negative integers or fractions summing to 1; "
                             f"length at index {i} is {length!r}")
    lengths = [int(x) for x in lengths]
    if sum(lengths) != n:
        raise ValueError(f"random_split: sum of input lengths ({sum(lengths)}) does not equal the length of "
                         f"the input dataset ({n})")
    order = numpy_generator(generator).permutation(n)
    offsets = np.cumsum([0] + lengths)
    return [Subset(dataset, order[start:stop]) for start, stop in itertools.pairwise(offsets)]
