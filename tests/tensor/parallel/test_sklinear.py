"""SKLinear (single process): the sketched product matches a dense reference, shapes, costs, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.nn.sketched import SKLinear


@given(st.integers(1, 12), st.integers(1, 9), st.integers(1, 10), st.integers(1, 4), st.booleans())
def test_sklinear_matches_dense_reference(n_in, n_out, k, batch, bias):
    manual_seed(n_in * 100 + n_out)
    layer = SKLinear(n_in, n_out, k, bias=bias, dtype=np.float64)
    x = np.random.default_rng(k).normal(size=(batch, n_in))
    W = layer.weight_u.data @ layer.sketch_matrix.data
    want = x @ W.T + (layer.bias.data if bias else 0)
    xt = Tensor(x, requires_grad=True)
    y = layer(xt)
    assert np.abs(y.data - want).max() <= 1e-10
    w = np.random.default_rng(1).normal(size=want.shape)
    (y * Tensor(w)).sum().backward()
    S = layer.sketch_matrix.data
    assert np.abs(layer.weight_u.grad.data - w.T @ x @ S.T).max() <= 1e-10
    assert np.abs(xt.grad.data - w @ W).max() <= 1e-10
    assert layer.sketch_matrix.grad is None                 # a buffer: never trained
    assert np.abs(layer.dense_weight().data - W).max() <= 1e-12


def test_same_seed_same_sketch_and_buffer_in_state_dict():
    manual_seed(3)
    a = SKLinear(8, 4, 5)
    manual_seed(3)
    b = SKLinear(8, 4, 5)
    assert np.array_equal(a.sketch_matrix.data, b.sketch_matrix.data)
    assert list(a.state_dict()) == ["weight_u", "bias", "sketch_matrix"]
    assert [n for n, _ in a.named_parameters()] == ["weight_u", "bias"]


def test_sketch_approximates_the_dense_init_in_expectation():
    manual_seed(0)
    layer = SKLinear(64, 8, 4096, dtype=np.float64)
    S = layer.sketch_matrix.data
    assert np.abs(S.T @ S - np.eye(64)).max() < 0.25        # E[S^T S] = I


@pytest.mark.parametrize("args", [(0, 4, 2), (4, 0, 2), (4, 4, 0)])
def test_bad_sizes_name_the_argument(args):
    with pytest.raises(ValueError, match="must be a positive integer"):
        SKLinear(*args)
