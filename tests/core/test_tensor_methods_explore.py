"""Exploring properties of torch's Tensor methods that a ported script calls and that were an
``AttributeError`` before (:mod:`neural_arch.core.tensor_methods`, plus the unary math added to
:mod:`neural_arch.core.ops_activation`): ``t``/``mT``/``H``, ``repeat``, ``index_add``/``index_copy``/
``index_fill``/``scatter`` and their in-place forms, ``addcmul_``/``addcdiv_``, the random fills,
``median``, ``tensor_split``, ``kron``, ``cross``...

Each is checked against a float64 NumPy reference written from torch's documented formula, its
gradient against central finite differences in float64 (``core_testutils.check_grad``); the in-place
forms against ``ops_inplace``'s rules (aliases see the write, the version moves, a leaf that requires
grad and a recorded tensor raise, a constant updated from a tensor that requires grad joins the
graph); bad input a clear error at the call; the array ops on the strict fake device without a host
wait.

Example of what one property checks::

    >>> import neural_arch as na
    >>> p, g = na.ones(2), na.tensor([1.0, 2.0])
    >>> exp_avg_sq = na.zeros(2).addcmul_(g, g, value=0.5)        # an optimizer's update, in place
    >>> p.addcdiv_(g, exp_avg_sq.sqrt().add_(1e-8), value=-0.1).tolist()
    [0.8585786819458008, 0.8585786819458008]
"""

from __future__ import annotations

import doctest
import importlib.util
import math
import pathlib

import numpy as np
import pytest
from core_testutils import check_grad
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor
from neural_arch.core import tensor_methods

TOL = {np.float64: 1e-10, np.float32: 3e-6}
DTYPES = st.sampled_from([np.float64, np.float32])
SMALL = settings(max_examples=15, deadline=None)
SHAPES = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


