"""``register_full_backward_hook`` / ``register_full_backward_pre_hook`` against the gradients of the
same model without hooks (float64): what the hooks see, what their replacements change, torch's
order and limits."""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.autograd import no_grad
from neural_arch.core.tensor import Tensor


def _model(seed: int = 0):
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.Tanh(), nn.Linear(4, 2, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.shape)
    return model


def _run(model, x_np, requires_grad=True):
    x = Tensor(x_np.copy(), requires_grad=requires_grad)
    (model(x) * Tensor(np.arange(1.0, 3.0))).sum().backward()
    return x


def test_hooks_see_the_gradients_of_the_call_in_torchs_order():
    x_np = np.random.default_rng(1).normal(size=(5, 3))
    plain = _model()
    x_plain = _run(plain, x_np)
    hooked = _model()
    seen = []
    for name, layer in hooked.named_children():
        layer.register_full_backward_pre_hook(lambda m, gout, name=name: seen.append(("pre", name, gout[0].data.copy())))
        layer.register_full_backward_hook(
            lambda m, gin, gout, name=name: seen.append(("full", name, gin[0].data.copy(), gout[0].data.copy())))
    x = _run(hooked, x_np)
    assert [(s[0], s[1]) for s in seen] == [("pre", "2"), ("full", "2"), ("pre", "1"), ("full", "1"),
                                            ("pre", "0"), ("full", "0")]       # output layer first
    np.testing.assert_allclose(seen[0][2], np.broadcast_to(np.arange(1.0, 3.0), (5, 2)))
    np.testing.assert_allclose(seen[-1][2], x_plain.grad.data, rtol=1e-12)   # grad_input of the first layer
    np.testing.assert_allclose(x.grad.data, x_plain.grad.data, rtol=1e-12)   # hooks that return None change nothing
    for (name, p), q in zip(hooked.named_parameters(), plain.parameters()):
        np.testing.assert_allclose(p.grad.data, q.grad.data, rtol=1e-12, err_msg=name)


def test_replacements_change_what_flows_on():
    x_np = np.random.default_rng(2).normal(size=(4, 3))
    plain, scaled, muted = _model(), _model(), _model()
    x_plain = _run(plain, x_np)
    scaled[0].register_full_backward_hook(lambda m, gin, gout: (gin[0] * 3.0,))     # only what reaches x
    x = _run(scaled, x_np)
    np.testing.assert_allclose(x.grad.data, 3.0 * x_plain.grad.data, rtol=1e-12)
    np.testing.assert_allclose(scaled[0].weight.grad.data, plain[0].weight.grad.data, rtol=1e-12)
    handle = muted[2].register_full_backward_pre_hook(lambda m, gout: (gout[0] * 0.0,))  # before the layer
    _run(muted, x_np)
    assert not np.any(muted[2].weight.grad.data) and not np.any(muted[0].weight.grad.data)
    handle.remove()
    muted.zero_grad()
    _run(muted, x_np)
    np.testing.assert_allclose(muted[0].weight.grad.data, plain[0].weight.grad.data, rtol=1e-12)


def test_an_input_without_grad_gets_none_and_limits_are_clear_errors():
    model = _model()
    seen = []
    model[0].register_full_backward_hook(lambda m, gin, gout: seen.append((gin, gout[0].shape)))
    _run(model, np.ones((2, 3)), requires_grad=False)
    assert seen == [((None,), (2, 4))]
    with no_grad():
        model(Tensor(np.ones((2, 3))))          # no graph: nothing wrapped, no hook
    assert len(seen) == 1

    class Pair(nn.Module):
        def forward(self, a, b):
            return a * b

    pair = Pair()
    pair.register_full_backward_hook(lambda m, gin, gout: None)
    with pytest.raises(NotImplementedError, match="Pair: a full backward hook on a call with 2 inputs"):
        pair(Tensor(np.ones(2), requires_grad=True), Tensor(np.ones(2), requires_grad=True))
    bad = nn.Identity()
    bad.register_full_backward_hook(lambda m, gin, gout: (Tensor(np.ones(3)),))
    with pytest.raises(RuntimeError, match="invalid grad_input\\[0\\]: expected a Tensor of shape \\(2,\\)"):
        bad(Tensor(np.ones(2), requires_grad=True)).sum().backward()
