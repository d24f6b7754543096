"""DistributedTrainer's sharded strategies on 4 real ranks (one RankPool for the module):
``fully_shard`` (FSDP2), ``tp`` (a ``tp_plan`` for an MLP) and the mesh ``{"dp": 2, "tp": 2}``
(an MLP with a plan, an ``nn.GPT`` through ``parallelize_gpt``) equal one process on the union of
each window's micro-batches with ``gradient_accumulation_steps=4`` (float64 <= 1e-10); a
``fully_shard`` (and a dp x tp) run resumed from a checkpoint is bitwise equal to an uninterrupted
one, and the ``fully_shard`` checkpoint resumes in one process (another world size); the mesh
``{"dp": 2, "pp": 2}`` (pipeline stages replicated over dp) equals one process too; pipeline with
tensor parallelism, and a model the pipeline cannot split, refuse with a sentence;
examples/production_train.py takes the new strategy names."""

import numpy as np
import trainer_pp_rank_fns
import pytest
import strategy_rank_fns as fns

from neural_arch.distributed.testing import RankPool
from neural_arch.distributed.trainer import DistributedTrainer, resolve_strategy

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=240.0) as p:
        yield p


def test_fully_shard_tp_and_dp_tp_meshes_equal_single_process(pool):
    cases = [("mlp", "fully_shard"), ("mlp", "tp"), ("mlp", {"dp": 2, "tp": 2}), ("gpt", {"dp": 2, "tp": 2})]
    results = pool.run(fns.equivalence, {"cases": cases})
    for rank, per in enumerate(results):
        for r in per:
            assert r["diff"] <= 1e-10, f"rank {rank} {r['case']}: differs from one process by {r['diff']:g}"
            assert r["steps"] == [0, 0, 0, 1, 1, 1, 1, 2] and len(r["grad_norms"]) == 2, r
            assert r["lr"] == pytest.approx(0.05 * 0.7 ** 2)
        models = [r["model"] for r in per]
        assert models == ["FSDPSequential", "Sequential", "DistributedDataParallel", "DistributedDataParallel"]
    # the clipped norm is global: the same on every rank, whatever piece of the gradients it holds
    for i in range(len(cases)):
        assert len({tuple(per[i]["grad_norms"]) for per in results}) == 1


def test_fully_shard_mixed_precision_uses_a_policy(pool):
    for r in pool.run(fns.mixed_precision, None):
        assert r["param_dtype"] == "bfloat16" and r["dtypes"] == ["float32"], r   # float32 master shards
        assert np.isfinite(r["loss"])
        assert 0 < r["diff"] <= 5e-2, r   # bfloat16 forward/backward: near float32 training, not equal


def test_fully_shard_and_dp_tp_resume_bitwise_and_on_one_process(pool, tmp_path):
    directory = str(tmp_path / "fs")
    results = pool.run(fns.resume, {"kind": "mlp", "strategy": "fully_shard", "dir": directory})
    for rank, r in enumerate(results):
        assert r["bitwise"], f"rank {rank}: resumed run differs by {r['diff']:g}"
        assert r["step"] == 2 and r["lr"] == pytest.approx(0.05 * 0.7 ** 4)
    # the 4-rank checkpoint into one process (a fully_shard trainer on a world of one)
    trainer, opt = fns._trainer("mlp", "fully_shard", 0.3, k=2, checkpoint_dir=directory)
    with trainer:
        assert trainer.resume(opt)["world_size"] == 4
        X, y = fns.data("mlp", 4, 4, 2)
        for w in range(2, 4):
            for j in range(2):   # one process takes the 4 ranks' micro-batch j at once
                xs = [fns.micro_batch(X, y, w, j, d, 4, 2) for d in range(4)]
                trainer.train_step((np.concatenate([a for a, _ in xs]), np.concatenate([b for _, b in xs])),
                                   opt, fns.criterion_for("mlp"), w * 2 + j)
        got = fns.full_params(trainer)
    want = results[0]["uninterrupted"]
    assert max(float(np.abs(got[n] - v).max()) for n, v in want.items()) <= 1e-10
    # a dp x tp mesh: tensor-parallel pieces and DDP together, also bitwise
    results = pool.run(fns.resume, {"kind": "mlp", "strategy": {"dp": 2, "tp": 2}, "dir": str(tmp_path / "tp")})
    assert all(r["bitwise"] and r["step"] == 2 for r in results), [r["diff"] for r in results]


