"""``DataLoader``: batches from a dataset, optionally shuffled, collated into Tensors.

* Shuffling uses the loader's own ``numpy.random.Generator``, seeded from ``seed`` (or, when
  ``seed`` is None, from the global generator at construction, so it follows ``manual_seed``), or
  the ``generator=`` given (a ``neural_arch.Generator``, as torch's). Each ``iter(loader)`` draws a
  fresh permutation: epochs differ, and two loaders built with the same seed give the same epochs.
* ``sampler`` is any iterable of indices with ``__len__`` (e.g. ``DistributedSampler``; call its
  ``set_epoch`` yourself, as in torch).
* Fast path: when the dataset can gather rows in one go (``TensorDataset``), each batch is one
  fancy-indexing call per array instead of ``batch_size`` Python ``__getitem__`` calls.
* ``num_workers > 0`` loads batches in that many worker **processes** (torch's semantics: ``fork``
  on Linux, or ``multiprocessing_context="spawn"``), so Python transforms run in parallel instead
  of taking turns on the GIL; batches come back through shared memory, in order
  (:mod:`neural_arch.data.worker_pool`, :mod:`neural_arch.data.shared_batch`). Each worker is
  seeded with ``base_seed + worker_id`` (:func:`~neural_arch.data.worker.get_worker_info`).
  A worker's exception is raised here with its traceback; a worker that dies is a
  ``RuntimeError`` naming it, never a hang. Workers of CuPy datasets: use ``spawn`` (CUDA does
  not survive ``fork``).
* Resumable: :meth:`DataLoader.state_dict` / :meth:`DataLoader.load_state_dict` save and restore
  the position inside the epoch. With a sampler that keeps its own position
  (``DistributedSampler``: ``state_dict`` first tells it, by ``record_batch``, how many batches were
  yielded) the sampler's state is saved, so the rest of the epoch can resume on another world size.
  A sampler without a state is iterated again and the batches already seen are skipped; if it then
  gives another order (a random sampler), the resume raises ``ValueError`` rather than repeat some
  samples and miss others.

Example::

    >>> import numpy as np
    >>> from neural_arch.data import DataLoader, TensorDataset
    >>> ds = TensorDataset(np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5))
    >>> loader = DataLoader(ds, batch_size=2, shuffle=True, seed=0)
    >>> len(loader), [tuple(x.shape) for x, y in loader]
    (3, [(2, 2), (2, 2), (1, 2)])
"""

from __future__ import annotations

import hashlib
import itertools
import math
import pickle
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.rng import numpy_generator
from neural_arch.core.tensor import Tensor, get_generator
from neural_arch.data.dataset import IterableDataset, as_index, gathers_like_getitem
from neural_arch.data.shared_batch import discard, unpack
from neural_arch.data.worker import ExceptionWrapper, IterableEnd
from neural_arch.data.worker_pool import WorkerPool

__all__ = ["DataLoader", "default_collate", "default_convert"]


def _stack(items: list) -> Any:
    first = items[0]
    if isinstance(first, (str, bytes)):  # before np.generic: np.str_ and np.bytes_ are strings too (torch's rule)
        return list(items)
    if isinstance(first, np.ndarray) and first.dtype.kind in "SaUO":
        # np.stack would make an array of strings or objects that no Tensor op can use (torch refuses too)
        raise TypeError(f"default_collate: batch must contain arrays of numbers, got dtype {first.dtype}; "
                        "pass collate_fn=... to DataLoader")
    if isinstance(first, Tensor):
        xp = first.xp
        return Tensor(xp.stack([t.data for t in items]))
    if isinstance(first, np.ndarray):
        return Tensor(np.stack(items))
    if isinstance(first, (np.generic, bool, int, float)):
        numbers = np.array(items)
        if numbers.dtype.kind in "SaUO":  # [1, "a"] became strings, [2**70, 1] objects: torch refuses both
            raise TypeError(f"default_collate: samples {items[:4]!r} do not make one array of numbers "
                            f"(NumPy made dtype {numbers.dtype}); pass collate_fn=... to DataLoader")
        return Tensor(numbers)
    if _backend.is_device_array(first):  # CuPy (or a registered device type): stack on the device
        return Tensor(_backend.get_array_module(first).stack(items))
    if isinstance(first, (tuple, list)):
        if any(len(item) != len(first) for item in items):
            # zip would silently cut every sample to the shortest one's fields
            raise ValueError(f"default_collate: samples have different numbers of fields "
                             f"({sorted({len(item) for item in items})}); each sample must have the same structure")
        fields = [_stack(list(field)) for field in zip(*items)]
        if hasattr(first, "_fields"):  # a namedtuple stays one, field names and all (torch's rule)
            return type(first)(*fields)
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, dict):
        if any(item.keys() != first.keys() for item in items):
            # keys only some samples have would vanish from the batch without a word
            raise ValueError(f"default_collate: samples have different keys ({sorted(first)} and "
                             f"{sorted(next(i for i in items if i.keys() != first.keys()))}); "
                             "each sample must have the same keys")
        return {k: _stack([item[k] for item in items]) for k in first}
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




