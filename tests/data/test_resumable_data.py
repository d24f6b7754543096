"""Resumable data state: interrupt an epoch, save the loader's (and sampler's) state, resume on the
same or another world size (ranks simulated by samplers with num_replicas/rank): every sample of
the interrupted epoch is seen exactly once."""

import collections
import json

import numpy as np
import pytest

from neural_arch.data import DataLoader, TensorDataset
from neural_arch.distributed.data.sampler import DistributedSampler

N = 23


def _dataset():
    return TensorDataset(np.arange(N))


def _rank_loaders(world, epoch=1, batch_size=2, num_workers=0):
    loaders = []
    for rank in range(world):
        sampler = DistributedSampler(N, num_replicas=world, rank=rank, shuffle=True, seed=4)
        sampler.set_epoch(epoch)
        loaders.append(DataLoader(_dataset(), batch_size=batch_size, sampler=sampler, num_workers=num_workers))
    return loaders


@pytest.mark.parametrize("world,new_world,batches_done,num_workers",
                         [(3, 2, 2, 1), (2, 3, 1, 0), (2, 2, 3, 0), (4, 1, 1, 0), (3, 5, 0, 0)])
def test_every_sample_of_the_interrupted_epoch_is_seen_once(world, new_world, batches_done, num_workers):
    seen = collections.Counter()
    before = _rank_loaders(world, num_workers=num_workers)   # workers prefetch more than was consumed
    iterators = []
    for loader in before:                       # every rank trains batches_done batches, then the job dies
        it = iter(loader)
        for _ in range(batches_done):
            seen.update(next(it)[0].data.tolist())
        iterators.append(it)
    states = [json.loads(json.dumps(loader.state_dict())) for loader in before]  # what a checkpoint holds
    # the position is the same on every rank: any rank's copy resumes any rank (the worker-seed stream
    # is each loader's own: these loaders drew their seeds from one process's generator in turn)
    position = [{k: v for k, v in s.items() if k not in ("worker_seeds", "seed", "worker_random_states")}
                for s in states]
    assert all(p == position[0] for p in position)
    assert states[0]["sampler"]["processed"] == min(N, batches_done * 2 * world)
    del iterators
    after = _rank_loaders(new_world, epoch=0)   # a fresh job: the state brings back epoch 1
    for loader in after:
        loader.load_state_dict(states[0])
        real = ~loader.sampler.padding_mask()   # padding duplicates (equal counts per rank) are not samples
        served = np.concatenate([b[0].data for b in loader])
        assert len(served) == len(real)
        seen.update(served[real].tolist())
    assert seen == collections.Counter(range(N))
    for loader in after:                        # the epoch finished: a checkpoint now resumes at its end
        assert loader.state_dict()["sampler"]["processed"] == N
    uninterrupted = _rank_loaders(1)[0]         # and the order is the epoch's own (seed + epoch)
    assert sorted(np.concatenate([b[0].data for b in uninterrupted]).tolist()) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_shuffled_loader_resumes_mid_epoch(num_workers):
    def loader():
        return DataLoader(_dataset(), batch_size=4, shuffle=True, seed=9, num_workers=num_workers)

    reference = loader()
    list(reference)                             # epoch 0
    full = [b[0].data.tolist() for b in reference]   # epoch 1, uninterrupted
    interrupted = loader()
    list(interrupted)
    it = iter(interrupted)                      # epoch 1, interrupted after 2 batches
    head = [next(it)[0].data.tolist() for _ in range(2)]
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert state["batches_yielded"] == 2
    del it
    resumed = loader()                          # a fresh process: its generator is at epoch 0
    resumed.load_state_dict(state)
    tail = [b[0].data.tolist() for b in resumed]
    assert head + tail == full and len(full) == 6
    assert resumed.state_dict()["batches_yielded"] == 0   # finished: the next resume starts a new epoch
    assert [b[0].data.tolist() for b in resumed] == [b[0].data.tolist() for b in reference]  # epoch 2 agrees


def test_sampler_state_without_a_loader():
    s = DistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
    s.record_batch(1, 2)                        # two batches of 2 on each of 2 ranks
    state = s.state_dict()
    assert state == {"epoch": 0, "processed": 8, "seed": 0, "shuffle": False, "drop_last": False,
                     "dataset_size": 10}
    new = DistributedSampler(dataset_size=10, num_replicas=3, rank=2, shuffle=False)
    new.load_state_dict(state)
    assert list(new) == [8] and new.padding_mask().tolist() == [True]   # 8, 9 left; rank 2 gets padding
    new.set_epoch(1)
    assert len(new) == 4                        # a new epoch starts from its first sample
    with pytest.raises(ValueError, match="state is for 10 samples"):
        DistributedSampler(dataset_size=11, num_replicas=1, rank=0).load_state_dict(state)


class _RandomTransform:
    """Each sample plus a draw from the worker's NumPy generator (seeded base_seed + worker id)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.float64(i) + np.random.random()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_workers_of_a_job_resumed_at_an_epoch_start_draw_the_uninterrupted_jobs_transforms(num_workers):
    """The worker base seed of every epoch comes from the loader's seed stream: a resumed job must
    continue that stream, or its workers repeat the first epoch's random transforms (found: they did)."""
    def loader():
        return DataLoader(_RandomTransform(), batch_size=4, seed=5, num_workers=num_workers)

    reference = loader()
    epochs = [np.concatenate([b.data for b in reference]) for _ in range(3)]
    assert not np.array_equal(epochs[1], epochs[2])   # the check can fail: epochs draw other seeds
    first = loader()
    list(first)
    state = json.loads(json.dumps(first.state_dict()))     # saved between epochs 0 and 1
    resumed = loader()
    resumed.load_state_dict(state)
    assert np.array_equal(np.concatenate([b.data for b in resumed]), epochs[1])
    assert np.array_equal(np.concatenate([b.data for b in resumed]), epochs[2])


def test_a_loader_of_another_seed_keeps_its_own_worker_seeds():
    """Ranks seeded apart (seed=base+rank) that resume from one rank's state must not all take that
    rank's worker-seed stream: their workers would apply the same random transforms."""
    def loader(seed):
        return DataLoader(_RandomTransform(), batch_size=4, seed=seed, num_workers=1)

    rank0 = loader(5)
    list(rank0)
    state = json.loads(json.dumps(rank0.state_dict()))
    rank1_resumed, rank1_fresh = loader(6), loader(6)
    rank1_resumed.load_state_dict(state)
    assert np.array_equal(np.concatenate([b.data for b in rank1_resumed]),
                          np.concatenate([b.data for b in rank1_fresh]))
