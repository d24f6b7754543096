"""The end-to-end proofs of sharded replicas: ZeRO-2, ``fully_shard`` (FSDP2) or tensor parallelism
inside each replica, a SIGKILLed replica, a replacement that heals shard by shard.

Two replicas of two ranks each (real processes, gloo over TCP) train a float64 MLP with Adam, sharded
over the replica's own group by ``ZeroRedundancyOptimizer(optim.Adam, stage=2)`` or by
``fully_shard`` (the weights sharded too: each rank holds its ``Shard(0)`` rows), or tensor-parallel
(``parallelize_module``: ColwiseParallel then RowwiseParallel; each rank holds its slices, both run the
replica's whole batch); each gradient shard is averaged across the replicas through its rank's
``Manager(shard=(s, 2))`` (``replicate_group=ft.ManagedProcessGroup(manager)``; tensor parallelism:
``ft.DistributedDataParallel(manager, model)`` over the rank's local gradients). Both ranks of replica b are SIGKILLed in the
middle of a step; replica a discards that step and goes on alone (no restart, nothing read from disk);
a replacement replica of two ranks starts from another initialisation, each of its ranks heals from
the rank of a with the same shard index (ZeRO-2: the weights and its shard of the Adam state;
fully_shard and tensor parallelism: its local pieces of every parameter, received straight into its
DTensors' local arrays (``Manager(heal_into=...)``), and their Adam state; all: step, RNG, data position)
and the two replicas finish the run. At most four ranks are alive at once. The final parameters of
every rank equal a single-process run over exactly the committed global batches (<= 1e-10), and
every sample of every epoch is used exactly once."""

import secrets

import ft_sharded_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.ft import Lighthouse
from neural_arch.distributed.run.rank_worker import pack_call
from neural_arch.distributed.testing import RankPool