def _data(seed, shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(got, want, dtype=np.float64, what=""):
    got = np.asarray(got.data if isinstance(got, Tensor) else got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=what)


# ================================================================================ the surface
#: the methods the task listed (each an AttributeError before), and the torch aliases added with them
_LISTED_TEXT = """t t_ mT H mH repeat masked_fill_ index_add_ index_add index_copy_ index_copy index_fill_ index_fill
scatter scatter_ clamp_min clamp_max clamp_min_ clamp_max_ is_contiguous stride storage_offset unsqueeze_
squeeze_ unflatten tensor_split abs_ neg_ exp_ sqrt_ pow_ reciprocal reciprocal_ square square_ rsqrt log10
trunc frac fmod logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not
where fliplr flipud tril_ triu_ mm dot mv addmm addmv baddbmm addcmul addcmul_ addcdiv addcdiv_ uniform_
normal_ bernoulli_ bernoulli random_ exponential_ detach_ isnan isinf isfinite nansum nanmean median
nanmedian select transpose_ sinh cosh tan asin acos atan arcsin arccos arctan hypot fmax fmin floor_divide
true_divide rsub kron cross trace std_mean var_mean sum_to_size type is_complex is_signed positive negative
sgn absolute fix divide multiply subtract greater less greater_equal less_equal not_equal lerp_ relu_
sigmoid_ tanh_ log_ floor_ ceil_ round_ sign_ log_normal_ cauchy_ geometric_"""
LISTED = _LISTED_TEXT.split()


def test_every_listed_method_exists_and_is_documented_with_an_example():
    x = na.ones(2, 2)
    missing = [n for n in LISTED if not hasattr(x, n)]
    assert not missing, missing
    undocumented = []
    for name in LISTED:
        attr = getattr(Tensor, name)
        doc = attr.__doc__ or ""
        if ">>>" not in doc:
            undocumented.append(name)
    assert not undocumented, undocumented


def test_the_docstring_examples_of_the_bound_methods_run():
    """Closures bound on Tensor are not module attributes, so doctest.testmod would not see them."""
    assert doctest.testmod(tensor_methods, verbose=False).failed == 0
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    parser = doctest.DocTestParser()
    for name in sorted(vars(Tensor)):
        attr = vars(Tensor)[name]
        fn = attr.fget if isinstance(attr, property) else attr
        if getattr(fn, "__module__", None) != tensor_methods.__name__ or not attr.__doc__:
            continue
        runner.run(parser.get_doctest(attr.__doc__, {}, name, None, 0))
    assert runner.failures == 0


# ================================================================================ unary math (ops_activation)
#: name -> (math function per element, derivative per element, domain transform of normal data)
UNARY = {
    "tan": (math.tan, lambda v: 1 / math.cos(v) ** 2, lambda a: a * 0.5),
    "sinh": (math.sinh, math.cosh, lambda a: a),
    "cosh": (math.cosh, math.sinh, lambda a: a),
    "asin": (math.asin, lambda v: 1 / math.sqrt(1 - v * v), lambda a: np.tanh(a) * 0.9),
    "acos": (math.acos, lambda v: -1 / math.sqrt(1 - v * v), lambda a: np.tanh(a) * 0.9),
    "atan": (math.atan, lambda v: 1 / (1 + v * v), lambda a: a * 2),
    "log10": (math.log10, lambda v: 1 / (v * math.log(10)), lambda a: np.abs(a) + 0.1),
    "reciprocal": (lambda v: 1 / v, lambda v: -1 / v ** 2, lambda a: np.abs(a) + 0.2),
    "rsqrt": (lambda v: 1 / math.sqrt(v), lambda v: -0.5 * v ** -1.5, lambda a: np.abs(a) + 0.2),
    "trunc": (math.trunc, lambda v: 0.0, lambda a: a * 3),
    "frac": (lambda v: v - math.trunc(v), lambda v: 1.0, lambda a: a * 3),
}


@SMALL
@given(name=st.sampled_from(sorted(UNARY)), shape=SHAPES, dtype=DTYPES, seed=st.integers(0, 2**16))
@example(name="frac", shape=(3,), dtype=np.float64, seed=0)
@example(name="rsqrt", shape=(), dtype=np.float32, seed=1)
def test_unary_math_matches_the_reference_with_its_gradient(name, shape, dtype, seed):
    f, df, domain = UNARY[name]
    a = domain(_data(seed, shape)).astype(dtype)
    x = Tensor(a, requires_grad=True)
    out = getattr(x, name)()
    a64 = a.astype(np.float64)
    assert out.dtype == dtype
    _close(out, np.vectorize(f, otypes=[float])(a64) if a.size else a64, dtype, name)
    g = _data(seed + 1, shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, g * (np.vectorize(df, otypes=[float])(a64) if a.size else a64), dtype, name + " grad")


def test_unary_math_dtypes_are_torchs():
    ints = na.tensor([4, -3])
    assert ints.reciprocal().dtype == np.float32 and ints.rsqrt().dtype == np.float32      # promote
    assert ints.trunc().tolist() == [4, -3] and ints.trunc().dtype == np.int64           # kept
    with pytest.raises(RuntimeError, match="integer"):
        ints.frac()                                                                      # torch: floats only
    assert na.tensor([-2.5, 2.5]).trunc().tolist() == [-2.0, 2.0]
    assert na.tensor([-2.5]).frac().tolist() == [-0.5]                                    # sign of x
    assert np.isnan(na.tensor([2.0]).asin().item()) and na.tensor([0.0]).reciprocal().item() == math.inf


# ================================================================================ binary ops
BINARY = {
    "fmod": math.fmod,
    "hypot": math.hypot,
    "fmax": lambda a, b: b if math.isnan(a) else a if math.isnan(b) else max(a, b),
    "fmin": lambda a, b: b if math.isnan(a) else a if math.isnan(b) else min(a, b),
}


@SMALL
@given(name=st.sampled_from(sorted(BINARY)), shapes=st.sampled_from([((2, 3), (2, 3)), ((2, 1), (3,)),
       ((), (2,)), ((0, 2), (1, 2))]), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_binary_ops_match_the_reference_and_broadcast(name, shapes, dtype, seed):
    a, b = _data(seed, shapes[0], dtype) * 3, _data(seed + 1, shapes[1], dtype) + 0.5
    out = getattr(Tensor(a), name)(Tensor(b))
    a64, b64 = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
    want = np.vectorize(BINARY[name], otypes=[float])(a64, b64) if a64.size else np.zeros(a64.shape)
    assert out.dtype == dtype
    _close(out, want, dtype, name)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_gradients_are_finite_differences(name):
    a = np.array([[2.7, -1.3, 0.4], [-3.1, 1.9, -0.6]])
    b = np.array([1.1, -0.7, 0.35])                   # no ties and no fmod discontinuity nearby
    check_grad(lambda x, y: getattr(x, name)(y), a, b)


def test_binary_op_edges_are_torchs():
    nan = float("nan")
    x, y = na.tensor([1.0, nan, 2.0]), na.tensor([nan, 3.0, 2.0])
    assert x.fmax(y).tolist() == [1.0, 3.0, 2.0] and x.fmin(y).tolist() == [1.0, 3.0, 2.0]
    a, b = Tensor(np.array([2.0]), requires_grad=True), Tensor(np.array([2.0]), requires_grad=True)
    a.fmax(b).backward(Tensor(np.ones(1)))
    assert (a.grad.item(), b.grad.item()) == (1.0, 0.0)      # a tie: the gradient goes to self (torch)
    assert na.tensor([-7, 7]).fmod(3).tolist() == [-1, 1] and na.tensor([-7, 7]).fmod(3).dtype == np.int64
    assert na.tensor([-7.0, 7.0]).fmod(-3).tolist() == [-1.0, 1.0]
    with pytest.raises(RuntimeError, match="ZeroDivision"):
        na.tensor([1, 2]).fmod(0)
    with pytest.raises(RuntimeError, match="floating"):
        na.tensor([1, 2]).hypot(na.tensor([1, 2]))
    assert na.tensor([-7, 7]).floor_divide(2).tolist() == [-4, 3]
    assert na.tensor([-7.0]).floor_divide(2).tolist() == [-4.0]
    assert na.tensor([1.0, 2.0]).true_divide(4).tolist() == [0.25, 0.5]
    assert na.tensor([1.0, 2.0]).rsub(na.tensor([10.0, 10.0]), alpha=3).tolist() == [7.0, 4.0]


# ================================================================================ composed ops: values and gradients
def _np_kron(a, b):
    return np.kron(a, b)


def _np_cross(a, b, dim):
    return np.cross(np.moveaxis(a, dim, -1), np.moveaxis(b, dim, -1)).swapaxes(-1, dim) if a.ndim > 1 else \
        np.cross(a, b)


#: name -> (method call on tensors, NumPy float64 reference on arrays, input shapes)
COMPOSED = {
    "addcmul": (lambda s, a, b: s.addcmul(a, b, value=0.3), lambda s, a, b: s + 0.3 * a * b,
                [(2, 3), (3,), (2, 1)]),
    "addcdiv": (lambda s, a, b: s.addcdiv(a, b, value=-2), lambda s, a, b: s - 2 * a / b,
                [(2, 3), (2, 3), (3,)]),
    "addmm": (lambda s, a, b: s.addmm(a, b, beta=0.5, alpha=2), lambda s, a, b: 0.5 * s + 2 * a @ b,
              [(3,), (2, 4), (4, 3)]),
    "addmv": (lambda s, a, b: s.addmv(a, b, alpha=-1), lambda s, a, b: s - a @ b, [(2,), (2, 3), (3,)]),
    "baddbmm": (lambda s, a, b: s.baddbmm(a, b, beta=2), lambda s, a, b: 2 * s + a @ b,
                [(2, 1, 3), (2, 2, 4), (2, 4, 3)]),
    "mm": (lambda a, b: a.mm(b), lambda a, b: a @ b, [(2, 3), (3, 2)]),
    "mv": (lambda a, b: a.mv(b), lambda a, b: a @ b, [(2, 3), (3,)]),
    "dot": (lambda a, b: a.dot(b), lambda a, b: np.dot(a, b), [(4,), (4,)]),
    "kron": (lambda a, b: a.kron(b), _np_kron, [(2, 3), (2, 2)]),
    "kron_mixed_dims": (lambda a, b: a.kron(b), _np_kron, [(3,), (2, 2)]),
    "cross": (lambda a, b: a.cross(b, dim=1), lambda a, b: _np_cross(a, b, 1), [(2, 3, 2), (1, 3, 2)]),
    "cross_default_dim": (lambda a, b: a.cross(b), lambda a, b: _np_cross(a, b, 1), [(2, 3), (2, 3)]),
    "trace": (lambda a: a.trace(), lambda a: np.trace(a), [(3, 4)]),
    "t": (lambda a: a.t(), lambda a: a.T, [(2, 3)]),
    "mT": (lambda a: a.mT, lambda a: a.swapaxes(-1, -2), [(2, 3, 4)]),
    "H": (lambda a: a.H, lambda a: a.T, [(2, 3)]),
    "repeat": (lambda a: a.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3)), [(2, 2)]),
    "unflatten": (lambda a: a.unflatten(-1, (2, -1)), lambda a: a.reshape(2, 2, 3), [(2, 6)]),
    "select": (lambda a: a.select(1, -2), lambda a: a[:, -2], [(2, 3)]),
    "fliplr": (lambda a: a.fliplr(), np.fliplr, [(2, 3)]),
    "flipud": (lambda a: a.flipud(), np.flipud, [(2, 3)]),
    "sum_to_size": (lambda a: a.sum_to_size(1, 3), lambda a: a.sum((0, 1))[None], [(2, 2, 3)]),
    "square": (lambda a: a.square(), np.square, [(2, 3)]),
    "clamp_min": (lambda a: a.clamp_min(0.1), lambda a: np.maximum(a, 0.1), [(2, 3)]),
    "clamp_max": (lambda a: a.clamp_max(0.1), lambda a: np.minimum(a, 0.1), [(2, 3)]),
    "where": (lambda a, b: a.where(a > 0, b), lambda a, b: np.where(a > 0, a, b), [(2, 3), (3,)]),
    "nansum": (lambda a: a.nansum(1), lambda a: np.nansum(a, 1), [(2, 3)]),
    "nanmean": (lambda a: a.nanmean(0, keepdim=True), lambda a: np.nanmean(a, 0, keepdims=True), [(2, 3)]),
    "median": (lambda a: a.median(), lambda a: np.sort(a.reshape(-1))[(a.size - 1) // 2], [(2, 3)]),
    "median_dim": (lambda a: a.median(1).values, lambda a: np.sort(a, 1)[:, (a.shape[1] - 1) // 2], [(3, 4)]),
    "std_mean": (lambda a: a.std_mean(0)[0] + a.std_mean(0)[1], lambda a: a.std(0, ddof=1) + a.mean(0),
                 [(3, 2)]),
    "var_mean": (lambda a: a.var_mean(correction=0)[0] * a.var_mean()[1], lambda a: a.var() * a.mean(),
                 [(3, 2)]),
    "tensor_split": (lambda a: a.tensor_split(3, dim=1)[0] * 2 + a.tensor_split([1, 4], 1)[1].sum(),
                     lambda a: np.array_split(a, 3, 1)[0] * 2 + a[:, 1:4].sum(), [(2, 5)]),
    "rsub": (lambda a, b: a.rsub(b, alpha=2), lambda a, b: b - 2 * a, [(2, 3), (3,)]),
    "index_add": (lambda s, v: s.index_add(1, na.tensor([2, 0, 2]), v, alpha=3),
                  lambda s, v: _np_index_add(s, v), [(2, 4), (2, 3)]),
    "index_copy": (lambda s, v: s.index_copy(0, na.tensor([2, 0]), v),
                   lambda s, v: _np_set(s, (np.array([2, 0]),), v), [(3, 2), (2, 2)]),
    "index_fill": (lambda s: s.index_fill(1, na.tensor([1]), -2.0),
                   lambda s: _np_set(s, (slice(None), np.array([1])), -2.0), [(2, 3)]),
    "scatter": (lambda s, v: s.scatter(1, na.tensor([[2, 0], [1, 2]]), v),
                lambda s, v: _np_scatter(s, v), [(2, 3), (2, 3)]),
}


def _np_index_add(s, v):
    out = s.copy()
    np.add.at(out, (slice(None), np.array([2, 0, 2])), 3 * v)
    return out


def _np_set(s, idx, v):
    out = s.copy()
    out[idx] = v
    return out


def _np_scatter(s, v):
    out = s.copy()
    for i, row in enumerate([[2, 0], [1, 2]]):
        for j, k in enumerate(row):
            out[i, k] = v[i, j]
    return out


@pytest.mark.parametrize("name", sorted(COMPOSED))
def test_composed_methods_match_the_reference_and_finite_differences(name):
    fn, ref, shapes = COMPOSED[name]
    arrays = [_data(i + 7, shape) + (2.5 if name == "addcdiv" and i == 2 else 0) for i, shape in enumerate(shapes)]
    out = fn(*[Tensor(a) for a in arrays])
    _close(out, ref(*arrays), np.float64, name)
    check_grad(fn, *arrays)


# ================================================================================ median, tensor_split
@SMALL
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16),
       ties=st.booleans(), keepdim=st.booleans(), data=st.data())
@example(shape=(4,), seed=0, ties=True, keepdim=False, data=None)
def test_median_is_the_lower_middle_value_and_its_index_holds_it(shape, seed, ties, keepdim, data):
    a = _data(seed, shape)
    if ties:
        a = np.round(a)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1)) if data is not None else 0
    values, indices = Tensor(a).median(dim, keepdim=keepdim)
    want = np.take(np.sort(a, axis=dim), (a.shape[dim] - 1) // 2, axis=dim)
    if keepdim:
        want = np.expand_dims(want, dim)
    _close(values, want)
    assert indices.dtype == np.int64 and indices.shape == want.shape
    picked = np.take_along_axis(a, indices.data if keepdim else np.expand_dims(indices.data, dim), axis=dim)
    _close(picked if keepdim else picked.squeeze(dim), want)
    assert isinstance(Tensor(a).median(dim), na.return_types.median)


def test_median_edges_are_torchs():
    nan = float("nan")
    assert na.tensor([1.0, 2.0, 3.0, 4.0]).median().item() == 2.0                 # the lower one
    assert math.isnan(na.tensor([1.0, nan, 3.0]).median().item())                 # NaN propagates
    values, indices = na.tensor([[1.0, nan, 3.0], [3.0, 1.0, 2.0]]).median(1)
    assert math.isnan(values.tolist()[0]) and values.tolist()[1] == 2.0 and indices.tolist() == [1, 2]
    assert na.tensor([1.0, nan, 3.0]).nanmedian().item() == 1.0
    assert math.isnan(na.tensor([nan, nan]).nanmedian().item())
    assert na.tensor([5, 1, 3]).median().item() == 3 and na.tensor(2.0).median(0).values.item() == 2.0
    assert math.isnan(na.zeros(0).median().item())
    with pytest.raises(IndexError, match="non-zero size"):
        na.zeros(2, 0).median(1)


@SMALL
@given(n=st.integers(0, 7), sections=st.integers(1, 5), cuts=st.lists(st.integers(-8, 8), max_size=3))
@example(n=0, sections=3, cuts=[])
def test_tensor_split_matches_numpys_array_split(n, sections, cuts):
    a = np.arange(2 * n, dtype=np.float64).reshape(2, n)
    got = Tensor(a).tensor_split(sections, dim=1)
    want = np.array_split(a, sections, axis=1)
    assert len(got) == len(want) and all(g.tolist() == w.tolist() for g, w in zip(got, want))
    got = Tensor(a).tensor_split(cuts, dim=-1)
    want = np.split(a, cuts, axis=1)      # torch and NumPy clamp and wrap the indices the same way
    assert [g.shape for g in got] == [w.shape for w in want]
    assert all(g.tolist() == w.tolist() for g, w in zip(got, want))
    assert [p.tolist() for p in Tensor(a).tensor_split(na.tensor(sections), 1)] == \
        [w.tolist() for w in np.array_split(a, sections, axis=1)]


# ================================================================================ in-place rules
#: name -> (in-place call, out-of-place reference call), on a 2x3 float tensor
INPLACE = {
    "abs_": (lambda t: t.abs_(), lambda t: t.abs()),
    "neg_": (lambda t: t.neg_(), lambda t: -t),
    "exp_": (lambda t: t.exp_(), lambda t: t.exp()),
    "sqrt_": (lambda t: t.abs_().sqrt_(), lambda t: t.abs().sqrt()),
    "pow_": (lambda t: t.pow_(3), lambda t: t ** 3),
    "reciprocal_": (lambda t: t.reciprocal_(), lambda t: 1 / t),
    "square_": (lambda t: t.square_(), lambda t: t * t),
    "masked_fill_": (lambda t: t.masked_fill_(t > 0, 9.0), lambda t: t.masked_fill(t > 0, 9.0)),
    "clamp_min_": (lambda t: t.clamp_min_(0.2), lambda t: t.clamp(min=0.2)),
    "tril_": (lambda t: t.tril_(), lambda t: t.tril()),
    "triu_": (lambda t: t.triu_(1), lambda t: t.triu(1)),
    "addcmul_": (lambda t: t.addcmul_(t, na.ones(3), value=0.5), lambda t: t + 0.5 * t),
    "addcdiv_": (lambda t: t.addcdiv_(na.ones(3), na.full((3,), 4.0), value=-2), lambda t: t - 0.5),
    "index_add_": (lambda t: t.index_add_(0, na.tensor([1, 1]), na.ones(2, 3)), lambda t: t + na.tensor([[0.0], [2.0]])),
    "index_copy_": (lambda t: t.index_copy_(1, na.tensor([0]), na.zeros(2, 1)),
                    lambda t: t * na.tensor([0.0, 1.0, 1.0])),
    "index_fill_": (lambda t: t.index_fill_(1, na.tensor([2]), 0.0), lambda t: t * na.tensor([1.0, 1.0, 0.0])),
    "scatter_": (lambda t: t.scatter_(0, na.tensor([[1, 0, 1]]), 5.0),
                 lambda t: t.masked_fill(na.tensor([[False, True, False], [True, False, True]]), 5.0)),
    "lerp_": (lambda t: t.lerp_(na.ones(3), 0.25), lambda t: t + 0.25 * (1 - t)),
    "fmod_": (lambda t: t.fmod_(0.5), lambda t: t.fmod(0.5)),
    "sign_": (lambda t: t.sign_(), lambda t: t.sign()),
    "t_": (lambda t: t.t_(), lambda t: t.t()),
    "transpose_": (lambda t: t.transpose_(0, 1), lambda t: t.transpose(0, 1)),
    "unsqueeze_": (lambda t: t.unsqueeze_(1), lambda t: t.unsqueeze(1)),
    "squeeze_": (lambda t: t.unsqueeze_(0).squeeze_(0), lambda t: t),
}
_METADATA = {"t_", "transpose_", "unsqueeze_", "squeeze_"}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_methods_follow_the_ops_inplace_rules(name):
    inplace, outplace = INPLACE[name]
    a = _data(3, (2, 3), np.float32)                 # float32: the operands made by na.ones/na.tensor
    t = Tensor(a.copy())
    alias = t
    version = t._version
    want = outplace(Tensor(a.copy())).data
    assert inplace(t) is t and alias is t
    _close(t, want, np.float32, name)
    if name not in _METADATA:                       # a write: the array itself changed, seen by views
        assert t._version > version
    w = Tensor(a.copy(), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        inplace(w)
    with na.no_grad():
        inplace(w)                                  # an optimizer / initializer update is fine
    _close(w, want, np.float64, name)
    y = Tensor(a.copy(), requires_grad=True) * 1.0
    with pytest.raises(RuntimeError, match="produced by a recorded op"):
        inplace(y)


def test_a_write_through_an_inplace_method_is_seen_by_views_and_detected_by_backward():
    base = na.zeros(2, 3)
    row = base[1]
    base.index_fill_(1, na.tensor([0]), 1.0)
    assert row.tolist() == [1.0, 0.0, 0.0]
    w = Tensor(np.ones(3), requires_grad=True)
    c = na.ones(3, dtype=na.float64)
    y = (w * c).sum()
    c.exp_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_a_constant_updated_from_a_tensor_that_requires_grad_joins_the_graph():
    src = Tensor(np.array([[1.0, 2.0]]), requires_grad=True)
    acc = Tensor(np.zeros((3, 2)))
    acc.index_add_(0, na.tensor([2]), src, alpha=2)
    assert acc.requires_grad and not acc.is_leaf
    (acc * Tensor(np.arange(6.0).reshape(3, 2))).sum().backward()
    assert src.grad.tolist() == [[8.0, 10.0]]
    v = Tensor(np.array(3.0), requires_grad=True)
    filled = Tensor(np.zeros(4)).masked_fill_(na.tensor([True, False, True, False]), v)
    filled.sum().backward()
    assert filled.tolist() == [3.0, 0.0, 3.0, 0.0] and v.grad.item() == 2.0


def test_inplace_results_must_fit_the_tensors_dtype_and_shape():
    with pytest.raises(RuntimeError, match="can't be cast"):
        na.tensor([4, 9]).sqrt_()
    with pytest.raises(RuntimeError, match="does not match this tensor's shape"):
        na.ones(3).addcmul_(na.ones(2, 3), na.ones(3))
    t = na.tensor([1, 2])
    assert t.pow_(2).tolist() == [1, 4] and t.dtype == np.int64      # an int result stays int
    h = na.ones(2, dtype=na.float32)
    assert h.addcmul_(Tensor(np.ones(2)), Tensor(np.ones(2))).dtype == np.float32   # cast back, as torch


def test_an_adam_step_written_with_inplace_methods_matches_numpy():
    rng = np.random.default_rng(0)
    p0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(3)]
    p = Tensor(p0.copy(), requires_grad=True)
    exp_avg, exp_avg_sq = Tensor(np.zeros(4)), Tensor(np.zeros(4))
    b1, b2, lr, eps = 0.9, 0.999, 1e-2, 1e-8
    m, v, q = np.zeros(4), np.zeros(4), p0.copy()
    for step, g in enumerate(grads, 1):
        gt = Tensor(g)
        with na.no_grad():
            exp_avg.mul_(b1).add_(gt, alpha=1 - b1)
            exp_avg_sq.mul_(b2).addcmul_(gt, gt, value=1 - b2)
            denom = (exp_avg_sq.sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-lr / (1 - b1 ** step))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        q = q - lr / (1 - b1 ** step) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** step) + eps)
    _close(p, q)
    assert p.is_leaf and p.requires_grad


