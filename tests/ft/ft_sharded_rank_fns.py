"""Rank functions of the sharded-replica proofs (module level: pickled by reference).

Each replica is two ranks with a process group of their own that shard it, in one of three ways
(``strategy``):

* ``"zero2"``: ``ZeroRedundancyOptimizer(stage=2)`` shards the optimizer state and the gradients
  (the weights stay whole on every rank);
* ``"fully_shard"``: ``fully_shard`` (FSDP2) shards the weights too (each rank holds its ``Shard(0)``
  rows; Adam steps those local pieces);
* ``"tp"``: tensor parallelism, Megatron's MLP (``parallelize_module``: the first Linear
  ``ColwiseParallel``, the second ``RowwiseParallel``): each rank holds its slices of the weights
  (and the replicated last bias), both ranks run the replica's whole batch, and
  ``ft.DistributedDataParallel`` averages each rank's local gradients over its lane.

* ``"fsdp1_hybrid"``: the older ``FullyShardedDataParallel`` class with ``HYBRID_SHARD``: the replica's
  group shards one flat parameter (each rank holds its half of the flattened weights, Adam steps
  that half), and the replicate group is the rank's lane:
  ``process_group=(group, ft.ManagedProcessGroup(manager))``. Not in ``STRATEGIES`` (the proof's
  parametrization) until ``FullyShardedDataParallel`` takes a replicate group whose size follows
  the quorum (it reads the size once, at construction, and resolves the pair's groups as
  process groups).

Each way, each gradient shard is averaged across the replicas through the rank's
``Manager(shard=(s, 2))`` (``replicate_group=ManagedProcessGroup``, or ``ft.DistributedDataParallel``
for tensor parallelism: the shard's lane), and a replacement heals each rank's part from the rank
with the same shard index. The loop is the one docs/fault_tolerance.md teaches ("Sharded replicas").
"""

from __future__ import annotations

import os
import signal
import time

import ft_rank_fns
import numpy as np

STRATEGIES = ("zero2", "fully_shard", "tp")
FSDP1_HYBRID = "fsdp1_hybrid"
N, BATCH, SHARDS, EPOCHS, SEED = 24, 4, 2, 2, 3   # BATCH: samples per replica per step (BATCH / SHARDS per rank)
STARTED = "sharded/started"
SPARE_SIGNAL = "sharded/start_the_spare"      # set once the survivor committed two steps alone
SPARE_READY = "sharded/spare_registered"      # counted up by each of the spare's ranks once its Manager is up


def setup(seed: int = 0):
    """The DDP proof's tiny float64 MLP and ``N`` rows of its data (the same on every replica for seed 0)."""
    return ft_rank_fns.model_and_data(seed, N)


def global_batch(epoch: int, processed: int, size: int) -> np.ndarray:
    """The samples a committed step of ``size`` replicas uses (what the single-process reference replays)."""
    order = np.random.default_rng(SEED + epoch).permutation(N)
    return order[processed:processed + min(size * BATCH, N - processed)]