KILL_AT = 2
LAYOUT = (("a", 0, "replica"), ("a", 1, "replica"), ("b", 0, "victim"), ("b", 1, "victim"),
          ("c", 0, "spare"), ("c", 1, "spare"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", (*fns.STRATEGIES, fns.FSDP1_HYBRID))
def test_a_killed_sharded_replica_is_replaced_by_one_that_heals_shard_by_shard(strategy):
    token = secrets.token_hex(16)
    with Lighthouse(min_replicas=1, heartbeat_timeout=1.0, join_timeout=5.0, auth_token=token) as lighthouse:
        pool = RankPool(len(LAYOUT), init=False, timeout=180.0)
        try:
            blob, main = pack_call(fns.by_rank, (lighthouse.address, token, LAYOUT, KILL_AT),
                                   {"strategy": strategy})
            results = pool.run_packed(blob, main, 180.0, failure_grace=180.0)
        finally:
            pool.close()
        quorums = list(lighthouse.quorums)
    for r in (2, 3):
        assert not results[r].ok and results[r].exc_type == "Died", results[r]
    survivors = {LAYOUT[r][:2]: results[r] for r in (0, 1, 4, 5)}
    for r in survivors.values():
        assert r.ok, f"rank {r.rank}: {r.exc_type}: {r.error}\n{r.traceback}"
    params = {key: r.value[0] for key, r in survivors.items()}
    logs = {key: r.value[1] for key, r in survivors.items()}
    stats = {key: r.value[2] for key, r in survivors.items()}

    # the fatal step was discarded by a's two ranks and redone; c's ranks healed, each from its own shard index
    # (a replica the lighthouse left out for a while -- a starved process looks dead -- heals too, the same way)
    assert stats["a", 0]["discarded"] >= 1 and stats["a", 1]["discarded"] >= 1
    for s in range(fns.SHARDS):
        assert stats["c", s]["heals"] >= 1 and stats["c", s]["heal_bytes"] > 0
    assert len({st["step"] for st in stats.values()}) == 1
    assert len({st["rng"] for st in stats.values()}) == 1          # the RNG state came with the heal
    heals = [(target.split(":")[0], source.split(":")[0]) for q in quorums for target, source in q.heal.items()]
    assert ("c/s0", "a/s0") in heals and ("c/s1", "a/s1") in heals, heals
    assert all(target[-3:] == source[-3:] for target, source in heals), heals     # shard s from shard s
    # the Adam state is sharded (each rank holds its own slices) and c's shards equal a's, shard by shard
    for s in range(fns.SHARDS):
        mine, peer = stats["c", s]["optim_shard"], stats["a", s]["optim_shard"]
        assert mine and len(mine) == len(peer) and all(np.array_equal(x, y) for x, y in zip(mine, peer))
    held = sum(x.size for s in range(fns.SHARDS) for x in stats["a", s]["optim_shard"]) // 2
    model_size = sum(p.size for p in params["a", 0])
    # tensor parallelism keeps the row-parallel layer's bias (the last parameter) whole on every rank
    replicated = params["a", 0][-1].size * (fns.SHARDS - 1) if strategy == "tp" else 0
    assert model_size + replicated <= held < model_size + replicated + 2 * fns.SHARDS * 8, (held, model_size)
    same = [np.array_equal(x, y) for x, y in zip(stats["a", 0]["optim_shard"], stats["a", 1]["optim_shard"])
            if x.shape == y.shape]
    assert same == ([False] * (len(same) - 2) + [True] * 2 if strategy == "tp" else [False] * len(same)), same
    if strategy == "tp":      # Megatron's split: fc1 by output rows, fc2 by input columns, fc2's bias whole
        assert stats["a", 0]["placements"] == stats["c", 1]["placements"] == [
            "(Shard(dim=0),)", "(Shard(dim=0),)", "(Shard(dim=1),)", "(Replicate(),)"], stats["a", 0]["placements"]
    if strategy != "zero2":   # the weights are sharded too: each rank's local pieces, c's equal to a's
        for s in range(fns.SHARDS):
            assert stats["c", s]["healed_in_place"] is True     # received straight into the DTensors' local arrays
            mine, peer = stats["c", s]["local_params"], stats["a", s]["local_params"]
            assert all(np.array_equal(x, y) for x, y in zip(mine, peer))
        local = sum(x.size for s in range(fns.SHARDS) for x in stats["a", s]["local_params"])
        assert local == model_size + replicated

    # one record per committed step: the same on every rank that took part in it
    steps = {}
    for log in logs.values():
        for step, *record in log:
            assert steps.setdefault(step, record[:4]) == record[:4], step
    final = stats["a", 0]["step"]
    assert sorted(steps) == list(range(1, final + 1))
    committed = [(step, *steps[step], None) for step in sorted(steps)]
    sizes = [size for _s, _e, _p, size, _m, _x in committed]
    assert sizes[:KILL_AT] == [2] * KILL_AT and 1 in sizes and sizes[-1] == 2, sizes
    assert [q.size for q in quorums].count(1) >= 1

    # every sample of every epoch exactly once, and the ranks' shares make up each global batch
    for epoch in range(fns.EPOCHS):
        used = np.concatenate([fns.global_batch(e, p, n) for _s, e, p, n, _m, _x in committed if e == epoch])
        assert sorted(used.tolist()) == list(range(fns.N)), epoch
    shares = {stats[key]["member"]: {step: mine for step, *_r, mine in log} for key, log in logs.items()}
    checked = 0
    # (tensor parallelism: both ranks of a replica run the replica's share, so each shard index's lane
    # makes up the global batch on its own)
    lanes = [f"/s{s}:" for s in range(fns.SHARDS)] if strategy == "tp" else ["/s"]
    for step, e, p, n, members, _x in committed:
        if all(step in shares.get(m, {}) for m in members):   # every member of that step reported it
            for lane in lanes:
                got = sorted(x for m in members if lane in m for x in shares[m][step])
                assert got == sorted(fns.global_batch(e, p, n).tolist()), (step, lane)
            checked += 1
    assert checked >= KILL_AT

    # equal to one process over exactly the committed batches, on every rank of both replicas
    ref = fns.reference(committed)
    for key, got in params.items():
        for a, b in zip(got, ref):
            assert np.max(np.abs(a - b)) <= 1e-10, key
