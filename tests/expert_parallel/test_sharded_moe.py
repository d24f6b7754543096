"""ZeRO-1, ZeRO-2 and FSDP over a mixture-of-experts model under expert parallelism (issue 31).

The replicated parameters are sharded over the data-parallel group as usual; the expert parameters
stay out of the partition / replicated units and are reduced over their expert-data-parallel group
(the ranks holding the same expert); under ZeRO their optimizer state is sharded over that group
(each rank holds its share; the consolidated state gathers rank 0's experts' moments from their
owners), under FSDP each expert is a flat unit of its own sharded over that group (parameters,
gradient and optimizer state: 1 / edp per rank). Outputs, aux loss, the clipped global gradient norm and parameters
after 3 Adam steps equal one process on the union batch (float64 <= 1e-10), for ep = world = 2 and
ep = 2 inside dp = 4; FSDP also as HYBRID_SHARD (replicate 2 x shard world / 2). Ranks are real
gloo processes (one RankPool per world size).
"""

import fsdp_expert_rank_fns as fsdp_fns
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


@pytest.mark.parametrize("top_k", [1, 2], ids=["top1", "top2"])
def test_fsdp_shards_each_expert_over_its_expert_data_parallel_group(pool, top_k):
    """FSDP gives each expert a unit of its own sharded over its expert-data-parallel group (2 ranks
    at ep = 2 inside dp = 4; 1 at ep = world = 2: the expert stays whole). With a capacity that drops
    tokens, parameters after 3 Adam steps (FSDP's full state dict and DCP's, under global expert
    names), Adam's moments and the clipped norm equal one process; full and sharded state dicts load
    back and summon_full_params gathers the experts whole; each rank keeps 1 / edp of its
    experts' parameters and Adam state (up to each unit's padding to a multiple of edp)."""
    edp = pool.world_size // 2
    for rank, out in enumerate(pool.run(fsdp_fns.fsdp_expert_run, 2, top_k, 1.0)):
        for key in ("out", "norm", "params", "dcp_params", "dcp_moments", "full_roundtrip", "summoned"):
            assert out[key] <= TOL, f"rank {rank}: {key} differs by {out[key]:g}"
        assert out["dropped"] > 0 and out["norm_ref"] > 0.05     # the capacity and the clip both bind
        mine = [2 * (rank % 2), 2 * (rank % 2) + 1]               # ep rank r % 2 holds experts 2r, 2r + 1
        assert out["names"] == sorted(f"moe.experts.{e}.{p}" for e in mine
                                      for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
        kept, moments, whole = out["memory"]
        assert out["edp"] == edp and out["units"] == (len(mine) if edp > 1 else 0)
        assert whole <= kept * edp <= whole + out["units"] * out["padding"], (kept, edp, whole)
        assert moments == 2 * kept                                 # exp_avg and exp_avg_sq of the shards only
        if edp > 1:
            assert out["sharded_expert_keys"] == [f"moe.experts.{e}.flat_param" for e in mine]
