"""Exploring properties of elastic restarts against plain references (no processes):

* ``ElasticDistributedSampler.reset`` re-partitions the rest of the epoch in place when the world
  changes mid-epoch: over any sequence of worlds and commit points, every remaining sample of the
  epoch is seen exactly once (drop_last=False), or at most once and only the tail is dropped
  (drop_last=True);
* ``elastic.State`` round trips (in memory and through a durable checkpoint) the sampler's
  position, the step and a NumPy RNG's state exactly: the resumed run draws the same numbers.
"""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed import elastic
from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 40), worlds=st.lists(st.integers(1, 7), min_size=1, max_size=5),
       takes=st.lists(st.integers(0, 9), min_size=5, max_size=5), epoch=st.integers(0, 3),
       shuffle=st.booleans(), drop_last=st.booleans(), by_batch=st.booleans())
@example(n=1, worlds=[3, 1], takes=[1, 0, 0, 0, 0], epoch=0, shuffle=False, drop_last=False, by_batch=False)
@example(n=5, worlds=[7, 2], takes=[0, 0, 0, 0, 0], epoch=0, shuffle=True, drop_last=True, by_batch=False)
def test_reset_in_place_sees_every_remaining_sample_once(n, worlds, takes, epoch, shuffle, drop_last, by_batch):
    samplers = [ElasticDistributedSampler(dataset_size=n, num_replicas=worlds[0], rank=r, shuffle=shuffle,
                                          seed=3, drop_last=drop_last) for r in range(worlds[0])]
    for s in samplers:
        s.set_epoch(epoch)
    seen = []
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1
        before = samplers[0].processed_samples()
        for s in samplers:
            idx, pad = s.indices(), s.padding_mask()
            k = len(idx) if last else min(takes[i], len(idx))
            seen.extend(idx[:k][~pad[:k]].tolist())
            if by_batch and k:
                s.record_batch(0, k)
            else:
                s.record_samples(k)
        done = {s.processed_samples() for s in samplers}
        assert len(done) == 1 and done.pop() >= before
        if not last:       # the world changes: survivors and newcomers re-partition the rest in place
            state = samplers[0].state_dict()
            kept = samplers[:world]
            for r, s in enumerate(kept):
                s.reset(num_replicas=world, rank=r)
            for r in range(len(kept), world):
                s = ElasticDistributedSampler(dataset_size=n, num_replicas=world, rank=r, shuffle=shuffle,
                                              seed=3, drop_last=drop_last)
                s.load_state_dict(state)
                kept.append(s)
            samplers = kept
            assert all(np.array_equal(s.indices(), samplers[0].global_order()[r::world])
                       for r, s in enumerate(samplers))
    assert len(seen) == len(set(seen)), "a sample was seen twice"
    if drop_last:
        assert set(seen) <= set(range(n)) and n - len(seen) < max(worlds)
    else:
        assert sorted(seen) == list(range(n))


def test_state_round_trips_sampler_step_and_rng_in_memory_and_through_a_checkpoint(tmp_path):
    rng = np.random.default_rng(7)
    sampler = ElasticDistributedSampler(dataset_size=13, num_replicas=2, rank=1, seed=4)
    sampler.set_epoch(2)
    state = elastic.State(sampler=sampler, checkpoint_dir=tmp_path, step=0, epoch=2, lr=0.5,
                          rng=rng.bit_generator.state)
    sampler.record_samples(3)
    rng.normal(size=5)
    state.step, state.rng = 3, rng.bit_generator.state
    state.commit()
    rest = np.random.default_rng(4 + 2).permutation(13)[6:]             # the epoch's order after 6 samples
    want = (sampler.state_dict(), np.resize(rest, 8)[1::2].tolist(), rng.normal(size=4))   # rank 1 of 2
    sampler.record_samples(2)
    state.step, state.lr, state.rng = 99, 0.1, np.random.default_rng(0).bit_generator.state
    state.restore()
    replay = np.random.default_rng()
    replay.bit_generator.state = state.rng
    assert (state.step, state.lr, sampler.state_dict(), list(sampler)) == (3, 0.5, want[0], want[1])
    assert np.array_equal(replay.normal(size=4), want[2])

    fresh = ElasticDistributedSampler(dataset_size=13, num_replicas=3, rank=2, seed=4)
    resumed = elastic.State(sampler=fresh, checkpoint_dir=tmp_path, step=0, epoch=0, lr=0.0,
                            rng=np.random.default_rng(1).bit_generator.state)
    assert resumed.load_latest_checkpoint() == 3
    assert (resumed.step, resumed.epoch, resumed.lr) == (3, 2, 0.5)
    assert fresh.processed_samples() == 6 and fresh.epoch == 2        # 3 per rank on 2 ranks
    assert list(fresh) == np.resize(rest, 9)[2::3].tolist()              # 7 left, padded to 9, rank 2 of 3
    replay = np.random.default_rng()
    replay.bit_generator.state = resumed.rng
    assert np.array_equal(replay.normal(size=4), want[2])
