"""DistributedTrainer's API in this process (a world of one the trainer initialises and destroys):
strategy errors, optimizer checks, float16 loss scaling, DistributedMonitor, fit() with checkpoints,
evaluation and resume. The multi-rank proofs are in test_trainer.py."""

import csv
import os

import numpy as np
import pytest
import trainer_rank_fns as fns

import neural_arch.distributed as dist
import neural_arch.nn.functional as F
from neural_arch.distributed.trainer import (
    STRATEGIES,
    DistributedMonitor,
    DistributedTrainer,
    EnhancedDistributedTrainer,
    resolve_strategy,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_leftover_group():
    yield
    assert not dist.is_initialized(), "the trainer left its process group behind"


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown strategy 'horovod'.*'ddp'.*'zero2'.*'fsdp'"):
        resolve_strategy("horovod")
    # fully_shard, tp, pp and their meshes are strategies now (tests/trainer/test_trainer_strategies.py)
    assert resolve_strategy("fully_shard") is STRATEGIES["fully_shard"]
    assert resolve_strategy({"dp": 1, "tp": 2}, world_size=2).mesh == (("dp", 1), ("tp", 2))
    assert resolve_strategy("pp").name == "pp"
    with pytest.raises(ValueError, match="describes 4 ranks but the world has 2"):
        resolve_strategy({"dp": 2, "tp": 2}, world_size=2)
    assert resolve_strategy({"dp": 2}, world_size=2) is STRATEGIES["ddp"]
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="unknown strategy"):
        DistributedTrainer(fns.build(), strategy="nope").close()


def test_constructor_and_optimizer_checks():
    from neural_arch import nn, optim

    with pytest.raises(ValueError, match="cpu_offload=True .* needs strategy='fsdp'"):
        DistributedTrainer(fns.build(), strategy="ddp", cpu_offload=True)
    model = fns.build()
    with DistributedTrainer(model, strategy="fsdp", cpu_offload=True) as t:
        other = optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        with pytest.raises(ValueError, match="not the model's"):
            t.train_step(fns.micro_batch(*fns.data(1, 1), 0, 0, 0, 1), other, F.cross_entropy, 0)
        used = fns.make_optimizer(model.parameters())
        used.state[next(iter(model.parameters()))] = {"step": 1}
        with pytest.raises(ValueError, match="has state or several param groups"):
            t.train_step(fns.micro_batch(*fns.data(1, 1), 0, 0, 0, 1), used, F.cross_entropy, 0)
        with pytest.raises(ValueError, match="no checkpoint_dir"):
            t.save_checkpoint(0, fns.make_optimizer(model.parameters()), 1.0)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_fp16_uses_a_grad_scaler_and_reports_skipped_steps():
    model = fns.build(0, np.float32)
    with DistributedTrainer(model, strategy="zero2", mixed_precision="fp16", gradient_accumulation_steps=2) as t:
        assert t.amp_dtype == "float16" and type(t.scaler).__name__ == "ShardedGradScaler"
        opt = fns.make_optimizer(model.parameters())
        X, y = fns.data(2, 1, 2, dtype=np.float32)
        t.scaler._scale = 1e38   # overflows float16: the first step must be skipped, then backed off
        metrics = fns.train_windows(t, opt, X, y, 0, 2, 2)
        ends = [m for m in metrics if not m["accumulating"]]
        assert ends[0]["skipped"] and t.scaler.get_scale() < 1e38
        assert all(np.isfinite(m["loss"]) for m in metrics)


