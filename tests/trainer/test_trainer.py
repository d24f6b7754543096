"""DistributedTrainer (seed 003): accumulation equals single-process training for DDP, FSDP and ZeRO-2,
and for the pipeline strategy 'pp' (each schedule); save/resume is exact (bitwise on the same world
size, <= 1e-10 on another); bf16 autocast matches a single-process autocast run. Ranks are real processes (one RankPool for the module); the other
world size is this test process (a world of one)."""

import numpy as np
import trainer_pp_rank_fns
import pytest
import trainer_rank_fns as fns

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0) as p:
        yield p


def test_accumulation_equals_single_process_for_ddp_fsdp_zero1_zero2(pool):
    results = pool.run(fns.equivalence, {"strategies": ["ddp", "fsdp", "zero1", "zero2"]})
    for rank, per in enumerate(results):
        for strategy, r in per.items():
            assert r["diff"] <= 1e-10, f"rank {rank} {strategy}: differs from one process by {r['diff']:g}"
            assert r["loss0_diff"] <= 1e-12, "metrics['loss'] must be the criterion's value, not loss / K"
            assert r["accumulating"] == [True, True, True, False] * 2
            assert r["steps"] == [0, 0, 0, 1, 1, 1, 1, 2]
            assert all(n > 0 for n in r["grad_norms"]) and len(r["grad_norms"]) == 2
            assert r["lr"] == pytest.approx(0.05 * 0.7 ** 2)
            assert r["comm_at_window_end"] > 0
            assert set(r["perf"]) >= {"samples_per_second_per_gpu", "communication_overhead_percent"}
            assert r["perf"]["steps"] == 8 and r["perf"]["samples_per_second_per_gpu"] > 0
        # DDP's no_sync() (also under ZeRO-1): the micro-batches before a window's last one communicate nothing
        assert per["ddp"]["comm_while_accumulating"] == 0.0 and per["zero1"]["comm_while_accumulating"] == 0.0


def test_resume_is_bitwise_on_same_world_and_exact_on_another(pool, tmp_path):
    root = str(tmp_path)
    results = pool.run(fns.resume, {"strategies": ["ddp", "fsdp", "zero2"], "root": root})
    for rank, per in enumerate(results):
        for strategy, r in per.items():
            assert r["bitwise"], f"rank {rank} {strategy}: resumed run differs by {r['diff']:g}"
            assert r["rng"] and r["step"] == 2 and r["lr"] == pytest.approx(0.05 * 0.7 ** 4)
    # the 2-rank FSDP and ZeRO-2 checkpoints resume in one process (a DDP trainer, world of one)
    import neural_arch.nn.functional as F
    from neural_arch.distributed.trainer import DistributedTrainer

    for strategy in ("fsdp", "zero2"):
        model = fns.build(5)
        with DistributedTrainer(model, strategy="ddp", gradient_accumulation_steps=2, gradient_clip_val=0.3,
                                checkpoint_dir=f"{root}/{strategy}") as t:
            opt = fns.make_optimizer(model.parameters())
            t.lr_scheduler = fns.make_scheduler(opt)
            assert t.resume(opt)["world_size"] == 2
            X, y = fns.data(4, 2, 2)
            for w in range(2, 4):
                for j in range(2):   # one process takes both ranks' micro-batch j at once
                    xs = [fns.micro_batch(X, y, w, j, r, 2, 2) for r in range(2)]
                    t.train_step((np.concatenate([a for a, _ in xs]), np.concatenate([b for _, b in xs])),
                                 opt, F.cross_entropy, w * 2 + j)
            got = fns.full_params(t)
        want = results[0][strategy]["uninterrupted"]
        diff = max(float(np.abs(got[n] - v).max()) for n, v in want.items())
        assert diff <= 1e-10, f"{strategy} checkpoint resumed on 1 process differs by {diff:g}"


def test_bf16_autocast_matches_single_process_autocast(pool):
    for r in pool.run(fns.amp_run, None):
        assert r["amp"] == "bfloat16"
        # the forward is row-wise: the micro-batch loss equals one process's autocast loss exactly
        assert r["loss0"] == r["loss_bf16"] != r["loss_f32"], r
        # bfloat16 keeps ~3 significant digits: per-rank and whole-batch weight gradients round
        # differently, so after 2 SGD steps parameters agree to ~1e-5 (here: 3.3e-5), not 1e-10
        assert r["diff"] <= 2e-4, r