# ================================================================================ random fills
def test_random_fills_are_reproducible_from_manual_seed_and_the_generator():
    def draws():
        t = na.zeros(5, dtype=na.float64)
        return [t.normal_(1.0, 2.0).tolist(), t.uniform_(-1, 1).tolist(), t.bernoulli_(0.5).tolist(),
                t.exponential_(3.0).tolist(), t.random_(10).tolist(), t.uniform_().bernoulli().tolist()]

    na.manual_seed(123)
    first = draws()
    na.manual_seed(123)
    assert draws() == first
    g1, g2 = na.Generator().manual_seed(5), na.Generator().manual_seed(5)
    assert na.zeros(4).normal_(generator=g1).tolist() == na.zeros(4).normal_(generator=g2).tolist()


def test_random_fills_draw_from_torchs_distributions():
    na.manual_seed(0)
    n = 4000
    x = na.zeros(n, dtype=na.float64)
    assert abs(x.normal_(2.0, 0.5).data.mean() - 2.0) < 0.05 and abs(x.data.std() - 0.5) < 0.05
    u = x.uniform_(-3, -1).data
    assert u.min() >= -3 and u.max() < -1 and abs(u.mean() + 2) < 0.05
    assert abs(x.exponential_(4.0).data.mean() - 0.25) < 0.02 and x.data.min() >= 0
    r = na.zeros(n, dtype=na.int64).random_(3, 6).data
    assert set(np.unique(r).tolist()) == {3, 4, 5}
    assert set(np.unique(na.zeros(n).random_(2).data).tolist()) == {0.0, 1.0}
    assert set(np.unique(na.zeros(n).random_(to=2).data).tolist()) == {0.0, 1.0}
    assert na.zeros(3).index_fill_(0, na.tensor([-1]), 1.0).tolist() == [0.0, 0.0, 1.0]   # from the end
    f = na.zeros(n).random_().data
    assert f.min() >= 0 and f.max() <= 2 ** 24 and f.max() > 2 ** 20 and np.all(f == np.round(f))
    assert na.zeros(3, dtype=na.uint8).random_().dtype == np.uint8
    assert set(np.unique(na.zeros(n).geometric_(0.5).data)) >= {1.0, 2.0}
    p = na.tensor([0.0, 1.0, 0.0, 1.0])
    assert na.zeros(4).bernoulli_(p).tolist() == [0.0, 1.0, 0.0, 1.0] and p.bernoulli().tolist() == p.tolist()
    assert abs(na.zeros(n).bernoulli_(0.3).data.mean() - 0.3) < 0.03


