"""Property tests of DistributedSampler: no processes needed (num_replicas/rank are explicit)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neural_arch.distributed.data.sampler import DistributedSampler

sizes = st.integers(min_value=0, max_value=300)
replicas = st.integers(min_value=1, max_value=9)


def all_ranks(n, r, **kw):
    return [DistributedSampler(dataset_size=n, num_replicas=r, rank=k, **kw) for k in range(r)]


@settings(deadline=None, max_examples=80)
@given(n=sizes, r=replicas, shuffle=st.booleans(), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_padding_covers_everything_with_equal_lengths(n, r, shuffle, seed, epoch):
    samplers = all_ranks(n, r, shuffle=shuffle, seed=seed)
    for s in samplers:
        s.set_epoch(epoch)
    parts = [list(s) for s in samplers]
    lengths = {len(p) for p in parts} | {len(s) for s in samplers}
    assert len(lengths) == 1, "every rank must get the same number of indices"
    flat = [i for p in parts for i in p]
    assert set(flat) == set(range(n)), "every sample is covered"
    assert len(flat) == r * -(-n // r)  # padded to ceil(n / r) per rank
    assert all(isinstance(i, int) for i in flat)
    # only padding positions are duplicates, and padding_mask marks exactly those
    assert sum(int(s.padding_mask().sum()) for s in samplers) == samplers[0].num_padding == len(flat) - n


@settings(deadline=None, max_examples=80)
@given(n=sizes, r=replicas, shuffle=st.booleans(), seed=st.integers(0, 2**31))
def test_drop_last_is_disjoint_and_drops_less_than_a_round(n, r, shuffle, seed):
    parts = [list(s) for s in all_ranks(n, r, shuffle=shuffle, seed=seed, drop_last=True)]
    assert {len(p) for p in parts} == {n // r}
    flat = [i for p in parts for i in p]
    assert len(set(flat)) == len(flat), "drop_last never repeats a sample"
    assert set(flat) <= set(range(n))
    assert n - len(flat) < r


@settings(deadline=None, max_examples=50)
@given(n=st.integers(0, 300), r=replicas, seed=st.integers(0, 2**31), epoch=st.integers(0, 100))
def test_epochs_are_deterministic_per_seed(n, r, seed, epoch):
    a, b = all_ranks(n, r, seed=seed), all_ranks(n, r, seed=seed)
    for s in a + b:
        s.set_epoch(epoch)
    assert [list(s) for s in a] == [list(s) for s in b]


@settings(deadline=None, max_examples=50)
@given(n=st.integers(20, 300), r=replicas, seed=st.integers(0, 2**31), epoch=st.integers(0, 100))
def test_epochs_differ_for_big_enough_datasets(n, r, seed, epoch):
    s = DistributedSampler(dataset_size=n, num_replicas=r, rank=0, seed=seed)
    s.set_epoch(epoch)
    first = s.global_order().tolist()
    s.set_epoch(epoch + 1)
    assert s.global_order().tolist() != first  # 20! orders: a collision is beyond unlikely


def test_shuffle_false_is_strided_arange():
    s = DistributedSampler(range(10), num_replicas=3, rank=1, shuffle=False)
    assert list(s) == [1, 4, 7, 0]
    assert list(DistributedSampler(range(10), 3, 1, shuffle=False, drop_last=True)) == [1, 4, 7]


def test_seed_spellings_and_errors():
    # seed 002 spelling: a dataset object; seed 001 spelling: dataset_size
    assert len(DistributedSampler(list(range(7)), num_replicas=2, rank=0)) == 4
    assert len(DistributedSampler(dataset_size=7, num_replicas=2, rank=1)) == 4
    # defaults from the (absent) process group: a world of one
    s = DistributedSampler(dataset_size=5, shuffle=False)
    assert (s.num_replicas, s.rank, list(s)) == (1, 0, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="rank 2 is outside"):
        DistributedSampler(dataset_size=5, num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="dataset_size"):
        DistributedSampler()
    with pytest.raises(ValueError, match="pass only one"):
        DistributedSampler(range(4), dataset_size=5, num_replicas=1, rank=0)


def test_tiny_dataset_smaller_than_world_wraps_repeatedly():
    parts = [list(s) for s in all_ranks(2, 5, shuffle=False)]
    assert parts == [[0], [1], [0], [1], [0]]


def test_works_with_dataloader():
    from neural_arch.data import DataLoader, TensorDataset

    ds = TensorDataset(np.arange(10, dtype=np.float64)[:, None], np.arange(10))
    s = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)
    ys = [int(v) for _, y in DataLoader(ds, batch_size=2, sampler=s) for v in np.asarray(y)]
    assert ys == [1, 3, 5, 7, 9]
