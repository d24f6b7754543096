"""The autograd engine: accumulation, graph freeing, retain_graph, no_grad, deep graphs, and the
three hooks DDP builds on (order and exactly-once firing)."""

from __future__ import annotations

import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch.core import queue_callback as core_queue_callback
from neural_arch.core.tensor import (
    Tensor,
    enable_grad,
    is_backward_running,
    is_grad_enabled,
    no_grad,
    queue_callback,
)


def leaf(shape, seed=0, dtype=np.float64):
    return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype), requires_grad=True)


# ----------------------------------------------------------------------------- basics
def test_gradients_accumulate_across_uses_and_backwards():
    x = leaf((3,))
    y = x * 2.0 + x * 3.0  # x used twice in one graph
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, 5.0)
    (x * 1.0).sum().backward()  # a second backward adds to .grad
    np.testing.assert_allclose(x.grad.data, 6.0)


def test_leaf_and_grad_fn_attributes():
    x = leaf((2,))
    y = x * 2.0
    assert x.is_leaf and x.grad_fn is None
    assert not y.is_leaf and y.grad_fn is not None and y.requires_grad
    z = Tensor([1.0, 2.0])
    assert not (z * 2.0).requires_grad and (z * 2.0).grad_fn is None
    d = y.detach()
    assert d.is_leaf and not d.requires_grad and np.shares_memory(d.data, y.data)


def test_backward_errors():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).backward()
    x = leaf((3,))
    with pytest.raises(RuntimeError, match="single-element"):
        (x * 2.0).backward()
    with pytest.raises(RuntimeError, match="expected"):
        (x * 2.0).backward(np.ones(4))


def test_backward_with_explicit_grad_and_leaf_root():
    x = leaf((3,))
    g = Tensor(np.array([1.0, 2.0, 3.0]))
    (x * 2.0).backward(g)
    np.testing.assert_allclose(x.grad.data, [2.0, 4.0, 6.0])
    x2 = leaf((3,))
    x2.backward(g)  # backward on a leaf itself
    np.testing.assert_allclose(x2.grad.data, g.data)
    assert not np.shares_memory(x2.grad.data, g.data)


def test_first_grad_never_aliases_other_buffers():
    a, b = leaf((4,), 1), leaf((4,), 2)
    out = a + b  # Add passes the same upstream array to both inputs
    up = Tensor(np.ones(4))
    out.backward(up)
    assert not np.shares_memory(a.grad.data, b.grad.data)
    assert not np.shares_memory(a.grad.data, up.data)
    a.grad.data[...] = 7.0  # what an optimizer or DDP does in place
    np.testing.assert_allclose(b.grad.data, 1.0)
    c = leaf((2, 3))
    r = c.reshape(6)  # reshape's gradient is a view of the upstream array
    up2 = Tensor(np.ones(6))
    r.backward(up2)
    assert not np.shares_memory(c.grad.data, up2.data)


def test_grad_setter():
    x = leaf((2,))
    x.grad = Tensor(np.ones(2))
    (x * 1.0).sum().backward()
    np.testing.assert_allclose(x.grad.data, 2.0)
    x.grad = None
    assert x.grad is None
    x.grad = np.zeros(2)
    assert isinstance(x.grad, Tensor)
    with pytest.raises(RuntimeError, match="shape"):
        x.grad = Tensor(np.ones(3))


def test_retain_grad_on_intermediate():
    x = leaf((3,))
    y = x * 2.0
    y.retain_grad()
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.data, 2 * y.data)


def test_unreached_branch_does_not_get_grad():
    x, w = leaf((3,)), leaf((3,), 5)
    y = x * 2.0
    _unused = w * 3.0  # noqa: F841
    y.sum().backward()
    assert w.grad is None


def test_no_grad_input_blocks_gradient_flow():
    x = leaf((3,))
    with no_grad():
        y = x * 2.0
    z = (y * x).sum()
    z.backward()
    np.testing.assert_allclose(x.grad.data, y.data)


