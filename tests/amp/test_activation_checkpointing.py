"""Activation checkpointing: gradients equal the non-checkpointed ones (float64 <= 1e-12),
dropout included; seed 002's names; memory statistics."""

import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import memory, nn
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.utils.checkpoint import apply_activation_checkpointing, checkpoint, checkpoint_sequential


def _net(seed=0, p=0.3):
    rng = np.random.default_rng(seed)
    m = nn.Sequential(nn.Linear(6, 16, dtype=np.float64), nn.Tanh(), nn.Dropout(p),
                      nn.Linear(16, 16, dtype=np.float64), nn.ReLU(), nn.Dropout(p),
                      nn.Linear(16, 3, dtype=np.float64))
    for q in m.parameters():
        q.data[...] = rng.normal(0, 0.5, size=q.shape)
    return m


def _grads(run, m, x):
    manual_seed(123)
    xt = Tensor(x, requires_grad=True)
    out = run(m, xt)
    (out * out).sum().backward()
    return [q.grad.data.copy() for q in m.parameters()] + [xt.grad.data.copy()], out.data.copy()


RUNS = {
    "checkpoint-whole": lambda m, x: checkpoint(m, x, use_reentrant=False),
    "checkpoint-reentrant": lambda m, x: checkpoint(m, x, use_reentrant=True),
    "checkpoint-two-parts": lambda m, x: checkpoint(lambda h: m[3:](h), checkpoint(lambda h: m[:3](h), x)),
    "checkpoint_sequential-3": lambda m, x: checkpoint_sequential(m, 3, x),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_checkpointed_gradients_equal_plain_ones_with_dropout(name):
    x = np.random.default_rng(5).normal(size=(8, 6))
    plain_grads, plain_out = _grads(lambda m, xt: m(xt), _net(), x)
    ck_grads, ck_out = _grads(RUNS[name], _net(), x)
    assert np.array_equal(plain_out, ck_out)
    for a, b in zip(plain_grads, ck_grads):
        assert np.abs(a - b).max() <= 1e-12
    # the check can fail: a different dropout mask changes the gradients
    manual_seed(7)
    other = _net()
    xt = Tensor(x, requires_grad=True)
    (other(xt) ** 2).sum().backward()
    assert max(np.abs(a - q.grad.data).max() for a, q in zip(plain_grads, other.parameters())) > 1e-6


def test_checkpoint_keeps_no_graph_in_forward_and_rng_continues():
    m = _net()
    manual_seed(1)
    out = checkpoint(m, Tensor(np.ones((2, 6))))
    assert out.requires_grad and out.grad_fn.name == "Checkpoint"
    from neural_arch.core.rng import get_generator

    after_forward = get_generator().random()
    manual_seed(1)
    m(Tensor(np.ones((2, 6))))
    assert get_generator().random() == after_forward


def test_gpt_blocks_checkpointed_match():
    def run(ck):
        manual_seed(0)
        gpt = nn.GPT(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dropout=0.1).double()
        if ck:
            apply_activation_checkpointing(gpt, check_fn=lambda mod: isinstance(mod, nn.TransformerBlock))
        idx = np.random.default_rng(3).integers(0, 11, (3, 6))
        manual_seed(9)
        logits = gpt(idx)
        F.cross_entropy(logits.reshape(-1, 11), idx.reshape(-1)).backward()
        return [p.grad.data for p in gpt.parameters()]

    for a, b in zip(run(False), run(True)):
        assert np.abs(a - b).max() <= 1e-12


def test_seed_002_names():
    from neural_arch.optimization import gradient_checkpointing, memory_pool_scope

    m = nn.Sequential(nn.Sequential(nn.Linear(4, 4, dtype=np.float64)), nn.Sequential(nn.Linear(4, 2, dtype=np.float64)))
    with gradient_checkpointing.checkpoint_scope(m):
        assert gradient_checkpointing.is_checkpointing_enabled()
        with memory_pool_scope():
            out = m(Tensor(np.ones((3, 4))))
            assert out.grad_fn.name == "Checkpoint"
            out.sum().backward()
    assert not gradient_checkpointing.is_checkpointing_enabled()
    assert "forward" not in m[0].__dict__  # unwrapped after the scope
    assert m[0][0].weight.grad is not None


def test_seed_002_scope_without_a_model_checkpoints_the_model_called_in_it():
    """Seed 002 writes ``with checkpoint_scope(): output = ddp_model(batch)``: no model is named, so the
    first module called in the scope is the model, and its blocks are recomputed in backward."""
    from neural_arch.optimization import checkpoint_scope

    calls = []

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4, dtype=np.float64)

        def forward(self, x):
            calls.append("forward")
            return self.lin(x).tanh()

    class Wrapper(nn.Module):   # a DDP-like wrapper: the blocks sit one level down
        def __init__(self):
            super().__init__()
            self.module = nn.Sequential(*[Block() for _ in range(2)])

        def forward(self, x):
            return self.module(x)

    def grads(scoped):
        manual_seed(3)
        model = Wrapper()
        calls.clear()
        x = Tensor(np.linspace(-1, 1, 12).reshape(3, 4))
        if scoped:
            with checkpoint_scope():
                out = model(x)
                out.sum().backward()
        else:
            out = model(x)
            out.sum().backward()
        return [p.grad.data.copy() for p in model.parameters()], len(calls), model

    plain, plain_calls, _ = grads(False)
    ckpt, ckpt_calls, model = grads(True)
    assert plain_calls == 2 and ckpt_calls == 4           # each block ran again in backward
    for a, b in zip(plain, ckpt):
        assert np.array_equal(a, b)
    assert all("_checkpoint_wrapper" not in m.__dict__ for m in model.modules())   # unwrapped after


def test_memory_stats_track_peak():
    memory.reset_peak_memory_stats()
    base = memory.memory_allocated()
    a = np.ones(500_000)
    peak = memory.max_memory_allocated()
    del a
    assert peak - base >= 4_000_000
    memory.reset_peak_memory_stats()
    assert memory.max_memory_allocated() < peak
    s = memory.stats()
    assert s["backend"] == "tracemalloc" and s["allocated_bytes.all.peak"] >= s["allocated_bytes.all.current"]