def test_random_fills_on_parameters_follow_the_inplace_rules():
    w = Tensor(np.zeros((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w.normal_()
    v = w._version
    with na.no_grad():
        w.normal_(0, 0.02)
    assert w._version == v + 1 and w.requires_grad and w.data.std() > 0
    d = w.detach()       # torch's `p.data.uniform_()`: here `.data` is the array, a detached alias the tensor
    d.uniform_(-0.1, 0.1)
    assert np.abs(w.data).max() <= 0.1
    with pytest.raises(RuntimeError, match="std >= 0"):
        na.zeros(2).normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        na.zeros(2).bernoulli_(1.5)
    with pytest.raises(RuntimeError, match="from"):
        na.zeros(2).uniform_(2, 1)


# ================================================================================ layout, metadata, misc
def test_layout_queries_are_torchs():
    x = na.arange(24).reshape(2, 3, 4)
    assert x.is_contiguous() and x.stride() == (12, 4, 1) and x.stride(-1) == 1
    assert not x.transpose(0, 2).is_contiguous() and x.transpose(0, 2).stride() == (1, 4, 12)
    assert x[1].storage_offset() == 12 and x[:, 1:, 2:].storage_offset() == 6 and x.storage_offset() == 0
    assert x.mT.shape == (2, 4, 3) and x.mH.shape == (2, 4, 3)
    t = na.ones(2, 3)
    assert t.t_().shape == (3, 2) and t.unsqueeze_(0).shape == (1, 3, 2) and t.squeeze_().shape == (3, 2)
    assert t.transpose_(0, 1).shape == (2, 3)
    assert na.ones(3).t().shape == (3,) and na.tensor(1.0).t().shape == ()


def test_logical_bitwise_and_float_classes_are_torchs():
    a, b = na.tensor([0.0, 1.0, -2.0]), na.tensor([1.0, 0.0, 3.0])
    assert a.logical_and(b).tolist() == [False, False, True] and a.logical_or(b).tolist() == [True, True, True]
    assert a.logical_xor(b).tolist() == [True, True, False] and a.logical_not().tolist() == [True, False, False]
    assert a.logical_and(b).dtype == np.bool_
    i, j = na.tensor([12, 5]), na.tensor([10, 3])
    assert i.bitwise_and(j).tolist() == [8, 1] and i.bitwise_or(j).tolist() == [14, 7]
    assert i.bitwise_xor(j).tolist() == [6, 6] and i.bitwise_not().tolist() == [-13, -6]
    assert na.tensor([True, False]).bitwise_not().tolist() == [False, True]
    with pytest.raises(RuntimeError, match="integer and bool"):
        a.bitwise_and(b)
    s = na.tensor([1.0, float("inf"), float("-inf"), float("nan")])
    assert s.isnan().tolist() == [False, False, False, True] and s.isinf().tolist() == [False, True, True, False]
    assert s.isfinite().tolist() == [True, False, False, False] and na.tensor([1, 2]).isfinite().tolist() == [True] * 2
    assert na.ones(2).type() == "torch.FloatTensor" and na.tensor([1]).type() == "torch.LongTensor"
    assert na.ones(2).type(na.float64).dtype == np.float64 and na.ones(1).type("torch.IntTensor").dtype == np.int32
    assert not na.ones(1).is_complex() and na.ones(1).is_signed() and not na.tensor([True]).is_signed()
    y = Tensor(np.ones(2), requires_grad=True) * 2
    assert y.detach_() is y and y.is_leaf and not y.requires_grad
    assert na.tensor([-2.0]).negative().tolist() == [2.0] and na.tensor([-2.0]).sgn().tolist() == [-1.0]


def test_bad_arguments_raise_torchs_errors():
    cases = [
        (lambda: na.ones(2, 2, 2).t(), RuntimeError, "<= 2 dimensions"),
        (lambda: na.ones(3).mT, RuntimeError, "matrices"),
        (lambda: na.ones(2, 2, 2).H, RuntimeError, "2-D"),
        (lambda: na.ones(2, 2).repeat(2), RuntimeError, "can not be smaller"),
        (lambda: na.ones(2, 3).mm(na.ones(2, 3)), RuntimeError, "cannot be multiplied"),
        (lambda: na.ones(2, 3, 1).mm(na.ones(1, 3)), RuntimeError, "matrix"),
        (lambda: na.ones(3).dot(na.ones(3, dtype=na.float64)), RuntimeError, "same dtype"),
        (lambda: na.ones(3).dot(na.ones(2)), RuntimeError, "inconsistent"),
        (lambda: na.ones(2, 3).scatter(0, na.tensor([[0]]), na.ones(1, 1), reduce="add"),
         NotImplementedError, "scatter_add"),
        (lambda: na.ones(2).addcdiv(na.tensor([1, 2]), na.tensor([1, 2])), RuntimeError, "Integer division"),
        (lambda: na.ones(2, 4).cross(na.ones(2, 4), dim=1), RuntimeError, "must have length 3"),
        (lambda: na.ones(2, 4).cross(na.ones(2, 4)), RuntimeError, "size 3"),
        (lambda: na.ones(2, 3).select(1, 3), IndexError, "out of range"),
        (lambda: na.ones(2, 3).select(2, 0), IndexError, "Dimension out of range"),
        (lambda: na.ones(2, 6).unflatten(1, (4, -1)), RuntimeError, "multiply up"),
        (lambda: na.ones(2, 3).sum_to_size(2, 2), RuntimeError, "not expandable"),
        (lambda: na.ones(3).index_add(0, na.tensor([3]), na.ones(1)), IndexError, "out of bounds"),
        (lambda: na.ones(3).index_copy(0, na.tensor([-1]), na.ones(1)), IndexError, "out of bounds"),
        (lambda: na.ones(3).index_fill(0, na.tensor([-4]), 0.0), IndexError, "out of bounds"),
        (lambda: na.ones(3).index_add(0, na.tensor([0]), na.ones(2)), RuntimeError, "source has shape"),
        (lambda: na.ones(3).index_copy(0, na.tensor([0.0]), na.ones(1)), TypeError, "integer"),
        (lambda: na.ones(3).index_fill(0, na.tensor([0]), na.ones(2)), RuntimeError, "0-dimensional"),
        (lambda: na.ones(3).tensor_split(0), RuntimeError, "larger than 0"),
        (lambda: na.tensor(1.0).tensor_split(2), RuntimeError, "at least a 1-dimensional"),
        (lambda: na.ones(3).fliplr(), RuntimeError, ">= 2-d"),
        (lambda: na.tensor([1, 2]).nanmean(), RuntimeError, "floating point"),
        (lambda: na.ones(2).is_contiguous(memory_format="channels_last"), ValueError, "row-major"),
    ]
    for fn, error, match in cases:
        with pytest.raises(error, match=match):
            fn()


# ================================================================================ strict fake device
@pytest.fixture(scope="module")
def fd():
    path = pathlib.Path(__file__).parents[1] / "strict_device" / "fake_device.py"
    spec = importlib.util.spec_from_file_location("fake_device_for_tensor_methods", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: name -> (function of the leaves and consts, leaf shapes, consts): the ops with their own array code
DEVICE = {
    "unary": (lambda x: x.tan() + x.sinh() + x.atan() + x.frac() + x.trunc() + x.abs().add(1).log10(),
              [(2, 3)], ()),
    "fmod_hypot": (lambda x, y: x.fmod(y) + x.hypot(y), [(2, 3), (3,)], ()),
    "fmax_fmin": (lambda x, y: x.fmax(y) * x.fmin(y), [(2, 3), (2, 3)], ()),
    "median": (lambda x: x.median(1).values + x.median(), [(3, 4)], ()),
    "nansum": (lambda x: x.nansum(0) + x.nanmean(0), [(3, 2)], ()),
    "index_ops": (lambda x, v, i, j: x.index_add(1, i, v).index_fill(0, j, 2.0).index_copy(1, j, v[:, :1]),
                  [(2, 3), (2, 2)], (np.array([0, 0]), np.array([1]))),
    "scatter": (lambda x, v, i: x.scatter(1, i, v), [(2, 3), (2, 2)], (np.array([[2, 0], [1, 2]]),)),
    "products": (lambda s, a, b: s.addmm(a, b).addcdiv(s, s.abs() + 1).kron(s[:1, :1]),
                 [(2, 2), (2, 3), (3, 2)], ()),
}


@pytest.mark.parametrize("name", sorted(DEVICE))
def test_the_ops_run_on_the_strict_fake_device_without_waiting_for_it(fd, name):
    fn, shapes, consts = DEVICE[name]
    arrays = [_data(i, shape) for i, shape in enumerate(shapes)]
    fd.assert_host_and_device_agree(lambda *ts: fn(*ts[:len(shapes)], *[Tensor._wrap(c) for c in ts[len(shapes):]]),
                                    arrays, lambda shape: _data(9, shape), consts=consts)
