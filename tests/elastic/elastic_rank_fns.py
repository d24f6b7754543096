"""Rank functions for the elastic tests (module level: pickled by reference)."""

from __future__ import annotations

import numpy as np


def _setup(seed=0):
    from neural_arch import nn, optim

    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(4, 6, dtype=np.float64), nn.ReLU(), nn.Linear(6, 2, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.data.shape)
    X = rng.normal(size=(40, 4))
    Y = rng.normal(size=(40, 2))
    return model, optim.Adam(model.parameters(), lr=0.01), X, Y


def train_with_failure(fail_at: int | None, fail_ranks: tuple, ckpt_dir: str | None = None):
    """Two epochs of data-parallel training under ``elastic.run``; raise a simulated peer failure
    on ``fail_ranks`` at global step ``fail_at`` (first attempt only). Returns the final params,
    how many times the function was entered, and the process group generation."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import elastic, groups
    from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler

    model, opt, X, Y = _setup()
    sampler = ElasticDistributedSampler(dataset_size=len(X), shuffle=True, seed=3)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0,
                          checkpoint_dir=ckpt_dir, save_every=2)
    entries = []

    @elastic.run
    def train(state):
        entries.append(state.step)
        for epoch in range(state.epoch, 2):
            state.epoch = epoch
            idx = sampler.indices()
            for b in range(0, len(idx), 4):
                batch = idx[b:b + 4]
                if fail_at is not None and state.step == fail_at and len(entries) == 1 \
                        and dist.get_rank() in fail_ranks:
                    raise dist.PeerFailureError(f"simulated failure at step {state.step}")
                opt.zero_grad()
                loss = ((model(Tensor(X[batch])) - Tensor(Y[batch])) ** 2).sum()
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad.data)  # sum over ranks, then mean over the global batch
                    p.grad.data[...] /= 4 * dist.get_world_size()
                opt.step()
                sampler.record_samples(len(batch))
                state.step += 1
                if state.step % 2 == 0:
                    state.commit()
            sampler.set_epoch(epoch + 1)
            state.epoch = epoch + 1
            state.commit()
        return [p.data.copy() for p in model.parameters()]

    params = train(state)
    return params, entries, groups.get_default_group().generation
