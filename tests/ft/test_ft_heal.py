"""The proof of per-step fault tolerance: three replicas (real processes, gloo over TCP) train a
float64 MLP with Adam; one is SIGKILLed in the middle of a step; the two survivors discard that step
and go on with a quorum of two (no restart, nothing read from disk); a replacement starts, heals from
a live peer (weights, Adam state, step, RNG, data position) and joins. The final parameters of every
replica equal a single-process run over exactly the committed global batches (<= 1e-10), and every
sample of every epoch is used exactly once. Again with the quorum overlapped with the forward and
backward (``use_async_quorum``): the same proof holds."""

import secrets

import ft_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.ft import Lighthouse
from neural_arch.distributed.run.rank_worker import pack_call
from neural_arch.distributed.testing import RankPool

KILL_AT = 3


@pytest.mark.timeout(180)
@pytest.mark.parametrize("overlap", [False, True], ids=["sync_quorum", "async_quorum"])
def test_a_killed_replica_is_replaced_by_one_that_heals_from_a_live_peer(overlap):
    token = secrets.token_hex(16)
    roles = ("replica", "victim", "replica", "spare")
    with Lighthouse(min_replicas=2, heartbeat_timeout=1.0, join_timeout=5.0, auth_token=token) as lighthouse:
        pool = RankPool(4, init=False, timeout=120.0)
        try:
            blob, main = pack_call(fns.by_rank, (lighthouse.address, token, roles, KILL_AT, overlap), {})
            results = pool.run_packed(blob, main, 120.0, failure_grace=120.0)
        finally:
            pool.close()
        quorums = list(lighthouse.quorums)
    victim = results[1]
    assert not victim.ok and victim.exc_type == "Died", victim
    survivors = [results[r] for r in (0, 2, 3)]
    for r in survivors:
        assert r.ok, f"rank {r.rank}: {r.exc_type}: {r.error}\n{r.traceback}"
    (p0, log0, s0), (p2, log2, s2), (p3, log3, s3) = (r.value for r in survivors)

    # the fatal step was discarded by both survivors and redone; the replacement healed from a peer
    assert s0["discarded"] >= 1 and s2["discarded"] >= 1
    assert s3["heals"] >= 1 and s3["heal_bytes"] > 0
    assert s0["step"] == s2["step"] == s3["step"]
    if overlap:   # most committed steps computed while their quorum was on its way
        assert min(s0["overlapped"], s2["overlapped"]) > s0["step"] // 2, (s0, s2)
    assert s0["rng"] == s2["rng"] == s3["rng"]          # the RNG state came with the heal

    # one record per committed step: the same on every replica that took part in it (a replica the
    # lighthouse left out for a while -- a starved process looks dead -- has gaps, never conflicts)
    steps = {}
    for log in (log0, log2, log3):
        for step, *record in log:
            assert steps.setdefault(step, record[:4]) == record[:4], step
    assert sorted(steps) == list(range(1, s0["step"] + 1))
    committed = [(step, *steps[step], None) for step in sorted(steps)]
    sizes = [size for _s, _e, _p, size, _m, _x in committed]
    assert sizes[:KILL_AT] == [3] * KILL_AT and 2 in sizes and sizes[-1] == 3, sizes
    assert [q.size for q in quorums].count(2) >= 1

    # every sample of every epoch exactly once, and the replicas' shares make up each global batch
    for epoch in range(fns.EPOCHS):
        used = np.concatenate([fns.global_batch(e, p, n) for _s, e, p, n, _m, _x in committed if e == epoch])
        assert sorted(used.tolist()) == list(range(fns.N)), epoch
    shares = {s["member"]: {step: mine for step, *_r, mine in log} for s, log in ((s0, log0), (s2, log2), (s3, log3))}
    checked = 0
    for step, e, p, n, members, _x in committed:
        if all(step in shares.get(m, {}) for m in members):   # every member of that step reported it
            got = sorted(x for m in members for x in shares[m][step])
            assert got == sorted(fns.global_batch(e, p, n).tolist()), step
            checked += 1
    assert checked >= 1

    # equal to one process over exactly the committed batches
    ref = fns.reference(committed)
    for params in (p0, p2, p3):
        for a, b in zip(params, ref):
            assert np.max(np.abs(a - b)) <= 1e-10
