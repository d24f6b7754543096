"""Exploring properties of the torch ops a ported script calls that the core lacked (each was an
AttributeError on ``neural_arch`` and on ``Tensor``): the unary math (``sin``, ``cos``, ``erf``,
``expm1``, ``log1p``, ``log2``, ``floor``, ``ceil``, ``round``, ``sign``, ``nan_to_num``, ``atan2``),
the reorderings and selections (``flip``, ``roll``, ``unbind``, ``narrow``, ``movedim``, ``tile``,
``diagonal``, ``diag``, ``repeat_interleave``, ``masked_select``), ``sort``/``argsort``/``topk``,
``cumprod``, ``count_nonzero``, ``nonzero``, and ``einsum``/``bmm``/``outer``/``lerp``/``isclose``.

Each is checked against the element-by-element float64 references of
``tests/core/ops_torch_added_references.py`` over float32 and float64, size-0 and size-1 dims and
negative dims; gradients against the analytic derivative or central finite differences in float64;
the torch choices at the edges (NaN sorts largest, ties keep their order, ``sign(nan) == 0``,
``cumprod`` exact with zeros); bad input a clear error at the call; the same values on the strict
fake device without a host wait.

Example of what one property checks::

    >>> import neural_arch as na
    >>> values, indices = na.sort(na.tensor([2.0, float("nan"), 2.0, 1.0]), descending=True)
    >>> values.tolist()[1:], indices.tolist()     # NaN first (the largest), the tied 2.0s in order
    ([2.0, 2.0, 1.0], [1, 0, 2, 3])
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
from neural_arch import Tensor, return_types
from tests.core import ops_torch_added_references as ref

TOL = {np.float64: 1e-10, np.float32: 3e-6}
DTYPES = st.sampled_from([np.float64, np.float32])
SMALL = settings(max_examples=15)
SHAPES = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
NONEMPTY_SHAPES = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


def _close(got, want, dtype, what=""):
    got = np.asarray(got.data if isinstance(got, Tensor) else got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=what)


def _data(seed, shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _unbroadcast(g, shape):
    """``g`` summed down to ``shape`` (what broadcasting an input of that shape did, undone)."""
    while g.ndim > len(shape):
        g = g.sum(0)
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1), keepdims=True)


# ================================================================================ unary math
#: a transform of standard-normal data into each op's domain (away from the kinks of floor/ceil/round)
_DOMAIN = {
    "log1p": lambda a: np.abs(a) - 0.5,   # > -1
    "log2": lambda a: np.abs(a) + 0.1,    # > 0
    "floor": lambda a: np.round(a * 4) / 4 + 0.1, "ceil": lambda a: np.round(a * 4) / 4 + 0.1,
    "round": lambda a: np.round(a * 4) / 4 + 0.1,
}


@SMALL
@given(name=st.sampled_from(sorted(ref.UNARY)), shape=SHAPES, dtype=DTYPES, seed=st.integers(0, 2**16))
@example(name="erf", shape=(3,), dtype=np.float64, seed=0)       # float64 erf to full precision
@example(name="sign", shape=(0, 2), dtype=np.float32, seed=0)
@example(name="log2", shape=(), dtype=np.float64, seed=1)
def test_unary_math_matches_the_reference_with_its_gradient(name, shape, dtype, seed):
    a = _DOMAIN.get(name, lambda v: v * 2)(_data(seed, shape)).astype(dtype)
    x = Tensor(a, requires_grad=True)
    out = getattr(na, name)(x)
    want, deriv = ref.unary(name, a.astype(np.float64))
    assert out.dtype == dtype and getattr(x, name)().tolist() == out.tolist()  # the method is the function
    _close(out, want, dtype, "forward")
    g = _data(seed + 1, shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, g * deriv, dtype, "grad")


def test_unary_math_edges_are_torchs():
    special = Tensor(np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 2.5], np.float32))
    assert na.sign(special).tolist()[0] == 0.0                      # torch: sign(nan) is 0 (NumPy: nan)
    assert na.sign(na.tensor([-3, 0, 7])).tolist() == [-1, 0, 1]      # integer sign, dtype kept
    assert na.sign(na.tensor([True, False])).dtype == np.bool_
    assert na.log1p(special).tolist()[4] == -math.inf and na.log2(Tensor(np.array([0.0]))).item() == -math.inf
    assert na.round(na.tensor([0.5, 1.5, 2.5, -0.5])).tolist() == [0.0, 2.0, 2.0, -0.0]  # halves to even
    assert na.round(na.tensor([1234.5], dtype=na.float64), decimals=-2).item() == 1200.0
    nan_to_num = na.nan_to_num(special).tolist()
    assert nan_to_num[:3] == [0.0, float(np.finfo(np.float32).max), float(np.finfo(np.float32).min)]
    assert na.nan_to_num(special, nan=1.0, posinf=2.0, neginf=-2.0).tolist()[:3] == [1.0, 2.0, -2.0]
    for name in ("sin", "erf", "expm1", "log2", "exp", "sqrt", "tanh", "log"):   # integers promote (torch)
        assert getattr(na, name)(na.tensor([1, 2])).dtype == np.float32, name
    for name in ("floor", "ceil", "round", "nan_to_num"):               # ... or are kept as they are
        assert getattr(na, name)(na.tensor([1, 2])).tolist() == [1, 2], name
    x = Tensor(np.array([np.nan, 1.0, np.inf]), requires_grad=True)
    na.nan_to_num(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 0.0]                          # replaced entries get no gradient


@SMALL
@given(shapes=st.sampled_from([((2, 3), (2, 3)), ((2, 1), (3,)), ((), (2,)), ((0, 2), (1, 2))]),
       dtype=DTYPES, seed=st.integers(0, 2**16))
def test_atan2_broadcasts_and_its_gradients_are_the_partial_derivatives(shapes, dtype, seed):
    a, b = _data(seed, shapes[0], dtype), _data(seed + 1, shapes[1], dtype)
    y, x = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    out = na.atan2(y, x)
    a64, b64 = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
    want = np.vectorize(math.atan2)(a64, b64) if a64.size else np.zeros(a64.shape)
    assert out.dtype == dtype
    _close(out, want, dtype, "forward")
    g = _data(seed + 2, want.shape)
    out.backward(Tensor(g.astype(dtype)))
    r2 = a64 ** 2 + b64 ** 2
    _close(y.grad, _unbroadcast(g * b64 / r2, shapes[0]), dtype, "d/dinput")
    _close(x.grad, _unbroadcast(-g * a64 / r2, shapes[1]), dtype, "d/dother")
    check_grad(na.atan2, _data(seed, (2, 1)), _data(seed + 1, (3,)))
    assert na.atan2(na.tensor([1]), na.tensor([1.0])).dtype == np.float32  # int with float32: float32


# ================================================================================ reorderings
@st.composite
def tensor_and_dim(draw, shapes=SHAPES, min_ndim=1):
    shape = draw(shapes.filter(lambda s: len(s) >= min_ndim))
    nd = len(shape)
    return shape, draw(st.integers(-nd, nd - 1))


@SMALL
@given(case=tensor_and_dim(), dtype=DTYPES, seed=st.integers(0, 2**16), data=st.data())
@example(case=((2, 0, 3), -2), dtype=np.float64, seed=0, data=None)
@example(case=((1,), 0), dtype=np.float32, seed=0, data=None)
def test_flip_roll_movedim_match_the_references(case, dtype, seed, data):
    shape, dim = case
    nd = len(shape)
    a = _data(seed, shape, dtype)
    shift = data.draw(st.integers(-4, 4)) if data is not None else 5
    other = data.draw(st.integers(-nd, nd - 1)) if data is not None else 0
    _close(na.flip(Tensor(a), dim), ref.flip(a, {dim % nd}), dtype, "flip")
    _close(Tensor(a).flip(dim, other) if dim % nd != other % nd else na.flip(Tensor(a), (dim,)),
           ref.flip(a, {dim % nd, other % nd}), dtype, "flip two dims")
    _close(na.roll(Tensor(a), shift, dim), ref.roll(a, (shift,), (dim % nd,)), dtype, "roll")
    _close(na.roll(Tensor(a), shift), ref.roll(a, (shift,), None), dtype, "roll flattened")
    _close(na.movedim(Tensor(a), dim, other), ref.movedim(a, [dim], [other]), dtype, "movedim")
    _close(Tensor(a).moveaxis(dim, other), ref.movedim(a, [dim], [other]), dtype, "moveaxis")
    pieces = na.unbind(Tensor(a), dim)
    assert isinstance(pieces, tuple) and len(pieces) == shape[dim]
    for i, p in enumerate(pieces):
        _close(p, np.take(a, i, axis=dim), dtype, "unbind")


def test_reorderings_gradients_match_finite_differences():
    a = _data(3, (2, 3))
    check_grad(lambda t: na.flip(t, (0, 1)), a)
    check_grad(lambda t: na.roll(t, (1, -1), (0, 1)), a)
    check_grad(lambda t: na.roll(t, 4), a)
    check_grad(lambda t: na.movedim(t, (0, 1), (1, 0)), a)
    check_grad(lambda t: na.stack(na.unbind(t, 1)[::-1]), a)
    check_grad(lambda t: na.narrow(t, -1, -2, 2), a)
    check_grad(lambda t: na.tile(t, (2, 1, 2)), a)
    check_grad(lambda t: na.diagonal(t, 1), a)
    check_grad(lambda t: na.diag(t, -1), a)
    check_grad(lambda t: na.diag(t[0], 1), a)
    check_grad(lambda t: na.repeat_interleave(t, Tensor(np.array([2, 0, 1])), dim=1), a)
    check_grad(lambda t: na.masked_select(t, Tensor(np.array([True, False, True]))), a)


@SMALL
@given(shape=SHAPES, reps=st.lists(st.integers(0, 3), min_size=0, max_size=4).map(tuple), dtype=DTYPES,
       seed=st.integers(0, 2**16))
@example(shape=(2, 3), reps=(2,), dtype=np.float64, seed=0)          # fewer reps than dims: leading 1s
@example(shape=(3,), reps=(2, 1, 2), dtype=np.float64, seed=0)       # more: new leading dims
@example(shape=(2,), reps=(0,), dtype=np.float32, seed=0)
def test_tile_matches_the_reference_and_its_gradient_sums_the_copies(shape, reps, dtype, seed):
    a = _data(seed, shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = na.tile(x, reps)
    want = ref.tile(a, reps)
    _close(out, want, dtype, "forward")
    _close(x.tile(*reps) if reps else x.tile(()), want, dtype, "method")
    g = _data(seed + 1, want.shape)
    out.backward(Tensor(g.astype(dtype)))
    nd = max(len(shape), len(reps))
    full = (1,) * (nd - len(reps)) + reps
    base = (1,) * (nd - len(shape)) + shape
    inter = [v for pair in zip(full, base) for v in pair]
    _close(x.grad, g.reshape(inter).sum(axis=tuple(range(0, 2 * nd, 2))).reshape(shape), dtype, "grad")


@SMALL
@given(shape=st.lists(st.integers(0, 3), min_size=2, max_size=3).map(tuple), offset=st.integers(-3, 3),
       dtype=DTYPES, seed=st.integers(0, 2**16), data=st.data())
@example(shape=(2, 3), offset=3, dtype=np.float64, seed=0, data=None)   # past the corner: empty
@example(shape=(3, 2, 2), offset=-1, dtype=np.float32, seed=0, data=None)
def test_diagonal_matches_the_reference(shape, offset, dtype, seed, data):
    nd = len(shape)
    d1, d2 = (data.draw(st.lists(st.integers(-nd, nd - 1), min_size=2, max_size=2,
                                 unique_by=lambda d: d % nd)) if data is not None else (0, 1))
    a = _data(seed, shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = na.diagonal(x, offset, d1, d2)
    want = ref.diagonal(a, offset, d1, d2)
    _close(out, want, dtype, "forward")
    g = _data(seed + 1, want.shape)
    out.backward(Tensor(g.astype(dtype)))
    gx = np.zeros(shape)  # the reference's adjoint: each diagonal entry gets its upstream gradient
    moved = np.moveaxis(gx, (d1 % nd, d2 % nd), (-2, -1))
    for k in range(want.shape[-1]):
        moved[..., k + max(0, -offset), k + max(0, offset)] = g[..., k]
    _close(x.grad, gx, dtype, "grad")
    if nd == 2 and (d1 % nd, d2 % nd) == (0, 1):
        _close(na.diag(Tensor(a), offset), want, dtype, "diag of a matrix")


def test_diag_of_a_vector_is_the_matrix():
    assert na.diag(na.tensor([1, 2]), 1).tolist() == [[0, 1, 0], [0, 0, 2], [0, 0, 0]]
    assert na.tensor([1.0]).diag(-1).shape == (2, 2)


@SMALL
@given(case=tensor_and_dim(), dtype=DTYPES, seed=st.integers(0, 2**16), data=st.data())
@example(case=((2, 3), 1), dtype=np.float64, seed=0, data=None)
@example(case=((0, 2), 0), dtype=np.float32, seed=0, data=None)
def test_repeat_interleave_matches_the_reference(case, dtype, seed, data):
    shape, dim = case
    n = shape[dim]
    counts = (data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) if data is not None
              else [2, 0, 1][:n])
    a = _data(seed, shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = na.repeat_interleave(x, Tensor(np.array(counts, dtype=np.int64)), dim=dim)
    want = ref.repeat_interleave(a, counts, dim % len(shape))
    _close(out, want, dtype, "forward")
    _close(x.repeat_interleave(2, dim), ref.repeat_interleave(a, [2] * n, dim % len(shape)), dtype, "int repeats")
    _close(na.repeat_interleave(x, 2), ref.repeat_interleave(a, [2] * a.size, None), dtype, "flattened")
    g = _data(seed + 1, want.shape)
    out.backward(Tensor(g.astype(dtype)))
    gx = np.zeros(shape)
    src = np.repeat(np.arange(n), counts)
    for j, i in enumerate(src):
        idx = [slice(None)] * len(shape)
        idx[dim] = i
        jdx = [slice(None)] * len(shape)
        jdx[dim] = j
        gx[tuple(idx)] += g[tuple(jdx)]
    _close(x.grad, gx, dtype, "grad")


@SMALL
@given(shape=SHAPES, mask_kind=st.sampled_from(["same", "last", "scalar", "leading"]), dtype=DTYPES,
       seed=st.integers(0, 2**16))
@example(shape=(2, 3), mask_kind="last", dtype=np.float64, seed=0)        # a broadcast mask
@example(shape=(0, 3), mask_kind="same", dtype=np.float32, seed=0)
def test_masked_select_broadcasts_the_mask(shape, mask_kind, dtype, seed):
    rng = np.random.default_rng(seed)
    mshape = {"same": shape, "last": shape[-1:], "scalar": (), "leading": (2,) + shape}[mask_kind]
    mask = rng.random(mshape) < 0.5
    a = _data(seed, shape, dtype)
    x = Tensor(a, requires_grad=True)
    out = na.masked_select(x, Tensor(mask))
    want = ref.masked_select(a, mask)
    _close(out, want, dtype, "forward")
    g = _data(seed + 1, want.shape)
    out.backward(Tensor(g.astype(dtype)))
    full = np.broadcast_shapes(shape, mshape)
    gx = np.zeros(full)
    gx[np.broadcast_to(mask, full)] = g
    while gx.ndim > len(shape):
        gx = gx.sum(0)
    _close(x.grad, gx.reshape(shape), dtype, "grad")


def test_narrow_unbind_and_the_selections_refuse_bad_input():
    x = na.ones(2, 3)
    assert na.narrow(x, 1, -1, 1).shape == (2, 1) and x.narrow(0, 0, 0).shape == (0, 3)
    with pytest.raises(RuntimeError, match="exceeds"):
        na.narrow(x, 1, 2, 2)                   # never a silently shorter slice
    with pytest.raises(IndexError, match="start"):
        na.narrow(x, 1, -4, 1)
    with pytest.raises(IndexError):
        na.unbind(na.tensor(1.0))
    with pytest.raises(RuntimeError, match="multiple times"):
        na.flip(x, (0, -2))
    with pytest.raises(RuntimeError, match="align"):
        na.roll(x, (1, 2), 0)
    with pytest.raises(RuntimeError, match="identical"):
        na.diagonal(x, 0, 1, -1)
    with pytest.raises(RuntimeError, match="1D or 2D"):
        na.diag(na.ones(2, 2, 2))
    with pytest.raises(RuntimeError, match="same size"):
        na.repeat_interleave(x, Tensor(np.array([1, 2])), dim=1)
    with pytest.raises(RuntimeError, match="negative"):
        na.repeat_interleave(x, -1)
    with pytest.raises(RuntimeError, match="integer"):
        na.repeat_interleave(x, Tensor(np.array([1.0, 2.0, 1.0])), dim=1)
    with pytest.raises(RuntimeError, match="boolean"):
        na.masked_select(x, na.ones(3))
    with pytest.raises(RuntimeError, match="same number of dims"):
        na.movedim(na.ones(2, 3, 4), (0, 1), 2)
    with pytest.raises(RuntimeError, match="negative"):
        na.tile(x, (-1,))


# ================================================================================ sort, topk, cumprod, counts
@SMALL
@given(case=tensor_and_dim(), dtype=DTYPES, seed=st.integers(0, 2**16), descending=st.booleans(),
       specials=st.sampled_from(["none", "ties", "nan"]))
@example(case=((4,), 0), dtype=np.float64, seed=0, descending=True, specials="ties")
@example(case=((2, 5), -1), dtype=np.float32, seed=1, descending=False, specials="nan")
@example(case=((3, 0), 1), dtype=np.float64, seed=0, descending=True, specials="none")
def test_sort_argsort_topk_match_the_reference(case, dtype, seed, descending, specials):
    shape, dim = case
    rng = np.random.default_rng(seed)
    a = _data(seed, shape, dtype)
    if specials == "ties":
        a = np.round(a).astype(dtype)
    elif specials == "nan":
        a[rng.random(shape) < 0.3] = np.nan
    x = Tensor(a, requires_grad=True)
    got = na.sort(x, dim, descending)
    values, indices = ref.sort(a.astype(np.float64), dim, descending)
    assert isinstance(got, return_types.sort) and got.indices.dtype == np.int64
    _close(got.values, values, dtype, "values")
    assert got.indices.tolist() == indices.tolist()          # stable: ties in their original order
    assert na.argsort(x, dim, descending).tolist() == indices.tolist()
    assert x.sort(dim=dim, descending=descending).indices.tolist() == indices.tolist()
    g = _data(seed + 1, shape)
    got.values.backward(Tensor(g.astype(dtype)))
    gx = np.zeros(shape)
    np.put_along_axis(gx, indices, g, axis=dim % len(shape))
    _close(x.grad, gx, dtype, "grad")
    n = shape[dim]
    for k in sorted({0, min(1, n), n}):
        top = na.topk(Tensor(a), k, dim, largest=descending)
        assert isinstance(top, return_types.topk)
        lead = (slice(None),) * (dim % len(shape)) + (slice(0, k),)
        _close(top.values, values[lead], dtype, f"topk k={k}")
        # topk's order among equal values is torch's choice too: check the values its indices pick
        _close(np.take_along_axis(a, top.indices.data, axis=dim % len(shape)), values[lead], dtype, "topk idx")


def test_topk_refuses_k_beyond_the_dim_and_sort_handles_0d_and_integers():
    with pytest.raises(RuntimeError, match="out of range"):
        na.topk(na.ones(3), 4)
    with pytest.raises(TypeError):
        na.topk(na.ones(3), 1.5)
    v, i = na.sort(na.tensor(2.0))
    assert v.item() == 2.0 and i.item() == 0 and v.shape == i.shape == ()
    assert na.sort(na.tensor([3, 1, 2])).values.tolist() == [1, 2, 3]
    assert na.sort(na.tensor([True, False])).values.tolist() == [False, True]
    x = Tensor(np.array([3.0, 1.0, 2.0]), requires_grad=True)
    na.topk(x, 2).values.sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 1.0]


@SMALL
@given(case=tensor_and_dim(), dtype=DTYPES, seed=st.integers(0, 2**16), zeros=st.sampled_from([0.0, 0.3, 0.6]))
@example(case=((5,), 0), dtype=np.float64, seed=0, zeros=0.6)      # several zeros in one slice
@example(case=((2, 0), 1), dtype=np.float32, seed=0, zeros=0.0)
def test_cumprod_and_its_gradient_with_zeros_match_the_reference(case, dtype, seed, zeros):
    shape, dim = case
    a = _data(seed, shape, dtype)
    a[np.random.default_rng(seed + 3).random(shape) < zeros] = 0
    x = Tensor(a, requires_grad=True)
    out = na.cumprod(x, dim)
    _close(out, ref.cumprod(a.astype(np.float64), dim), dtype, "forward")
    g = _data(seed + 1, shape)
    out.backward(Tensor(g.astype(dtype)))
    _close(x.grad, ref.cumprod_grad(a.astype(np.float64), dim, g), dtype, "grad")


def test_cumprod_integer_and_gradcheck():
    assert na.cumprod(na.tensor([[1, 2, 3]], dtype=na.int8), 1).tolist() == [[1, 2, 6]]
    assert na.cumprod(na.tensor([True, True]), 0).dtype == np.int64
    check_grad(lambda t: na.cumprod(t, 0), np.array([[2.0, 0.5], [0.0, 3.0], [1.5, 0.0]]))
    with pytest.raises(TypeError):
        na.cumprod(na.ones(2), None)


@SMALL
@given(shape=SHAPES, seed=st.integers(0, 2**16), data=st.data())
@example(shape=(), seed=0, data=None)
@example(shape=(2, 0), seed=0, data=None)
def test_count_nonzero_and_nonzero_match_the_reference(shape, seed, data):
    a = np.random.default_rng(seed).integers(-1, 2, shape).astype(np.float32)
    nd = len(shape)
    dims = tuple(data.draw(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd))) if data and nd else ()
    got = na.count_nonzero(Tensor(a), dims if dims else None)
    assert got.dtype == np.int64
    assert got.tolist() == ref.count_nonzero(a, dims if dims else tuple(range(nd))).tolist()
    if nd:
        nz = na.nonzero(Tensor(a))
        assert nz.dtype == np.int64 and nz.tolist() == ref.nonzero(a).tolist()
        assert [t.tolist() for t in Tensor(a).nonzero(as_tuple=True)] == [c.tolist() for c in ref.nonzero(a).T]
        assert [t.tolist() for t in na.where(Tensor(a != 0))] == [c.tolist() for c in ref.nonzero(a).T]
    else:
        assert na.nonzero(Tensor(a)).shape == (int(a != 0), 0)   # torch: a 0-d input gives (n, 0)


# ================================================================================ einsum and products
_EQUATIONS = [
    ("ij,jk->ik", [(2, 3), (3, 2)]), ("ij,jk", [(1, 3), (3, 2)]), ("bij,bjk->bik", [(2, 1, 3), (2, 3, 2)]),
    ("ii->i", [(3, 3)]), ("ii", [(2, 2)]), ("iij->j", [(2, 2, 3)]), ("ij->", [(2, 3)]), ("ij->ji", [(2, 3)]),
    ("i,j->ij", [(2,), (3,)]), ("i,i", [(3,), (3,)]), ("ij,ij->ij", [(2, 1), (2, 3)]),
    ("ij,j->i", [(0, 3), (3,)]), ("ijk,ikj->k", [(2, 3, 2), (2, 2, 3)]),
]


@settings(max_examples=len(_EQUATIONS))
@given(case=st.sampled_from(_EQUATIONS), dtype=DTYPES, seed=st.integers(0, 2**16), as_list=st.booleans())
@example(case=("ii", [(2, 2)]), dtype=np.float64, seed=0, as_list=False)          # a trace: a repeated letter
@example(case=("ij,ij->ij", [(2, 1), (2, 3)]), dtype=np.float64, seed=0, as_list=True)  # size-1 broadcast
def test_einsum_matches_the_brute_force_reference_and_finite_differences(case, dtype, seed, as_list):
    equation, shapes = case
    arrays = [_data(seed + i, s, dtype) for i, s in enumerate(shapes)]
    ts = [Tensor(a) for a in arrays]
    out = na.einsum(equation, ts) if as_list else na.einsum(equation, *ts)
    assert out.dtype == dtype
    _close(out, ref.einsum(equation, [a.astype(np.float64) for a in arrays]), dtype, equation)
    if dtype == np.float64:
        check_grad(lambda *t: na.einsum(equation, *t), *arrays)


def test_einsum_ellipsis_is_spelled_out_as_torch_reads_it():
    a, b = _data(0, (2, 2, 3)), _data(1, (3, 4))
    _close(na.einsum("...ij,...jk", Tensor(a), Tensor(b)), a @ b, np.float64, "batched")
    _close(na.einsum("i...->i", Tensor(a)), a.sum((1, 2)), np.float64, "ellipsis summed away")
    check_grad(lambda s, t: na.einsum("...ij,jk->...ik", s, t), a, b)
    with pytest.raises(ValueError, match="operands"):
        na.einsum("ij,jk->ik", Tensor(a[0]))


def test_bmm_outer_lerp_isclose_follow_torch():
    a, b = _data(0, (2, 3, 4)), _data(1, (2, 4, 2))
    _close(na.bmm(Tensor(a), Tensor(b)), a @ b, np.float64, "bmm")
    check_grad(na.bmm, a, b)
    with pytest.raises(RuntimeError, match="3D"):
        na.bmm(na.ones(3, 4), na.ones(4, 2))        # no broadcasting: that is matmul
    with pytest.raises(RuntimeError, match="batch"):
        na.bmm(na.ones(2, 3, 4), na.ones(3, 4, 2))
    u, v = _data(2, (3,)), _data(3, (2,))
    _close(na.outer(Tensor(u), Tensor(v)), u[:, None] * v[None, :], np.float64, "outer")
    check_grad(na.outer, u, v)
    with pytest.raises(RuntimeError, match="1-D"):
        na.outer(na.ones(2, 1), na.ones(2))
    s, e, w = _data(4, (2, 3)), _data(5, (3,)), _data(6, (2, 1))
    _close(na.lerp(Tensor(s), Tensor(e), Tensor(w)), s + w * (e - s), np.float64, "lerp")
    _close(Tensor(s).lerp(Tensor(e), 0.25), s + 0.25 * (e - s), np.float64, "lerp scalar weight")
    check_grad(na.lerp, s, e, w)
    with pytest.raises(RuntimeError, match="dtype"):
        na.lerp(na.ones(2), na.ones(2, dtype=na.float64), 0.5)
    x = na.tensor([1.0, float("nan"), float("inf"), 1.0])
    y = na.tensor([1.0 + 1e-7, float("nan"), float("inf"), 1.1])
    assert na.isclose(x, y).tolist() == [True, False, True, False]
    assert na.isclose(x, y, equal_nan=True).tolist() == [True, True, True, False]
    assert x.isclose(y, atol=0.2, equal_nan=True).all().item() and not na.allclose(x, y)
    assert na.allclose(x, x, equal_nan=True) is True
    with pytest.raises(RuntimeError, match="did not match"):
        na.isclose(na.ones(2), na.ones(2, dtype=na.float64))


# ================================================================================ strict fake device
@pytest.fixture(scope="module")
def fd():
    path = pathlib.Path(__file__).parents[1] / "strict_device" / "fake_device.py"
    spec = importlib.util.spec_from_file_location("fake_device_for_torch_added_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# erf on a device is CuPy's special function (the fake device has none); repeat_interleave copies its
# host index and masked_select's output size is data (torch waits there too): those three are left out
DEVICE_CASES = {
    "unary": (lambda t: na.sin(t) + na.cos(t) + na.expm1(t) + na.log1p(t * t) + na.log2(t * t + 1)
              + na.floor(t) + na.ceil(t) + na.round(t) + na.sign(t) + na.nan_to_num(t), [(2, 3)]),
    "atan2": (na.atan2, [(2, 3), (3,)]),
    "reorder": (lambda t: na.flip(t, (0, 1)) + na.roll(t, 1, 1) + na.roll(t, 2) + na.movedim(t, 0, 0)
                + na.unbind(na.tile(t, (2, 1)), 0)[3] + na.narrow(t, 0, 1, 1), [(2, 3)]),
    "diagonal": (lambda t: na.diagonal(t, 1) + na.diag(na.diag(t, -1)).sum(0)[:2], [(3, 3)]),
    "sort-topk": (lambda t: na.sort(t, 1, True).values + na.topk(t, 3, largest=False).values, [(2, 3)]),
    "cumprod": (lambda t: na.cumprod(t, 1), [(2, 3)]),
    "einsum": (lambda a, b: na.einsum("ij,jk->ik", a, b) + na.einsum("ii->i", a @ b)[:, None], [(2, 3), (3, 2)]),
    "bmm-outer-lerp": (lambda a, b, w: na.bmm(a, b).sum(0) + na.outer(w[0], w[1]) + na.lerp(w, w * 2, 0.3),
                       [(2, 2, 3), (2, 3, 2), (2, 2)]),
}


@pytest.mark.parametrize("name", list(DEVICE_CASES))
def test_the_ops_run_on_the_strict_fake_device_without_waiting_for_it(fd, name):
    fn, shapes = DEVICE_CASES[name]
    arrays = [_data(10 + i, s) for i, s in enumerate(shapes)]
    fd.assert_host_and_device_agree(fn, arrays, lambda shape: _data(1, shape))
