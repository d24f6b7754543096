"""``DataLoader``: batches from a dataset, optionally shuffled, collated into Tensors.

* Shuffling uses the loader's own ``numpy.random.Generator``, seeded from ``seed`` (or, when
  ``seed`` is None, from the global generator at construction, so it follows ``manual_seed``).
  Each ``iter(loader)`` draws a fresh permutation: epochs differ, and two loaders built with the
  same seed produce the same sequence of epochs.
* ``sampler`` is any iterable of indices with ``__len__`` (e.g. ``DistributedSampler``; call its
  ``set_epoch`` yourself, as in torch).
* Fast path: when the dataset can gather rows in one go (``TensorDataset``), each batch is one
  fancy-indexing call per array instead of ``batch_size`` Python ``__getitem__`` calls.
* ``num_workers > 0`` prefetches batches on that many background threads (order is preserved).
  Threads, not processes: the work is NumPy indexing/stacking, which mostly releases the GIL.

Example::

    >>> import numpy as np
    >>> from neural_arch.data import DataLoader, TensorDataset
    >>> ds = TensorDataset(np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5))
    >>> loader = DataLoader(ds, batch_size=2, shuffle=True, seed=0)
    >>> len(loader), [tuple(x.shape) for x, y in loader]
    (3, [(2, 2), (2, 2), (1, 2)])
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor, get_generator

__all__ = ["DataLoader", "default_collate"]


def _stack(items: list) -> Any:
    first = items[0]
    if isinstance(first, Tensor):
        xp = first.xp
        return Tensor(xp.stack([t.data for t in items]))
    if isinstance(first, np.ndarray):
        return Tensor(np.stack(items))
    if isinstance(first, (np.generic, bool, int, float)):
        return Tensor(np.array(items))
    if _backend.is_device_array(first):  # CuPy (or a registered device type): stack on the device
        return Tensor(_backend.get_array_module(first).stack(items))
    if isinstance(first, (tuple, list)):
        fields = [_stack(list(field)) for field in zip(*items)]
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, dict):
        return {k: _stack([item[k] for item in items]) for k in first}
    if isinstance(first, str):
        return list(items)
    raise TypeError(
        f"default_collate: don't know how to batch items of type {type(first).__name__}; "
        "pass collate_fn=... to DataLoader"
    )


def default_collate(batch: list) -> Any:
    """Stack a list of samples into Tensors, field by field.

    Samples may be arrays, Tensors, numbers, or tuples/lists/dicts of them; strings are kept as
    lists. Python ints become int64, Python floats float64 (NumPy's defaults), like arrays do.

    Example::

        >>> import numpy as np
        >>> from neural_arch.data.dataloader import default_collate
        >>> x, y = default_collate([(np.zeros(3), 0), (np.ones(3), 1)])
        >>> x.shape, y.tolist()
        ((2, 3), [0, 1])
    """
    if not batch:
        raise ValueError("default_collate got an empty batch")
    return _stack(list(batch))


def _collate_arrays(arrays: tuple) -> tuple:
    """The fast path's collate: wrap already-gathered batch arrays (no copy)."""
    return tuple(Tensor(a) for a in arrays)


class DataLoader:
    """Iterate over ``dataset`` in batches.

    Args:
        dataset: a map-style dataset (``__len__``, ``__getitem__``).
        batch_size: samples per batch.
        shuffle: reshuffle the order every epoch (mutually exclusive with ``sampler``).
        sampler: iterable of indices with ``__len__`` (e.g. ``DistributedSampler``).
        drop_last: drop the final short batch.
        collate_fn: turns a list of samples into a batch (default: :func:`default_collate`). A
            custom ``collate_fn`` always receives the list of samples (it turns the fast path off).
        seed: seed for the shuffling generator (default: drawn from the global generator).
        num_workers: background threads that prefetch batches (0: load in the calling thread).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import DataLoader, TensorDataset
        >>> data = TensorDataset(np.arange(10.0).reshape(5, 2), np.arange(5))
        >>> [(x.shape, y.tolist()) for x, y in DataLoader(data, batch_size=2)]
        [((2, 2), [0, 1]), ((2, 2), [2, 3]), ((1, 2), [4])]
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False,
                 sampler: Iterable[int] | None = None, drop_last: bool = False,
                 collate_fn: Callable | None = None, seed: int | None = None,
                 num_workers: int = 0, pin_memory: bool = False):
        if int(batch_size) <= 0:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size}")
        if sampler is not None and shuffle:
            raise ValueError(
                "DataLoader: sampler and shuffle=True are mutually exclusive; shuffle in the sampler"
            )
        if sampler is not None and not hasattr(sampler, "__len__"):
            raise TypeError("DataLoader: sampler must have __len__ (an iterable of indices with a length)")
        if int(num_workers) < 0:
            raise ValueError(f"DataLoader: num_workers must be >= 0, got {num_workers}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.sampler = sampler
        self.drop_last = bool(drop_last)
        self.collate_fn = collate_fn
        self.num_workers = int(num_workers)
        self.pin_memory = pin_memory  # accepted for torch compatibility; host arrays need no pinning
        if seed is None:
            seed = int(get_generator().integers(0, 2**63 - 1))
        self.seed = int(seed)
        self._generator = np.random.default_rng(self.seed)
        self._fast = collate_fn is None and callable(getattr(dataset, "get_batch", None)) \
            and getattr(dataset, "supports_batch", True)

    def _num_samples(self) -> int:
        return len(self.sampler) if self.sampler is not None else len(self.dataset)

    def __len__(self) -> int:
        n = self._num_samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _order(self) -> np.ndarray:
        """The indices of one epoch, in the order they will be served."""
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64, count=len(self.sampler))
        n = len(self.dataset)
        return self._generator.permutation(n) if self.shuffle else np.arange(n, dtype=np.int64)

    def _batch_indices(self) -> list[np.ndarray]:
        order = self._order()
        stop = len(self) * self.batch_size
        return [order[i:i + self.batch_size] for i in range(0, min(stop, len(order)), self.batch_size)]

    def _load(self, indices: np.ndarray):
        if self._fast:
            return _collate_arrays(self.dataset.get_batch(indices))
        samples = [self.dataset[int(i)] for i in indices]
        return (self.collate_fn or default_collate)(samples)

    def __iter__(self) -> Iterator:
        batches = self._batch_indices()  # drawn now, so the epoch order is fixed at iter() time
        if self.num_workers == 0:
            for indices in batches:
                yield self._load(indices)
            return
        # Keep up to 2 batches per worker in flight; results come back in submission order.
        with ThreadPoolExecutor(max_workers=self.num_workers) as pool:
            pending: collections.deque = collections.deque()
            it = iter(batches)
            for indices in it:
                pending.append(pool.submit(self._load, indices))
                if len(pending) >= 2 * self.num_workers:
                    break
            while pending:
                yield pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(self._load, nxt))

    def __repr__(self) -> str:
        return (f"DataLoader(batches={len(self)}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"drop_last={self.drop_last}, num_workers={self.num_workers})")
