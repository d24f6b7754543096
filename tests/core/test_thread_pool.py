"""The core's thread pool (neural_arch/core/thread_pool.py) and the kernels that use it: split over
any number of threads, GELU, layer norm, attention and AdamW give bit-identical results."""

import math

import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn, optim
from neural_arch.core import thread_pool
from neural_arch.core.ops_attention import scaled_dot_product_attention
from neural_arch.nn import functional as F


def test_chunks_cover_the_range_in_order():
    assert thread_pool.parallel_chunks(10, lambda lo, hi: (lo, hi), min_work=0, threads=3) == [
        (0, 1), (1, 3), (3, 5), (5, 6), (6, 8), (8, 10)]  # PIECES_PER_THREAD pieces per thread
    # more threads than rows: one row each
    assert thread_pool.parallel_chunks(2, lambda lo, hi: (lo, hi), min_work=0, threads=8) == [(0, 1), (1, 2)]


def test_small_work_and_one_thread_run_inline():
    import threading

    main = threading.get_ident()
    idents = thread_pool.parallel_chunks(8, lambda lo, hi: threading.get_ident(), threads=4)  # below MIN_WORK
    assert idents == [main]
    assert thread_pool.parallel_chunks(8, lambda lo, hi: (lo, hi), min_work=0, threads=1) == [(0, 8)]


def test_an_error_in_a_worker_chunk_is_raised_in_the_caller():
    def fn(lo, hi):
        if lo > 0:
            raise ValueError(f"chunk {lo}")
        return lo

    with pytest.raises(ValueError, match="chunk"):
        thread_pool.parallel_chunks(10, fn, min_work=0, threads=2)


def test_thread_count_follows_the_setting_and_the_blas(monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_INTRAOP_THREADS", "3")
    assert thread_pool.intraop_threads() == 3
    monkeypatch.setenv("NEURAL_ARCH_INTRAOP_THREADS", "1")
    assert thread_pool.intraop_threads() == 1
    monkeypatch.delenv("NEURAL_ARCH_INTRAOP_THREADS")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1):
        assert thread_pool.intraop_threads() == 1


def _gpt_like_step(dtype, threads, monkeypatch):
    """GELU, layer norm, causal attention and AdamW, forward + backward + step, at ``threads``."""
    monkeypatch.setattr(thread_pool, "MIN_WORK", 0)
    monkeypatch.setenv("NEURAL_ARCH_INTRAOP_THREADS", str(threads))
    rng = np.random.default_rng(0)
    x = na.tensor(rng.standard_normal((3, 5, 8)).astype(dtype), requires_grad=True)
    ln = nn.LayerNorm(8)
    ln.weight.data[...] = rng.standard_normal(8)
    ln.to(dtype=getattr(na, np.dtype(dtype).name))
    h = ln(x)
    q = h.reshape(3, 5, 2, 4).permute(0, 2, 1, 3)
    a = scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)
    y = F.gelu(a.permute(0, 2, 1, 3).reshape(3, 5, 8) * 3.0)
    (y * na.tensor(rng.standard_normal((3, 5, 8)).astype(dtype))).sum().backward()
    opt = optim.AdamW(ln.parameters(), lr=0.1, foreach=True)
    opt.step()
    return [y.data, x.grad.data, ln.weight.grad.data, ln.bias.grad.data, ln.weight.data, ln.bias.data]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_split_over_threads_are_bit_identical(dtype, monkeypatch):
    one = _gpt_like_step(dtype, 1, monkeypatch)
    three = _gpt_like_step(dtype, 3, monkeypatch)
    for a, b in zip(one, three):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)


def test_gelu_matches_erf_and_keeps_float32(monkeypatch):
    monkeypatch.setattr(thread_pool, "MIN_WORK", 0)
    monkeypatch.setenv("NEURAL_ARCH_INTRAOP_THREADS", "2")
    xs = np.concatenate([np.linspace(-6, 6, 301), [0.0, -0.0, 1e-30, -1e-30]])
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in xs])
    for dtype, tol in ((np.float64, 5e-7), (np.float32, 2e-6)):
        x = na.tensor(xs.astype(dtype), requires_grad=True)
        y = F.gelu(x)
        y.sum().backward()
        assert y.dtype == x.dtype and x.grad.dtype == x.dtype
        np.testing.assert_allclose(y.data, exact, rtol=1e-6, atol=tol)
        dexact = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)
                           for v in xs])
        np.testing.assert_allclose(x.grad.data, dexact, rtol=1e-6, atol=tol)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_foreach_paths_agree_exactly(amsgrad):
    shapes = [(7, 3), (3,), (), (40,)]
    results = []
    for foreach in (False, None, True):
        rng = np.random.default_rng(1)
        params = [nn.Parameter(na.tensor(np.asarray(rng.standard_normal(s)))) for s in shapes]
        opt = optim.Adam(params, lr=0.05, weight_decay=0.1, amsgrad=amsgrad, foreach=foreach)
        for step in range(3):
            for i, p in enumerate(params):
                p.grad = na.tensor(np.full(p.shape, 0.3 * (i + 1) - step, dtype=np.float64))
            opt.step()
        results.append([p.data.copy() for p in params] + [opt.state[params[0]]["exp_avg_sq"].copy()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
