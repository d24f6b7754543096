"""Exploring properties of the torch ops a ported script calls that the core once lacked (each was an
AttributeError): ``logsumexp``, ``prod``, ``cumsum``, ``linalg.vector_norm``/``norm``, ``gather``,
``scatter_add``/``scatter_add_``, ``index_select``, ``F.softplus``, ``F.rms_norm``, ``F.group_norm``
(and their ``nn`` layers), against the plain float64 NumPy references of
``tests/core/ops_added_references.py``: values and gradients over float32 and float64, size-0 and
size-1 dims, negative dims, ``keepdim``, dim tuples; gradients against central finite differences in
float64; the subgradients torch picks at the kinks (``prod`` with zeros, the norms at 0 and at ties);
bad input a clear error at the call; and the same values on the strict fake device without a host wait.

Example of what one property checks::

    >>> import numpy as np
    >>> import neural_arch as na
    >>> x = na.tensor([[2.0, 0.0, 0.0]], requires_grad=True)
    >>> x.prod(dim=1).backward(na.ones(1))
    >>> x.grad.tolist()           # two zeros in the slice: every gradient is 0 (torch)
    [[0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest
from core_testutils import check_grad
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch import Tensor, nn
from neural_arch.core.ops_reduce import vector_norm
from tests.core import ops_added_references as ref

TOL = {np.float64: 1e-10, np.float32: 3e-5}
DTYPES = st.sampled_from([np.float64, np.float32])
SMALL = settings(max_examples=20)
INF = math.inf


def _close(got, want, dtype, what=""):
    got = np.asarray(got.data if isinstance(got, Tensor) else got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=what)


def _data(seed, shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@st.composite
def reduction_case(draw, min_side=0, tuples=True):
    """``(shape, dim, keepdim)``: 1-3 dims of size ``min_side``..3; dim None, an int (negative
    spellings too) or a tuple."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(min_side, 3), min_size=ndim, max_size=ndim)))
    kind = draw(st.sampled_from(["none", "int", "tuple"] if tuples else ["none", "int"]))
    if kind == "none":
        dim = None
    elif kind == "int":
        dim = draw(st.integers(-ndim, ndim - 1))
    else:
        picked = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        dim = tuple(d - ndim if draw(st.booleans()) else d for d in picked)
    return shape, dim, draw(st.booleans())


def _dims(dim, ndim):
    if dim is None:
        return tuple(range(ndim))
    return tuple(sorted(d % ndim for d in (dim if isinstance(dim, tuple) else (dim,))))


# ================================================================================ logsumexp
@SMALL
@given(case=reduction_case(), dtype=DTYPES, seed=st.integers(0, 2**16),
       neg_inf=st.sampled_from(["none", "some", "all"]))
@example(case=((2, 0), 1, False), dtype=np.float64, seed=0, neg_inf="none")      # empty slices: -inf
@example(case=((2, 3), -1, True), dtype=np.float64, seed=0, neg_inf="all")       # all -inf: -inf, grad NaN
@example(case=((1, 3, 1), (0, -1), False), dtype=np.float32, seed=1, neg_inf="some")
def test_logsumexp_matches_numpy(case, dtype, seed, neg_inf):
    shape, dim, keepdim = case
    a = _data(seed, shape, dtype) * 3
    if neg_inf == "all":
        a[...] = -np.inf
    elif neg_inf == "some":
        a[np.random.default_rng(seed).random(shape) < 0.4] = -np.inf
    x = Tensor(a, requires_grad=True)
    out = na.logsumexp(x, dim, keepdim)
    dims = _dims(dim, len(shape))
    want = ref.logsumexp(a.astype(np.float64), dims, keepdim)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    g = _data(seed + 1, want.shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, ref.logsumexp_grad(a.astype(np.float64), dims, keepdim, g), dtype, "grad")


