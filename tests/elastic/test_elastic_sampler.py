"""ElasticDistributedSampler: for any epoch, commit point and world-size changes, every index of
the epoch is seen exactly once (padding duplicates are marked and excluded)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler


def _segment(n, world, state, epoch, seed, shuffle, take=None):
    """Run one segment on every rank: returns (real indices seen, state at the commit)."""
    seen, states = [], []
    for rank in range(world):
        s = ElasticDistributedSampler(dataset_size=n, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        s.set_epoch(epoch)
        if state is not None:
            s.load_state_dict(state)
        idx, pad = s.indices(), s.padding_mask()
        k = len(idx) if take is None else min(take, len(idx))
        seen.extend(idx[:k][~pad[:k]].tolist())
        s.record_samples(k)
        states.append(s.state_dict())
    assert all(st_ == states[0] for st_ in states), "ranks disagree on the commit"
    return seen, states[0]


@given(n=st.integers(0, 60), worlds=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       takes=st.lists(st.integers(0, 20), min_size=3, max_size=3), epoch=st.integers(0, 5),
       seed=st.integers(0, 3), shuffle=st.booleans())
def test_every_index_exactly_once_across_world_changes(n, worlds, takes, epoch, seed, shuffle):
    seen, state = [], None
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1
        part, state = _segment(n, world, state, epoch, seed, shuffle, None if last else takes[i % 3])
        seen.extend(part)
    assert sorted(seen) == list(range(n))
    assert state["processed"] == n


def test_matches_distributed_sampler_order_without_a_resume():
    from neural_arch.distributed.data.sampler import DistributedSampler

    a = ElasticDistributedSampler(dataset_size=23, num_replicas=3, rank=1, seed=5)
    b = DistributedSampler(dataset_size=23, num_replicas=3, rank=1, seed=5)
    for epoch in range(3):
        a.set_epoch(epoch), b.set_epoch(epoch)
        assert list(a) == list(b) and len(a) == len(b)


def test_docstring_example():
    s = ElasticDistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
    assert list(s) == [0, 2, 4, 6, 8]
    s.record_batch(0, 2)
    saved = s.state_dict()
    assert saved["processed"] == 4
    new = ElasticDistributedSampler(dataset_size=10, num_replicas=3, rank=1, shuffle=False)
    new.load_state_dict(saved)
    assert list(new) == [5, 8]
    new.reset(num_replicas=2, rank=0)
    assert np.array_equal(new.indices(), [4, 6, 8])
