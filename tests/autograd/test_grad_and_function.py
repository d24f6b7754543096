"""torch's ``autograd.grad``/``autograd.backward`` and ``autograd.Function`` against analytic float64
references: the same gradients as ``Tensor.backward``, no ``.grad`` touched by ``grad``, torch's
errors; custom ops with one and several outputs, non-Tensor arguments, non-differentiable outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch.autograd as autograd
from neural_arch.core.tensor import Tensor


def _leaf(values):
    return Tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), seed=st.integers(0, 10_000), stale=st.booleans())
@example(n=1, seed=0, stale=True)
def test_grad_equals_backward_and_leaves_every_grad_alone(n, seed, stale):
    rng = np.random.default_rng(seed)
    a_np, b_np = rng.normal(size=n), rng.normal(size=n)
    a, b = _leaf(a_np), _leaf(b_np)
    if stale:                                   # a .grad from before: grad() must not change it
        a.grad = Tensor(np.full(n, 7.0))
    h = a * b                                   # non-leaf input too
    out = (h * h).sum() + (a * 3.0).sum()
    ga, gb, gh = autograd.grad(out, [a, b, h])
    np.testing.assert_allclose(ga.data, 2 * a_np * b_np ** 2 + 3.0, rtol=1e-12)
    np.testing.assert_allclose(gb.data, 2 * b_np * a_np ** 2, rtol=1e-12)
    np.testing.assert_allclose(gh.data, 2 * a_np * b_np, rtol=1e-12)
    assert b.grad is None and h.grad is None
    if stale:
        np.testing.assert_array_equal(a.grad.data, np.full(n, 7.0))
    else:
        assert a.grad is None
    with pytest.raises(RuntimeError):           # the graph was freed (retain_graph defaults to False)
        autograd.grad(out, [a])


def test_several_outputs_with_grad_outputs_and_unused_inputs():
    x, y, unused = _leaf([1.0, 2.0]), _leaf([3.0, -1.0]), _leaf([5.0])
    o1, o2 = x * y, (x * x).sum()
    gx, gy = autograd.grad([o1, o2], [x, y], grad_outputs=[Tensor(np.array([1.0, 10.0])), None], retain_graph=True)
    np.testing.assert_allclose(gx.data, [1.0 * 3.0 + 2 * 1.0, 10.0 * -1.0 + 2 * 2.0])
    np.testing.assert_allclose(gy.data, [1.0 * 1.0, 10.0 * 2.0])
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        autograd.grad(o2, [x, unused], retain_graph=True)
    assert autograd.grad(o2, [x, unused], retain_graph=True, allow_unused=True)[1] is None
    zeros = autograd.grad(o2, [unused], retain_graph=True, materialize_grads=True)[0]
    np.testing.assert_array_equal(zeros.data, [0.0])
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"):
        autograd.grad(o1, [x])
    with pytest.raises(RuntimeError, match="does not require grad"):
        autograd.grad(o2, [Tensor(np.ones(2))])
    with pytest.raises(NotImplementedError, match="create_graph=True"):
        autograd.grad(o2, [x], create_graph=True)


def test_grad_runs_no_accumulation_hook():
    """``grad`` accumulates nothing, so a post-accumulate hook (DDP's reducer uses one) must not run."""
    w = _leaf([1.0, 2.0])
    calls = []
    w.register_post_accumulate_grad_hook(lambda t: calls.append(1))
    autograd.grad((w * w).sum(), [w])
    assert calls == []
    (w * w).sum().backward()
    assert calls == [1]


def test_autograd_backward_sums_several_roots():
    x = _leaf([1.0, 2.0])
    autograd.backward([x.sum(), (x * x).sum()], [None, Tensor(np.array(2.0))])
    np.testing.assert_allclose(x.grad.data, [1 + 2 * 2 * 1.0, 1 + 2 * 2 * 2.0])


class _Cube(autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * x * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.k, None


class _SumAndProduct(autograd.Function):
    """Two outputs, and an integer one (an argmax) that gets no gradient."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        index = Tensor(np.argmax(a.data, keepdims=True))
        ctx.mark_non_differentiable(index)
        return a + b, a * b, index

    @staticmethod
    def backward(ctx, g_sum, g_prod, g_index):
        a, b = ctx.saved_tensors
        return g_sum + g_prod * b, g_sum + g_prod * a


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.floats(-3, 3, allow_nan=False))
def test_a_function_with_its_own_backward_equals_the_analytic_gradient(seed, k):
    rng = np.random.default_rng(seed)
    x_np = rng.normal(size=4)
    x = _leaf(x_np)
    y = _Cube.apply(x, k)
    assert y.requires_grad and y.grad_fn is not None
    (y * Tensor(np.arange(4.0))).sum().backward()
    np.testing.assert_allclose(x.grad.data, np.arange(4.0) * 3 * x_np ** 2 * k, rtol=1e-12, atol=1e-12)


def test_a_function_with_several_outputs_gets_each_outputs_gradient():
    a_np, b_np = np.array([1.0, 4.0, 2.0]), np.array([3.0, -1.0, 0.5])
    a, b = _leaf(a_np), _leaf(b_np)
    s, p, index = _SumAndProduct.apply(a, b)
    assert not index.requires_grad and index.tolist() == [1]
    (s * 2.0 + p * p).sum().backward()
    np.testing.assert_allclose(a.grad.data, 2.0 + 2 * a_np * b_np * b_np, rtol=1e-12)
    np.testing.assert_allclose(b.grad.data, 2.0 + 2 * a_np * b_np * a_np, rtol=1e-12)
    a2, b2 = _leaf(a_np), _leaf(b_np)
    _SumAndProduct.apply(a2, b2)[1].sum().backward()       # only one output used: zeros for the other
    np.testing.assert_allclose(a2.grad.data, b_np)


def test_function_needs_input_grad_no_grad_and_errors():
    seen = []

    class Probe(autograd.Function):
        @staticmethod
        def forward(ctx, x, y, scale):
            seen.append(ctx.needs_input_grad)
            return x * y * scale

        @staticmethod
        def backward(ctx, g):
            return g, g                       # one too few

    x, y = _leaf([1.0]), Tensor(np.array([2.0]))
    out = Probe.apply(x, y, 2.0)
    assert seen[-1] == (True, False, False)
    with pytest.raises(RuntimeError, match="incorrect number of gradients \\(expected 3, got 2\\)"):
        out.sum().backward()
    with autograd.no_grad():
        assert not Probe.apply(x, y, 2.0).requires_grad

    class WrongShape(autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return g                           # a scalar for a vector input

    with pytest.raises(RuntimeError, match="invalid gradient at index 0"):
        WrongShape.apply(_leaf([1.0, 2.0])).backward()
    with pytest.raises(RuntimeError, match="call Probe.apply"):
        Probe()
