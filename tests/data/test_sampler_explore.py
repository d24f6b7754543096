"""Exploring properties: ``DistributedSampler`` / ``ElasticDistributedSampler`` and ``DataLoader``
against torch's documented semantics, written out in NumPy.

torch's ``DistributedSampler``: ``num_samples = ceil(N / W)`` (``floor`` with ``drop_last``), the
epoch's order padded by wrap-around (its first indices repeated) up to ``num_samples * W`` or cut
to it, and rank ``r`` takes ``order[r::W]``. Our order is ``default_rng(seed + epoch).permutation``
(documented), so the reference below draws it the same way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch.data import DataLoader, Dataset, TensorDataset
from neural_arch.distributed.data.sampler import DistributedSampler
from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler


def _torch_reference(n, world, shuffle, seed, epoch, drop_last):
    order = np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n)
    per_rank = n // world if drop_last else math.ceil(n / world)
    total = per_rank * world
    padded = list(order)
    while len(padded) < total:  # torch: indices += indices[:padding_size], repeated if too short
        padded += list(order[:total - len(padded)])
    padded = padded[:total]
    return [padded[r::world] for r in range(world)]


@settings(max_examples=25)
@given(n=st.integers(0, 23), world=st.integers(1, 5), shuffle=st.booleans(), seed=st.integers(0, 3),
       epoch=st.integers(0, 2), drop_last=st.booleans())
@example(n=1, world=4, shuffle=False, seed=0, epoch=0, drop_last=False)   # one sample, padded 3 times
@example(n=3, world=4, shuffle=True, seed=0, epoch=1, drop_last=True)     # fewer samples than ranks
@example(n=0, world=2, shuffle=True, seed=0, epoch=0, drop_last=False)    # empty data set
def test_distributed_sampler_matches_torch_partition(n, world, shuffle, seed, epoch, drop_last):
    want = _torch_reference(n, world, shuffle, seed, epoch, drop_last)
    seen = []
    for rank in range(world):
        s = DistributedSampler(n, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        got = list(s)
        assert got == [int(i) for i in want[rank]] and len(s) == len(got)
        assert all(isinstance(i, int) for i in got)
        assert int(s.padding_mask().sum()) == sum(1 for k in range(len(got)) if rank + k * world >= n)
        seen += got
    if drop_last:
        assert len(seen) == len(set(seen)) == (n // world) * world
    else:
        assert set(seen) == set(range(n))


@settings(max_examples=25)
@given(n=st.integers(1, 23), w1=st.integers(1, 4), w2=st.integers(1, 4), batch=st.integers(1, 4),
       batches_done=st.integers(0, 6), shuffle=st.booleans(), elastic=st.booleans())
@example(n=10, w1=2, w2=3, batch=2, batches_done=1, shuffle=False, elastic=True)
def test_resume_on_another_world_sees_each_sample_once(n, w1, w2, batch, batches_done, shuffle, elastic):
    """After ``batches_done`` batches on ``w1`` ranks, the rest of the epoch on ``w2`` ranks covers exactly
    the samples not yet processed (padding duplicates aside), whichever sampler class."""
    cls = ElasticDistributedSampler if elastic else DistributedSampler
    first = [cls(n, num_replicas=w1, rank=r, shuffle=shuffle, seed=5) for r in range(w1)]
    per_rank = [list(s) for s in first]
    done_batches = min(batches_done, math.ceil(len(first[0]) / batch))
    consumed = set()
    for s, idx in zip(first, per_rank):
        if done_batches:
            s.record_batch(done_batches - 1, batch)
        consumed.update(idx[:done_batches * batch])
    states = [s.state_dict() for s in first]
    assert all(st_ == states[0] for st_ in states)
    rest = []
    for r in range(w2):
        s = cls(n, num_replicas=w2, rank=r, shuffle=False, seed=0)
        s.load_state_dict(states[0])
        mine = s.indices()
        rest += [int(i) for i, pad in zip(mine, s.padding_mask()) if not pad]
    assert len(rest) == len(set(rest))
    assert consumed | set(rest) == set(range(n))
    assert not (consumed & set(rest)) or len(consumed) + len(rest) >= n  # only padding repeats


def test_elastic_reset_repartitions_the_rest():
    s = ElasticDistributedSampler(10, num_replicas=2, rank=0, shuffle=False)
    s.record_batch(0, 2)
    s.reset(num_replicas=3, rank=1)
    assert list(s) == [5, 8]
    with pytest.raises(ValueError, match="outside"):
        s.reset(num_replicas=2, rank=2)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_replicas": 0, "rank": 0}, "num_replicas"),
    ({"num_replicas": 2, "rank": 2}, "rank"),
    ({"num_replicas": 2, "rank": -1}, "rank"),
])
def test_sampler_bad_arguments_are_clear(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedSampler(5, **kwargs)


# ---- DataLoader ----------------------------------------------------------------------------------

class _Dicts(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(2, float(i), np.float32), "y": int(i), "pair": (float(i), np.array([i, -i]))}


@settings(max_examples=25)
@given(n=st.integers(1, 17), batch=st.integers(1, 6), drop_last=st.booleans(), shuffle=st.booleans(),
       fast=st.booleans(), seed=st.integers(0, 3))
@example(n=5, batch=5, drop_last=True, shuffle=False, fast=True, seed=0)   # one full batch, nothing dropped
@example(n=4, batch=6, drop_last=True, shuffle=True, fast=False, seed=0)   # everything dropped
def test_dataloader_batches_match_reference(n, batch, drop_last, shuffle, fast, seed):
    x = np.arange(n * 3, dtype=np.float64).reshape(n, 3)
    y = np.arange(n, dtype=np.int64)
    ds = TensorDataset(x, y) if fast else _Dicts(n)
    loader = DataLoader(ds, batch_size=batch, shuffle=shuffle, drop_last=drop_last, generator=na.Generator().manual_seed(seed))
    twin = DataLoader(ds, batch_size=batch, shuffle=shuffle, drop_last=drop_last, generator=na.Generator().manual_seed(seed))
    batches = list(loader)
    assert len(batches) == len(loader) == (n // batch if drop_last else math.ceil(n / batch))
    order = []
    for b in batches:
        if fast:
            bx, by = b
            np.testing.assert_array_equal(bx.data, x[by.data])
            ids = by.data.tolist()
        else:
            ids = b["y"].data.tolist()
            assert b["x"].data.dtype == np.float32 and b["x"].shape == (len(ids), 2)
            np.testing.assert_array_equal(b["x"].data[:, 0], ids)
            assert isinstance(b["pair"], tuple)
            np.testing.assert_array_equal(b["pair"][0].data, ids)
            np.testing.assert_array_equal(b["pair"][1].data, np.stack([ids, [-i for i in ids]], 1))
        assert len(ids) == batch or (not drop_last and b is batches[-1])
        order += ids
    assert len(order) == len(set(order))
    if not drop_last:
        assert sorted(order) == list(range(n))
    if not shuffle:
        assert order == list(range(len(order)))
    twin_order = [int(i) for b in twin for i in (b[1].data if fast else b["y"].data)]
    assert twin_order == order  # the same generator seed gives the same epoch


@settings(max_examples=10)
@given(n=st.integers(2, 13), batch=st.integers(1, 4), stop=st.integers(0, 4))
def test_dataloader_state_dict_resumes_the_epoch(n, batch, stop):
    ds = TensorDataset(np.arange(n, dtype=np.float64))
    loader = DataLoader(ds, batch_size=batch, shuffle=True, seed=3)
    full = [b[0].data.tolist() for b in DataLoader(ds, batch_size=batch, shuffle=True, seed=3)]
    stop = min(stop, len(full))
    it = iter(loader)
    head = [next(it)[0].data.tolist() for _ in range(stop)]
    state = loader.state_dict()
    resumed = DataLoader(ds, batch_size=batch, shuffle=True, seed=99)
    resumed.load_state_dict(state)
    assert head + [b[0].data.tolist() for b in resumed] == full


def test_dataloader_with_distributed_sampler_len_and_content():
    ds = TensorDataset(np.arange(7, dtype=np.float64))
    got = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=False)
        loader = DataLoader(ds, batch_size=2, sampler=sampler)
        assert len(loader) == 2
        got.append([b[0].data.tolist() for b in loader])
    assert got == [[[0.0, 3.0], [6.0]], [[1.0, 4.0], [0.0]], [[2.0, 5.0], [1.0]]]


def test_default_collate_keeps_namedtuples_and_rejects_ragged_samples():
    """torch keeps a namedtuple's type; samples whose fields or keys differ used to be cut to the
    shortest (zip) or to the first sample's keys without a word."""
    import collections

    from neural_arch.data import default_collate

    Pair = collections.namedtuple("Pair", "x y")
    batch = default_collate([Pair(np.ones(2), 1), Pair(np.zeros(2), 2)])
    assert type(batch) is Pair and batch.x.shape == (2, 2) and batch.y.data.tolist() == [1, 2]
    with pytest.raises(ValueError, match="numbers of fields"):
        default_collate([(1, 2), (1, 2, 3)])
    with pytest.raises(ValueError, match="different keys"):
        default_collate([{"a": 1}, {"a": 1, "b": 2}])