def shard_rank(addr: str, token: str, replica: str, shard: int, role: str, kill_at: int, wait_s: float = 60.0,
               strategy: str = "zero2"):
    """Rank ``shard`` of replica ``replica``, sharded by ``strategy``: train until the end of epoch ``EPOCHS - 1``.

    ``role``: ``"replica"`` starts at once; ``"victim"`` SIGKILLs itself in the middle of step
    ``kill_at`` (both ranks of the replica, after joining the quorum, before the gradients go out);
    ``"spare"`` builds everything from another initialisation, waits until the survivor committed
    two steps alone, then starts its Managers and heals shard by shard. Returns ``(params, log,
    stats)``: ``log`` has one record per committed step (step, epoch, samples processed before it,
    quorum size in replicas, members, this rank's samples: ``"tp"``: the replica's, both ranks run
    them); ``params`` are the whole parameters (``fully_shard``, ``"tp"``: gathered from the
    replica's ranks).
    """
    if strategy not in (*STRATEGIES, FSDP1_HYBRID):
        raise ValueError(f"strategy={strategy!r}: one of {(*STRATEGIES, FSDP1_HYBRID)}")
    import neural_arch.distributed as dist
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import ft
    from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, fully_shard
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.distributed.rendezvous.base import PrefixStore
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    host, _, port = addr.rpartition(":")
    signals = TCPStore(host, int(port), timeout=wait_s, auth_token=token)
    # the replica's own group (its ZeRO collectives): rendezvous under a prefix of the lighthouse's store
    group_store = TCPStore(host, int(port), timeout=wait_s, auth_token=token)
    group = dist.init_process_group("gloo", store=PrefixStore(f"sharded/{replica}", group_store), timeout=10.0)
    model, X, Y = setup(seed=0 if role != "spare" else 99)
    sampler = ElasticDistributedSampler(dataset_size=N, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    rng = np.random.default_rng(1000 if role != "spare" else 1099)   # the spare's differs until it heals
    holder = {"owner": model}     # whose named_parameters are this rank's part (FSDP1: its flat shard)

    # this shard's part: ZeRO-2: the whole weights (kept on every rank) and its optimizer shard; fully_shard:
    # the rank's local rows of every parameter (model.state_dict() holds the DTensors' local pieces) and
    # the Adam state of those rows
    # (FSDP1: the flat parameter's shard; its state_dict() would gather, a collective)
    def state_dict():
        weights = model.state_dict() if strategy != FSDP1_HYBRID else \
            {name: p.data for name, p in holder["owner"].named_parameters()}
        return {"model": weights, "optim": holder["optim"].state_dict(),
                "sampler": sampler.state_dict(), "rng": rng.bit_generator.state}

    def load_state_dict(state):
        owner = holder["owner"]
        holder["in_place"] = all(state["model"][name] is p.data for name, p in owner.named_parameters())
        if strategy == FSDP1_HYBRID:
            for name, p in owner.named_parameters():
                if state["model"][name] is not p.data:
                    p.data[...] = state["model"][name]
        else:
            model.load_state_dict(state["model"])  # ZeRO-2: the next step copies them into the master shards
        holder["optim"].load_state_dict(state["optim"])
        sampler.load_state_dict(state["sampler"])
        rng.bit_generator.state = state["rng"]

    # fully_shard, tp: the heal receives each rank's pieces straight into its DTensors' local arrays
    def local_pieces():
        return {"model": {name: p.data for name, p in holder["owner"].named_parameters()}}

    if role == "spare":   # everything imported and built before the wait: it registers at once when told
        signals.wait([SPARE_SIGNAL], timeout=wait_s)
    manager = ft.Manager(pg=ft.ProcessGroupGloo(timeout=10.0, transport="tcp"), load_state_dict=load_state_dict,
                         state_dict=state_dict, min_replica_size=1, replica_id=replica, shard=(shard, SHARDS),
                         lighthouse_addr=addr, timeout=10.0, quorum_timeout=wait_s, heartbeat_interval=0.05,
                         auth_token=token, init_sync=False,        # seeded alike: nothing to copy at step 0
                         heal_into=local_pieces if strategy != "zero2" else None)
    lane = ft.ManagedProcessGroup(manager)
    net = model             # what the loop runs (tp: the ft DDP wrapper, which averages over the lane)
    if strategy == "zero2":
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, process_group=group, stage=2,
                                            bucket_cap_mb=1e-4, replicate_group=lane, lr=0.05)   # a few buckets
        inner = holder["optim"] = optimizer.optim
    elif strategy == "fully_shard":   # two fully_shard groups (the first layer, and the root with the rest)
        fully_shard(model[0], replicate_group=lane)
        fully_shard(model, replicate_group=lane)
        optimizer = inner = holder["optim"] = optim.Adam(model.parameters(), lr=0.05)
    elif strategy == FSDP1_HYBRID:   # one flat unit sharded over the replica's group, replicated over the lane
        net = holder["owner"] = FullyShardedDataParallel(model, process_group=(group, lane),
                                                         sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        optimizer = inner = holder["optim"] = optim.Adam(net.parameters(), lr=0.05)
    else:   # tensor parallel over the replica's group; each rank's local gradients averaged over its lane
        parallelize_module(model, group, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        net = ft.DistributedDataParallel(manager, model, bucket_cap_mb=1e-4, first_bucket_mb=1e-4)   # a few buckets
        optimizer = inner = holder["optim"] = optim.Adam(model.parameters(), lr=0.05)
    if role == "spare":
        signals.add(SPARE_READY, 1)
    else:   # the four register before any asks (else the first quorum may be one replica, and the late one heals)
        signals.add(STARTED, 1)
        deadline = time.monotonic() + wait_s
        while int(signals.add(STARTED, 0)) < 2 * SHARDS and time.monotonic() < deadline:
            time.sleep(0.005)
    opt = ft.OptimizerWrapper(manager, optimizer)
    log, discarded, solo = [], 0, 0
    while sampler.epoch < EPOCHS:
        opt.zero_grad()                                         # joins the quorum; heals this shard if behind
        size, me = manager.num_participants(), manager.participating_rank()
        if role == "victim" and manager.current_step() == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        sampler.reset(num_replicas=size, rank=me)
        processed = sampler.processed_samples()
        ours, pad = sampler.indices()[:BATCH], sampler.padding_mask()[:BATCH]
        n_global = min(size * BATCH, N - processed)
        if strategy == "tp":                                     # both ranks run the replica's whole share
            mine, split = ours[~pad], 1
        else:                                                    # the replica's share, split over its ranks
            mine, split = ours[shard::SHARDS][~pad[shard::SHARDS]], SHARDS
        if len(mine):
            err = net(Tensor(X[mine])) - Tensor(Y[mine])
            # averaged over the replica's ranks (sharded data), then over the replicas: the global-batch mean
            loss = (err * err).sum() * (size * split / n_global)
        else:                                                    # only padding here: zero gradients, same collectives
            loss = (net(Tensor(X[:1])) * 0.0).sum()
        loss.backward()
        if opt.step():
            log.append((manager.current_step(), sampler.epoch, processed, size, manager.quorum.members,
                        mine.tolist()))
            sampler.record_samples(BATCH)
            solo += size == 1
            if replica == "a" and shard == 0 and solo == 2:
                signals.set(SPARE_SIGNAL, b"1")
                deadline = time.monotonic() + wait_s               # else the epoch could end before it arrives
                while int(signals.add(SPARE_READY, 0)) < SHARDS and time.monotonic() < deadline:
                    time.sleep(0.005)
            rng.random()                                         # the RNG moves with every committed step
            if sampler.processed_samples() >= N:
                sampler.set_epoch(sampler.epoch + 1)
        else:
            discarded += 1
    held = inner.state_dict()["state"]
    stats = {"replica": replica, "shard": shard, "member": manager.member, "heals": manager.heals,
             "discarded": discarded, "step": manager.current_step(), "heal_bytes": manager.heal_bytes_received,
             "rng": rng.bit_generator.state["state"]["state"],
             "optim_shard": [np.asarray(held[k][name]).copy() for k in sorted(held)
                             for name in ("exp_avg", "exp_avg_sq") if name in held[k]],
             "local_params": [np.asarray(p.data).copy() for p in holder["owner"].parameters()],
             "healed_in_place": holder.get("in_place"),
             "placements": [repr(getattr(p, "placements", None)) for p in model.parameters()]}
    if strategy == FSDP1_HYBRID:     # gathered over the replica's group (a collective of its two ranks)
        with net.summon_full_params():
            params = [np.asarray(p.data).copy() for p in model.parameters()]
    else:
        params = [np.asarray(p.full_tensor().data if strategy != "zero2" else p.data).copy()
                  for p in model.parameters()]
    manager.shutdown()
    dist.destroy_process_group()
    group_store.close()
    signals.close()
    return params, log, stats


def by_rank(addr: str, token: str, layout: tuple, kill_at: int, strategy: str = "zero2"):
    """Pool entry point: rank ``r`` is shard ``layout[r][1]`` of replica ``layout[r][0]`` in role ``layout[r][2]``."""
    replica, shard, role = layout[int(os.environ["RANK"])]
    # each replica is a job of its own (as if its own torchrun started it): its ranks are 0..SHARDS-1
    os.environ.update(RANK=str(shard), WORLD_SIZE=str(SHARDS), LOCAL_RANK=str(shard), LOCAL_WORLD_SIZE=str(SHARDS))
    return shard_rank(addr, token, replica, shard, role, kill_at, strategy=strategy)


def reference(log) -> list[np.ndarray]:
    """Single-process Adam over exactly the committed global batches of ``log``."""
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor

    model, X, Y = setup(seed=0)
    adam = optim.Adam(model.parameters(), lr=0.05)
    for _step, epoch, processed, size, _members, _mine in log:
        batch = global_batch(epoch, processed, size)
        adam.zero_grad()
        err = model(Tensor(X[batch])) - Tensor(Y[batch])
        ((err * err).sum() * (1.0 / len(batch))).backward()
        adam.step()
    return [p.data.copy() for p in model.parameters()]
