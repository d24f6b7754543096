"""A DataLoader resumed mid-epoch with worker processes gives the uninterrupted epoch's batches bit
for bit, random transforms included: each worker's random streams (Python's ``random``, NumPy's legacy
global generator, neural_arch's) travel with every batch, ``state_dict`` keeps them as of each worker's
last batch yielded, and the resumed workers continue them (torchdata's ``StatefulDataLoader`` does the
same). Before, the resumed workers started freshly seeded: the same samples with other augmentations,
without a word."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import neural_arch as na
from neural_arch.data import DataLoader, Dataset

pytestmark = pytest.mark.timeout(120)


class Augmented(Dataset):
    """Every item draws from all three streams a transform may use."""

    def __len__(self):
        return 17

    def __getitem__(self, i):
        noise = np.random.rand() + random.random() + float(na.get_generator().random())
        return np.array([i + noise]), np.int64(i)


def _loader(workers: int, persistent: bool = False) -> DataLoader:
    return DataLoader(Augmented(), batch_size=3, shuffle=True, seed=5, num_workers=workers,
                      persistent_workers=persistent)


def _values(batches) -> list:
    return [b[0].numpy().copy() for b in batches]


@pytest.mark.parametrize("workers,done", [(2, 1), (3, 5)])
def test_a_mid_epoch_resume_continues_each_workers_random_streams(workers, done):
    whole = _values(_loader(workers))
    loader = _loader(workers)
    it = iter(loader)
    head = _values(next(it) for _ in range(done))
    state = json.loads(json.dumps(loader.state_dict()))      # what a checkpoint holds: plain data
    del it
    resumed = _loader(workers)
    resumed.load_state_dict(state)
    got = head + _values(resumed)
    assert len(got) == len(whole)
    for k, (a, b) in enumerate(zip(got, whole)):
        np.testing.assert_array_equal(a, b, err_msg=f"batch {k} after a resume at batch {done}")


@pytest.mark.parametrize("done", [3])
def test_persistent_workers_resume_in_their_second_epoch(done):
    """Persistent workers carry their streams across epochs: a resume at the second epoch's start or
    middle restores them too."""
    reference = _loader(2, persistent=True)
    first, second = _values(reference), _values(reference)
    loader = _loader(2, persistent=True)
    assert all(np.array_equal(a, b) for a, b in zip(_values(loader), first))
    it = iter(loader)
    head = _values(next(it) for _ in range(done))
    state = loader.state_dict()
    del it
    resumed = _loader(2, persistent=True)
    resumed.load_state_dict(state)
    got = head + _values(resumed)
    assert len(got) == len(second) and all(np.array_equal(a, b) for a, b in zip(got, second))


def test_another_worker_count_cannot_continue_the_streams_and_says_so():
    loader = _loader(2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = _loader(3)
    with pytest.warns(UserWarning, match="saved with num_workers=2.*random transforms differ"):
        other.load_state_dict(state)
    assert len(_values(other)) == len(loader) - 1     # the samples still resume exactly
