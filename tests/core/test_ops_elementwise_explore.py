"""Exploring properties of the elementwise ops against float64 NumPy references
(``tests/core/ops_references.py``): forward values and gradients of ``+ - * / **`` with
broadcasting and number operands (each gradient summed back to its input's shape), the unary math
and activations (exp/log/sqrt/abs/tanh/sigmoid/relu/gelu both forms/silu/leaky_relu), clamp with
number and tensor bounds, where, maximum/minimum with ties (torch gives each side half). Shapes
with size-1 and empty dims, transposed (non-contiguous) inputs, float32 and float64. Pinned
``@example`` cases are bugs this exploration found.

Example of what one property checks::

    >>> import numpy as np
    >>> from neural_arch import Tensor
    >>> a = Tensor(np.ones((2, 1)), requires_grad=True)
    >>> (a * Tensor(np.ones(3))).sum().backward()
    >>> a.grad.tolist()
    [[3.0], [3.0]]
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import neural_arch.nn.functional as F
from neural_arch import Tensor
from neural_arch.core.ops_reduce import maximum, minimum
from tests.core import ops_references as ref

TOL = {np.float64: 1e-10, np.float32: 2e-5}
DTYPES = st.sampled_from([np.float64, np.float32])


def _close(got, want, dtype, what="", gelu=None):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    tol = gelu or TOL[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


def _array(seed, shape, dtype, transposed=False, positive=False):
    """Seeded data of ``shape``; ``transposed`` gives a non-contiguous view of the same shape."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape[::-1] if transposed else shape)
    if positive:
        a = np.abs(a) + 0.5
    a = np.asarray(a).astype(dtype)  # an ndarray even for shape ()
    return a.T if transposed else a


def _leaf(a):
    return Tensor(a, requires_grad=True)


shapes2 = mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3)


# ---------------------------------------------------------------------------------- arithmetic
@settings(max_examples=40)
@given(shapes=shapes2, op=st.sampled_from(["+", "-", "*", "/", "**"]), dtype=DTYPES,
       seed=st.integers(0, 2**16), b_kind=st.sampled_from(["tensor", "number", "const"]),
       transposed=st.booleans())
@example(shapes=((( 2, 1), (3,)), None), op="**", dtype=np.float64, seed=0, b_kind="tensor", transposed=False)
def test_binary_ops_forward_and_gradients_match_numpy(shapes, op, dtype, seed, b_kind, transposed):
    (sa, sb), _ = shapes
    positive = op in ("/", "**")  # keep a**b real and b away from 0
    a = _array(seed, sa, dtype, transposed and len(sa) >= 2, positive=positive)
    b = _array(seed + 1, sb, dtype, positive=positive) if b_kind != "number" else 1.5
    ta = _leaf(a)
    tb = _leaf(b) if b_kind == "tensor" else (Tensor(b) if b_kind == "const" else b)
    out = {"+": lambda: ta + tb, "-": lambda: ta - tb, "*": lambda: ta * tb,
           "/": lambda: ta / tb, "**": lambda: ta ** tb}[op]()
    g = _array(seed + 2, out.shape, dtype)
    out.backward(Tensor(g))
    want, ga, gb = ref.binary(op, a, b, g)
    assert out.dtype == dtype
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, ga, dtype, "grad a")
    if b_kind == "tensor":
        _close(tb.grad.data, gb, dtype, "grad b")


@settings(max_examples=30)
@given(shape=st.sampled_from([(3,), (2, 3), ()]), dtype=DTYPES, seed=st.integers(0, 2**16),
       op=st.sampled_from(["r-", "r/", "r**", "r+", "r*"]))
def test_reflected_number_ops_match_numpy(shape, dtype, seed, op):
    """``number op tensor`` (``__rsub__``, ``__rtruediv__``, ``__rpow__``...)."""
    a = _array(seed, shape, dtype, positive=True)
    ta = _leaf(a)
    n = 1.5
    out = {"r-": lambda: n - ta, "r/": lambda: n / ta, "r**": lambda: n ** ta,
           "r+": lambda: n + ta, "r*": lambda: n * ta}[op]()
    g = _array(seed + 2, out.shape, dtype)
    out.backward(Tensor(g))
    want, _, gb = ref.binary(op[1:], np.float64(n), a.astype(np.float64), g)
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, gb, dtype, "grad")


