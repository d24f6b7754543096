"""Exploring properties of the data utilities a ported PyTorch script uses, against plain NumPy.

``TensorDataset``, ``Subset``, ``DataLoader`` (map-style and ``IterableDataset``, 0 or more workers),
``default_collate``: each batch is compared with rows picked out of the arrays by NumPy, and bad input
(float or boolean indices, a ``batch_size`` torch refuses, string arrays) must be a clear error at the
call, never a quietly different result. The contract is torch's documented semantics.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    get_worker_info,
    random_split,
)


class _Doubled(TensorDataset):
    """A transform in a ``TensorDataset`` subclass: what a ported script writes for augmentation."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return 2 * x, y


def _rows(loader):
    """The epoch's batches as lists of (x, y) NumPy arrays."""
    return [(x.numpy(), y.numpy()) for x, y in loader]


def _reference(x, y, order, batch, drop_last):
    stop = len(order) // batch * batch if drop_last else len(order)
    return [(x[order[i:i + batch]], y[order[i:i + batch]]) for i in range(0, stop, batch)]


def _assert_same_batches(got, want):
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert gx.dtype == wx.dtype and gy.dtype == wy.dtype
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


@settings(max_examples=25)
@given(n=st.integers(0, 11), batch=st.integers(1, 5), drop_last=st.booleans(), shuffle=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 3), transform=st.booleans())
@example(n=4, batch=2, drop_last=False, shuffle=False, dtype=np.float64, seed=0, transform=True)  # bug 1
@example(n=1, batch=3, drop_last=True, shuffle=True, dtype=np.float32, seed=0, transform=False)   # all dropped
@example(n=0, batch=1, drop_last=False, shuffle=True, dtype=np.float32, seed=0, transform=True)   # empty
def test_loader_batches_are_the_rows_numpy_picks(n, batch, drop_last, shuffle, dtype, seed, transform):
    """Batches equal ``x[order[i:i+b]]`` (order: the epoch's permutation, read off the labels); a
    ``TensorDataset`` subclass overriding ``__getitem__`` has it applied (it used to be skipped by the
    gather fast path: the loader served untransformed rows)."""
    x = np.arange(n * 3, dtype=dtype).reshape(n, 3) - 4.5
    y = np.arange(n, dtype=np.int64)
    ds = _Doubled(x, y) if transform else TensorDataset(x, y)
    loader = DataLoader(ds, batch_size=batch, shuffle=shuffle, drop_last=drop_last, seed=seed)
    got = _rows(loader)
    assert len(got) == len(loader) == (n // batch if drop_last else math.ceil(n / batch))
    order = np.concatenate([gy for _, gy in got]) if got else np.zeros(0, np.int64)
    if not shuffle:
        assert order.tolist() == list(range(len(order)))
    assert sorted(order.tolist()) == (sorted(order.tolist()) if drop_last else list(range(n)))
    _assert_same_batches(got, _reference(2 * x if transform else x, y, order, batch, drop_last))


@settings(max_examples=25)
@given(n=st.integers(1, 9), data=st.data(), batch=st.integers(1, 4), transform=st.booleans())
@example(n=3, data=None, batch=2, transform=True)
def test_subset_matches_numpy_indexing(n, data, batch, transform):
    """``Subset(ds, idx)`` (negative and repeated indices, empty) serves ``x[idx]`` item by item and
    through the loader, and a Subset of a transforming subclass keeps the transform."""
    idx = [-1, 0, -1] if data is None else data.draw(st.lists(st.integers(-n, n - 1), max_size=6))
    x = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    y = np.arange(n, dtype=np.int64)
    ds = _Doubled(x, y) if transform else TensorDataset(x, y)
    part = Subset(ds, idx)
    assert len(part) == len(idx)
    for k, i in enumerate(idx):
        np.testing.assert_array_equal(part[k][0], (2 if transform else 1) * x[i])
    want = _reference((2 if transform else 1) * x, y, np.array(idx, dtype=np.int64), batch, False)
    _assert_same_batches(_rows(DataLoader(part, batch_size=batch)), want)
    nested = Subset(part, list(range(len(idx)))[::-1])
    _assert_same_batches(_rows(DataLoader(nested, batch_size=batch)),
                         _reference((2 if transform else 1) * x, y, np.array(idx[::-1], dtype=np.int64), batch, False))


@pytest.mark.parametrize("indices, match", [
    (np.array([True, False, True]), "booleans"),    # read as indices [1, 0, 1] before
    ([1.7], "integers"),                            # truncated to [1] before
    (na.tensor([0.5]), "integers"),
    ([[0, 1]], "one-dimensional"),
])
def test_subset_refuses_masks_and_float_indices(indices, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Subset(TensorDataset(np.arange(5)), indices)


def test_subset_accepts_integer_arrays_tensors_and_empty():
    ds = TensorDataset(np.arange(5) * 10)
    kinds = (np.array([3], np.int32), na.tensor([4]), [np.int64(1)])
    assert [int(Subset(ds, ix)[0][0]) for ix in kinds] == [30, 40, 10]
    assert len(Subset(ds, [])) == 0 and list(DataLoader(Subset(ds, []), batch_size=2)) == []


def test_tensor_dataset_length_mismatch_and_zero_d_are_errors():
    with pytest.raises(ValueError, match="same"):
        TensorDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="same"):
        TensorDataset(np.zeros(3), np.float64(1.0))
    with pytest.raises(ValueError, match="at least one"):
        TensorDataset()


@pytest.mark.parametrize("batch_size", [2.5, True, 0, -1, "2"])
def test_batch_size_that_torch_refuses_is_a_clear_error(batch_size):
    """``int(2.5)`` was quietly 2 and ``True`` 1."""
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(TensorDataset(np.arange(4)), batch_size=batch_size)


def test_integer_like_batch_size_is_accepted():
    assert len(DataLoader(TensorDataset(np.arange(5)), batch_size=np.int64(2))) == 3


@pytest.mark.parametrize("index", [0.9, np.float64(1.0), [0, 1]])
def test_sampler_yielding_a_non_integer_is_a_clear_error(index):
    """A float index was truncated (0.9 served sample 0) without a word; torch's indexing refuses it."""
    with pytest.raises(TypeError, match="integer"):
        list(DataLoader(TensorDataset(np.arange(3)), sampler=[index, 1], batch_size=2))


def test_sampler_integer_kinds_and_negative_indices_index_like_numpy():
    loader = DataLoader(TensorDataset(np.arange(3) * 10), sampler=[np.int32(2), -1, 0], batch_size=2)
    assert [b[0].tolist() for b in loader] == [[20, 20], [0]]


@pytest.mark.parametrize("kwargs, match", [
    ({"sampler": [0, 1], "shuffle": True}, "mutually exclusive"),
    ({"prefetch_factor": 2}, "num_workers > 0"),
    ({"persistent_workers": True}, "num_workers > 0"),
    ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
    ({"timeout": -1}, "timeout"),
    ({"num_workers": -1}, "num_workers"),
    ({"num_workers": 1.5}, "num_workers"),                                    # int() made it 1 worker
    ({"num_workers": 1, "prefetch_factor": 2.5}, "prefetch_factor"),
    ({"seed": 1, "generator": na.Generator().manual_seed(2)}, "not both"),   # the seed was silently ignored
])
def test_exclusive_or_invalid_options_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(TensorDataset(np.arange(3)), **kwargs)


def test_default_collate_keeps_dtypes_and_strings_like_torch():
    for dtype in (np.float32, np.float64, np.int32, np.bool_):
        batch = default_collate([np.zeros(2, dtype), np.ones(2, dtype)])
        assert batch.dtype == dtype and batch.shape == (2, 2)
    assert default_collate([np.float32(1), np.float32(2)]).dtype == np.float32
    assert default_collate([1, 2]).dtype == np.int64 and default_collate([1.0, 2]).dtype == np.float64
    # numpy strings are strings (torch's rule), not a Tensor of dtype <U1; bytes likewise
    assert default_collate([np.str_("a"), np.str_("b")]) == ["a", "b"]
    assert default_collate([b"a", b"b"]) == [b"a", b"b"]
    for items in ([np.array(["a"]), np.array(["b"])], [np.array([None]), np.array([1])], [1, "a"], [2**70, 1]):
        with pytest.raises(TypeError, match="numbers"):
            default_collate(items)


class _Stream(IterableDataset):
    """0..n-1, each worker taking every num_workers-th item (torch's documented sharding recipe)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(first, self.n, step))


class _SizedStream(_Stream):
    def __len__(self):
        return self.n


def _torch_iterable_order(n, batch, workers, drop_last):
    """torch: each worker batches its own shard; batches come round-robin, skipping finished workers."""
    per_worker = []
    for w in range(max(workers, 1)):
        items = list(range(w, n, max(workers, 1)))
        stop = len(items) // batch * batch if drop_last else len(items)
        per_worker.append([items[i:i + batch] for i in range(0, stop, batch)])
    out, k = [], 0
    while any(k < len(b) for b in per_worker):
        out += [b[k] for b in per_worker if k < len(b)]
        k += 1
    return out


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_iterable_dataset_batches_follow_torchs_round_robin(workers):
    for n, batch, drop_last in ((7, 2, False), (7, 2, True), (2, 3, False)):
        loader = DataLoader(_Stream(n), batch_size=batch, drop_last=drop_last, num_workers=workers)
        assert [b.tolist() for b in loader] == _torch_iterable_order(n, batch, workers, drop_last)


def test_len_of_a_loader_over_an_iterable_dataset():
    assert len(DataLoader(_SizedStream(7), batch_size=2)) == 4
    assert len(DataLoader(_SizedStream(7), batch_size=2, drop_last=True)) == 3
    with pytest.raises(TypeError, match="no __len__"):
        len(DataLoader(_Stream(7), batch_size=2))
    with pytest.raises(ValueError, match="IterableDataset"):
        DataLoader(_Stream(3), shuffle=True)


class _Records(Dataset):
    def __len__(self):
        return 7

    def __getitem__(self, i):
        return {"x": np.full(2, i, np.float64), "y": i}


def _pick_y(items):
    return [item["y"] for item in items]


def test_workers_give_the_batches_and_order_of_one_process():
    """Shuffled map-style data, a custom collate_fn and the transform subclass: 2 workers serve what
    the loading process would, in the same order."""
    for kwargs in ({"dataset": _Records(), "collate_fn": _pick_y, "batch_size": 3, "shuffle": True},
                   {"dataset": _Records(), "collate_fn": _pick_y,
                    "batch_sampler": [[6, 0], [1], [5, 4, 3, 2]]},   # a batch sampler: any iterable of lists
                   {"dataset": _Doubled(np.arange(7.0), np.arange(7)), "batch_size": 3, "shuffle": True}):
        batches = []
        for workers in (0, 2):
            loader = DataLoader(seed=4, num_workers=workers, **kwargs)
            batches.append([b if isinstance(b, list) else [t.tolist() for t in b] for b in loader])
        assert batches[0] == batches[1]
    assert batches[0][0][0] == [2 * i for i in batches[0][0][1]]  # the transform ran in the workers too


def test_generator_makes_the_shuffle_reproducible():
    ds = TensorDataset(np.arange(9))

    def epochs(seed):
        loader = DataLoader(ds, batch_size=4, shuffle=True, generator=na.Generator().manual_seed(seed))
        return [[b[0].tolist() for b in loader] for _ in range(2)]

    first = epochs(5)
    assert first == epochs(5) and first[0] != first[1]
    assert all(sorted(i for b in e for i in b) == list(range(9)) for e in first)


class _FreshRandomOrder:
    """A random sampler without state_dict: each iter() draws a new permutation (torch's RandomSampler
    written by hand, as ported scripts do)."""

    def __init__(self, n, seed=None):
        self.n, self.rng = n, np.random.default_rng(seed)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())


@pytest.mark.parametrize("stop", [0, 1, 2])
def test_resuming_a_stateless_sampler_is_exact_or_a_clear_error(stop):
    """Mid-epoch resume with a sampler that has no state redraws its order and skips what was seen: a
    deterministic sampler resumes exactly; a random one used to repeat some samples and miss others
    (resumed with batches [0, 0, 1, 2, 2, 3, 5, 6] of 0..7), now it is a ValueError."""
    ds = TensorDataset(np.arange(8))
    for sampler, twin, deterministic in (([5, 1, 7, 0, 2, 3, 6, 4],) * 2 + (True,),
                                         (_FreshRandomOrder(8, 0), _FreshRandomOrder(8, 1), False)):
        loader = DataLoader(ds, batch_size=3, sampler=sampler)
        it = iter(loader)
        head = [next(it)[0].tolist() for _ in range(stop)]
        resumed = DataLoader(ds, batch_size=3, sampler=twin)
        resumed.load_state_dict(loader.state_dict())
        if deterministic or stop == 0:
            rest = [b[0].tolist() for b in resumed]
            assert sorted(i for b in head + rest for i in b) == list(range(8))
        else:
            with pytest.raises(ValueError, match="another order"):
                list(resumed)


@settings(max_examples=25)
@given(sizes=st.lists(st.integers(0, 4), min_size=1, max_size=4), batch=st.integers(1, 4), seed=st.integers(0, 3))
@example(sizes=[2, 0, 3], batch=2, seed=0)   # an empty member in the middle
@example(sizes=[0, 0], batch=1, seed=0)      # nothing at all
def test_concat_dataset_is_numpy_concatenate(sizes, batch, seed):
    """Item ``i`` (negative too) of ``ConcatDataset`` is ``np.concatenate(arrays)[i]``; the loader's
    shuffled batches are rows of the concatenation; out-of-range indices raise torch's errors."""
    arrays = [np.arange(k, dtype=np.float64) + 10 * m for m, k in enumerate(sizes)]
    whole = np.concatenate(arrays)
    parts = [TensorDataset(a, np.arange(len(a))) for a in arrays]
    both = ConcatDataset(parts)
    n = len(whole)
    assert len(both) == n and both.cumulative_sizes == np.cumsum(sizes).tolist()
    assert [float(both[i][0]) for i in range(-n, n)] == whole[list(range(-n, n))].tolist()
    with pytest.raises(IndexError):
        both[n]
    with pytest.raises(ValueError, match="exceeds"):
        both[-n - 1]
    summed = parts[0]
    for part in parts[1:]:
        summed = summed + part  # Dataset.__add__, as torch's
    assert len(summed) == n and [float(summed[i][0]) for i in range(n)] == whole.tolist()
    for x, _ in DataLoader(both, batch_size=batch, shuffle=True, seed=seed):
        assert x.dtype == np.float64 and set(x.tolist()) <= set(whole.tolist())
    served = [v for x, _ in DataLoader(both, batch_size=batch, shuffle=True, seed=seed) for v in x.tolist()]
    assert sorted(served) == sorted(whole.tolist())


def test_concat_dataset_refuses_nothing_and_streams():
    with pytest.raises(ValueError, match="empty"):
        ConcatDataset([])
    with pytest.raises(TypeError, match="IterableDataset"):
        ConcatDataset([TensorDataset(np.arange(2)), _Stream(3)])


def _torch_split_lengths(n, lengths):
    """torch.utils.data.random_split's lengths, written out: fractions summing to 1 give floor(n * f),
    the remainder handed out round-robin from the first split."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts = [math.floor(n * f) for f in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        return counts
    return list(lengths)


_FRACTIONS = [[0.5, 0.5], [0.3, 0.3, 0.4], [1], [1, 0], [0.1] * 10, [0.7, 0.2, 0.1], [1 / 3] * 3, [0.25, 0.75]]


@settings(max_examples=25)
@given(n=st.integers(0, 12), data=st.data(), fractions=st.booleans(), seed=st.integers(0, 3))
@example(n=10, data=None, fractions=True, seed=0)   # [1/3] * 3 of 10: 4, 3, 3 (remainder round-robin)
def test_random_split_lengths_cover_and_reproduce_like_torch(n, data, fractions, seed):
    if data is None:
        lengths = [1 / 3] * 3
    elif fractions:
        lengths = data.draw(st.sampled_from(_FRACTIONS))
    else:
        cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=0, max_size=3)))
        lengths = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
    want = _torch_split_lengths(n, lengths)
    ds = TensorDataset(np.arange(n) * 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty split warns, as in torch
        splits = random_split(ds, lengths, generator=na.Generator().manual_seed(seed))
        again = random_split(ds, lengths, generator=na.Generator().manual_seed(seed))
    assert [len(s) for s in splits] == want
    served = [int(s[i][0]) for s in splits for i in range(len(s))]
    assert sorted(served) == [10 * i for i in range(n)]  # disjoint, and every item once
    assert [s.indices.tolist() for s in splits] == [s.indices.tolist() for s in again]


@pytest.mark.parametrize("lengths, match", [
    ([2, 2], "does not equal"),               # torch's error: the lengths do not sum to len(dataset)
    ([-1, 6], "non-negative"),                # sums to 5, but a negative split would take the wrong items
    ([2.5, 2.5], "non-negative integers"),    # sums to 5: neither counts nor fractions
    ([1.5, -0.5], "between 0 and 1"),         # sums to 1: fractions, one out of range
    ([0.5, 0.4], "fractions summing to 1"),  # torch: "does not equal"; ours names the fraction rule
    ([], "empty"),
])
def test_random_split_bad_lengths_are_clear_errors(lengths, match):
    with pytest.raises(ValueError, match=match):
        random_split(TensorDataset(np.arange(5)), lengths)


def test_random_split_follows_manual_seed_and_warns_on_an_empty_split():
    ds = TensorDataset(np.arange(6))
    na.manual_seed(3)
    first = [s.indices.tolist() for s in random_split(ds, [4, 2])]
    na.manual_seed(3)
    assert [s.indices.tolist() for s in random_split(ds, [4, 2])] == first
    with pytest.warns(UserWarning, match="index 1 is 0"):
        random_split(TensorDataset(np.arange(1)), [0.5, 0.5])


@settings(max_examples=25)
@given(n=st.integers(1, 7), replacement=st.booleans(), num_samples=st.one_of(st.none(), st.integers(1, 17)),
       seed=st.integers(0, 3))
@example(n=3, replacement=False, num_samples=7, seed=0)   # more than n without replacement: 2 permutations + 1
def test_random_sampler_draws_like_torch(n, replacement, num_samples, seed):
    """Without replacement: whole permutations, the last one cut short (torch's rule); with replacement:
    ``num_samples`` draws in range. Reproducible with a generator seed."""
    def draw():
        return list(RandomSampler(range(n), replacement, num_samples, generator=na.Generator().manual_seed(seed)))

    order = draw()
    count = n if num_samples is None else num_samples
    assert len(order) == count == len(RandomSampler(range(n), replacement, num_samples))
    assert all(type(i) is int and 0 <= i < n for i in order) and order == draw()
    if not replacement:
        for start in range(0, count, n):
            block = order[start:start + n]
            assert len(set(block)) == len(block)
            assert len(block) < n or sorted(block) == list(range(n))


@settings(max_examples=25)
@given(weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=6), data=st.data(),
       replacement=st.booleans())
def test_weighted_random_sampler_never_draws_a_zero_weight(weights, data, replacement):
    nonzero = [i for i, w in enumerate(weights) if w > 0]
    if not nonzero:  # all zero: torch fails only when iterating, here at once
        with pytest.raises(ValueError, match="not all zero"):
            WeightedRandomSampler(weights, 1)
        return
    limit = 12 if replacement else len(nonzero)
    count = data.draw(st.integers(1, limit))
    draws = list(WeightedRandomSampler(weights, count, replacement, generator=na.Generator().manual_seed(1)))
    assert len(draws) == count and set(draws) <= set(nonzero)
    if not replacement:
        assert len(set(draws)) == count
    if not replacement and len(nonzero) < len(weights):  # torch would pad with zero-weight indices
        with pytest.raises(ValueError, match="without replacement"):
            WeightedRandomSampler(weights, len(nonzero) + 1, replacement=False)


def test_weighted_random_sampler_follows_the_weights():
    draws = list(WeightedRandomSampler([1.0, 3.0], 4000, generator=na.Generator().manual_seed(0)))
    assert abs(draws.count(1) / 4000 - 0.75) < 0.03  # binomial sd 0.007: a 4-sigma band


@pytest.mark.parametrize("make, error, match", [
    (lambda: RandomSampler(range(3), replacement=1), TypeError, "boolean"),
    (lambda: RandomSampler(range(3), num_samples=0), ValueError, "positive integer"),
    (lambda: RandomSampler(range(3), num_samples=2.0), ValueError, "positive integer"),
    (lambda: RandomSampler(range(0)), ValueError, "positive integer"),
    (lambda: WeightedRandomSampler([1.0, -2.0], 2), ValueError, "non-negative"),
    (lambda: WeightedRandomSampler([1.0, float("nan")], 2), ValueError, "finite"),
    (lambda: WeightedRandomSampler([[1.0, 2.0]], 2), ValueError, "1d"),
    (lambda: WeightedRandomSampler([1.0, 2.0], True), ValueError, "positive integer"),
    (lambda: WeightedRandomSampler([1.0, 2.0], 2, replacement=1), ValueError, "boolean"),
    (lambda: BatchSampler(range(3), 2, 1), ValueError, "boolean"),
    (lambda: BatchSampler(range(3), True, False), ValueError, "positive integer"),
    (lambda: SubsetRandomSampler([0.5, 1.0]), TypeError, "integers"),
])
def test_sampler_arguments_torch_refuses_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


@settings(max_examples=25)
@given(n=st.integers(0, 9), batch=st.integers(1, 4), drop_last=st.booleans(), shuffled=st.booleans())
@example(n=5, batch=5, drop_last=True, shuffled=False)
def test_batch_sampler_and_the_loader_serve_its_batches(n, batch, drop_last, shuffled):
    x = np.arange(n, dtype=np.float32) * 3
    ds = TensorDataset(x)
    inner = np.random.default_rng(2).permutation(n).tolist() if shuffled else SequentialSampler(ds)
    order = list(inner)
    stop = n // batch * batch if drop_last else n
    want = [order[i:i + batch] for i in range(0, stop, batch)]
    sampler = BatchSampler(inner, batch, drop_last)
    assert list(sampler) == want and len(sampler) == len(want)
    loader = DataLoader(ds, batch_sampler=sampler)
    assert len(loader) == len(want) and loader.batch_size is None
    got = [b[0].numpy() for b in loader]
    assert [g.tolist() for g in got] == [x[w].tolist() for w in want] and all(g.dtype == np.float32 for g in got)


@pytest.mark.parametrize("kwargs", [{"batch_size": 2}, {"shuffle": True}, {"sampler": [0, 1]}, {"drop_last": True},
                                    {"batch_size": None}])
def test_batch_sampler_is_mutually_exclusive_like_torch(kwargs):
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(TensorDataset(np.arange(4)), batch_sampler=[[0, 1], [2, 3]], **kwargs)


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_yields_converted_samples_like_torch(workers):
    """``batch_size=None`` (torch: automatic batching off; it used to fail with ``int() argument must be
    ...``): one sample per step, arrays made Tensors, a tuple sample a list (torch's default_convert)."""
    x, y = np.arange(6.0).reshape(3, 2), np.arange(3)
    loader = DataLoader(_Doubled(x, y), batch_size=None, shuffle=True, seed=1, num_workers=workers)
    got = list(loader)
    assert len(loader) == len(got) == 3
    for sample in got:
        assert type(sample) is list and [type(t) for t in sample] == [na.Tensor, na.Tensor]
        assert sample[0].shape == (2,) and sample[0].tolist() == (2 * x[int(sample[1].item())]).tolist()
    assert sorted(int(s[1].item()) for s in got) == [0, 1, 2]
    stream = list(DataLoader(_Stream(5), batch_size=None, num_workers=workers))
    assert stream == [0, 1, 2, 3, 4] and all(type(i) is int for i in stream)  # Python numbers stay (torch)
    with pytest.raises(ValueError, match="drop_last"):
        DataLoader(TensorDataset(x), batch_size=None, drop_last=True)


def test_default_convert_follows_torch():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    assert type(default_convert(np.float32(2))) is na.Tensor and default_convert(3) == 3
    assert default_convert("s") == "s" and default_convert(np.array(["a"])).dtype.kind == "U"
    pair = default_convert(Pair(np.ones(1), 2))
    assert type(pair) is Pair and type(pair.a) is na.Tensor and pair.b == 2
    assert type(default_convert({"k": np.ones(1)})["k"]) is na.Tensor
    assert type(default_convert((np.ones(1), 1))) is list  # torch's rule: a tuple comes back a list
