"""DataLoader worker processes: ``get_worker_info()``, per-worker seeding, and the worker's loop.

Each worker is a process (``fork`` on Linux, as torch; ``spawn`` when asked) that takes index
batches from its own queue, loads and collates them, and puts the batch (its arrays in shared
memory, see :mod:`neural_arch.data.shared_batch`) on the one result queue. A worker never decides
the order: the main process numbers every task and yields the results in that order.

Seeding: worker ``i`` seeds Python's ``random``, NumPy's legacy global generator and
neural_arch's global generator with ``base_seed + i``, where ``base_seed`` is drawn from the
loader's generator once per iterator (once per loader with ``persistent_workers=True``). So random
transforms differ between workers yet are reproducible for a given loader seed.

An exception in a worker travels back as text (its traceback) and is raised in the main process;
``IterableDataset`` copies are sharded by the user with :func:`get_worker_info`, as in torch.

Example::

    >>> from neural_arch.data import get_worker_info
    >>> get_worker_info() is None        # in the main process
    True
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import random
import traceback

import numpy as np

__all__ = ["WorkerInfo", "capture_random_state", "get_worker_info", "restore_random_state"]

#: seconds a worker waits on its index queue before checking that the main process is alive
_POLL_S = 0.5

_worker_info: WorkerInfo | None = None


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What a DataLoader worker process knows about itself (torch's ``WorkerInfo``).

    Attributes:
        id: this worker's index in ``[0, num_workers)``.
        num_workers: how many workers the loader started.
        seed: this worker's seed (``base_seed + id``), already applied to ``random``, NumPy and
            neural_arch's global generator.
        dataset: this worker's copy of the dataset.

    Example::

        >>> from neural_arch.data.worker import WorkerInfo
        >>> WorkerInfo(id=1, num_workers=2, seed=8, dataset=None).id
        1
    """

    id: int
    num_workers: int
    seed: int
    dataset: object


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the DataLoader worker this runs in, or ``None`` in the main process.

    Use it in ``IterableDataset.__iter__`` to give each worker its own shard, or in
    ``worker_init_fn`` to configure the worker's copy of the dataset.

    Example::

        >>> import numpy as np
        >>> from neural_arch.data import DataLoader, IterableDataset, get_worker_info
        >>> class Range(IterableDataset):
        ...     def __iter__(self):
        ...         info = get_worker_info()
        ...         start, step = (0, 1) if info is None else (info.id, info.num_workers)
        ...         return iter(range(start, 6, step))
        >>> sorted(int(v) for b in DataLoader(Range(), batch_size=2, num_workers=2) for v in b.data)
        [0, 1, 2, 3, 4, 5]
    """
    return _worker_info


class ExceptionWrapper:
    """An exception raised in a worker, carried to the main process as text (tracebacks do not pickle)."""

    def __init__(self, worker_id: int, exc: BaseException):
        self.exc_type = type(exc)
        self.worker_id = worker_id
        self.text = "".join(traceback.format_exception(exc))

    def reraise(self):
        """Raise the worker's exception type (when it takes one message) with the worker's traceback."""
        msg = (f"Caught {self.exc_type.__name__} in DataLoader worker process {self.worker_id}.\n"
               f"Original {self.text}")
        try:
            exc = self.exc_type(msg)
        except Exception:  # noqa: BLE001 - a type that does not take one message: say it as RuntimeError
            exc = RuntimeError(msg)
        raise exc


def serialize(worker_id: int, payload) -> bytes:
    """``payload`` pickled here, in the worker, so that a batch that cannot be pickled becomes an error
    the main process raises, instead of a result lost in the queue's feeder thread (a hang)."""
    try:
        return pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises goes to the main process
        wrapper = payload if isinstance(payload, ExceptionWrapper) else ExceptionWrapper(worker_id, exc)
        try:
            return pickle.dumps(wrapper, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an exception class defined where the main process cannot import it
            wrapper.exc_type = RuntimeError
            return pickle.dumps(wrapper, protocol=pickle.HIGHEST_PROTOCOL)


@dataclasses.dataclass(frozen=True)
class IterableEnd:
    """Sent by a worker whose ``IterableDataset`` copy is exhausted for this epoch."""

    worker_id: int


def capture_random_state() -> dict:
    """The random streams ``seed_worker`` seeds, as plain data (JSON-serialisable): Python's
    ``random``, NumPy's legacy global generator and neural_arch's global generator. A worker sends
    them with every batch, so a loader can resume mid-epoch with each worker's streams where the
    uninterrupted run had them (:meth:`neural_arch.data.DataLoader.state_dict`).

    Example::

        >>> state = capture_random_state()
        >>> import random; before = random.random(); restore_random_state(state)
        >>> random.random() == before
        True
    """
    from neural_arch.core.rng import get_generator

    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=False)
    return {"random": [version, list(internal), gauss],
            "numpy": {"key": legacy["state"]["key"].tolist(), "pos": int(legacy["state"]["pos"]),
                      "has_gauss": int(legacy["has_gauss"]), "gauss": float(legacy["gauss"])},
            "neural_arch": get_generator().bit_generator.state}