# ----------------------------------------------------------------------------- retain_graph
def test_second_backward_without_retain_graph_errors():
    x = leaf((3,))
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_second_backward():
    x = leaf((3,))
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    g1 = x.grad.data.copy()
    y.backward()
    np.testing.assert_allclose(x.grad.data, 2 * g1)
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_shared_subgraph_freed_after_first_backward():
    x = leaf((3,))
    h = x * 2.0
    a = h.sum()
    b = (h * 3.0).sum()
    a.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        b.backward()  # h's node was freed by the first backward


# ----------------------------------------------------------------------------- no_grad
def test_no_grad_context_and_decorator():
    x = leaf((2,))
    assert is_grad_enabled()
    with no_grad():
        assert not is_grad_enabled()
        y = x * 2.0
        with enable_grad():
            assert is_grad_enabled()
            z = x * 2.0
        assert not is_grad_enabled()
    assert is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad

    @no_grad()
    def f(t):
        assert not is_grad_enabled()
        return t * 3.0

    assert not f(x).requires_grad
    assert is_grad_enabled()


def test_no_grad_restores_mode_on_exception():
    with pytest.raises(ValueError):
        with no_grad():
            raise ValueError("boom")
    assert is_grad_enabled()


def test_backward_does_not_record_graph_inside_hooks():
    x = leaf((2,))
    seen = []
    x.register_hook(lambda g: seen.append(is_grad_enabled()))
    (x * 2.0).sum().backward()
    assert seen == [False]
    assert is_grad_enabled()


# ----------------------------------------------------------------------------- deep graphs
def test_ten_thousand_op_chain():
    x = Tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, [1.0001**10_000], rtol=1e-9)


def test_wide_fan_in():
    x = leaf((2,))
    total = x * 0.0
    for _ in range(500):
        total = total + x
    total.sum().backward()
    np.testing.assert_allclose(x.grad.data, 500.0)


# ----------------------------------------------------------------------------- hooks
def _mlp():
    """A 3-layer MLP; returns (params dict, loss-building function)."""
    rng = np.random.default_rng(0)
    p = {
        "w1": Tensor(rng.standard_normal((4, 3)), requires_grad=True),
        "b1": Tensor(np.zeros(4), requires_grad=True),
        "w2": Tensor(rng.standard_normal((4, 4)), requires_grad=True),
        "w3": Tensor(rng.standard_normal((2, 4)), requires_grad=True),
    }
    x = Tensor(rng.standard_normal((5, 3)))

    def loss(hook_h2=None):
        h1 = F.relu(F.linear(x, p["w1"], p["b1"]))
        h2 = F.tanh(F.linear(h1, p["w2"]))
        if hook_h2:
            h2.register_hook(hook_h2)
        return F.cross_entropy(F.linear(h2, p["w3"]), np.array([0, 1, 1, 0, 1]))

    return p, loss


def test_post_accumulate_hooks_fire_early_once_and_in_reverse_layer_order():
    p, loss = _mlp()
    events = []
    for name, t in p.items():
        t.register_post_accumulate_grad_hook(lambda t, name=name: events.append(("post", name)))
    l = loss(hook_h2=lambda g: events.append(("h2", None)))
    l.backward()
    names = [n for kind, n in events if kind == "post"]
    assert sorted(names) == sorted(p)  # exactly once each
    # w3's gradient is final before backward even reaches h2 (DDP overlaps on this)
    assert events.index(("post", "w3")) < events.index(("h2", None))
    assert names.index("w3") < names.index("w2") < names.index("w1")
    events.clear()
    loss().backward()  # and again, once per backward
    assert sorted(n for _, n in events) == sorted(p)


def test_post_hook_sees_final_accumulated_grad_for_reused_leaf():
    x = leaf((3,))
    seen = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.data.copy()))
    y = (x * 2.0).sum() + (x * 3.0).sum() + (x * x).sum()
    y.backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 5.0 + 2 * x.data)