def test_logsumexp_is_stable_and_takes_torch_spellings():
    x = Tensor(np.array([[1000.0, 1000.0], [-1000.0, -1000.0]]))
    assert np.allclose(x.logsumexp(1).data, [1000 + np.log(2), -1000 + np.log(2)], rtol=0, atol=1e-12)
    assert na.logsumexp(Tensor(np.array([np.inf, 0.0])), 0).item() == np.inf
    assert na.logsumexp(na.tensor([1, 2]), 0).dtype == np.float32         # integers: the default float
    assert na.logsumexp(x, dim=(0, 1), keepdim=True).shape == (1, 1)
    check_grad(lambda t: na.logsumexp(t, (0, -1)), _data(3, (2, 3)))


# ================================================================================ prod
@SMALL
@given(case=reduction_case(tuples=False), dtype=DTYPES, seed=st.integers(0, 2**16),
       zeros=st.sampled_from([0.0, 0.3, 0.7]))
@example(case=((3,), 0, False), dtype=np.float64, seed=0, zeros=0.0)
@example(case=((2, 0), -1, True), dtype=np.float64, seed=0, zeros=0.0)            # empty slices: 1
@example(case=((2, 1, 3), None, False), dtype=np.float32, seed=2, zeros=0.3)
def test_prod_and_its_gradient_with_zeros_match_numpy(case, dtype, seed, zeros):
    shape, dim, keepdim = case
    a = _data(seed, shape, dtype)
    a[np.random.default_rng(seed + 7).random(shape) < zeros] = 0
    x = Tensor(a, requires_grad=True)
    out = x.prod(dim, keepdim) if dim is not None else x.prod()
    g = _data(seed + 1, out.shape)
    want, gx = ref.prod(a.astype(np.float64), dim, keepdim if dim is not None else False, g)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, gx, dtype, "grad")


@pytest.mark.parametrize("row", [[2.0, 0.0, 3.0], [0.0, 5.0, 0.0], [0.0], [1.5, -2.0, 4.0]],
                         ids=["one-zero", "two-zeros", "lone-zero", "no-zero"])
def test_prod_gradient_with_zeros_is_torchs_and_matches_finite_differences(row):
    a = np.array([row, [1.0] * len(row)])
    x = Tensor(a, requires_grad=True)
    x.prod(1).sum().backward()
    assert x.grad.data[0].tolist() == ref.prod_grad_of_slice(np.array(row)).tolist()
    check_grad(lambda t: t.prod(1), a)
    check_grad(lambda t: t.prod(), a)


def test_prod_of_integers_is_int64_and_dtype_casts_first():
    assert na.prod(na.tensor([[2, 3]], dtype=na.int32), 1).dtype == np.int64
    assert na.tensor([True, True]).prod().dtype == np.int64
    x = Tensor(np.array([1.5, 2.0], np.float32), requires_grad=True)
    y = x.prod(dtype=na.float64)
    y.backward()
    assert y.dtype == np.float64 and x.grad.dtype == np.float32 and x.grad.tolist() == [2.0, 1.5]


# ================================================================================ cumsum
@SMALL
@given(shape=st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple), dtype=DTYPES,
       seed=st.integers(0, 2**16), data=st.data())
@example(shape=(), dtype=np.float64, seed=0, data=None)
@example(shape=(1, 0, 2), dtype=np.float32, seed=0, data=None)
def test_cumsum_matches_numpy(shape, dtype, seed, data):
    nd = len(shape)
    dim = data.draw(st.integers(-max(nd, 1), max(nd, 1) - 1)) if data is not None else -1
    a = _data(seed, shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = x.cumsum(dim)
    g = _data(seed + 1, shape)
    want, gx = ref.cumsum(a.astype(np.float64), dim, g)
    assert out.dtype == dtype and out.shape == shape
    _close(out, want, dtype, "forward")
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, gx, dtype, "grad")


def test_cumsum_of_integers_is_int64_and_its_gradient_matches_finite_differences():
    assert na.cumsum(na.tensor([[1, 2]], dtype=na.int8), dim=1).tolist() == [[1, 3]]
    assert na.cumsum(na.tensor([True, True]), 0).dtype == np.int64
    check_grad(lambda t: t.cumsum(0), _data(4, (3, 2)))
    check_grad(lambda t: na.cumsum(t, -1), _data(5, (2, 3)))


# ================================================================================ norms
ORDS = [2, 1, INF, -INF, 0, 0.5, 3, -1.5]


