"""Elastic training: ``elastic.State`` + ``ElasticDistributedSampler`` + durable distributed checkpoints.

Run it any way ``init_process_group()`` understands::

    python examples/train_elastic.py                     # one process
    python -m neural_arch.distributed.run.launcher --nproc_per_node 2 examples/train_elastic.py

Every 2nd step is committed in memory; every 4th commit is also a distributed checkpoint in
``--ckpt`` (restart the job and it resumes there, mid-epoch, at any world size). A peer failure
inside ``train`` restores the last commit and re-forms the process group (``@elastic.run``);
``--simulate-failure STEP`` raises one on every rank at that step to show it.
"""

import argparse

import numpy as np

import neural_arch.distributed as dist
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor
from neural_arch.distributed import elastic
from neural_arch.distributed.data.elastic_sampler import ElasticDistributedSampler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="elastic_ckpts")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--simulate-failure", type=int, default=None)
    args = ap.parse_args()

    dist.init_process_group()
    rng = np.random.default_rng(0)
    X, w_true = rng.normal(size=(256, 8)), rng.normal(size=(8, 1))
    Y = X @ w_true
    model = nn.Linear(8, 1, dtype=np.float64)
    opt = optim.SGD(model.parameters(), lr=0.05)
    sampler = ElasticDistributedSampler(dataset_size=len(X), seed=1)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0,
                          checkpoint_dir=args.ckpt, save_every=4)
    resumed = state.load_latest_checkpoint()
    if dist.get_rank() == 0 and resumed is not None:
        print(f"resumed from step {resumed}, epoch {state.epoch}, {sampler.processed_samples()} samples done")
    failed = []

    @elastic.run
    def train(state):
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            idx = sampler.indices()
            for b in range(0, len(idx), args.batch):
                if state.step == args.simulate_failure and not failed:
                    failed.append(True)
                    raise dist.PeerFailureError(f"simulated failure at step {state.step}")
                batch = idx[b:b + args.batch]
                opt.zero_grad()
                loss = ((model(Tensor(X[batch])) - Tensor(Y[batch])) ** 2).mean()
                loss.backward()
                for p in model.parameters():  # plain data parallel: average the gradients
                    dist.all_reduce(p.grad.data)
                    p.grad.data[...] /= dist.get_world_size()
                opt.step()
                sampler.record_samples(len(batch))
                state.step += 1
                if state.step % 2 == 0:
                    state.commit()
            if dist.get_rank() == 0:
                print(f"epoch {epoch}: step {state.step}, loss {float(loss.data):.6f}")
            sampler.set_epoch(epoch + 1)
            state.epoch = epoch + 1
            state.commit()

    train(state)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
