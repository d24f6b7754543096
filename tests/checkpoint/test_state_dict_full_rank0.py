"""``StateDictOptions(full_state_dict=True, cpu_offload=True)`` gathers to rank 0 only (torch's
semantics): rank 0 gets the whole model and optimizer state, equal to the unsharded values; the
other ranks get empty dicts and never receive the others' pieces (no all-gather, no receive).
Without ``cpu_offload`` every rank gets the whole state (one all-gather). 2 gloo ranks.
"""

import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(180)


def full_state_run(cpu_offload: bool) -> dict:
    """fully_shard a Linear, one Adam step, then the full state dicts; records which object
    collectives this rank called."""
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed import collectives
    from neural_arch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from neural_arch.distributed.fsdp import fully_shard
    from neural_arch.optim import Adam

    manual_seed(0)
    model = nn.Linear(3, 5, dtype=np.float64)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    fully_shard(model)
    opt = Adam(model.parameters(), lr=0.1)
    model(Tensor(np.ones((2, 3)))).sum().backward()
    opt.step()
    calls = []
    saved = {}
    for name in ("all_gather_object", "gather_object", "send_object_list", "recv_object_list"):
        original = saved[name] = getattr(collectives, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(collectives, name, spy)
    try:
        options = StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)
        msd = get_model_state_dict(model, options=options)
        osd = get_optimizer_state_dict(model, opt, options=options)["state"]
    finally:
        for name, original in saved.items():
            setattr(collectives, name, original)
    # Adam's first step moves every weight by -lr * sign(grad) (up to eps): the expected values
    grads = {"weight": np.full((5, 3), 2.0), "bias": np.full(5, 2.0)}
    expect = {n: before[n] - 0.1 * np.sign(grads[n]) for n in before}
    return {"calls": calls, "keys": sorted(msd), "optim_keys": sorted(osd),
            "diff": max((float(np.abs(np.asarray(msd[n]) - expect[n]).max()) for n in msd), default=None),
            "shapes": {n: tuple(np.asarray(v).shape) for n, v in msd.items()},
            "exp_avg": {n: tuple(np.asarray(v["exp_avg"]).shape) for n, v in osd.items()}}


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0) as p:
        yield p


def test_cpu_offload_gathers_to_rank_0_only(pool):
    rank0, rank1 = pool.run(full_state_run, True)
    assert rank0["keys"] == ["bias", "weight"] and rank0["optim_keys"] == ["bias", "weight"]
    assert rank0["shapes"] == {"bias": (5,), "weight": (5, 3)} and rank0["exp_avg"] == rank0["shapes"]
    assert rank0["diff"] < 1e-6
    assert "all_gather_object" not in rank0["calls"] and "recv_object_list" in rank0["calls"]
    assert rank1["keys"] == [] and rank1["optim_keys"] == []
    # rank 1 only sends: it never receives the state it would drop
    assert set(rank1["calls"]) == {"send_object_list"}, rank1["calls"]


def test_full_state_dict_without_offload_on_every_rank(pool):
    for out in pool.run(full_state_run, False):
        assert out["keys"] == ["bias", "weight"] and out["diff"] < 1e-6
        assert out["exp_avg"] == {"bias": (5,), "weight": (5, 3)}
        assert set(out["calls"]) == {"all_gather_object"}, out["calls"]


def subgroup_full_state_run(cpu_offload: bool):
    """FSDP over ranks 0 and 1 of a world of 3 (rank 2 trains nothing and never calls in): the full state
    dicts are gathered over the model's group, not the world, where they would wait for rank 2."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.checkpoint.state_dict import StateDictOptions
    from neural_arch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from neural_arch.optim import Adam

    group = dist.new_group([0, 1])
    if dist.get_rank() == 2:
        return None
    manual_seed(0)
    model = nn.Linear(3, 5, dtype=np.float64)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    fsdp = FSDP(model, process_group=group)
    opt = Adam(fsdp.parameters(), lr=0.1)
    fsdp(Tensor(np.ones((2, 3)))).sum().backward()
    opt.step()
    options = StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)
    from neural_arch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    msd = get_model_state_dict(fsdp, options=options)
    osd = get_optimizer_state_dict(fsdp, opt, options=options)["state"]
    expect = {n: before[n] - 0.1 for n in before}        # Adam's first step: -lr * sign(grad), grad > 0
    return {"keys": sorted(msd), "optim_keys": sorted(osd),
            "diff": max((float(np.abs(np.asarray(msd[n]) - expect[n]).max()) for n in msd), default=None),
            "exp_avg": {n: np.asarray(v["exp_avg"]).tolist() for n, v in osd.items()}}


@pytest.mark.parametrize("cpu_offload", [False, True])
def test_a_model_sharded_over_a_sub_group_gathers_there(cpu_offload):
    with RankPool(3, backend="gloo", timeout=60.0) as pool3:
        rank0, rank1, rank2 = pool3.run(subgroup_full_state_run, cpu_offload, timeout=60)
    assert rank2 is None
    for out in (rank0,) if cpu_offload else (rank0, rank1):
        assert out["keys"] == ["bias", "weight"] == out["optim_keys"] and out["diff"] < 1e-6
        # Adam's first moment after one step: (1 - beta1) * grad, grad of sum(W x + b) with x = ones((2, 3))
        assert np.allclose(out["exp_avg"]["weight"], np.full((5, 3), 0.1 * 2.0))
        assert np.allclose(out["exp_avg"]["bias"], np.full(5, 0.1 * 2.0))
    if cpu_offload:
        assert rank1["keys"] == [] and rank1["optim_keys"] == []
