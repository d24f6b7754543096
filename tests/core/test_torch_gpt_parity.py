"""What torch GPT scripts call in the core (issue 33): ``Generator``, ``remainder`` / ``%``,
``masked_fill``, ``tril`` / ``triu`` and ``multinomial``, with torch's semantics and errors.

Gradients are checked against finite differences in float64, values against NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_testutils import check_grad, randn

import neural_arch as na
from neural_arch.core.tensor import Tensor


# ----------------------------------------------------------------------------------- Generator
def test_generator_same_seed_same_draws_for_every_random_function():
    def draws(g):
        return [na.randn(3, generator=g).tolist(), na.rand(2, 2, generator=g).tolist(),
                na.randint(0, 100, (4,), generator=g).tolist(), na.randperm(6, generator=g).tolist(),
                na.randn_like(na.zeros(2), generator=g).tolist(),
                na.rand_like(na.zeros(2), generator=g).tolist(),
                na.randint_like(na.zeros(3), 10, generator=g).tolist(),
                na.multinomial(na.tensor([0.2, 0.3, 0.5]), 4, True, generator=g).tolist()]

    assert draws(na.Generator().manual_seed(123)) == draws(na.Generator().manual_seed(123))
    assert draws(na.Generator().manual_seed(123)) != draws(na.Generator().manual_seed(124))


def test_generator_is_independent_of_the_global_generator():
    na.manual_seed(0)
    reference = na.randn(4, generator=na.Generator().manual_seed(5)).tolist()
    global_next = na.randn(4).tolist()
    na.manual_seed(0)
    g = na.Generator().manual_seed(5)
    na.randn(100)  # the global stream moves; g's does not
    assert na.randn(4, generator=g).tolist() == reference
    na.manual_seed(0)
    na.randn(4, generator=na.Generator().manual_seed(99))  # g's draws leave the global stream alone
    assert na.randn(4).tolist() == global_next


def test_generator_torch_api():
    g = na.Generator()
    assert g.initial_seed() == 67280421310721  # torch's seed for a fresh Generator
    assert na.rand(3, generator=na.Generator()).tolist() == na.rand(3, generator=g).tolist()
    assert g.manual_seed(7) is g and g.initial_seed() == 7
    assert na.Generator().manual_seed(-1).initial_seed() == 2**64 - 1
    new = g.seed()
    assert isinstance(new, int) and g.initial_seed() == new
    state = g.get_state()
    assert state.dtype == np.uint8 and state.ndim == 1
    after = na.randn(5, generator=g).tolist()
    assert g.set_state(state) is g
    assert na.randn(5, generator=g).tolist() == after
    assert g.initial_seed() == new
    assert str(g.device) == "cpu"
    with pytest.raises(TypeError, match="seed must be an int"):
        g.manual_seed(1.5)
    with pytest.raises(TypeError, match="uint8"):
        g.set_state(na.zeros(3))
    with pytest.raises(RuntimeError, match="get_state"):
        g.set_state(Tensor(np.frombuffer(b"not a state", dtype=np.uint8).copy()))
    with pytest.raises(TypeError, match="neural_arch.Generator"):
        na.randn(2, generator=42)


def test_numpy_generator_still_accepted():
    a = na.randn(3, generator=np.random.default_rng(1)).tolist()
    assert a == na.randn(3, generator=np.random.default_rng(1)).tolist()


# ----------------------------------------------------------------------------------- remainder
@pytest.mark.parametrize("a, b", [([-7.5, -3.0, 0.5, 3.0, 7.25], [2.0, -2.0, 0.3, -1.5, 4.0])])
def test_remainder_values_match_numpy_mod(a, b):
    an, bn = np.array(a), np.array(b)
    ta, tb = na.tensor(an), na.tensor(bn)
    np.testing.assert_array_equal(na.remainder(ta, tb).data, np.mod(an, bn))
    np.testing.assert_array_equal((ta % tb).data, np.mod(an, bn))
    np.testing.assert_array_equal((ta % 2.5).data, np.mod(an, 2.5))
    np.testing.assert_array_equal((2.5 % ta).data, np.mod(2.5, an))
    np.testing.assert_array_equal(na.remainder(2.5, ta).data, np.mod(2.5, an))
    np.testing.assert_array_equal(ta.remainder(tb).data, np.mod(an, bn))


def test_remainder_integers_and_errors():
    x = na.tensor([-7, -3, 0, 3, 7])
    out = x % 3
    assert out.dtype == np.int64 and out.tolist() == [2, 0, 0, 0, 1]
    assert (x % -3).tolist() == [-1, 0, 0, 0, -2]
    assert (10 % na.tensor([3, -3])).tolist() == [1, -2]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        x % 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        x % na.tensor([1, 1, 0, 1, 1])
    assert np.isnan((na.tensor([1.0]) % 0.0).data).all()  # float: nan, as torch
    with pytest.raises(TypeError):
        na.remainder(1, 2)


def test_remainder_gradcheck():
    a = randn(1, (3, 4)) * 3
    b = randn(2, (4,), positive=True) * np.array([1, -1, 1, -1])
    # keep a/b away from integers, where remainder jumps and finite differences lie
    frac = np.mod(a / b, 1.0)
    a = a + (0.5 - frac) * b * 0.5
    check_grad(lambda x, y: na.remainder(x, y), a, b)
    check_grad(lambda x: x % 1.7, a)
    check_grad(lambda y: 5.3 % y, b)


# ----------------------------------------------------------------------------------- masked_fill
def test_masked_fill_values_broadcast_and_dtype():
    x = na.arange(6).reshape(2, 3).astype(na.float64)
    mask = na.tensor([True, False, True])
    out = x.masked_fill(mask, -1.0)
    np.testing.assert_array_equal(out.data, np.where([True, False, True], -1.0, x.data))
    assert out.dtype == np.float64
    assert na.masked_fill(x, mask, na.tensor(9.0)).tolist() == [[9.0, 1.0, 9.0], [9.0, 4.0, 9.0]]
    ints = na.tensor([1, 2]).masked_fill(na.tensor([True, False]), 7.9)
    assert ints.dtype == np.int64 and ints.tolist() == [7, 2]  # the value is cast, as torch
    wide = na.zeros(3).masked_fill(na.ones(2, 3, dtype=na.bool), 1.0)  # the mask may widen
    assert wide.shape == (2, 3)
    causal = na.ones(3, 3).masked_fill(na.tril(na.ones(3, 3)) == 0, float("-inf"))
    assert np.isneginf(causal.data).sum() == 3


def test_masked_fill_errors():
    x = na.zeros(3)
    with pytest.raises(RuntimeError, match="boolean masks"):
        x.masked_fill(na.tensor([1, 0, 1]), 1.0)
    with pytest.raises(RuntimeError, match="0-dimensional value"):
        x.masked_fill(na.tensor([True, False, True]), na.ones(1))


def test_masked_fill_gradcheck():
    mask = np.array([[True, False, False, True], [False, True, False, False], [True, True, False, False]])
    check_grad(lambda x: na.masked_fill(x, Tensor(mask), 3.0), randn(3, (3, 4)))
    check_grad(lambda x, v: x.masked_fill(Tensor(mask), v), randn(4, (3, 4)), np.array(0.5))
    check_grad(lambda x: x.masked_fill(Tensor(mask[0]), -2.0), randn(5, (3, 4)))


# ----------------------------------------------------------------------------------- tril / triu
@pytest.mark.parametrize("diagonal", [-1, 0, 2])
def test_tril_triu_values(diagonal):
    a = randn(6, (2, 3, 4))
    np.testing.assert_array_equal(na.tril(Tensor(a), diagonal).data, np.tril(a, diagonal))
    np.testing.assert_array_equal(na.triu(Tensor(a), diagonal=diagonal).data, np.triu(a, diagonal))
    np.testing.assert_array_equal(Tensor(a).tril(diagonal).data, np.tril(a, diagonal))
    np.testing.assert_array_equal(Tensor(a).triu(diagonal).data, np.triu(a, diagonal))


def test_tril_triu_errors_and_gradcheck():
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        na.tril(na.ones(3))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        na.ones(3).triu()
    check_grad(lambda x: na.tril(x, -1), randn(7, (2, 3, 3)))
    check_grad(lambda x: x.triu(1), randn(8, (3, 5)))


# ----------------------------------------------------------------------------------- multinomial
def test_multinomial_shapes_dtype_and_zero_weights():
    g = na.Generator().manual_seed(0)
    p = na.tensor([0.0, 2.0, 0.0, 1.0, 0.0])
    draws = na.multinomial(p, 500, replacement=True, generator=g)
    assert draws.dtype == np.int64 and draws.shape == (500,)
    assert set(draws.tolist()) <= {1, 3}  # zero weights are never drawn
    rows = na.multinomial(na.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 5.0, 1.0]]), 2, generator=g)
    assert rows.shape == (2, 2)
    assert len(set(rows.tolist()[0])) == 2 and set(rows.tolist()[1]) == {2, 3}
    assert sorted(p.multinomial(2, generator=g).tolist()) == [1, 3]
    assert not draws.requires_grad


def test_multinomial_frequencies_with_replacement():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    n = 40_000
    draws = na.multinomial(na.tensor(p * 7), n, replacement=True, generator=na.Generator().manual_seed(1))
    freq = np.bincount(draws.data, minlength=4) / n
    # a fixed seed makes this deterministic; the bound is > 10 standard deviations anyway
    np.testing.assert_allclose(freq, p, atol=0.025)


def test_multinomial_without_replacement_draws_in_order():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    rows = 20_000
    draws = na.multinomial(na.tensor(np.tile(p, (rows, 1))), 2, generator=na.Generator().manual_seed(2))
    first, second = draws.data[:, 0], draws.data[:, 1]
    assert (first != second).all()
    np.testing.assert_allclose(np.bincount(first, minlength=4) / rows, p, atol=0.025)
    # the second draw is from the rest, renormalised: P(second=j) = sum_i p_i p_j / (1 - p_i)
    expected_second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
    np.testing.assert_allclose(np.bincount(second, minlength=4) / rows, expected_second, atol=0.025)


def test_multinomial_errors_as_torch():
    with pytest.raises(RuntimeError, match="1 or 2 dim"):
        na.multinomial(na.ones(2, 2, 2), 1)
    with pytest.raises(RuntimeError, match="floating-point"):
        na.multinomial(na.tensor([1, 2]), 1)
    with pytest.raises(RuntimeError, match="n_sample <= 0"):
        na.multinomial(na.ones(3), 0)
    with pytest.raises(RuntimeError, match="without replacement"):
        na.multinomial(na.ones(3), 4)
    with pytest.raises(RuntimeError, match="element < 0"):
        na.multinomial(na.tensor([0.5, -0.1]), 1)
    with pytest.raises(RuntimeError, match="inf"):
        na.multinomial(na.tensor([0.5, float("nan")]), 1, True)
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        na.multinomial(na.tensor([[1.0, 1.0], [0.0, 0.0]]), 1, True)
    with pytest.raises(RuntimeError, match="not enough non-negative category"):
        na.multinomial(na.tensor([0.0, 1.0, 0.0]), 2)
    assert na.multinomial(na.tensor([0.0, 1.0, 0.0]), 5, replacement=True).tolist() == [1] * 5
