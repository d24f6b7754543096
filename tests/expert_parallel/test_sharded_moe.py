"""ZeRO-1, ZeRO-2 and FSDP over a mixture-of-experts model under expert parallelism (issue 31).

The replicated parameters are sharded over the data-parallel group as usual; the expert parameters
stay out of the partition / flat units and are reduced over their expert-data-parallel group (the
ranks holding the same expert), and under ZeRO their optimizer state is sharded over that group
(each rank holds its share; the consolidated state gathers rank 0's experts' moments from their
owners). Outputs, aux loss, the clipped global gradient norm and parameters
after 3 Adam steps equal one process on the union batch (float64 <= 1e-10), for ep = world = 2 and
ep = 2 inside dp = 4; FSDP also as HYBRID_SHARD (replicate 2 x shard world / 2). Ranks are real
gloo processes (one RankPool per world size).
"""

import pytest
import sharded_moe_rank_fns as fns

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

TOL = 1e-10


@pytest.fixture(scope="module", params=[2, 4], ids=["gloo-2", "gloo-4"])
def pool(request):
    with RankPool(request.param, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.mark.parametrize("wrapper", ["zero1", "zero2", "fsdp", "fsdp-hybrid"])
def test_sharding_wrappers_over_experts_match_single_process(pool, wrapper):
    results = pool.run(fns.sharded_moe_run, wrapper, 2)     # ep = 2: the world, or inside dp = 4
    for rank, out in enumerate(results):
        for key in ("out", "aux", "norm", "params"):
            assert out[key] <= TOL, f"{wrapper} rank {rank}: {key} differs by {out[key]:g}"
    if wrapper.startswith("fsdp"):
        assert all(out["experts_outside_units"] for out in results)
    else:
        entries, params = results[0]["state_entries"]
        assert entries == params, f"consolidated state has {entries} entries for {params} parameters"
        assert results[0]["expert_moments"] <= TOL, results[0]["expert_moments"]
        # ep = 2: inside dp = 4 each expert's state lives on one of its 2 holders; at ep = world on its only one
        holders = pool.world_size // 2
        for rank, out in enumerate(results):
            with_state, experts = out["expert_state"]
            assert with_state * holders == experts, f"rank {rank}: state for {with_state} of {experts} expert params"
