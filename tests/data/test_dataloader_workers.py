"""DataLoader worker processes: same batches as num_workers=0, deterministic seeding, a worker's
exception or death reported (never a hang), workers reaped, IterableDataset sharded per worker."""

import multiprocessing
import os
import random
import signal
import time

import numpy as np
import pytest

from neural_arch.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info


class Rows(Dataset):
    """A Python-level dataset (no fast path): item i is (a row filled with i, i)."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(3, i, dtype=np.float64), i


def _batches(loader):
    return [tuple(np.asarray(t.data).copy() for t in b) for b in loader]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_workers_give_the_batches_of_one_process(num_workers):
    kw = {"batch_size": 4, "shuffle": True, "seed": 3}
    _assert_same(_batches(DataLoader(Rows(), num_workers=num_workers, **kw)), _batches(DataLoader(Rows(), **kw)))
    # large batches travel through shared memory (the fast path's arrays, collated in the worker)
    big = TensorDataset(np.random.default_rng(0).normal(size=(40, 2048)), np.arange(40))
    kw = {"batch_size": 8, "shuffle": True, "seed": 1, "drop_last": True}
    _assert_same(_batches(DataLoader(big, num_workers=num_workers, **kw)), _batches(DataLoader(big, **kw)))
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"na-dl-{os.getpid()}-")]


class Seeded(Dataset):
    """Draws from every stream a transform might use; reports the worker that served it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return (np.array([random.random(), np.random.random()]),
                np.array([info.id, info.seed, info.num_workers, getattr(info.dataset, "init_by", -1)]))


def _mark(worker_id):
    get_worker_info().dataset.init_by = worker_id


def test_worker_seeding_is_deterministic_and_per_worker():
    def run(seed):
        loader = DataLoader(Seeded(), batch_size=2, num_workers=2, seed=seed, worker_init_fn=_mark)
        batches = list(loader)
        return np.concatenate([d.data for d, _ in batches]), np.concatenate([i.data for _, i in batches])

    (a, info), (b, _), (c, _) = run(5), run(5), run(6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    worker = info[:, 0]
    assert worker.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]          # batch k goes to worker k % 2
    assert (info[:, 1] == info[0, 1] + worker).all() and (info[:, 2] == 2).all()
    assert (info[:, 3] == worker).all()                         # worker_init_fn ran in each worker
    assert not np.array_equal(a[worker == 0][:2], a[worker == 1][:2])  # workers draw different numbers


class Failing(Rows):
    def __getitem__(self, i):
        if i == 5:
            raise ValueError(f"cannot decode sample {i}")
        return super().__getitem__(i)


def test_worker_exception_is_raised_with_its_traceback():
    with pytest.raises(ValueError) as info:
        list(DataLoader(Failing(), batch_size=2, num_workers=2))
    text = str(info.value)
    assert "in DataLoader worker process 0" in text and "cannot decode sample 5" in text
    assert "__getitem__" in text and "Traceback" in text
    assert not multiprocessing.active_children()


class KilledInWorker1(Rows):
    def __getitem__(self, i):
        if get_worker_info().id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class Slow(Rows):
    def __getitem__(self, i):
        time.sleep(0.3)
        return super().__getitem__(i)


def test_dead_or_slow_worker_is_an_error_not_a_hang():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker 1 \(pid \d+\) exited unexpectedly with exit code -9 "
                                           r"\(killed by signal SIGKILL\)"):
        list(DataLoader(KilledInWorker1(), batch_size=2, num_workers=2))
    assert time.monotonic() - start < 10
    assert not multiprocessing.active_children()
    with pytest.raises(RuntimeError, match="timed out after 0.1 seconds"):
        list(DataLoader(Slow(), batch_size=1, num_workers=1, timeout=0.1, prefetch_factor=1))
    assert not multiprocessing.active_children()


class Stream(IterableDataset):
    """0..n-1, each worker taking every num_workers-th item (the user's sharding, as in torch)."""

    def __init__(self, n=11):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


def test_iterable_dataset_sharded_across_workers():
    single = [b.data.tolist() for b in DataLoader(Stream(), batch_size=2)]
    assert single == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10]]
    sharded = [b.data.tolist() for b in DataLoader(Stream(), batch_size=2, num_workers=2)]
    assert sharded == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9]]   # batches alternate between workers
    with pytest.raises(ValueError, match="IterableDataset"):
        DataLoader(Stream(), shuffle=True)


def test_persistent_workers_live_across_epochs_and_are_reaped():
    loader = DataLoader(Stream(), batch_size=3, num_workers=2, persistent_workers=True)
    first = [b.data.tolist() for b in loader]
    pids = [p.pid for p in loader._pool.procs]
    assert [b.data.tolist() for b in loader] == first
    assert [p.pid for p in loader._pool.procs] == pids and all(p.is_alive() for p in loader._pool.procs)
    del loader
    assert not multiprocessing.active_children()
    loader = DataLoader(Rows(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    assert len(multiprocessing.active_children()) == 2
    del it                                                      # an abandoned epoch reaps its workers
    assert not multiprocessing.active_children()


def test_a_batch_that_cannot_be_pickled_is_an_error_not_a_hang():
    loader = DataLoader(Rows(4), batch_size=2, num_workers=1, collate_fn=lambda items: (lambda: items))
    with pytest.raises(Exception, match="in DataLoader worker process 0"):
        list(loader)
    assert not multiprocessing.active_children()