def test_pow_gradients_at_zero_follow_torch():
    """Pins: ``a ** 0`` at ``a = 0`` had a nan gradient (torch: 0) and ``0 ** a`` had -inf/nan
    (torch: 0 where ``a >= 0``); ``a ** b`` at a negative base gives torch's nan for ``d/db``."""
    a = _leaf(np.array([0.0, 1.0, -2.0]))
    (a ** 0).sum().backward()
    assert a.grad.tolist() == [0.0, 0.0, 0.0]
    a = _leaf(np.array([0.0, 2.0]))
    (0.0 ** a).sum().backward()
    assert a.grad.tolist() == [0.0, 0.0]
    a, b = _leaf(np.array([0.0, -2.0])), _leaf(np.array([0.0, 2.0]))
    (a ** b).sum().backward()
    assert a.grad.tolist() == [0.0, -4.0]
    assert b.grad.data[0] == 0.0 and np.isnan(b.grad.data[1])


# ---------------------------------------------------------------------------------- unary
UNARY_OPS = {
    "exp": F.exp, "log": F.log, "sqrt": F.sqrt, "abs": F.abs, "tanh": F.tanh, "sigmoid": F.sigmoid,
    "relu": F.relu, "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "neg": lambda t: -t,
}


@settings(max_examples=60)
@given(name=st.sampled_from(sorted(UNARY_OPS)), dtype=DTYPES, seed=st.integers(0, 2**16),
       shape=st.sampled_from([(), (0,), (1,), (4,), (2, 3), (3, 1, 2)]), transposed=st.booleans(),
       scale=st.sampled_from([1.0, 6.0]))
@example(name="gelu", dtype=np.float64, seed=0, shape=(2, 3), transposed=False, scale=1.0)
def test_unary_ops_forward_and_gradients_match_numpy(name, dtype, seed, shape, transposed, scale):
    positive = name in ("log", "sqrt")
    a = _array(seed, shape, dtype, transposed and len(shape) >= 2, positive=positive)
    a = np.asarray(a * dtype(scale))
    if name == "relu" or name == "abs":
        a.reshape(-1)[:1] = 0  # the kink: torch's gradient there is 0
    ta = _leaf(a)
    out = UNARY_OPS[name](ta)
    g = _array(seed + 1, shape, dtype)
    out.backward(Tensor(g))
    f, df = ref.UNARY[name]
    x = a.astype(np.float64)
    assert out.dtype == dtype and out.shape == shape
    # the erf form of GELU is a polynomial good to 1.5e-7 (NumPy has no erf; documented in gelu)
    tol = {"gelu": 3e-7} if name == "gelu" and dtype == np.float64 else {}
    _close(out.data, f(x), dtype, "forward", **tol)
    _close(ta.grad.data, g * df(x), dtype, "grad", **tol)


@settings(max_examples=20)
@given(dtype=DTYPES, seed=st.integers(0, 2**16), slope=st.sampled_from([0.01, 0.2, -0.5, 0.0]))
def test_leaky_relu_matches_numpy(dtype, seed, slope):
    a = _array(seed, (2, 3), dtype)
    a[0, 0] = 0
    ta = _leaf(a)
    out = F.leaky_relu(ta, slope)
    g = _array(seed + 1, (2, 3), dtype)
    out.backward(Tensor(g))
    want, d = ref.leaky_relu(a.astype(np.float64), slope)
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, g * d, dtype, "grad")


# ---------------------------------------------------------------------------------- clamp / where / extremes
@settings(max_examples=40)
@given(dtype=DTYPES, seed=st.integers(0, 2**16), bounds=st.sampled_from(["lo", "hi", "both", "crossed"]),
       kind=st.sampled_from(["number", "tensor", "broadcast"]))
@example(dtype=np.float64, seed=0, bounds="lo", kind="tensor")
@example(dtype=np.float64, seed=0, bounds="both", kind="broadcast")
def test_clamp_matches_torch_rule(dtype, seed, bounds, kind):
    """torch's clamp: ``min(max(x, lo), hi)`` (so ``hi`` wins when ``lo > hi``); ``x`` gets the
    gradient where ``lo <= x <= hi``, ``lo`` where ``x < lo < hi``, ``hi`` where ``x > hi`` or
    ``lo > hi`` (torch's masks, checked with torch 2.13). Pins: tensor bounds received no gradient,
    and a bound broadcasting ``x`` to a bigger shape failed in backward."""
    a = np.round(_array(seed, (3,), dtype) * 2) / 2  # ties with the bounds happen
    lo_v, hi_v = {"lo": (0.0, None), "hi": (None, 0.5), "both": (-0.5, 0.5), "crossed": (0.5, -0.5)}[bounds]
    shape = (2, 3) if kind == "broadcast" else (3,)

    def bound(v, off):
        if v is None:
            return None, None
        if kind == "number":
            return v, None
        arr = (np.full(shape, v) + off * np.arange(np.prod(shape)).reshape(shape) * 0.25).astype(dtype)
        return _leaf(arr), arr.astype(np.float64)

    lo, lo_arr = bound(lo_v, 1)
    hi, hi_arr = bound(hi_v, -1)
    ta = _leaf(a)
    out = F.clamp(ta, min=lo, max=hi)
    x = a.astype(np.float64)
    lo_n = lo_arr if lo_arr is not None else lo_v
    hi_n = hi_arr if hi_arr is not None else hi_v
    want = x
    if lo_n is not None:
        want = np.maximum(want, lo_n)
    if hi_n is not None:
        want = np.minimum(want, hi_n)
    g = _array(seed + 1, want.shape, dtype)
    out.backward(Tensor(g))
    _close(out.data, want, dtype, "forward")
    inside = np.ones(want.shape, bool)
    if lo_n is not None:
        inside &= x >= lo_n
    if hi_n is not None:
        inside &= x <= hi_n
    _close(ta.grad.data, ref.unbroadcast(g * inside, x.shape), dtype, "grad x")
    if lo_arr is not None:
        picked_lo = (x < lo_arr) & (True if hi_n is None else lo_arr < hi_n)
        _close(lo.grad.data, g * picked_lo, dtype, "grad min")
    if hi_arr is not None:
        picked_hi = (x > hi_arr) | (False if lo_n is None else lo_n > hi_arr)
        _close(hi.grad.data, g * picked_hi, dtype, "grad max")


