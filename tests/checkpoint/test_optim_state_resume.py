"""Saving FSDP + Adam (and ZeRO-1/2 + Adam) with a distributed checkpoint and resuming is exact,
on 2 -> 2, 2 -> 1 and 1 -> 2 ranks (float64 <= 1e-10 against an uninterrupted run); the old pattern
(``opt.state_dict()`` of FSDP shards saved as if replicated) raises instead of mixing the ranks'
shards; ``Optimizer.load_state_dict`` refuses state arrays of another shape than their parameter.
Real processes (RankPool, gloo, 2 ranks)."""

import numpy as np
import optim_resume_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(180)


def _diff(got: dict, want: dict) -> float:
    assert set(got) == set(want)
    return max(float(np.abs(got[k] - want[k]).max()) for k in want)


def test_sharded_adam_resumes_exactly_on_any_world_size(tmp_path):
    single, first = fns.single_process_first_steps(str(tmp_path / "single"))  # 1 process, uninterrupted
    with RankPool(2, backend="gloo", timeout=120.0) as pool:
        results = pool.run(fns.save_and_resume, str(tmp_path), str(tmp_path / "single"), first)
    for rank, r in enumerate(results):
        # the naive save names a leaf holding rank-different shards, on every rank, and writes nothing
        assert r["naive_error"] is not None, f"rank {rank}: saving FSDP shards as replicated did not raise"
        assert "'optim.state.0.exp_avg'" in r["naive_error"] and "ranks [0] vs ranks [1]" in r["naive_error"]
        assert "get_state_dict" in r["naive_error"]
        assert r["plain_error"] is not None and "1 leaf is" in r["plain_error"], r["plain_error"]
        assert "'loss' (ranks [0] vs ranks [1])" in r["plain_error"], r["plain_error"]
        for kind in ("fsdp", "zero2", "zero1"):
            assert _diff(r[kind], single) <= 1e-10, (rank, kind)  # sharded training is single-process training
            assert _diff(r[f"{kind}_2_2"], r[kind]) <= 1e-10, (rank, kind)       # 2 -> 2
        assert _diff(r["fsdp_1_2"], single) <= 1e-10, rank                         # 1 -> 2
        assert _diff(r["fsdp_1_2_full"], single) <= 1e-10, rank   # torch's full state dicts, no checkpoint
        # FSDP.optim_state_dict (FULL_STATE_DICT) on every rank: the single process's state, by name
        full, want = r["fsdp_full_osd"], first["optim"]
        assert full["param_groups"] == want["param_groups"] and set(full["state"]) == set(want["state"])
        for name, st in want["state"].items():
            assert full["state"][name]["step"] == st["step"] == fns.FIRST
            for k in ("exp_avg", "exp_avg_sq"):
                assert full["state"][name][k].shape == st[k].shape
                assert float(np.abs(full["state"][name][k] - st[k]).max()) <= 1e-10, (rank, name, k)
    assert not (tmp_path / "naive" / ".metadata").exists() and not (tmp_path / "plain" / ".metadata").exists()
    for kind in ("fsdp", "zero2", "zero1"):                                        # 2 -> 1
        assert _diff(fns.resume(str(tmp_path / kind)), single) <= 1e-10, kind


def test_load_state_dict_checks_state_shapes():
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    model = nn.Linear(3, 2)
    opt = optim.Adam(model.parameters(), lr=0.1)
    (model(Tensor(np.ones((1, 3)))) ** 2).sum().backward()
    opt.step()
    sd = opt.state_dict()
    before = {k: v.copy() for k, v in opt.state[model.weight].items() if k != "step"}
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].reshape(-1)[:4]  # a shard of another layout
    with pytest.raises(ValueError, match=r"state 'exp_avg' of parameter 0 has shape \(4,\) but the parameter has "
                                         r"shape \(2, 3\).*get_optimizer_state_dict"):
        opt.load_state_dict(sd)
    assert all(np.array_equal(opt.state[model.weight][k], v) for k, v in before.items())  # nothing changed