def test_dp_pp_mesh_equals_single_process(pool):
    """{"dp": 2, "pp": 2}: 2 stages, each replicated on 2 ranks that average its gradients once per
    window; K=4 micro-batches per data-parallel row against one process on the union of 8."""
    results = pool.run(trainer_pp_rank_fns.equivalence, {"cases": [({"dp": 2, "pp": 2}, "1f1b")]})
    for rank, [r] in enumerate(results):
        assert r["diff"] <= 1e-10, f"rank {rank}: differs from one process by {r['diff']:g}"
        assert r["loss_diff"] <= 1e-12 and r["steps"] == [0, 0, 0, 1, 1, 1, 1, 2], r
        assert r["dp"] == (rank % 2, 2) and r["model"] == "GPTStage"   # (pp, dp) mesh: pp outermost
    assert len({tuple(r["grad_norms"]) for [r] in results}) == 1   # the global norm, on every rank


def test_strategy_errors_say_what_to_do():
    from neural_arch import nn

    assert resolve_strategy("pp", world_size=2).mesh == (("pp", 2), ("dp", 1))
    assert resolve_strategy({"dp": 2, "pp": 2}, world_size=4).mesh == (("pp", 2), ("dp", 2))
    with pytest.raises(NotImplementedError, match="pipeline and tensor parallelism together"):
        resolve_strategy({"pp": 2, "tp": 2}, world_size=4)
    with pytest.raises(ValueError, match="cannot split a Linear into pipeline stages; pass an nn.GPT"):
        DistributedTrainer(nn.Linear(2, 2), strategy="pp")
    with pytest.raises(ValueError, match="pp_schedule=.*use one of"):
        DistributedTrainer(fns.build("mlp"), strategy="pp", pp_schedule="zigzag")
    with pytest.raises(ValueError, match="need strategy='pp'"):
        DistributedTrainer(fns.build("mlp"), strategy="ddp", pp_schedule="gpipe")
    assert resolve_strategy({"dp": 2, "tp": 2}, world_size=4).mesh == (("dp", 2), ("tp", 2))
    with pytest.raises(ValueError, match="needs a plan for Sequential: pass tp_plan="):
        DistributedTrainer(fns.build("mlp"), strategy="tp")
    with pytest.raises(ValueError, match="tp_plan is a tensor-parallel plan"):
        DistributedTrainer(fns.build("mlp"), strategy="ddp", tp_plan=fns.tp_plan())


def test_production_train_example_takes_the_new_strategies(tmp_path, capsys, monkeypatch):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "production_train.py")
    spec = importlib.util.spec_from_file_location("production_train_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.parse_strategy("dp=2,tp=2") == {"dp": 2, "tp": 2}
    assert example.parse_strategy('{"dp": 2, "tp": 2}') == {"dp": 2, "tp": 2}
    assert example.tp_plan({"dp": 2, "tp": 1}) is None and set(example.tp_plan("tp")) == {"0", "2"}
    monkeypatch.chdir(tmp_path)
    for strategy in ("fully_shard", "tp", "pp"):   # a world of one (the launcher's 2-rank run: test_production_train_example)
        assert example.main(["--strategy", strategy, "--epochs", "1", "--samples", "160", "--no-progress",
                             "--checkpoint-dir", str(tmp_path / strategy)]) == 0
        assert "final: epoch=0" in capsys.readouterr().out
