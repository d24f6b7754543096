"""Elastic training: ``elastic.State`` + ``ElasticDistributedSampler`` + durable distributed checkpoints.

Run it any way ``init_process_group()`` understands::

    python examples/train_elastic.py                     # one process
    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/train_elastic.py

    # two nodes that may shrink to one: node 0 hosts the rendezvous, node 1 may die and come back
    export NEURAL_ARCH_AUTH_TOKEN=...                    # the same on every node
    python -m neural_arch.distributed.launcher --nnodes 1:2 --max_restarts 3 --nproc_per_node 2 \\
        --node_rank 0 --master_addr node0 examples/train_elastic.py --ckpt /shared/ckpts
    python -m neural_arch.distributed.launcher --nnodes 1:2 --max_restarts 3 --nproc_per_node 2 \\
        --node_rank 1 --master_addr node0 examples/train_elastic.py --ckpt /shared/ckpts

Every ``--commit-every`` steps the state is committed in memory; every ``--save-every``-th commit
is also a distributed checkpoint in ``--ckpt``. When the launcher re-forms the job at another size
(a node died), every rank starts again with new ``RANK``/``WORLD_SIZE`` and resumes at the newest
checkpoint, mid-epoch: the sampler splits the rest of the epoch over the new world.

Batch-size policy on a size change (the user's choice; this script keeps the *global* batch):

* ``--policy batch`` (default): per-rank batch = ``global_batch / world_size`` (8 on 4 ranks is 2
  per rank; on 2 ranks, 4 per rank). The learning rate stays as it is.
* ``--policy accum``: per-rank micro-batch fixed at ``--micro-batch``; gradient accumulation over
  ``global_batch / (micro_batch * world_size)`` micro-batches (memory per rank stays the same).

Either way step ``k`` of an epoch trains on the same samples, ``order[k*G:(k+1)*G]`` of the epoch's
permutation, whatever the world size, so a run that shrinks from 4 to 2 ranks computes the same
model as one that never changed (up to float rounding). A policy that keeps the per-rank batch
instead would change the global batch, and should then scale the learning rate (linear scaling
rule) in a ``state.register_reset_callbacks`` callback or on restart.

``--log-samples DIR`` writes one JSON line per step and rank (step, epoch, world size, sample ids,
time) so a test can check that no sample of an interrupted epoch is lost or repeated;
``--out FILE`` saves the final parameters; ``--simulate-failure STEP`` raises a peer failure on
every rank at that step to show ``@elastic.run``'s in-process reset.
"""

import argparse
import json
import os
import time

import numpy as np

import neural_arch.distributed as dist
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor
from neural_arch.distributed import elastic
from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler
from neural_arch.distributed.elastic.checkpoint_restart import restart_count

N_SAMPLES, N_FEATURES, SAMPLER_SEED = 256, 8, 1


def make_data():
    """The data set and the initial weights (a test recomputes the same run in plain NumPy)."""
    rng = np.random.default_rng(0)
    X, w_true = rng.normal(size=(N_SAMPLES, N_FEATURES)), rng.normal(size=(N_FEATURES, 1))
    w0 = 0.1 * np.random.default_rng(2).normal(size=(1, N_FEATURES))
    return X, X @ w_true, w0


def per_rank_plan(policy: str, global_batch: int, micro_batch: int, world: int) -> tuple[int, int]:
    """(samples per rank per step, micro-batches per step) that keep ``global_batch`` at ``world``."""
    if global_batch % world:
        raise SystemExit(f"--global-batch {global_batch} is not divisible by the world size {world}; "
                         f"pick a global batch that every world size you allow divides")
    per_rank = global_batch // world
    if policy == "batch":
        return per_rank, 1
    if per_rank % micro_batch:
        raise SystemExit(f"--policy accum: {per_rank} samples per rank is not a multiple of --micro-batch {micro_batch}")
    return per_rank, per_rank // micro_batch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="elastic_ckpts")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--policy", choices=("batch", "accum"), default="batch")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--commit-every", type=int, default=2, help="steps between commits")
    ap.add_argument("--save-every", type=int, default=4, help="commits between durable checkpoints")
    ap.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (to make a run last)")
    ap.add_argument("--log-samples", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--simulate-failure", type=int, default=None)
    args = ap.parse_args()

    dist.init_process_group()
    X, Y, w0 = make_data()
    model = nn.Linear(N_FEATURES, 1, dtype=np.float64)
    model.weight.data[...] = w0
    model.bias.data[...] = 0.0
    opt = optim.SGD(model.parameters(), lr=args.lr)
    sampler = ElasticDistributedSampler(dataset_size=len(X), seed=SAMPLER_SEED)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0,
                          checkpoint_dir=args.ckpt, save_every=args.save_every)
    resumed = state.load_latest_checkpoint()  # after the launcher re-formed the job: the last commit
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        where = f"resumed at step {resumed}, epoch {state.epoch}, {sampler.processed_samples()} samples done" \
            if resumed is not None else "fresh start"
        print(f"world size {world}, restart {restart_count()}: {where}", flush=True)
    log = None
    if args.log_samples:
        os.makedirs(args.log_samples, exist_ok=True)
        log = open(os.path.join(args.log_samples, f"restart{restart_count()}_rank{rank}.jsonl"), "a")  # noqa: SIM115
    failed = []

    def grads_of(batch):
        opt.zero_grad()
        loss = ((model(Tensor(X[batch])) - Tensor(Y[batch])) ** 2).mean()
        loss.backward()
        return loss, [p.grad.data.copy() for p in model.parameters()]

    @elastic.run
    def train(state):
        world = dist.get_world_size()
        per_rank, n_micro = per_rank_plan(args.policy, args.global_batch, args.micro_batch, world)
        loss = None
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            idx = sampler.indices()
            for b in range(0, len(idx) - per_rank + 1, per_rank):
                if state.step == args.simulate_failure and not failed:
                    failed.append(True)
                    raise dist.PeerFailureError(f"simulated failure at step {state.step}")
                batch = idx[b:b + per_rank]
                total = None
                for micro in np.split(batch, n_micro):  # gradient accumulation (one chunk for --policy batch)
                    loss, grads = grads_of(micro)
                    total = grads if total is None else [t + g for t, g in zip(total, grads)]
                for p, g in zip(model.parameters(), total):  # data parallel: mean over micro-batches and ranks
                    g = g / n_micro
                    dist.all_reduce(g)
                    p.grad.data[...] = g / world
                opt.step()
                if log is not None:
                    log.write(json.dumps({"step": state.step, "epoch": epoch, "world": world,
                                          "ids": batch.tolist(), "t": time.time(), "pid": os.getpid()}) + "\n")
                    log.flush()
                sampler.record_samples(len(batch))
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
                if args.step_delay:
                    time.sleep(args.step_delay)
            if rank == 0 and loss is not None:
                print(f"epoch {epoch}: step {state.step}, loss {float(loss.data):.6f}", flush=True)
            sampler.set_epoch(epoch + 1)
            state.epoch = epoch + 1
            state.commit()

    train(state)
    if args.out and dist.get_rank() == 0:
        np.savez(args.out, weight=model.weight.data, bias=model.bias.data, step=state.step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