@settings(max_examples=30)
@given(case=reduction_case(min_side=1), ord=st.sampled_from(ORDS), dtype=DTYPES, seed=st.integers(0, 2**16))
@example(case=((3,), None, False), ord=2, dtype=np.float64, seed=0)
@example(case=((2, 1, 2), (-1, 0), True), ord=INF, dtype=np.float64, seed=0)
@example(case=((1, 3), 1, False), ord=-INF, dtype=np.float32, seed=3)
def test_vector_norm_matches_numpy_and_finite_differences(case, ord, dtype, seed):
    shape, dim, keepdim = case
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    # distinct magnitudes well away from 0 and from each other: no kinks for the finite differences
    a = ((rng.permutation(n) + 1.0) * 0.37 * rng.choice([-1.0, 1.0], n)).reshape(shape).astype(dtype)
    x = Tensor(a, requires_grad=True)
    out = vector_norm(x, ord, dim, keepdim)
    want = ref.vector_norm(a.astype(np.float64), ord, _dims(dim, len(shape)), keepdim)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    if dtype == np.float64:
        check_grad(lambda t: vector_norm(t, ord, dim, keepdim), a, rtol=1e-6, atol=1e-8)


def test_norm_subgradients_at_zero_and_at_ties_are_torchs():
    zero = Tensor(np.zeros((2, 2)), requires_grad=True)
    for ord_ in (2, 1, 3, 0.5, -1.5, 0):
        zero.grad = None
        vector_norm(zero, ord_, dim=1).sum().backward()
        assert zero.grad.tolist() == [[0.0, 0.0], [0.0, 0.0]], ord_        # 0, never NaN
    x = Tensor(np.array([[3.0, -3.0, 1.0]]), requires_grad=True)
    vector_norm(x, INF).backward()
    assert x.grad.tolist() == [[0.5, -0.5, 0.0]]                            # ties share (torch's amax)
    x = Tensor(np.array([0.0, 2.0, -4.0]), requires_grad=True)
    vector_norm(x, 1).backward()
    assert x.grad.tolist() == [0.0, 1.0, -1.0]                              # sign(0) = 0
    x = Tensor(np.array([0.0, 2.0]), requires_grad=True)
    vector_norm(x, -1.5).backward()                                         # a zero makes the norm 0
    assert vector_norm(x, -1.5).item() == 0.0 and x.grad.tolist() == [0.0, 0.0]


def test_norm_is_torch_norm_with_fro_and_numbers():
    a = _data(6, (2, 3, 2))
    x = Tensor(a)
    assert np.isclose(x.norm().item(), np.sqrt((a * a).sum()), rtol=1e-12)
    _close(na.norm(x, "fro", dim=(0, 2)), np.sqrt((a * a).sum(axis=(0, 2))), np.float64)
    _close(x.norm(p=1, dim=-1, keepdim=True), np.abs(a).sum(-1, keepdims=True), np.float64)
    _close(na.norm(x, INF), np.abs(a).max(), np.float64)
    assert vector_norm(na.tensor([3, 4]), dtype=na.float64).item() == 5.0
    assert vector_norm(Tensor(np.zeros((0, 2))), 2).item() == 0.0           # an empty sum: 0
    assert vector_norm(Tensor(np.zeros((0, 2))), 0, dim=0).tolist() == [0.0, 0.0]


# ================================================================================ gather / scatter / index_select
@st.composite
def index_case(draw, larger_src=False):
    """``(in_shape, dim, index, src_shape)``: ``index`` no larger than the input apart from ``dim``
    (and, for scatter, than ``src``), with values in range and repeats."""
    ndim = draw(st.integers(1, 3))
    in_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    dim = draw(st.integers(-ndim, ndim - 1))
    ax = dim % ndim
    ishape = tuple(draw(st.integers(0, 4 if d == ax else in_shape[d])) for d in range(ndim))
    seed = draw(st.integers(0, 2**16))
    index = np.random.default_rng(seed).integers(0, in_shape[ax], ishape)
    src_shape = tuple(s + draw(st.integers(0, 1)) if larger_src else s for s in ishape)
    return in_shape, dim, index, src_shape, seed