@pytest.mark.parametrize("yielded", [3, 6])
def test_sampler_whose_len_disagrees_with_its_indices_is_a_clear_error(yielded):
    """Indices past ``len(sampler)`` used to be dropped without a word (too few: a bare NumPy error)."""

    class Sampler:
        def __len__(self):
            return 4

        def __iter__(self):
            return iter(range(yielded))

    loader = DataLoader(TensorDataset(np.arange(8.0)), batch_size=2, sampler=Sampler())
    with pytest.raises(ValueError, match="len"):
        list(loader)


@pytest.mark.parametrize("processed", [-1, -7, 11])
def test_a_resume_state_with_processed_outside_the_epoch_is_a_clear_error(processed):
    """A negative count used to resume from the end of the order (Python slicing) without a word."""
    sampler = DistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
    state = dict(sampler.state_dict(), processed=processed)
    with pytest.raises(ValueError, match="'processed' is"):
        sampler.load_state_dict(state)
    assert list(sampler) == [0, 2, 4, 6, 8]       # untouched


def test_recording_a_negative_count_is_a_clear_error():
    sampler = DistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
    sampler.record_samples(3)
    with pytest.raises(ValueError, match="count must be >= 0"):
        sampler.record_samples(-2)
    assert sampler.processed_samples() == 6       # unchanged: 3 samples on each of 2 ranks
