"""``nn.GELU(approximate=...)`` as torch's: the exact erf form by default, GPT-2's tanh form on request."""

from __future__ import annotations

import math

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor


def _torch_gelu(v: float, approximate: str) -> float:
    # torch's documented formulas (torch.nn.GELU)
    if approximate == "tanh":
        return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_module_formula_and_gradient(approximate):
    xs = np.linspace(-5.0, 5.0, 101)
    module = nn.GELU(approximate=approximate)
    x = Tensor(xs.copy(), requires_grad=True)
    y = module(x)
    ref = np.array([_torch_gelu(v, approximate) for v in xs])
    np.testing.assert_allclose(y.data, ref, atol=3e-7)
    y.sum().backward()
    h = 1e-6  # central differences of the module itself, float64
    num = (module(Tensor(xs + h)).data - module(Tensor(xs - h)).data) / (2 * h)
    np.testing.assert_allclose(x.grad.data, num, atol=1e-6)
    # the two forms really differ (by up to ~5e-4 near |x| = 2)
    other = nn.GELU(approximate="tanh" if approximate == "none" else "none")(Tensor(xs)).data
    assert np.abs(other - y.data).max() > 1e-4


def test_gelu_module_float32_and_repr():
    x = Tensor(np.linspace(-3, 3, 7, dtype=np.float32))
    assert nn.GELU(approximate="tanh")(x).dtype == np.float32
    assert repr(nn.GELU()) == "GELU()"
    assert repr(nn.GELU(approximate="tanh")) == "GELU(approximate='tanh')"


def test_gelu_module_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.GELU(approximate="fast")