def test_fit_checkpoints_the_loader_state_so_a_resumed_epoch_sees_every_sample_once(pool, tmp_path):
    """fit() saves the DataLoader's (and its DistributedSampler's) state in its checkpoints: a run that
    dies mid-epoch resumes that epoch, on 2 ranks or on 1, training on each of its samples exactly once."""
    import shutil
    from collections import Counter

    n = 24
    cfg = {"n": n, "batch_size": 2, "crash_at": 2, "root": str(tmp_path / "two_ranks")}
    died = pool.run(fns.fit_counting_samples, cfg)
    before = [i for r in died for i in r["seen"]]
    assert len(before) == 2 * 2 * 2                 # 2 ranks x 2 batches x 2 samples, then the crash
    shutil.copytree(cfg["root"], tmp_path / "one_process")
    for resumed_on in ("two ranks", "one process"):
        rest = {**cfg, "crash_at": None, "root": str(tmp_path / resumed_on.replace(" ", "_"))}
        if resumed_on == "two ranks":
            after = [i for r in pool.run(fns.fit_counting_samples, rest) for i in r["seen"]]
        else:
            after = fns.fit_counting_samples(rest, world_of_one=True)["seen"]
        counts = Counter(before + after)
        assert sorted(counts) == list(range(n)) and set(counts.values()) == {1}, (resumed_on, counts)


def test_pipeline_strategy_equals_single_process_and_resumes(pool, tmp_path):
    """strategy='pp' on 2 ranks, K=4 micro-batches per window = the schedule's micro-batches: equal to
    one process on each window's union (float64, Adam, clipping), for every schedule; the losses
    arrive at the window's end, the same on both ranks; a pp checkpoint resumes bitwise on 2 ranks
    and exactly in one process (a DDP trainer)."""
    from neural_arch.distributed.trainer import DistributedTrainer

    schedules = ["1f1b", "gpipe", "interleaved", "zbh1"]
    results = pool.run(trainer_pp_rank_fns.equivalence, {"cases": [("pp", s) for s in schedules]})
    for rank, per in enumerate(results):
        for r in per:
            assert r["diff"] <= 1e-10, f"rank {rank} {r['case']}: differs from one process by {r['diff']:g}"
            assert r["loss_diff"] <= 1e-12, r   # each micro-batch's loss as the criterion computed it
            assert all(np.isnan(loss) and losses == [] for loss, losses in r["buffered"]), r["buffered"]
            assert r["steps"] == [0, 0, 0, 1, 1, 1, 1, 2] and r["lr"] == pytest.approx(0.05 * 0.7 ** 2)
            assert r["dp"] == (0, 1) and len(r["grad_norms"]) == 2 and all(n > 0 for n in r["grad_norms"])
        assert [r["model"] for r in per] == ["GPTStage", "GPTStage", "StageModules", "GPTStage"]
    for i in range(len(schedules)):   # one loss and one global norm for the whole pipeline
        assert results[0][i]["last_loss"] == results[1][i]["last_loss"]
        assert results[0][i]["grad_norms"] == results[1][i]["grad_norms"]
        # the two stages hold every parameter of the model, each once
        names = results[0][i]["names"] + results[1][i]["names"]
        assert sorted(names) == sorted(n for n, _ in trainer_pp_rank_fns.build().named_parameters())

    root = str(tmp_path / "pp")
    resumed = pool.run(trainer_pp_rank_fns.resume, {"dir": root})
    for rank, r in enumerate(resumed):
        assert r["bitwise"], f"rank {rank}: resumed pipeline run differs by {r['diff']:g}"
        assert r["step"] == 2 and r["lr"] == pytest.approx(0.05 * 0.7 ** 4)
    model = trainer_pp_rank_fns.build()
    with DistributedTrainer(model, strategy="ddp", gradient_accumulation_steps=2,
                            gradient_clip_val=trainer_pp_rank_fns.CLIP, checkpoint_dir=root) as t:
        opt = trainer_pp_rank_fns.make_optimizer(model.parameters())
        t.lr_scheduler = trainer_pp_rank_fns.make_scheduler(opt)
        assert t.resume(opt)["strategy"] == "pp"
        X, y = trainer_pp_rank_fns.data(4, 1, 2)
        for w in range(2, 4):
            for j in range(2):
                t.train_step(trainer_pp_rank_fns.micro_batch(X, y, w, j, 0, 1, 2), opt, trainer_pp_rank_fns.lm_loss, w * 2 + j)
        got = {n: p.data for n, p in model.named_parameters()}
    want = {**resumed[0]["uninterrupted"], **resumed[1]["uninterrupted"]}
    assert sorted(want) == sorted(got)
    diff = max(float(np.abs(got[n] - v).max()) for n, v in want.items())
    assert diff <= 1e-10, f"the pp checkpoint resumed on 1 process differs by {diff:g}"


def test_pipeline_fit_runs_a_short_last_batch_and_evaluates_the_whole_model(pool):
    """fit under 'pp': the epoch's short last batch runs as a second schedule pass in its window,
    train_loss averages every micro-batch's loss, evaluation sees every stage's parameters."""
    for r in pool.run(trainer_pp_rank_fns.fit_with_short_last_batch, {"schedule": "1f1b"}):
        assert r["steps"] == 2 and np.isfinite(r["train_loss"]), r
        assert r["param_diff"] <= 1e-10 and r["eval_diff"] <= 1e-10, r
