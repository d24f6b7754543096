"""Datasets and DataLoader: collation, determinism per seed, reshuffling, samplers, fast path."""

import numpy as np
import pytest

from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import (
    DataLoader,
    Dataset,
    Subset,
    TensorDataset,
    default_collate,
    load_digits,
    make_classification_data,
    make_token_sequences,
)


def _ds(n=10):
    return TensorDataset(np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n))


class ListDataset(Dataset):
    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return np.full(2, i, dtype=np.float32), i

    def __len__(self):
        return self.n


def _epoch(loader):
    return np.concatenate([y.data for _, y in loader])


def test_tensor_dataset_and_errors():
    ds = _ds()
    x, y = ds[3]
    assert x.tolist() == [6.0, 7.0] and int(y) == 3
    assert len(TensorDataset(Tensor(np.zeros((4, 2))))) == 4
    with pytest.raises(ValueError, match="first dimension"):
        TensorDataset(np.zeros(3), np.zeros(4))


def test_sequential_batches_and_len():
    loader = DataLoader(_ds(10), batch_size=4)
    assert len(loader) == 3
    batches = list(loader)
    assert [tuple(x.shape) for x, _ in batches] == [(4, 2), (4, 2), (2, 2)]
    assert isinstance(batches[0][0], Tensor) and batches[0][1].dtype == np.int64
    assert _epoch(loader).tolist() == list(range(10))
    dropped = DataLoader(_ds(10), batch_size=4, drop_last=True)
    assert len(dropped) == 2 and len(list(dropped)) == 2


def test_shuffle_deterministic_per_seed_and_reshuffles():
    a = DataLoader(_ds(20), batch_size=3, shuffle=True, seed=7)
    b = DataLoader(_ds(20), batch_size=3, shuffle=True, seed=7)
    e1, e2 = _epoch(a), _epoch(a)
    assert sorted(e1.tolist()) == list(range(20))
    assert not np.array_equal(e1, e2)  # a new order each epoch
    np.testing.assert_array_equal(e1, _epoch(b))
    np.testing.assert_array_equal(e2, _epoch(b))
    c = DataLoader(_ds(20), batch_size=3, shuffle=True, seed=8)
    assert not np.array_equal(e1, _epoch(c))
    manual_seed(1)
    d1 = _epoch(DataLoader(_ds(20), batch_size=3, shuffle=True))
    manual_seed(1)
    d2 = _epoch(DataLoader(_ds(20), batch_size=3, shuffle=True))
    np.testing.assert_array_equal(d1, d2)


def test_fast_path_matches_generic_path():
    x = np.random.default_rng(0).normal(size=(17, 3)).astype(np.float32)
    y = np.arange(17)
    fast = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True, seed=3)
    slow = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True, seed=3, collate_fn=default_collate)
    assert fast._fast and not slow._fast
    for (fx, fy), (sx, sy) in zip(fast, slow):
        np.testing.assert_array_equal(fx.data, sx.data)
        np.testing.assert_array_equal(fy.data, sy.data)


def test_fast_path_does_not_call_getitem(monkeypatch):
    # (patched on the class itself: a subclass that overrides __getitem__ is a transform, which the
    # fast path must not skip -- tests/data/test_data_utils_explore.py)
    calls = []
    original = TensorDataset.__getitem__
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: calls.append(i) or original(self, i))
    list(DataLoader(TensorDataset(np.zeros((50, 2)), np.zeros(50)), batch_size=10))
    assert calls == []


def test_sampler_and_generic_dataset():
    class EvenSampler:
        def __iter__(self):
            return iter(range(0, 10, 2))

        def __len__(self):
            return 5

    loader = DataLoader(ListDataset(10), batch_size=2, sampler=EvenSampler())
    assert len(loader) == 3
    assert _epoch(loader).tolist() == [0, 2, 4, 6, 8]
    first_x = next(iter(loader))[0]
    assert first_x.shape == (2, 2)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ListDataset(4), sampler=EvenSampler(), shuffle=True)
    sub = Subset(_ds(10), [9, 8, 7])
    assert _epoch(DataLoader(sub, batch_size=2)).tolist() == [9, 8, 7]


def test_collate_nested_and_custom():
    batch = default_collate([{"a": 1, "b": (np.zeros(2), 2.5)}, {"a": 2, "b": (np.ones(2), 3.5)}])
    assert batch["a"].data.tolist() == [1, 2]
    assert batch["b"][0].shape == (2, 2) and batch["b"][1].data.tolist() == [2.5, 3.5]
    loader = DataLoader(ListDataset(4), batch_size=2, collate_fn=lambda items: len(items))
    assert list(loader) == [2, 2]
    with pytest.raises(TypeError, match="collate_fn"):
        default_collate([object()])


def test_num_workers_prefetch_preserves_order():
    base = _epoch(DataLoader(_ds(40), batch_size=3, shuffle=True, seed=1))
    threaded = _epoch(DataLoader(_ds(40), batch_size=3, shuffle=True, seed=1, num_workers=2))
    np.testing.assert_array_equal(base, threaded)
    generic = _epoch(DataLoader(ListDataset(9), batch_size=2, num_workers=3))
    assert generic.tolist() == list(range(9))


def test_load_digits():
    x_tr, y_tr, x_te, y_te = load_digits()
    assert x_tr.shape == (1438, 64) and x_te.shape == (359, 64)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
    assert 0.0 <= x_tr.min() and x_tr.max() <= 1.0
    assert set(np.unique(y_te)) == set(range(10))
    again = load_digits()
    np.testing.assert_array_equal(again[0], x_tr)


def test_synthetic_data():
    x, y = make_classification_data(100, 5, 3, seed=0)
    assert x.shape == (100, 5) and set(np.unique(y)) == {0, 1, 2}
    np.testing.assert_array_equal(make_classification_data(100, 5, 3, seed=0)[0], x)
    xs, ys = make_token_sequences(5, 10, 7, seed=1)
    assert xs.shape == ys.shape == (5, 10) and xs.max() < 7
    np.testing.assert_array_equal(ys[:, 1:], (xs[:, 1:] + xs[:, :-1]) % 7)
    xc, yc = make_token_sequences(3, 9, 5, seed=1, task="copy")
    seq = np.concatenate([xc, yc[:, -1:]], axis=1)
    np.testing.assert_array_equal(seq[:, 5:], seq[:, :5])
    with pytest.raises(ValueError, match="task"):
        make_token_sequences(2, 4, 4, task="nope")
