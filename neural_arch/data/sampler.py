"""Samplers: the order in which a DataLoader visits a map-style dataset (torch's ``torch.utils.data.sampler``).

* :class:`SequentialSampler` -- ``0, 1, ..., n-1``.
* :class:`RandomSampler` -- a permutation per epoch, or ``num_samples`` draws with replacement.
* :class:`SubsetRandomSampler` -- a permutation of given indices (a train/validation split).
* :class:`WeightedRandomSampler` -- indices drawn with the given (relative) probabilities.
* :class:`BatchSampler` -- lists of indices from another sampler; ``DataLoader(batch_sampler=...)``.

Randomness comes from ``generator=`` (a ``neural_arch.Generator``) or, without one, from the global
generator, so ``manual_seed`` makes the epochs reproducible. Bad arguments raise at construction
with torch's error types (``ValueError``, ``TypeError`` for a non-bool flag); weights that are
negative, non-finite or all zero are a ``ValueError`` here (torch only fails when iterating).

A sampler without ``state_dict`` is resumed by the DataLoader by iterating it again: a random one then
gives another order, and the resume is refused with a ``ValueError`` (resume at an epoch boundary).

Example::

    >>> import neural_arch as na
    >>> from neural_arch.data import BatchSampler, RandomSampler, SequentialSampler
    >>> list(BatchSampler(SequentialSampler(range(5)), batch_size=2, drop_last=False))
    [[0, 1], [2, 3], [4]]
    >>> sorted(RandomSampler(range(4), generator=na.Generator().manual_seed(0)))
    [0, 1, 2, 3]
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from neural_arch.core.rng import numpy_generator
from neural_arch.data.dataset import _index_array

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler", "SubsetRandomSampler",
           "WeightedRandomSampler"]


def _positive_int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value!r}")
    return int(value)


def _flag(value, name: str, error=TypeError) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} should be a boolean value, but got {name}={value!r}")
    return bool(value)


class Sampler:
    """Base class: an iterable of dataset indices with a ``__len__`` (torch's ``Sampler``).

    Example::

        >>> from neural_arch.data import Sampler
        >>> class Evens(Sampler):
        ...     def __init__(self, n):
        ...         self.n = n
        ...     def __iter__(self):
        ...         return iter(range(0, self.n, 2))
        ...     def __len__(self):
        ...         return (self.n + 1) // 2
        >>> list(Evens(5)), len(Evens(5))
        ([0, 2, 4], 3)
    """

    def __init__(self, data_source=None):
        pass  # torch accepts (and ignores) the data source here

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class SequentialSampler(Sampler):
    """``0, 1, ..., len(data_source) - 1``.

    Example::

        >>> from neural_arch.data import SequentialSampler
        >>> list(SequentialSampler("abc"))
        [0, 1, 2]
    """

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random order of ``data_source``'s indices, drawn anew each epoch (torch's ``RandomSampler``).

    Without replacement: a permutation; with ``num_samples`` larger than the data set, whole
    permutations one after another, the last one cut short (torch's rule). With replacement:
    ``num_samples`` independent uniform draws.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.data import RandomSampler
        >>> g = na.Generator().manual_seed(0)
        >>> order = list(RandomSampler(range(3), num_samples=7, generator=g))
        >>> len(order), sorted(order[:3]), sorted(order[3:6])
        (7, [0, 1, 2], [0, 1, 2])
    """

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None):
        self.data_source = data_source
        self.replacement = _flag(replacement, "replacement")
        self._num_samples = num_samples
        self.generator = generator
        _positive_int(self.num_samples, "num_samples")  # torch checks here too (an empty data set included)

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n, count = len(self.data_source), self.num_samples
        if n == 0:
            raise ValueError("RandomSampler: the data source is empty, there is nothing to draw")
        rng = numpy_generator(self.generator)
        if self.replacement:
            return iter(rng.integers(0, n, size=count).tolist())
        rounds = [rng.permutation(n) for _ in range(count // n)]
        if count % n:
            rounds.append(rng.permutation(n)[:count % n])
        return iter(np.concatenate(rounds).tolist())

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given ``indices`` in a random order, drawn anew each epoch (no replacement).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.data import SubsetRandomSampler
        >>> sorted(SubsetRandomSampler([7, 3, 5], generator=na.Generator().manual_seed(0)))
        [3, 5, 7]
    """

    def __init__(self, indices, generator=None):
        self.indices = _index_array(indices, "SubsetRandomSampler: indices").ravel()
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices[numpy_generator(self.generator).permutation(len(self.indices))].tolist())

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices ``0..len(weights)-1`` drawn with probabilities proportional to ``weights``.

    Weights need not sum to one; they must be finite, non-negative and not all zero (a ``ValueError``
    here, where torch fails only when iterating). Without replacement, ``num_samples`` may not exceed
    the number of non-zero weights.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.data import WeightedRandomSampler
        >>> draws = list(WeightedRandomSampler([0.0, 1.0, 3.0], 8, generator=na.Generator().manual_seed(0)))
        >>> len(draws), 0 in draws
        (8, False)
    """

    def __init__(self, weights, num_samples: int, replacement: bool = True, generator=None):
        self.num_samples = _positive_int(num_samples, "num_samples")
        self.replacement = _flag(replacement, "replacement", ValueError)  # torch's error type for this one
        raw = weights.numpy() if hasattr(weights, "numpy") and not isinstance(weights, np.ndarray) else weights
        w = np.asarray(raw, dtype=np.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(w.shape)}")
        if not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
            raise ValueError(f"WeightedRandomSampler: weights must be finite, non-negative and not all zero, "
                             f"got {w.tolist()[:8]}{'...' if len(w) > 8 else ''}")
        if not self.replacement and self.num_samples > np.count_nonzero(w):
            raise ValueError(f"WeightedRandomSampler: cannot draw {self.num_samples} samples without replacement "
                             f"from {np.count_nonzero(w)} non-zero weights")
        self.weights = w
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        rng = numpy_generator(self.generator)
        p = self.weights / self.weights.sum()
        return iter(rng.choice(len(p), size=self.num_samples, replace=self.replacement, p=p).tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of ``batch_size`` indices from ``sampler``; the last one shorter unless ``drop_last``.

    Example::

        >>> from neural_arch.data import BatchSampler
        >>> list(BatchSampler(range(5), batch_size=2, drop_last=True)), len(BatchSampler(range(5), 2, False))
        ([[0, 1], [2, 3]], 3)
    """

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        self.sampler = sampler
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.drop_last = _flag(drop_last, "drop_last", ValueError)

    def __iter__(self) -> Iterator[list[int]]:
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