@settings(max_examples=30)
@given(shapes=mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=1, max_side=3),
       dtype=DTYPES, seed=st.integers(0, 2**16), b_number=st.booleans())
def test_where_with_broadcast_condition_matches_numpy(shapes, dtype, seed, b_number):
    (sc, sa, sb), _ = shapes
    cond = np.random.default_rng(seed).random(sc) > 0.5
    a, b = _array(seed, sa, dtype), _array(seed + 1, sb, dtype)
    ta = _leaf(a)
    tb = 2.0 if b_number else _leaf(b)
    out = F.where(Tensor(cond), ta, tb)
    want = np.where(cond, a.astype(np.float64), 2.0 if b_number else b.astype(np.float64))
    g = _array(seed + 2, want.shape, dtype)
    out.backward(Tensor(g))
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, ref.unbroadcast(np.where(cond, g, 0.0) * np.ones(want.shape), sa), dtype, "grad a")
    if not b_number:
        _close(tb.grad.data, ref.unbroadcast(np.where(cond, 0.0, g) * np.ones(want.shape), sb), dtype, "grad b")


@settings(max_examples=30)
@given(shapes=shapes2, dtype=DTYPES, seed=st.integers(0, 2**16), which=st.sampled_from(["max", "min"]))
def test_maximum_minimum_ties_share_the_gradient(shapes, dtype, seed, which):
    (sa, sb), _ = shapes
    a = np.round(_array(seed, sa, dtype))  # small integers: ties are common
    b = np.round(_array(seed + 1, sb, dtype))
    ta, tb = _leaf(a), _leaf(b)
    out = (maximum if which == "max" else minimum)(ta, tb)
    x, y = a.astype(np.float64), b.astype(np.float64)
    want = np.maximum(x, y) if which == "max" else np.minimum(x, y)
    g = _array(seed + 2, want.shape, dtype)
    out.backward(Tensor(g))
    wins = (x > y) if which == "max" else (x < y)
    share = np.where(wins, 1.0, np.where(x == y, 0.5, 0.0))
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, ref.unbroadcast(g * share, sa), dtype, "grad a")
    _close(tb.grad.data, ref.unbroadcast(g * (1 - share), sb), dtype, "grad b")


@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_elementwise_on_empty_tensors(shape):
    t = _leaf(np.zeros(shape))
    (F.gelu(t) + F.sigmoid(t) * 2).sum().backward()
    assert t.grad.shape == shape


# ---------------------------------------------------------------------------------- matmul / linear
MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 3), (3, 2)), ((4, 2, 3), (3,)),
                 ((3,), (4, 3, 2)), ((1, 2, 3), (4, 3, 2)), ((2, 1, 2, 3), (4, 3, 1)), ((0, 3), (3, 2)),
                 ((2, 0), (0, 2))]


@settings(max_examples=30)
@given(shapes=st.sampled_from(MATMUL_SHAPES), dtype=DTYPES, seed=st.integers(0, 2**16), transposed=st.booleans())
def test_matmul_with_1d_and_broadcast_batches_matches_numpy(shapes, dtype, seed, transposed):
    sa, sb = shapes
    a = _array(seed, sa, dtype, transposed and len(sa) == 2)
    b = _array(seed + 1, sb, dtype)
    ta, tb = _leaf(a), _leaf(b)
    out = ta @ tb
    x, y = a.astype(np.float64), b.astype(np.float64)
    want = x @ y
    g = _array(seed + 2, want.shape, dtype).astype(np.float64)
    out.backward(Tensor(g.astype(dtype)))
    # the 1-d operands promoted to matrices (torch's rule), the gradient of a product of matrices
    A = x[None, :] if x.ndim == 1 else x
    B = y[:, None] if y.ndim == 1 else y
    G = g.reshape(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]) + (A.shape[-2], B.shape[-1]))
    ga = ref.unbroadcast(G @ np.swapaxes(B, -1, -2), A.shape).reshape(sa)
    gb = ref.unbroadcast(np.swapaxes(A, -1, -2) @ G, B.shape).reshape(sb)
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, ga, dtype, "grad a")
    _close(tb.grad.data, gb, dtype, "grad b")