@SMALL
@given(case=index_case(), dtype=DTYPES)
@example(case=((2, 3), -1, np.array([[2, 2, 2, 2], [0, 1, 0, 1]]), None, 0), dtype=np.float64)
@example(case=((3,), 0, np.zeros(0, np.int64), None, 0), dtype=np.float64)
@example(case=((2, 3), 0, np.array([[1, 0]]), None, 0), dtype=np.float32)        # index smaller than input
def test_gather_matches_numpy(case, dtype):
    in_shape, dim, index, _, seed = case
    a = _data(seed, in_shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = x.gather(dim, Tensor(index))
    ax = dim % len(in_shape)
    _close(out, ref.gather(a.astype(np.float64), ax, index), dtype, "forward")
    g = _data(seed + 1, index.shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, ref.gather_grad(in_shape, ax, index, g), dtype, "grad")


@SMALL
@given(case=index_case(larger_src=True), dtype=DTYPES)
@example(case=((3,), 0, np.array([1, 1, 1, 0]), (5,), 0), dtype=np.float64)      # repeats accumulate
@example(case=((2, 2), 1, np.zeros((2, 0), np.int64), (2, 1), 0), dtype=np.float64)
def test_scatter_add_matches_numpy(case, dtype):
    in_shape, dim, index, src_shape, seed = case
    a, s = _data(seed, in_shape, dtype), _data(seed + 2, src_shape, dtype)
    x, src = Tensor(a, requires_grad=True), Tensor(s, requires_grad=True)
    out = na.scatter_add(x, dim, index, src)
    ax = dim % len(in_shape)
    _close(out, ref.scatter_add(a.astype(np.float64), ax, index, s.astype(np.float64)), dtype, "forward")
    g = _data(seed + 1, in_shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, g, dtype, "input grad")
    _close(src.grad, ref.scatter_add_src_grad(src_shape, ax, index, g), dtype, "src grad")
    t = Tensor(a.copy())
    alias = t
    assert t.scatter_add_(dim, index, Tensor(s)) is t
    _close(alias, out.data, dtype, "in place")


@SMALL
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple), dtype=DTYPES,
       seed=st.integers(0, 2**16), data=st.data())