def restore_random_state(state: dict) -> None:
    """Set the streams :func:`capture_random_state` captured (in a worker, after its seeding and
    ``worker_init_fn``).

    Example::

        state = capture_random_state()      # in a worker, after a batch (sent with it)
        restore_random_state(state)         # in a resumed worker: its transforms draw on from there
    """
    from neural_arch.core.rng import get_generator

    version, internal, gauss = state["random"]
    random.setstate((version, tuple(internal), gauss))
    legacy = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937",
                         "state": {"key": np.asarray(legacy["key"], dtype=np.uint32), "pos": legacy["pos"]},
                         "has_gauss": legacy["has_gauss"], "gauss": legacy["gauss"]})
    get_generator().bit_generator.state = state["neural_arch"]


def seed_worker(seed: int) -> None:
    """Seed every random stream a transform might use: Python's, NumPy's legacy global one, ours."""
    from neural_arch.core.rng import manual_seed

    random.seed(seed)
    np.random.seed(seed % 2**32)
    manual_seed(seed % 2**63)


def worker_loop(worker_id: int, num_workers: int, seed: int, dataset, fetch, make_batches,
                init_fn, index_queue, result_queue, shm_prefix: str, parent_pid: int,
                random_state: dict | None = None) -> None:
    """The body of worker ``worker_id``: serve tasks until told to stop (``None``) or orphaned.

    A task is ``(key, indices)`` for a map-style dataset (``fetch(indices)`` gives the batch) or
    ``(key, None)`` for an iterable one (the next batch of ``make_batches()``, restarted by a
    ``("reset", None)`` message at each epoch). Results are ``(key, pickled payload, random
    state)``: for a map-style batch the worker's random streams right after it was made
    (:func:`capture_random_state`), else None. ``random_state``: streams to resume from, set
    after the seeding and ``worker_init_fn`` (a loader resumed mid-epoch).
    """
    from neural_arch.data.shared_batch import pack

    global _worker_info
    # At shutdown the main process stops reading: results still in the pipe must not keep us alive.
    result_queue.cancel_join_thread()
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    seed_worker(seed)
    init_error = None
    if init_fn is not None:
        try:
            init_fn(worker_id)
        except Exception as exc:  # noqa: BLE001 - reported with the first task, as torch does
            init_error = ExceptionWrapper(worker_id, exc)
    if random_state is not None:
        restore_random_state(random_state)
    batches = None
    counter = 0
    while True:
        try:
            task = index_queue.get(timeout=_POLL_S)
        except queue.Empty:
            if os.getppid() != parent_pid:  # the main process died: nobody will read our results
                return
            continue
        if task is None:
            return
        key, indices = task
        if key == "reset":
            batches = None
            continue
        if init_error is not None:
            result_queue.put((key, serialize(worker_id, init_error), None))
            continue
        try:
            if indices is not None:
                batch = fetch(indices)
            else:
                if batches is None:
                    batches = make_batches()
                try:
                    batch = next(batches)
                except StopIteration:
                    result_queue.put((key, serialize(worker_id, IterableEnd(worker_id)), None))
                    continue
            counter += 1
            payload = pack(batch, f"{shm_prefix}-{worker_id}-{counter}")
        except Exception as exc:  # noqa: BLE001 - the user's dataset may raise anything; the main process re-raises it
            payload = ExceptionWrapper(worker_id, exc)
        # where this batch left the worker's random streams (map-style: a resumed epoch restores them)
        streams = capture_random_state() if indices is not None else None
        result_queue.put((key, serialize(worker_id, payload), streams))