def default_convert(data: Any) -> Any:
    """Turn the arrays inside one sample into Tensors, without batching (torch's ``default_convert``).

    What ``DataLoader(batch_size=None)`` applies to each sample: NumPy/CuPy arrays of numbers and NumPy
    scalars become Tensors; Python numbers, strings and arrays of strings or objects stay as they are;
    dicts, namedtuples and lists keep their type, and a tuple becomes a list (torch's rule).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import default_convert
        >>> x, y = default_convert((np.ones(2), 3))
        >>> type(x).__name__, x.shape, y
        ('Tensor', (2,), 3)
    """
    if isinstance(data, (Tensor, str, bytes)):
        return data
    if isinstance(data, (np.ndarray, np.generic)):
        return data if data.dtype.kind in "SaUO" else Tensor(np.asarray(data))
    if _backend.is_device_array(data):
        return Tensor(data)
    if isinstance(data, dict):
        converted = {k: default_convert(v) for k, v in data.items()}
        return converted if type(data) is dict else _same_type(data, converted)
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # a namedtuple stays one
            return type(data)(*(default_convert(v) for v in data))
        return [default_convert(v) for v in data]
    if isinstance(data, list):
        return [default_convert(v) for v in data]
    return data


def _same_type(original, converted: dict):
    try:
        return type(original)(converted)
    except TypeError:  # a mapping type that cannot be built from a dict: torch falls back to dict too
        return converted


def _collate_arrays(arrays: tuple) -> tuple:
    """The fast path's collate: wrap already-gathered batch arrays (no copy)."""
    return tuple(Tensor(a) for a in arrays)


def _not_an_int(value) -> bool:
    return isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))


def _index_order(indices: list) -> np.ndarray:
    """A sampler's indices as int64; a float index would otherwise be truncated (0.9 serving sample 0)
    without a word, so anything but integers is an error, as in torch's indexing."""
    try:
        order = np.asarray(indices) if indices else np.zeros(0, np.int64)
    except ValueError:  # ragged (a batch sampler passed as sampler=): as_index names the culprit below
        order = None
    if order is None or order.ndim != 1 or order.dtype.kind not in "iu":
        order = np.array([as_index(i, "DataLoader: a sampler's index") for i in indices], dtype=np.int64)
    return order.astype(np.int64, copy=False)


class _Fetcher:
    """Loads and collates one batch of a map-style dataset (picklable, so ``spawn`` workers get it)."""

    def __init__(self, dataset, collate_fn, fast: bool, auto_batch: bool = True):
        self.dataset, self.collate_fn, self.fast, self.auto_batch = dataset, collate_fn, fast, auto_batch

    def __call__(self, indices):
        if not self.auto_batch:  # batch_size=None: one sample, converted, not stacked
            return (self.collate_fn or default_convert)(self.dataset[int(indices[0])])
        if self.fast:
            return _collate_arrays(self.dataset.get_batch(indices))
        return (self.collate_fn or default_collate)([self.dataset[int(i)] for i in indices])