@example(shape=(2, 3), dtype=np.float64, seed=0, data=None)
def test_index_select_matches_numpy(shape, dtype, seed, data):
    if data is None:
        dim, index = -1, np.array([2, 0, 2, 2])
    else:
        dim = data.draw(st.integers(-len(shape), len(shape) - 1))
        index = np.array(data.draw(st.lists(st.integers(0, shape[dim] - 1), max_size=4)), dtype=np.int64)
    a = _data(seed, shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = na.index_select(x, dim, index)
    ax = dim % len(shape)
    _close(out, ref.index_select(a.astype(np.float64), ax, index), dtype, "forward")
    g = _data(seed + 1, out.shape)
    out.backward(Tensor(g.astype(dtype)))
    want = ref.index_select_grad(shape, ax, index, g)
    _close(x.grad, want, dtype, "grad")


def test_indexing_gradients_match_finite_differences():
    a, s = _data(7, (2, 3)), _data(8, (2, 3))
    idx = np.array([[0, 2, 2], [1, 1, 0]])
    check_grad(lambda t: t.gather(1, idx), a)
    check_grad(lambda t, u: na.scatter_add(t, 1, idx[:, :2], u), a, s)
    check_grad(lambda t: t.index_select(0, np.array([1, 1, 0])), a)


def test_scatter_add_in_place_follows_torchs_rules():
    w = Tensor(np.zeros(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        w.scatter_add_(0, np.array([0]), Tensor(np.ones(1)))
    acc = Tensor(np.zeros(3))
    src = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    acc.scatter_add_(0, np.array([2, 2]), src)                 # a constant updated from a graph tensor
    assert acc.requires_grad and acc.tolist() == [0.0, 0.0, 3.0]
    (acc * Tensor(np.array([1.0, 2.0, 5.0]))).sum().backward()
    assert src.grad.tolist() == [5.0, 5.0]


# ================================================================================ softplus
@SMALL
@given(shape=st.lists(st.integers(0, 3), max_size=2).map(tuple), dtype=DTYPES, seed=st.integers(0, 2**16),
       beta=st.sampled_from([1.0, 2.0, 0.5, -1.0]), threshold=st.sampled_from([20.0, 1.0, 0.0]))
@example(shape=(3,), dtype=np.float64, seed=0, beta=1.0, threshold=20.0)
def test_softplus_matches_numpy(shape, dtype, seed, beta, threshold):
    a = (_data(seed, shape) * 15).astype(dtype)
    x = Tensor(a, requires_grad=True)
    out = F.softplus(x, beta, threshold) if (beta, threshold) != (1.0, 20.0) else F.softplus(x)
    want, d = ref.softplus(a.astype(np.float64), beta, threshold)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    g = _data(seed + 1, shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, g * d, dtype, "grad")
    _close(nn.Softplus(beta, threshold)(Tensor(a)), out.data, dtype, "nn.Softplus")


def test_softplus_does_not_overflow_and_matches_finite_differences():
    big = F.softplus(Tensor(np.array([800.0, -800.0])), threshold=1000.0)
    assert big.tolist() == [800.0, 0.0]
    check_grad(lambda t: F.softplus(t, beta=2.0, threshold=5.0), np.array([-3.0, -0.4, 0.3, 1.0, 2.0, 3.1]))


# ================================================================================ rms_norm / group_norm
@SMALL
@given(shape=st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple), dtype=DTYPES,
       seed=st.integers(0, 2**16), data=st.data(), affine=st.booleans(), eps=st.sampled_from([None, 1e-5, 0.5]))
@example(shape=(2, 1), dtype=np.float64, seed=0, data=None, affine=True, eps=None)
def test_rms_norm_matches_numpy_and_finite_differences(shape, dtype, seed, data, affine, eps):
    k = data.draw(st.integers(1, len(shape))) if data is not None else 1
    if 0 in shape[len(shape) - k:]:
        shape = shape[: len(shape) - k] + tuple(max(s, 1) for s in shape[len(shape) - k:])
    a, w = _data(seed, shape, dtype), _data(seed + 1, shape[len(shape) - k:], dtype)
    norm_shape = shape[len(shape) - k:]
    out = F.rms_norm(Tensor(a), norm_shape, Tensor(w) if affine else None, eps)
    e = np.finfo(dtype).eps if eps is None else eps
    want = ref.rms_norm(a.astype(np.float64), k, w.astype(np.float64) if affine else None, e)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    if dtype == np.float64 and a.size and a.size <= 12:
        if affine:
            check_grad(lambda t, u: F.rms_norm(t, norm_shape, u, eps), a, w)
        else:
            check_grad(lambda t: F.rms_norm(t, norm_shape, None, eps), a)


@SMALL
@given(n=st.integers(0, 2), groups=st.integers(1, 3), per=st.integers(1, 2),
       spatial=st.lists(st.integers(0, 2), max_size=2).map(tuple), dtype=DTYPES, seed=st.integers(0, 2**16),
       affine=st.booleans())
@example(n=1, groups=1, per=1, spatial=(1,), dtype=np.float64, seed=0, affine=True)   # one value a group
@example(n=2, groups=3, per=1, spatial=(), dtype=np.float64, seed=0, affine=True)     # (N, C) input
def test_group_norm_matches_numpy_and_finite_differences(n, groups, per, spatial, dtype, seed, affine):
    c = groups * per
    shape = (n, c) + spatial
    a, w, b = _data(seed, shape, dtype), _data(seed + 1, (c,), dtype), _data(seed + 2, (c,), dtype)
    wt, bt = (Tensor(w), Tensor(b)) if affine else (None, None)
    out = F.group_norm(Tensor(a), groups, wt, bt, 1e-5)
    want = ref.group_norm(a.astype(np.float64), groups, w.astype(np.float64) if affine else None,
                          b.astype(np.float64) if affine else None, 1e-5)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    layer = nn.GroupNorm(groups, c, affine=affine, dtype=dtype)
    if affine:
        layer.weight.data[...], layer.bias.data[...] = w, b
    _close(layer(Tensor(a)), out.data, dtype, "nn.GroupNorm")
    if dtype == np.float64 and a.size and a.size <= 16:
        if affine:
            check_grad(lambda t, u, v: F.group_norm(t, groups, u, v, 1e-5), a, w, b)
        else:
            check_grad(lambda t: F.group_norm(t, groups, eps=1e-5), a)


def test_rmsnorm_and_groupnorm_layers_hold_torchs_parameters():
    rms = nn.RMSNorm([2, 3], eps=1e-6)
    assert [k for k, _ in rms.named_parameters()] == ["weight"] and rms.weight.shape == (2, 3)
    assert repr(rms) == "RMSNorm((2, 3), eps=1e-06, elementwise_affine=True)"
    a = _data(9, (4, 2, 3), np.float32)
    _close(rms(Tensor(a)), F.rms_norm(Tensor(a), (2, 3), rms.weight, 1e-6).data, np.float32)
    assert nn.RMSNorm(3, elementwise_affine=False).weight is None
    gn = nn.GroupNorm(2, 4)
    assert sorted(gn.state_dict()) == ["bias", "weight"] and repr(gn) == "GroupNorm(2, 4, eps=1e-05, affine=True)"
    assert nn.GroupNorm(1, 3, affine=False).weight is None


# ================================================================================ bad input
BAD = [
    (lambda: na.gather(na.ones(2, 3), 1, np.array([[0.0]])), TypeError, "index must be an integer"),
    (lambda: na.gather(na.ones(2, 3), 1, np.array([[3]])), RuntimeError, "index 3 is out of bounds"),
    (lambda: na.gather(na.ones(2, 3), 0, np.array([[-1]])), RuntimeError, "index -1 is out of bounds"),
    (lambda: na.gather(na.ones(2, 3), 1, np.array([0])), RuntimeError, "same number of dimensions"),
    (lambda: na.gather(na.ones(2, 3), 0, np.zeros((1, 4), np.int64)), RuntimeError, "no larger than input"),
    (lambda: na.gather(na.ones(2, 3), 2, np.zeros((1, 1), np.int64)), IndexError, "Dimension out of range"),
    (lambda: na.scatter_add(na.zeros(3), 0, np.array([3]), na.ones(1)), RuntimeError, "out of bounds"),
    (lambda: na.scatter_add(na.zeros(3), 0, np.array([True]), na.ones(1)), TypeError, "index must be"),
    (lambda: na.scatter_add(na.zeros(3), 0, np.array([0, 1]), na.ones(1)), RuntimeError, "no larger than src"),
    (lambda: na.scatter_add(na.zeros(3), 0, np.array([0]), 1.0), TypeError, "src must be a tensor"),
    (lambda: na.zeros(3).scatter_add_(0, np.array([[0]]), na.ones(1, 1)), RuntimeError, "same number"),
    (lambda: na.scatter_add(na.zeros(3), 0, np.array([0]), na.ones(1, dtype=na.float64)), RuntimeError,
     "dtype"),
    (lambda: na.index_select(na.ones(2, 3), 1, np.array([3])), IndexError, "index 3 is out of bounds"),
    (lambda: na.index_select(na.ones(2, 3), 0, np.array([-1])), IndexError, "index -1"),
    (lambda: na.index_select(na.ones(2, 3), 0, np.array([[0]])), IndexError, "vector"),
    (lambda: na.index_select(na.ones(2, 3), 0, np.array([0.5])), TypeError, "index must be"),
    (lambda: na.prod(na.ones(2, 3), (0, 1)), TypeError, "single int"),
    (lambda: na.logsumexp(na.ones(2, 3), (1, -1)), RuntimeError, "more than once"),
    (lambda: na.logsumexp(na.ones(2, 3), 2), IndexError, "Dimension out of range"),
    (lambda: na.cumsum(na.ones(2), 1), IndexError, "Dimension out of range"),
    (lambda: na.ones(2).cumsum(), TypeError, "dim must be a single int"),
    (lambda: vector_norm(na.tensor([1, 2])), TypeError, "floating-point"),
    (lambda: vector_norm(na.ones(0), INF), RuntimeError, "empty"),
    (lambda: vector_norm(na.ones(2, 0), -1, dim=1), RuntimeError, "empty"),
    (lambda: vector_norm(na.ones(2), "fro"), TypeError, "ord must be a number"),
    (lambda: na.norm(na.ones(2, 2), "nuc"), NotImplementedError, "nuc"),
    (lambda: F.softplus(na.tensor([1, 2])), TypeError, "floating-point"),
    (lambda: F.rms_norm(na.ones(2, 3), (4,)), RuntimeError, "normalized_shape"),
    (lambda: F.rms_norm(na.ones(2, 3), (3,), na.ones(2)), RuntimeError, "weight"),
    (lambda: F.group_norm(na.ones(2, 5, 3), 2), RuntimeError, "divisible by num_groups"),
    (lambda: F.group_norm(na.ones(4), 2), RuntimeError, "at least 2 dimensions"),
    (lambda: F.group_norm(na.ones(2, 4), 2, na.ones(2)), RuntimeError, "weight"),
    (lambda: nn.GroupNorm(2, 5), ValueError, "divisible"),
]


@pytest.mark.parametrize("call,error,match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_is_a_clear_error_at_the_call(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_the_ops_are_where_torch_has_them():
    x = na.ones(2, 3)
    for name in ("logsumexp", "prod", "cumsum", "norm", "gather", "scatter_add", "index_select"):
        assert callable(getattr(na, name)) and name in na.__all__, name
    for name in ("logsumexp", "prod", "cumsum", "norm", "gather", "scatter_add", "scatter_add_", "index_select"):
        assert callable(getattr(x, name)), name
    for name in ("softplus", "rms_norm", "group_norm"):
        assert callable(getattr(F, name)) and name in F.__all__, name
    for name in ("Softplus", "RMSNorm", "GroupNorm"):
        assert name in nn.__all__, name
    # the module's NumPy spellings too (axis=/keepdims=), as its other reductions
    assert x.prod(axis=1, keepdims=True).shape == (2, 1) and x.cumsum(axis=0).shape == (2, 3)
    assert x.logsumexp(axis=[0, 1]).shape == ()


# ================================================================================ strict fake device
@pytest.fixture(scope="module")
def fd():
    path = pathlib.Path(__file__).parents[1] / "strict_device" / "fake_device.py"
    spec = importlib.util.spec_from_file_location("fake_device_for_added_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_IDX = np.array([[0, 2, 2], [1, 1, 0]])
DEVICE_CASES = {
    "logsumexp": (lambda t: na.logsumexp(t, (0, -1), keepdim=True), [(2, 3)], []),
    "logsumexp-empty": (lambda t: na.logsumexp(t, 1), [(2, 0)], []),
    "prod": (lambda t: t.prod(1), [(2, 3)], []),
    "prod-all": (lambda t: t.prod(), [(2, 3)], []),
    "cumsum": (lambda t: t.cumsum(-1), [(2, 3)], []),
    "norm-2": (lambda t: t.norm(dim=1), [(2, 3)], []),
    "norm-inf": (lambda t: vector_norm(t, INF, dim=(0, 1)), [(2, 3)], []),
    "norm-p": (lambda t: vector_norm(t, 3, dim=0, keepdim=True), [(2, 3)], []),
    "gather": (lambda t, i: t.gather(1, i), [(2, 3)], [_IDX]),
    "scatter_add": (lambda t, u, i: na.scatter_add(t, 1, i, u), [(2, 3), (2, 3)], [_IDX]),
    "index_select": (lambda t, i: t.index_select(1, i), [(2, 3)], [np.array([2, 0, 2])]),
    "softplus": (lambda t: F.softplus(t * 12, beta=2.0), [(2, 3)], []),
    "rms_norm": (lambda t, w: F.rms_norm(t, (3,), w), [(2, 3), (3,)], []),
    "group_norm": (lambda t, w, b: F.group_norm(t, 2, w, b), [(2, 4, 2), (4,), (4,)], []),
}


@pytest.mark.parametrize("name", list(DEVICE_CASES))
def test_the_ops_run_on_the_strict_fake_device_without_waiting_for_it(fd, name):
    fn, shapes, consts = DEVICE_CASES[name]
    arrays = [_data(10 + i, s) for i, s in enumerate(shapes)]
    fd.assert_host_and_device_agree(fn, arrays, lambda shape: _data(1, shape), consts)
