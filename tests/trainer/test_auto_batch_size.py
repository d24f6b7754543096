"""``examples/production_train.py --auto-batch-size``: the largest micro-batch whose step fits the
budget by the memory model (neural_arch.memory.estimate plus the MLP's activations), checked against
tracemalloc's peak of a real step, and the script saying what it chose."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import tracemalloc

import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import memory, nn, optim
from neural_arch.core.tensor import manual_seed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("production_train_example",
                                                  os.path.join(REPO, "examples", "production_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mlp(hidden=64):
    manual_seed(0)
    return nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def test_the_largest_batch_that_fits_the_model(example):
    model = _mlp()
    per_sample = example.activation_bytes_per_sample(model, 20, 4)
    fixed = memory.estimate(model, strategy="ddp", world_size=2, optimizer="adam").total
    for budget in (2**18, 2**20, 3 * 2**20 + 7):
        batch, why = example.choose_batch_size(model, "ddp", 2, 20, budget)
        assert fixed + batch * per_sample <= budget < fixed + (batch + 1) * per_sample
        assert f"auto batch size: {batch} samples per rank" in why
    ddp, _ = example.choose_batch_size(model, "ddp", 4, 20, 2**20)
    fsdp, _ = example.choose_batch_size(model, "fsdp", 4, 20, 2**20)
    assert fsdp > ddp                                   # sharding leaves more room for activations
    assert example.choose_batch_size(model, "ddp", 2, 20, 2**30, cap=100)[0] == 100
    with pytest.raises(SystemExit, match="does not hold one sample.*--memory-budget"):
        example.choose_batch_size(model, "ddp", 1, 20, fixed)
    assert example.parse_bytes("1.5KiB") == 1536


def test_the_chosen_batch_fits_a_measured_step(example):
    """One real step (forward, backward, Adam's first step) at the chosen batch, traced: its peak plus
    the parameters (allocated before tracing) stays within the budget."""
    model = _mlp(hidden=128)
    budget = 2**21
    batch, _ = example.choose_batch_size(model, "ddp", 1, 20, budget)
    x = np.random.default_rng(0).standard_normal((batch, 20)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 4, batch)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    params = sum(p.data.nbytes for p in model.parameters())
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        F.cross_entropy(model(x), y).backward()
        opt.step()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert params + peak + x.nbytes <= budget, (batch, params + peak, budget)
    assert params + peak > budget // 2          # and it is not wastefully small


def test_the_script_says_what_it_chose_and_trains_with_it(example, capsys):
    rc = example.main(["--auto-batch-size", "--memory-budget", "200KiB", "--epochs", "1", "--samples", "256",
                       "--no-progress"])
    out = capsys.readouterr().out
    chosen = re.search(r"auto batch size: (\d+) samples per rank .* budget from --memory-budget", out)
    assert rc == 0 and chosen, out
    steps = math.ceil(int(0.8 * 256) / int(chosen.group(1)))
    assert re.search(rf"final: epoch=0 .* steps={steps} world=1", out), out
