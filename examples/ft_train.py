"""Per-step fault tolerance with replica groups that the launcher restarts (torchft under torchelastic).

Each replica group is a job of its own, under its own launcher with ``--max_restarts``; a lighthouse
decides every step's quorum. When a rank of a replica dies, its launcher stops the group's other ranks
and starts the group again (``NEURAL_ARCH_RESTART_COUNT`` + 1). The new ranks' Managers join the next
quorum behind the others and heal from a live replica (rank ``s`` from the rank with the same shard
index): weights, Adam state, step, RNG and data position, over the network -- no checkpoint file.
The other replicas never restart: they discard the step the failure hit, wait for the quorum to
reach ``--min_replicas`` again (with ``--min_replicas 1`` they go on alone meanwhile), and train on
with the healed replica.

Run it (one lighthouse, one launcher per replica; replica b's rank 0 SIGKILLs itself in step 3 of its
first attempt, its launcher restarts it, it heals from a and both finish)::

    python -m neural_arch.distributed.ft.lighthouse --min_replicas 2 --port 29510 &
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 1 --max_restarts 2 \\
        examples/ft_train.py --lighthouse 127.0.0.1:29510 --replica_id a --out /tmp/ft &
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 1 --max_restarts 2 \\
        examples/ft_train.py --lighthouse 127.0.0.1:29510 --replica_id b --out /tmp/ft --kill_at_step 3
    wait %2; kill %1

Each replica may be several ranks (``--nproc_per_node 2``): they form the replica's own gloo group
(the launcher's rendezvous) and shard it with ZeRO-2; each rank runs ``Manager(shard=(rank, world))``
and averages its gradient shard over its lane (``ft.ManagedProcessGroup``). The job: a float64 MLP
regression on a synthetic set, Adam, ``ElasticDistributedSampler`` following the quorum, so every
sample of an epoch is used once whatever the failures. With ``--out DIR`` each rank writes
``DIR/{replica}.rank{r}.json``: its final whole parameters, one record per committed step (the
single-process replay of those steps, :func:`reference`, gives the same parameters) and its counters.
Set ``NEURAL_ARCH_FT_AUTH_TOKEN`` to the same value for the lighthouse and every replica on a
multi-host job (on one host the per-user secret is used). See docs/fault_tolerance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

# One BLAS thread per rank: ranks share the cores; more threads per rank only fight each other.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np

SEED = 3          # the data order of epoch e is permutation(SEED + e): every replica computes the same


def setup(samples: int, seed: int = 0):
    """The model (the same on every replica for the same ``seed``) and the data set (always the same)."""
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(3, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 2, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.data.shape)
    data = np.random.default_rng(100)
    return model, data.normal(size=(samples, 3)), data.normal(size=(samples, 2))


def global_batch(samples: int, batch: int, epoch: int, processed: int, size: int) -> np.ndarray:
    """The samples of a committed step of ``size`` replicas (``batch`` each) that starts after ``processed``."""
    order = np.random.default_rng(SEED + epoch).permutation(samples)
    return order[processed:processed + min(size * batch, samples - processed)]


def reference(log: list, samples: int, batch: int, lr: float) -> list[np.ndarray]:
    """One process, Adam over exactly the committed global batches of ``log`` (records as written by a rank)."""
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor

    model, X, Y = setup(samples)
    adam = optim.Adam(model.parameters(), lr=lr)
    for record in log:
        rows = global_batch(samples, batch, record["epoch"], record["processed"], record["size"])
        adam.zero_grad()
        err = model(Tensor(X[rows])) - Tensor(Y[rows])
        ((err * err).sum() * (1.0 / len(rows))).backward()
        adam.step()
    return [p.data.copy() for p in model.parameters()]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lighthouse", required=True, help="host:port of the lighthouse")
    parser.add_argument("--replica_id", required=True, help="this replica group's name (the same after a restart)")
    parser.add_argument("--min_replicas", type=int, default=2, help="the smallest quorum this replica steps in")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=24, help="samples per epoch")
    parser.add_argument("--batch", type=int, default=2, help="samples per replica per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="the model's initialisation")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per collective, heal and vote")
    parser.add_argument("--quorum_timeout", type=float, default=120.0,
                        help="seconds to wait for a quorum (a replica restarting, or the others waiting for it)")
    parser.add_argument("--kill_at_step", type=int, default=None,
                        help="fault injection: SIGKILL rank --kill_rank of this replica in this step of its first "
                             "attempt (the launcher restarts the group)")
    parser.add_argument("--kill_rank", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder for each rank's result (JSON)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import neural_arch.distributed as dist
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import ft
    from neural_arch.distributed.elastic.checkpoint_restart import restart_count
    from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler
    from neural_arch.distributed.ft.lighthouse import TOKEN_VAR
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.distributed.run.child_env import report_ready

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    attempt = restart_count()
    sharded = world > 1
    if sharded:       # the replica's own group (the launcher's rendezvous): ZeRO-2's reduce-scatters
        dist.init_process_group("gloo")
    else:             # no collectives of its own: tell the launcher's --start_timeout this rank is up
        report_ready()
    model, X, Y = setup(args.samples, args.seed)
    sampler = ElasticDistributedSampler(dataset_size=args.samples, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    rng = np.random.default_rng(1000)   # stands for any RNG the training draws from: healed with the rest
    holder = {}

    # what a replacement copies from its live peer: this rank's part of the training state
    def state_dict():
        return {"model": model.state_dict(), "optim": holder["optim"].state_dict(),
                "sampler": sampler.state_dict(), "rng": rng.bit_generator.state}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        holder["optim"].load_state_dict(state["optim"])
        sampler.load_state_dict(state["sampler"])
        rng.bit_generator.state = state["rng"]

    manager = ft.Manager(pg=ft.ProcessGroupGloo(timeout=args.timeout), load_state_dict=load_state_dict,
                         state_dict=state_dict, min_replica_size=args.min_replicas, replica_id=args.replica_id,
                         lighthouse_addr=args.lighthouse, timeout=args.timeout, quorum_timeout=args.quorum_timeout,
                         auth_token=os.environ.get(TOKEN_VAR) or None, shard=(rank, world) if sharded else None)
    if sharded:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=2, lr=args.lr,
                                            replicate_group=ft.ManagedProcessGroup(manager))
        holder["optim"] = optimizer.optim        # this rank's shard of the Adam state
        net = model
    else:
        optimizer = holder["optim"] = optim.Adam(model.parameters(), lr=args.lr)
        net = ft.DistributedDataParallel(manager, model)
    opt = ft.OptimizerWrapper(manager, optimizer)
    log, discarded = [], 0
    while sampler.epoch < args.epochs:
        opt.zero_grad()                                    # joins the quorum; heals this rank if behind
        size, me = manager.num_participants(), manager.participating_rank()
        if attempt == 0 and manager.current_step() == args.kill_at_step and rank == args.kill_rank:
            print(f"replica {args.replica_id} rank {rank}: SIGKILL in step {args.kill_at_step} (fault injection)",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        sampler.reset(num_replicas=size, rank=me)
        processed = sampler.processed_samples()
        ours, pad = sampler.indices()[:args.batch], sampler.padding_mask()[:args.batch]
        mine = ours[rank::world][~pad[rank::world]]       # the replica's share, split over its ranks
        n_global = min(size * args.batch, args.samples - processed)
        if len(mine):
            err = net(Tensor(X[mine])) - Tensor(Y[mine])
            # averaged over the replica's ranks, then over the quorum's replicas: the global-batch mean
            loss = (err * err).sum() * (size * world / n_global)
        else:                                              # only padding here: zero gradients, same collectives
            loss = (net(Tensor(X[:1])) * 0.0).sum()
        loss.backward()
        if opt.step():
            log.append({"step": manager.current_step(), "epoch": sampler.epoch, "processed": processed,
                        "size": size, "members": list(manager.quorum.members), "samples": mine.tolist()})
            sampler.record_samples(args.batch)
            rng.random()                                   # the RNG moves with every committed step
            if sampler.processed_samples() >= args.samples:
                sampler.set_epoch(sampler.epoch + 1)
        else:
            discarded += 1
    params = [np.asarray(p.data).copy() for p in model.parameters()]
    stats = {"replica": args.replica_id, "rank": rank, "attempt": attempt, "member": manager.member,
             "step": manager.current_step(), "heals": manager.heals, "heal_bytes": manager.heal_bytes_received,
             "discarded": discarded, "rng": int(rng.bit_generator.state["state"]["state"])}
    print(f"replica {args.replica_id} rank {rank} (attempt {attempt}): {stats['step']} steps committed, "
          f"{discarded} discarded, {manager.heals} heal(s)", flush=True)
    manager.shutdown()
    if sharded:
        dist.destroy_process_group()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"{args.replica_id}.rank{rank}.json")
        with open(path + ".tmp", "w") as f:      # written whole, then renamed: a reader never sees half
            json.dump({"params": [p.tolist() for p in params], "log": log, "stats": stats}, f)
        os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