@settings(max_examples=20)
@given(xshape=st.sampled_from([(3,), (2, 3), (2, 4, 3), (0, 3)]), bias=st.sampled_from([None, (2,), (1,), ()]),
       dtype=DTYPES, seed=st.integers(0, 2**16))
@example(xshape=(2, 3), bias=(), dtype=np.float64, seed=0)
def test_linear_matches_numpy(xshape, bias, dtype, seed):
    """Pin: a 0-d (broadcast) bias got a (out_features,) gradient and backward failed."""
    x, w = _array(seed, xshape, dtype), _array(seed + 1, (2, 3), dtype)
    b = None if bias is None else _array(seed + 2, bias, dtype)
    tx, tw = _leaf(x), _leaf(w)
    tb = None if b is None else _leaf(b)
    out = F.linear(tx, tw, tb)
    want = x.astype(np.float64) @ w.astype(np.float64).T + (0.0 if b is None else b.astype(np.float64))
    g = _array(seed + 3, want.shape, dtype).astype(np.float64)
    out.backward(Tensor(g.astype(dtype)))
    _close(out.data, want, dtype, "forward")
    _close(tx.grad.data, g @ w.astype(np.float64), dtype, "grad x")
    _close(tw.grad.data, g.reshape(-1, 2).T @ x.astype(np.float64).reshape(-1, 3), dtype, "grad w")
    if tb is not None:
        _close(tb.grad.data, ref.unbroadcast(g, bias), dtype, "grad bias")


@settings(max_examples=20)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, min_side=1, max_side=3),
       dtype=DTYPES, seed=st.integers(0, 2**16))
def test_masked_fill_with_a_broadcast_mask_matches_numpy(shapes, dtype, seed):
    (sx, sm), _ = shapes
    a = _array(seed, sx, dtype)
    mask = np.random.default_rng(seed).random(sm) > 0.5
    ta = _leaf(a)
    out = ta.masked_fill(Tensor(mask), -2.5)
    want = np.where(mask, -2.5, a.astype(np.float64))
    g = _array(seed + 1, want.shape, dtype).astype(np.float64)
    out.backward(Tensor(g.astype(dtype)))
    _close(out.data, want, dtype, "forward")
    _close(ta.grad.data, ref.unbroadcast(np.where(mask, 0.0, g), sx), dtype, "grad")


def test_clamp_of_an_integer_tensor_to_a_float_bound_promotes_like_torch():
    """Pin: ``tensor([1, 2, 3]).clamp(min=1.5)`` was cast back to int64, giving ``[1, 2, 3]`` (a value
    below the bound); torch promotes to float and gives ``[1.5, 2, 3]``."""
    out = Tensor(np.array([1, 2, 3])).clamp(min=1.5)
    assert out.dtype.kind == "f" and out.tolist() == [1.5, 2.0, 3.0]
    assert Tensor(np.array([1, 2, 3])).clamp(max=2).tolist() == [1, 2, 2]
    assert Tensor(np.array([1.0, 2.0], np.float32)).clamp(min=1.5).dtype == np.float32


def test_float_only_ops_on_integer_tensors_promote_or_refuse_never_truncate():
    """Pins: ``sigmoid``/``silu``/``gelu(approximate="tanh")`` of ``[0, 1, -2]`` returned
    ``[0, 0, 0]`` and ``layer_norm`` of ``[[1, 2, 3]]`` returned ``[[-1, 0, 1]]`` (float results cast
    back to int64). torch promotes sigmoid to float and refuses the others."""
    x = Tensor(np.array([0, 1, -2]))
    np.testing.assert_allclose(F.sigmoid(x).data, ref.sigmoid(np.array([0.0, 1.0, -2.0])), rtol=1e-6)
    assert F.sigmoid(x).dtype == np.float32
    for op in (F.silu, F.gelu, lambda t: F.gelu(t, approximate="tanh")):
        with pytest.raises(TypeError, match="floating-point"):
            op(x)
    with pytest.raises(TypeError, match="floating-point"):
        F.layer_norm(Tensor(np.array([[1, 2, 3]])), (3,))