def test_tensor_hook_order_replacement_and_accumulation():
    x = leaf((3,))
    x.grad = Tensor(np.full(3, 10.0))
    order = []

    def hook(g):
        order.append(("hook", x.grad.data.copy()))  # .grad not yet updated
        return g * 2.0

    x.register_hook(hook)
    x.register_post_accumulate_grad_hook(lambda t: order.append(("post", t.grad.data.copy())))
    (x * x).sum().backward()
    assert [k for k, _ in order] == ["hook", "post"]
    np.testing.assert_allclose(order[0][1], 10.0)
    np.testing.assert_allclose(order[1][1], 10.0 + 4 * x.data)


def test_hook_on_intermediate_replaces_gradient_and_fires_once():
    x = leaf((3,))
    y = x * 3.0
    calls = []

    def hook(g):
        calls.append(g.data.copy())
        return g * 0.0

    y.register_hook(hook)
    (y * 2.0 + y).sum().backward()  # y used twice: hook fires once with the summed grad
    assert len(calls) == 1
    np.testing.assert_allclose(calls[0], 3.0)
    np.testing.assert_allclose(x.grad.data, 0.0)


def test_hook_handles_remove():
    x = leaf((2,))
    calls = []
    h1 = x.register_hook(lambda g: calls.append("hook"))
    h2 = x.register_post_accumulate_grad_hook(lambda t: calls.append("post"))
    h1.remove()
    h2.remove()
    h2.remove()  # idempotent
    (x * 1.0).sum().backward()
    assert calls == []


def test_post_hook_only_for_leaves_requiring_grad():
    x = leaf((2,))
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="require grad"):
        Tensor([1.0]).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="require grad"):
        Tensor([1.0]).register_hook(lambda g: None)


def test_post_hook_not_fired_for_leaf_without_gradient_this_backward():
    a, b = leaf((2,), 1), leaf((2,), 2)
    fired = []
    b.register_post_accumulate_grad_hook(lambda t: fired.append(1))
    (a * 2.0).sum().backward()
    assert fired == []


def test_queue_callback_runs_after_all_post_hooks_in_order():
    p, loss = _mlp()
    events = []

    def post(t, name):
        events.append(("post", name))
        if name == "w3":  # queue from the first hook, as DDP does
            assert is_backward_running()
            queue_callback(lambda: events.append(("cb", 1)))
            queue_callback(lambda: events.append(("cb", 2)))
        if name == "w1":
            core_queue_callback(lambda: events.append(("cb", 3)))

    for name, t in p.items():
        t.register_post_accumulate_grad_hook(lambda t, name=name: post(t, name))
    loss().backward()
    kinds = [k for k, _ in events]
    assert kinds == ["post"] * 4 + ["cb"] * 3
    assert [v for k, v in events if k == "cb"] == [1, 2, 3]
    assert not is_backward_running()
    events.clear()
    loss().backward()  # callbacks do not persist to the next backward
    assert [v for k, v in events if k == "cb"] == [1, 2, 3]


def test_callback_may_queue_another_and_grads_are_final():
    x = leaf((2,))
    out = []

    def cb():
        out.append(x.grad.data.copy())
        if len(out) == 1:
            queue_callback(cb)

    x.register_hook(lambda g: queue_callback(cb))
    (x * 4.0).sum().backward()
    assert len(out) == 2
    np.testing.assert_allclose(out[0], 4.0)


def test_queue_callback_outside_backward_errors():
    assert not is_backward_running()
    with pytest.raises(RuntimeError, match="backward pass is running"):
        queue_callback(lambda: None)


def test_hook_exception_propagates_and_engine_recovers():
    x = leaf((2,))
    h = x.register_hook(lambda g: (_ for _ in ()).throw(ValueError("bad hook")))
    with pytest.raises(ValueError, match="bad hook"):
        (x * 2.0).sum().backward()
    assert not is_backward_running() and is_grad_enabled()
    h.remove()
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad.data, 2.0)


def test_activations_freed_after_backward_even_if_loss_kept():
    import gc
    import weakref

    x = leaf((3,))
    h = x * 2.0
    ref = weakref.ref(h)
    loss = (h * h).sum()
    del h
    loss.backward()
    gc.collect()
    assert ref() is None  # the kept `loss` no longer pins the intermediate tensor
    assert loss.item() > 0
