"""Finite-difference gradient checks (float64) for arithmetic, matmul, reductions, shape ops,
indexing and joining ops, over hypothesis-drawn shapes (0-d, size-1 dims, broadcasting)."""

from __future__ import annotations

import numpy as np
import pytest
from core_testutils import check_grad, randn
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neural_arch.nn.functional as F
from neural_arch.core import op_utils
from neural_arch.core import ops_shape as osh

SETTINGS = settings(deadline=None, max_examples=20)
seeds = st.integers(0, 2**16)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
pair_shapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)


# ----------------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a * b,
        lambda a, b: a / b,
        lambda a, b: a**b,
        lambda a, b: b - a * a,
    ],
    ids=["add", "sub", "mul", "div", "pow", "mixed"],
)
@SETTINGS
@given(shp=pair_shapes, seed=seeds)
def test_binary_broadcast(op, shp, seed):
    sa, sb = shp.input_shapes
    a = randn(seed, sa, positive=True)
    b = randn(seed + 1, sb, positive=True)
    check_grad(op, a, b)


@pytest.mark.parametrize(
    "op",
    [
        lambda a: a + 2.0,
        lambda a: 3.0 - a,
        lambda a: 2.5 * a,
        lambda a: a / 4.0,
        lambda a: 2.0 / a,
        lambda a: a**2,
        lambda a: a**3.5,
        lambda a: 1.7**a,
        lambda a: -a,
        lambda a: a + np.full(a.shape, 2.0),
        lambda a: np.full(a.shape, 2.0) * a,
    ],
    ids=["radd", "rsub", "rmul", "div_s", "rdiv", "sq", "pow_f", "rpow", "neg", "add_arr", "arr_mul"],
)
@SETTINGS
@given(shape=shapes, seed=seeds)
def test_scalar_operands(op, shape, seed):
    check_grad(op, randn(seed, shape, positive=True))


def test_same_tensor_twice():
    check_grad(lambda a: a * a + a, randn(0, (3, 2)))


# ----------------------------------------------------------------------------- matmul / linear
_MATMUL_CASES = [
    ((3,), (3,)),
    ((3,), (3, 2)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((2, 2, 3), (3, 4)),
    ((2, 1, 3), (1, 3, 2)),
    ((3,), (2, 3, 2)),
    ((2, 2, 3), (3,)),
    ((1, 3), (3, 1)),
]


@pytest.mark.parametrize("sa,sb", _MATMUL_CASES)
def test_matmul(sa, sb):
    check_grad(lambda a, b: a @ b, randn(1, sa), randn(2, sb))


@SETTINGS
@given(
    lead=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3),
    fin=st.integers(1, 3),
    fout=st.integers(1, 3),
    bias=st.booleans(),
    seed=seeds,
)
def test_linear(lead, fin, fout, bias, seed):
    x = randn(seed, lead + (fin,))
    w = randn(seed + 1, (fout, fin))
    if bias:
        check_grad(lambda x, w, b: F.linear(x, w, b), x, w, randn(seed + 2, (fout,)))
    else:
        check_grad(lambda x, w: F.linear(x, w), x, w)


# ----------------------------------------------------------------------------- reductions
def _axes(shape):
    nd = len(shape)
    opts = [None]
    if nd:
        opts += list(range(-nd, nd))
        opts += [tuple(range(nd))]
        if nd >= 2:
            opts += [(0, nd - 1)]
    return st.sampled_from(opts)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "var"])
@SETTINGS
@given(data=st.data(), shape=shapes, keepdims=st.booleans(), seed=seeds)
def test_reductions(name, data, shape, keepdims, seed):
    axis = data.draw(_axes(shape))
    if name == "var":
        n = int(np.prod([shape[a] for a in op_utils._norm_axes(axis, len(shape))])) if shape else 1
        if n < 2 and axis is not None:
            axis = None
    x = randn(seed, shape, spread=True)
    check_grad(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), x)


def test_var_ddof1_and_functional():
    x = randn(3, (3, 4))
    check_grad(lambda t: F.var(t, axis=1, ddof=1), x)
    check_grad(lambda t: F.sum(t, axis=(0, 1)) + F.mean(t) + F.max(t) + F.min(t, 0).values.sum(), x)


def test_max_ties_share_gradient():
    from neural_arch.core.tensor import Tensor

    x = Tensor([1.0, 3.0, 3.0], requires_grad=True)
    x.max().backward()
    assert x.grad.tolist() == [0.0, 0.5, 0.5]


