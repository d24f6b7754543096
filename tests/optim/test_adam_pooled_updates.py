"""Adam's per-tensor updates too small for the thread pool alone, run as one pooled job
(neural_arch/optim/adam.py ``_PooledUpdates``): the same values as one tensor at a time, inline,
for any thread count."""

import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn, optim
from neural_arch.core import thread_pool
from neural_arch.optim import adam as adam_module

SHAPES = [(7, 3), (3,), (), (40,), (5, 4)]


def _train(amsgrad, foreach, threads, min_work, monkeypatch):
    monkeypatch.setattr(thread_pool, "MIN_WORK", min_work)
    monkeypatch.setenv("NEURAL_ARCH_INTRAOP_THREADS", str(threads))
    rng = np.random.default_rng(2)
    params = [nn.Parameter(na.tensor(np.asarray(rng.standard_normal(s)).astype(np.float32))) for s in SHAPES]
    opt = optim.AdamW(params, lr=0.05, weight_decay=0.1, amsgrad=amsgrad, foreach=foreach)
    for step in range(3):
        for i, p in enumerate(params):
            p.grad = na.tensor(rng.standard_normal(p.shape).astype(np.float32) * (i + 1) - step)
        opt.step()
    states = [opt.state[p][name].copy() for p in params for name in ("exp_avg", "exp_avg_sq")]
    return [p.data.copy() for p in params] + states


@pytest.mark.parametrize("amsgrad", [False, True])
def test_pooled_updates_equal_inline_updates_for_any_thread_count(amsgrad, monkeypatch):
    # MIN_WORK above any one tensor's work (14 passes x 40 elements) but below the group's
    inline = _train(amsgrad, False, 1, thread_pool.MIN_WORK, monkeypatch)
    pieces = []
    real = adam_module.parallel_chunks

    def counting(n, fn, **kw):
        out = real(n, fn, **kw)
        pieces.append(len(out))
        return out

    monkeypatch.setattr(adam_module, "parallel_chunks", counting)
    for foreach in (False, None):
        pieces.clear()
        pooled = _train(amsgrad, foreach, 3, 14 * 60, monkeypatch)
        assert max(pieces) > 1  # the group did run split over the pool
        for a, b in zip(inline, pooled):
            assert b.dtype == np.float32
            np.testing.assert_array_equal(a, b)