class _IterableBatcher:
    """Batches of an ``IterableDataset`` (each worker runs one over its own copy)."""

    def __init__(self, dataset, batch_size: int, drop_last: bool, collate_fn):
        self.dataset, self.batch_size, self.drop_last, self.collate_fn = dataset, batch_size, drop_last, collate_fn

    def __call__(self) -> Iterator:
        items = iter(self.dataset)
        if self.batch_size is None:  # no automatic batching: each item, converted
            convert = self.collate_fn or default_convert
            for item in items:
                yield convert(item)
            return
        collate = self.collate_fn or default_collate
        while True:
            chunk = list(itertools.islice(items, self.batch_size))
            if not chunk or (self.drop_last and len(chunk) < self.batch_size):
                return
            yield collate(chunk)


class DataLoader:
    """Iterate over ``dataset`` in batches (torch's ``DataLoader``).

    Args:
        dataset: a map-style dataset (``__len__``, ``__getitem__``) or an ``IterableDataset``.
        batch_size: samples per batch; ``None`` turns automatic batching off (torch's): each step yields
            one sample, its arrays made Tensors by :func:`default_convert` (or ``collate_fn``).
        shuffle: reshuffle the order every epoch (mutually exclusive with ``sampler``).
        sampler: iterable of indices with ``__len__`` (e.g. ``DistributedSampler``).
        drop_last: drop the final short batch.
        batch_sampler: iterable of index lists with ``__len__`` (e.g. :class:`~neural_arch.data.BatchSampler`),
            each one batch; mutually exclusive with ``batch_size``, ``shuffle``, ``sampler`` and ``drop_last``.
        collate_fn: turns a list of samples into a batch (default: :func:`default_collate`). A
            custom ``collate_fn`` always receives the list of samples (it turns the fast path off).
        seed: seed for the shuffling generator (default: drawn from the global generator).
        num_workers: worker processes that load batches (0: load in the calling process).
        pin_memory: accepted for torch compatibility (host arrays need no pinning).
        timeout: seconds to wait for a worker's batch before raising (0: no limit; a dead worker
            is reported at once either way).
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each worker after seeding.
        multiprocessing_context: ``"fork"`` (default on Linux), ``"spawn"``, ``"forkserver"``
            or a context object.
        generator: a ``neural_arch.Generator`` (or ``numpy.random.Generator``) for the shuffle
            and the workers' base seed, instead of ``seed``.
        prefetch_factor: batches in flight per worker.
        persistent_workers: keep the workers alive between epochs (they start once per loader).

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import DataLoader, TensorDataset
        >>> data = TensorDataset(np.arange(10.0).reshape(5, 2), np.arange(5))
        >>> [(x.shape, y.tolist()) for x, y in DataLoader(data, batch_size=2)]
        [((2, 2), [0, 1]), ((2, 2), [2, 3]), ((1, 2), [4])]
        >>> [y.tolist() for _, y in DataLoader(data, batch_size=2, num_workers=2)]
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False,
                 sampler: Iterable[int] | None = None, drop_last: bool = False,
                 collate_fn: Callable | None = None, seed: int | None = None,
                 num_workers: int = 0, pin_memory: bool = False, timeout: float = 0,
                 worker_init_fn: Callable | None = None, multiprocessing_context=None,
                 generator=None, *, batch_sampler: Iterable | None = None, prefetch_factor: int | None = None,
                 persistent_workers: bool = False):
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                                 "sampler, and drop_last")
            if not hasattr(batch_sampler, "__len__"):
                raise TypeError("DataLoader: batch_sampler must have __len__ (an iterable of index lists with a "
                                "length)")
            if isinstance(dataset, IterableDataset):
                raise ValueError("DataLoader: an IterableDataset decides its own batches; batch_sampler= is for "
                                 "map-style datasets")
        if batch_size is None and drop_last:
            raise ValueError("DataLoader: batch_size=None option disables auto-batching and is mutually exclusive "
                             "with drop_last")
        if batch_size is not None and (_not_an_int(batch_size) or batch_size <= 0):
            # int(2.5) would quietly be 2, and True 1: torch refuses both
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size!r}")
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable and (shuffle or sampler is not None):
            raise ValueError("DataLoader: an IterableDataset decides its own order; shuffle=True and sampler= "
                             "are for map-style datasets")
        if sampler is not None and shuffle:
            raise ValueError(
                "DataLoader: sampler and shuffle=True are mutually exclusive; shuffle in the sampler"
            )
        if sampler is not None and not hasattr(sampler, "__len__"):
            raise TypeError("DataLoader: sampler must have __len__ (an iterable of indices with a length)")
        if _not_an_int(num_workers) or num_workers < 0:  # int(2.5) would quietly start 2 workers
            raise ValueError(f"DataLoader: num_workers must be an integer >= 0, got {num_workers!r}")
        if int(num_workers) == 0 and (persistent_workers or prefetch_factor is not None):
            raise ValueError("DataLoader: persistent_workers and prefetch_factor need num_workers > 0")
        if prefetch_factor is not None and (_not_an_int(prefetch_factor) or prefetch_factor < 1):
            raise ValueError(f"DataLoader: prefetch_factor must be an integer >= 1, got {prefetch_factor!r}")
        if float(timeout) < 0:
            raise ValueError(f"DataLoader: timeout must be >= 0, got {timeout}")
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        # None when the batch sampler decides (torch), or with batch_size=None: no automatic batching
        self.batch_size = int(batch_size) if batch_sampler is None and batch_size is not None else None
        self._auto_batch = batch_size is not None or batch_sampler is not None
        self.shuffle = bool(shuffle)
        self.sampler = sampler
        self.drop_last = bool(drop_last)
        self.collate_fn = collate_fn
        self.num_workers = int(num_workers)
        self.pin_memory = pin_memory  # accepted for torch compatibility; host arrays need no pinning
        self.timeout = float(timeout)
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.prefetch_factor = int(prefetch_factor) if prefetch_factor is not None else 2
        self.persistent_workers = bool(persistent_workers)
        self.generator = generator
        if generator is not None and seed is not None:
            raise ValueError("DataLoader: pass seed= or generator=, not both (the generator would silently win)")
        if generator is not None:
            # torch's semantics: the generator drives the shuffle and each iterator's worker base seed
            self._generator = numpy_generator(generator)
            self._seed_stream = self._generator
            self.seed = None
        else:
            if seed is None:
                seed = int(get_generator().integers(0, 2**63 - 1))
            self.seed = int(seed)
            self._generator = np.random.default_rng(self.seed)
            # a stream of its own, so drawing worker seeds leaves the shuffle order as it always was
            self._seed_stream = np.random.default_rng([self.seed, 1])
        # the fast path only where get_batch gathers what __getitem__ returns: a subclass overriding
        # __getitem__ (a transform) must have it called, as torch would
        self._fast = not self._iterable and collate_fn is None and self._auto_batch and gathers_like_getitem(dataset)
        self._pool: WorkerPool | None = None      # persistent workers only
        self._yielded = 0                         # batches yielded in the current epoch
        self._epoch_start = None                  # generator state when the current epoch was drawn
        self._seeds_start = None                  # worker-seed stream's state when the epoch drew its seed
        self._skip = 0                            # batches the next epoch skips (load_state_dict)
        self._segment_batches = None              # batches yielded since iter() (None: not iterated yet)
        self._order_digest = None                 # digest of the epoch's order, for a sampler without state
        self._resume_digest = None                # the digest the order resumed from must have (load_state_dict)
        self._worker_streams: list | None = None  # per worker: its random streams after its last batch yielded
        self._resume_streams: list | None = None  # streams the next pool's workers start from (load_state_dict)

    def _num_samples(self) -> int:
        if self.sampler is not None:
            return len(self.sampler)
        if self._iterable and not hasattr(self.dataset, "__len__"):
            raise TypeError("DataLoader: this IterableDataset has no __len__, so the loader has none")
        return len(self.dataset)

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        n = self._num_samples()
        if not self._auto_batch:
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _order(self) -> np.ndarray:
        """The indices of one epoch, in the order they will be served."""
        if self.sampler is not None:
            n = len(self.sampler)
            it = iter(self.sampler)
            order = _index_order(list(itertools.islice(it, n)))
            # a sampler whose len() disagrees with what it yields would lose its extra indices (or be
            # cut short) without a word: len(loader), the epoch's batches and a resume all rely on it
            extra = next(it, None) is not None
            if len(order) != n or extra:
                raise ValueError(f"DataLoader: the sampler's len() is {n} but it yielded "
                                 f"{'more' if extra else len(order)} indices; make __len__ match __iter__")
            return order
        n = len(self.dataset)
        return self._generator.permutation(n) if self.shuffle else np.arange(n, dtype=np.int64)

    def _batch_indices(self) -> list[np.ndarray]:
        if self.batch_sampler is not None:
            batches = self._sampled_batches()
            order = np.concatenate(batches + [np.array([len(b) for b in batches], dtype=np.int64)])
        else:
            order = self._order()
            size = self.batch_size or 1  # no automatic batching: one sample per step
            stop = len(self) * size
            batches = [order[i:i + size] for i in range(0, min(stop, len(order)), size)]
        chooser = self.sampler if self.batch_sampler is None else self.batch_sampler
        if chooser is not None and not callable(getattr(chooser, "state_dict", None)):
            # a sampler without a state of its own is resumed by drawing its order again: remember which
            # order this epoch had, so that a resume can tell when the sampler gives another one
            self._order_digest = hashlib.blake2b(order.tobytes(), digest_size=16).hexdigest()
        return batches

    def _sampled_batches(self) -> list[np.ndarray]:
        n = len(self.batch_sampler)
        it = iter(self.batch_sampler)
        batches = [_index_order(list(b)) for b in itertools.islice(it, n)]
        extra = next(it, None) is not None
        if len(batches) != n or extra:  # len(loader) and a resume rely on it, as for a sampler
            raise ValueError(f"DataLoader: the batch_sampler's len() is {n} but it yielded "
                             f"{'more' if extra else len(batches)} batches; make __len__ match __iter__")
        if any(len(b) == 0 for b in batches):
            raise ValueError("DataLoader: the batch_sampler yielded an empty batch")
        return batches

    def _check_resumed_order(self) -> None:
        expected, self._resume_digest = self._resume_digest, None
        if expected is not None and self._order_digest != expected:
            raise ValueError(
                "DataLoader: cannot resume mid-epoch: the sampler gave another order than the interrupted "
                "epoch's (a random sampler without state_dict/load_state_dict?), so skipping the batches "
                "already seen would repeat some samples and miss others. Give the sampler state_dict() and "
                "load_state_dict() that restore its order (DistributedSampler has them), or resume at an "
                "epoch boundary.")

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        self._epoch_start = self._generator.bit_generator.state  # drawn below: a resume redraws the same
        self._seeds_start = self._seed_stream.bit_generator.state   # likewise the workers' base seed
        base_seed = int(self._seed_stream.integers(0, 2**62))
        skip, self._skip = self._skip, 0
        if self._iterable:
            tasks = None
        else:
            tasks = self._batch_indices()  # drawn now, so the epoch order is fixed at iter() time
            if skip:
                self._check_resumed_order()
            tasks = iter(tasks[skip:])
        self._yielded, self._segment_batches = skip, 0
        if self.num_workers == 0:
            batches = self._single_process(tasks)
        else:
            pool = self._workers(base_seed)
            # task k of an epoch goes to worker k mod n (every worker is active for a map-style
            # dataset): a resumed epoch's first task goes where the uninterrupted one sent it
            batches = _MultiProcessIter(self, pool, tasks, first_worker=0 if self._iterable else skip)
        if self._iterable and skip:
            batches = itertools.islice(batches, skip, None)
        return self._counted(batches)

    def _single_process(self, tasks) -> Iterator:
        if tasks is None:
            yield from _IterableBatcher(self.dataset, self.batch_size, self.drop_last, self.collate_fn)()
            return
        fetch = _Fetcher(self.dataset, self.collate_fn, self._fast, self._auto_batch)
        for indices in tasks:
            yield fetch(indices)

    def _counted(self, batches) -> Iterator:
        """Yield ``batches``, counting them (the epoch's position; the sampler's segment's)."""
        for batch in batches:
            self._yielded += 1
            self._segment_batches += 1
            yield batch
        # the epoch is complete: a resume starts the next one
        self._yielded, self._epoch_start, self._seeds_start = 0, None, None

    def _workers(self, base_seed: int) -> WorkerPool:
        if self._pool is not None and self._pool.alive:
            return self._pool
        fetch = None if self._iterable else _Fetcher(self.dataset, self.collate_fn, self._fast, self._auto_batch)
        make_batches = _IterableBatcher(self.dataset, self.batch_size, self.drop_last, self.collate_fn) \
            if self._iterable else None
        streams, self._resume_streams = self._resume_streams, None
        pool = WorkerPool(self.num_workers, base_seed, self.dataset, fetch, make_batches, self.worker_init_fn,
                          context=self.multiprocessing_context, timeout=self.timeout, random_states=streams)
        # each worker's streams as of its last batch yielded: where it starts (seeded, or resumed)
        self._worker_streams = list(streams) if streams is not None else [None] * self.num_workers
        if self.persistent_workers:
            self._pool = pool
        return pool

    # -- resumable position -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the current epoch stands: batches yielded, the shuffle generator's state at the epoch's
        start, the sampler's ``state_dict()`` when it has one, and the state of the stream that draws
        each epoch's worker base seed (so the workers of a job resumed at an epoch's start seed their
        random transforms as the uninterrupted job's did). Plain data (JSON-serialisable).

        Example::

            >>> import numpy as np
            >>> from neural_arch.data import DataLoader, TensorDataset
            >>> loader = DataLoader(TensorDataset(np.arange(6)), batch_size=2, shuffle=True, seed=0)
            >>> it = iter(loader); first = next(it)
            >>> state = loader.state_dict()
            >>> resumed = DataLoader(TensorDataset(np.arange(6)), batch_size=2, shuffle=True, seed=0)
            >>> resumed.load_state_dict(state)
            >>> [b[0].tolist() for b in resumed] == [b[0].tolist() for b in it]
            True
        """
        generator = self._epoch_start if self._epoch_start is not None else self._generator.bit_generator.state
        if self.sampler is not None or self.batch_sampler is not None:
            generator = None  # the sampler owns the order; the loader's generator draws nothing for it
        record = getattr(self.sampler, "record_batch", None)
        if callable(record) and self._segment_batches is not None:
            # tell the sampler what was really consumed (batches prefetched by workers were not);
            # absolute, so it also corrects a count the user kept with record_samples
            record(self._segment_batches - 1, self.batch_size or 1)
        sampler = self.sampler.state_dict() if callable(getattr(self.sampler, "state_dict", None)) else None
        # the stream that draws each epoch's worker base seed: without it a resumed job's workers would
        # seed their random transforms as in the first epoch, not as in the one it resumes
        seeds = self._seeds_start if self._seeds_start is not None else self._seed_stream.bit_generator.state
        state = {"batches_yielded": int(self._yielded), "generator": generator, "sampler": sampler,
                 "worker_seeds": seeds, "seed": self.seed}
        if self._worker_streams is not None and (self._yielded or self.persistent_workers):
            # each worker's random streams after its last batch yielded (a map-style dataset's random
            # transforms): a resumed epoch's workers continue them, as torchdata's StatefulDataLoader
            state["worker_random_states"] = {"num_workers": self.num_workers,
                                             "persistent": bool(self.persistent_workers),
                                             "states": list(self._worker_streams)}
        if self._yielded and sampler is None and (self.sampler is not None or self.batch_sampler is not None):
            state["sampler_order"] = self._order_digest  # checked on resume: see _check_resumed_order
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``: the next ``iter(loader)`` continues the interrupted epoch.

        With a sampler state (``DistributedSampler``) the sampler resumes (on any world size) and
        serves only the rest of the epoch; otherwise the epoch's order is redrawn from the saved
        generator state and the batches already yielded are skipped (not loaded).
        """
        # the worker-seed stream only from a loader of the same seed: ranks seeded apart (seed=base+rank)
        # that resume from one rank's state keep their own streams, or their workers would apply the same
        # random transforms (states saved before it existed, or of another seed: this loader's own)
        if state.get("worker_seeds") is not None and "seed" in state and state["seed"] == self.seed:
            self._seed_stream.bit_generator.state = state["worker_seeds"]
        streams = state.get("worker_random_states")
        # like the worker-seed stream: only a loader of the same seed continues these streams (ranks seeded
        # apart that resume from one rank's state keep their own, or their workers' transforms would agree)
        if streams is not None and not self._iterable and state.get("seed", self.seed) == self.seed:
            if streams["num_workers"] != self.num_workers or bool(streams.get("persistent")) != bool(
                    self.persistent_workers):
                warnings.warn(f"DataLoader.load_state_dict: the state was saved with num_workers="
                              f"{streams['num_workers']} (persistent_workers={bool(streams.get('persistent'))}), "
                              f"this loader has {self.num_workers} ({bool(self.persistent_workers)}): the workers "
                              "start with fresh random streams, so random transforms differ from the interrupted "
                              "run's", stacklevel=2)
            elif any(s is not None for s in streams["states"]):
                self._resume_streams = list(streams["states"])
        if state.get("generator") is not None:
            self._generator.bit_generator.state = state["generator"]
        if state.get("sampler") is not None and callable(getattr(self.sampler, "load_state_dict", None)):
            self.sampler.load_state_dict(state["sampler"])
            self._skip, self._segment_batches = 0, None
        else:
            self._skip = int(state.get("batches_yielded", 0))
            self._resume_digest = state.get("sampler_order") if self._skip else None

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown()

    def __repr__(self) -> str:
        return (f"DataLoader(batches={len(self) if not self._iterable else '?'}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last}, num_workers={self.num_workers})")


class _MultiProcessIter:
    """One epoch over a :class:`~neural_arch.data.worker_pool.WorkerPool`, in task order.

    Task ``k`` goes to the next active worker in turn; up to ``prefetch_factor`` tasks per worker
    are in flight; results arriving early wait in a reorder buffer. Every task is tagged with this
    epoch's id, so results of an abandoned earlier epoch (persistent workers) are dropped.
    """

    _epochs = itertools.count()

    def __init__(self, loader: DataLoader, pool: WorkerPool, tasks, first_worker: int = 0):
        self._pool, self._tasks = pool, tasks
        self._loader = loader
        self._owns_pool = pool is not loader._pool
        self._epoch = next(self._epochs)
        n = pool.num_workers
        self._active = [True] * n
        first = int(first_worker) % n
        self._cycle = itertools.cycle([*range(first, n), *range(first)])
        self._worker_of: dict[int, int] = {}
        self._buffer: dict = {}
        self._sent = self._received = 0
        if tasks is None:  # each worker restarts its IterableDataset copy for this epoch
            for worker_id in range(n):
                pool.put(worker_id, ("reset", None))
        for _ in range(loader.prefetch_factor * n):
            self._try_put()

    def _try_put(self) -> None:
        if self._tasks is not None:
            indices = next(self._tasks, None)
            if indices is None:
                return
        else:
            indices = None
        for _ in range(len(self._active)):
            worker_id = next(self._cycle)
            if self._active[worker_id]:
                break
        else:
            return
        self._pool.put(worker_id, ((self._epoch, self._sent), indices))
        self._worker_of[self._sent] = worker_id
        self._sent += 1

    def __iter__(self):
        return self

    def __next__(self):
        try:
            while self._received < self._sent:
                if self._received not in self._buffer:
                    (epoch, index), data, streams = self._pool.get()
                    payload = pickle.loads(data)  # trusted: our own worker processes
                    if epoch != self._epoch:
                        discard(payload)
                    else:
                        self._buffer[index] = (payload, streams)
                    continue
                payload, streams = self._buffer.pop(self._received)
                worker_id = self._worker_of.pop(self._received)
                self._received += 1
                if streams is not None and self._loader._worker_streams is not None:
                    self._loader._worker_streams[worker_id] = streams   # yielded: the state_dict's point
                if isinstance(payload, IterableEnd):
                    self._active[worker_id] = False
                    self._try_put()
                    continue
                if isinstance(payload, ExceptionWrapper):
                    payload.reraise()
                self._try_put()
                return unpack(payload)
        except BaseException:
            self._close()
            raise
        self._close()
        raise StopIteration

    def _close(self) -> None:
        for payload, _streams in self._buffer.values():
            discard(payload)
        self._buffer.clear()
        if self._owns_pool:
            self._pool.shutdown()

    def __del__(self):
        if getattr(self, "_owns_pool", False):
            self._close()