def test_monitor_writes_csv_on_rank_zero_only(tmp_path):
    with DistributedMonitor(tmp_path / "r0", rank=0, tensorboard=False) as mon:
        row = mon.log_training_step(loss=0.5, batch_size=8, step_time=0.02, comm_time=0.005)
        mon.log_training_step(loss=0.4, batch_size=8, step_time=0.04, comm_time=0.01)
    assert row["samples_per_second"] == pytest.approx(400.0) and row["comm_overhead_percent"] == pytest.approx(25.0)
    with open(tmp_path / "r0" / "training_log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["0", "1"] and float(rows[1]["loss"]) == 0.4
    with DistributedMonitor(tmp_path / "r1", rank=1, tensorboard=False) as mon:
        mon.log_training_step(loss=0.5, batch_size=8, step_time=0.02, comm_time=0.005)
    assert not os.path.exists(tmp_path / "r1")


def test_fit_evaluates_checkpoints_and_resumes(tmp_path, capsys):
    from neural_arch.data import DataLoader, TensorDataset

    X, y = fns.data(4, 1, 4)                     # 32 samples: 8 batches of 4 per epoch
    loader = DataLoader(TensorDataset(X, y), batch_size=4)
    kw = {"checkpoint_dir": tmp_path / "ckpt", "log_dir": tmp_path / "logs", "keep_last": 1}
    model = fns.build()
    with EnhancedDistributedTrainer(model, "fsdp", False, 2, 0.5, True, **kw) as t:
        assert t.checkpointed_modules and t.gradient_clip_val == 0.5
        opt = fns.make_optimizer(model.parameters())
        out = t.fit(loader, epochs=2, eval_loader=(X, y), optimizer=opt, criterion=F.cross_entropy)
    assert [h["epoch"] for h in out["history"]] == [0, 1]
    assert out["history"][1]["eval_num_samples"] == 32 and out["history"][1]["optimizer_steps"] == 8
    assert out["history"][1]["eval_loss"] < out["history"][0]["eval_loss"]
    assert out["performance"]["steps"] == 16
    assert "Training finished" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step_00000008"]   # keep_last=1; the best is the newest
    with open(tmp_path / "logs" / "training_log.csv") as f:
        assert len(list(csv.DictReader(f))) == 16
    # a new run resumes after epoch 1 and only trains epoch 2
    model = fns.build(3)
    with DistributedTrainer(model, "ddp", gradient_accumulation_steps=2, **kw) as t:
        opt = fns.make_optimizer(model.parameters())
        again = t.fit(loader, epochs=3, optimizer=opt, criterion=F.cross_entropy, progress=False)
        assert t.global_step == 12
    assert [h["epoch"] for h in again["history"]] == [2]


def test_checkpoints_keep_the_last_k_and_the_best_apart(tmp_path):
    model = fns.build()
    with DistributedTrainer(model, "ddp", checkpoint_dir=tmp_path, keep_last=2) as t:
        opt = fns.make_optimizer(model.parameters())
        X, y = fns.data(1, 1)
        for i, best in enumerate([True, False, False, False]):
            t.train_step(fns.micro_batch(X, y, 0, i, 0, 1), opt, F.cross_entropy, i)
            t.save_checkpoint(epoch=i, optimizer=opt, loss=1.0 - i / 10, is_best=best)
        assert sorted(os.listdir(tmp_path)) == ["step_00000001", "step_00000003", "step_00000004"]
        assert t.load_checkpoint("best", opt)["epoch"] == 0 and t.global_step == 1
        assert t.resume(opt)["epoch"] == 3 and t.global_step == 4


def test_seed_003_enhanced_trainer_snippet_runs(tmp_path, capsys):
    # seed 003's "Python API - Enhanced Trainer", imports changed to neural_arch, a tiny model and data
    from neural_arch import nn, optim
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.distributed.trainer import DistributedMonitor as _Monitor

    X, y = fns.data(2, 1, 4)
    dataloader = DataLoader(TensorDataset(X.astype(np.float32), y), batch_size=4)
    model = nn.Sequential(nn.Linear(fns.D_IN, 8), nn.ReLU(), nn.Linear(8, fns.D_OUT))
    trainer = EnhancedDistributedTrainer(
        model=model, strategy="fsdp", mixed_precision=True, gradient_accumulation_steps=4, gradient_clip_val=1.0,
        enable_activation_checkpointing=True, cpu_offload=True, checkpoint_dir=str(tmp_path / "checkpoints"),
        log_dir=str(tmp_path / "logs"))
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    monitor = _Monitor(log_dir=str(tmp_path / "logs"), tensorboard=False)
    best_loss = float("inf")
    for epoch in range(2):
        losses = []
        for step, batch in enumerate(dataloader):
            metrics = trainer.train_step(batch=batch, optimizer=optimizer, criterion=criterion, step=step)
            monitor.log_training_step(loss=metrics["loss"], batch_size=batch[0].size(0),
                                      step_time=metrics["compute_time"], comm_time=metrics["communication_time"])
            losses.append(metrics["loss"])
        avg_loss = sum(losses) / len(losses)
        trainer.save_checkpoint(epoch=epoch, optimizer=optimizer, loss=avg_loss, is_best=(avg_loss < best_loss))
        best_loss = min(best_loss, avg_loss)
    final_metrics = trainer.get_performance_metrics()
    print(f"Throughput: {final_metrics['samples_per_second_per_gpu']:.1f} samples/s/GPU")
    print(f"Communication Overhead: {final_metrics['communication_overhead_percent']:.1f}%")
    monitor.close()
    trainer.close()
    assert "samples/s/GPU" in capsys.readouterr().out and trainer.global_step == 2