# ----------------------------------------------------------------------------- shape ops
@SETTINGS
@given(shape=shapes, seed=seeds)
def test_reshape_view_flatten(shape, seed):
    x = randn(seed, shape)
    n = x.size
    check_grad(lambda t: t.reshape(n, 1) * 2.0, x)
    check_grad(lambda t: t.view(-1) * 2.0, x)
    check_grad(lambda t: osh.flatten(t) * 2.0, x)
    check_grad(lambda t: osh.unsqueeze(t, 0) * 1.5, x)
    check_grad(lambda t: osh.squeeze(t) * 1.5, x)


@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3), seed=seeds)
def test_transpose_permute(data, shape, seed):
    perm = data.draw(st.permutations(range(len(shape))))
    x = randn(seed, shape)
    check_grad(lambda t: t.permute(*perm) * randn(1, tuple(shape[p] for p in perm)), x)
    check_grad(lambda t: t.transpose() * 2.0, x)
    check_grad(lambda t: t.T * 2.0, x)
    if len(shape) >= 2:
        check_grad(lambda t: t.transpose(0, -1) * 2.0, x)


def test_broadcast_to_and_astype():
    check_grad(lambda t: osh.broadcast_to(t, (2, 3, 4)) * randn(4, (2, 3, 4)), randn(0, (3, 1)))
    # Casting is linear: finite differences through float32 are too coarse, check exactly instead.
    from neural_arch.core.tensor import Tensor

    x = Tensor(randn(0, (3,)), requires_grad=True)
    (x.astype(np.float32) * 2.0).sum().backward()
    assert x.grad.dtype == np.float64 and x.grad.tolist() == [2.0, 2.0, 2.0]


# ----------------------------------------------------------------------------- indexing
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=seeds)
def test_getitem(shape, seed):
    x = randn(seed, shape)
    rng = np.random.default_rng(seed)
    n0 = shape[0]
    check_grad(lambda t: t[0], x)
    check_grad(lambda t: t[-1:], x)
    check_grad(lambda t: t[::2], x)
    check_grad(lambda t: t[..., None], x)
    idx = rng.integers(0, n0, size=5)  # repeats: gradient must accumulate
    check_grad(lambda t: t[idx], x)
    mask = rng.random(shape) > 0.4
    check_grad(lambda t: t[mask], x)
    if len(shape) >= 2:
        check_grad(lambda t: t[idx, 0], x)
        check_grad(lambda t: t[:, -1], x)


def test_getitem_tensor_index():
    from neural_arch.core.tensor import Tensor

    idx = Tensor(np.array([0, 0, 2]))
    check_grad(lambda t: t[idx], randn(0, (3, 2)))


# ----------------------------------------------------------------------------- joining
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seed=seeds,
       k=st.integers(1, 3))
def test_cat_stack_split_chunk(shape, seed, k):
    arrays = [randn(seed + i, shape) for i in range(k)]
    axis = seed % len(shape)
    check_grad(lambda *ts: F.cat(list(ts), axis=axis) * 2.0, *arrays)
    check_grad(lambda *ts: F.concatenate(list(ts), axis=-1) * 2.0, *arrays)
    check_grad(lambda *ts: F.stack(list(ts), axis=axis) * 2.0, *arrays)
    w = randn(9, (shape[axis],))

    def split_fn(t):
        parts = F.split(t, 2, axis=axis)
        return F.cat([p * float(i + 1) for i, p in enumerate(parts)], axis=axis)

    def chunk_fn(t):
        parts = F.chunk(t, 2, axis=axis)
        return F.cat([p * float(i + 2) for i, p in enumerate(parts)], axis=axis)

    check_grad(split_fn, arrays[0])
    check_grad(chunk_fn, arrays[0])
    assert w.shape == (shape[axis],)


def test_split_sections_and_chunk_sizes():
    from neural_arch.core.tensor import Tensor

    x = Tensor(np.arange(10.0))
    assert [p.shape[0] for p in F.split(x, 3)] == [3, 3, 3, 1]
    assert [p.shape[0] for p in F.split(x, [2, 8])] == [2, 8]
    assert [p.shape[0] for p in F.chunk(x, 3)] == [4, 4, 2]
    with pytest.raises(ValueError, match="add up"):
        F.split(x, [2, 3])
    check_grad(lambda t: F.split(t, [1, 3], axis=1)[1] * 3.0, randn(0, (2, 4)))
