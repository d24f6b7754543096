"""The fast paths of issue 37's overhead pass give exactly the values of the forms they replace.

``vector_op`` (a row vector applied to every row of a matrix through long inner loops), the shared
``ones_vector`` operand, the bias add of ``linear`` and the weight/bias of the fused layer norm, the
engine's inlined accumulation, and attention's skipped ``broadcast_to``: each is checked bit for bit
against the plain NumPy form (or the broadcast inputs) it stands for.
"""

from __future__ import annotations

import numpy as np
import pytest

import neural_arch as na
from neural_arch.core.autograd import Node
from neural_arch.core.op_utils import VECTOR_OP_MIN_SIZE, _result, ones_vector, vector_op
from neural_arch.core.ops_nn import _row_dots
from neural_arch.nn import functional as F


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1024, 128), (1000, 128), (130, 512), (64, 16), (8, 20000)])
@pytest.mark.parametrize("ufunc", [np.add, np.multiply, np.subtract])
def test_vector_op_equals_broadcast(dtype, shape, ufunc):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape[1]).astype(dtype)
    out = np.empty_like(a)
    vector_op(ufunc, a, v, out)
    assert np.array_equal(out, ufunc(a, v))
    inplace = a.copy()
    vector_op(ufunc, inplace, v, inplace)
    assert np.array_equal(inplace, ufunc(a, v))


def test_vector_op_non_contiguous_and_mixed_dtype_fall_back():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2048, 256)).astype(np.float32)
    a = base[:, ::2]  # not C-contiguous: the plain broadcast runs
    v = rng.standard_normal(128).astype(np.float64)
    out = np.empty(a.shape, np.float64)
    vector_op(np.multiply, a, v, out)
    assert np.array_equal(out, a * v)
    assert a.size >= VECTOR_OP_MIN_SIZE
    f32 = np.ascontiguousarray(a)
    expect = f32.copy()
    expect += v  # same_kind casting, as ``+=``
    vector_op(np.add, f32, v, f32)
    assert np.array_equal(f32, expect)


def test_ones_vector_is_shared_and_read_only():
    v = ones_vector(7, np.dtype(np.float32))
    assert v.dtype == np.float32 and v.tolist() == [1.0] * 7
    assert ones_vector(7, np.dtype(np.float32)) is v
    with pytest.raises(ValueError):
        v[0] = 2.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_bias_add_bit_identical(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 256, 64)).astype(dtype)
    w = rng.standard_normal((96, 64)).astype(dtype)
    b = rng.standard_normal(96).astype(dtype)
    expect = x.reshape(-1, 64) @ w.T
    expect += b
    got = F.linear(na.Tensor(x), na.Tensor(w), na.Tensor(b))
    assert got.shape == (4, 256, 96)
    assert np.array_equal(got.data, expect.reshape(4, 256, 96))


def _layer_norm_reference(x, w, b, g, eps=1e-5):
    """The fused layer norm's arithmetic written with plain broadcasts (before issue 37's pass)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    ones = np.ones(n, x.dtype)
    mu = _row_dots(rows, ones)
    mu /= n
    xhat = rows - mu[:, None]
    var = _row_dots(xhat, xhat)
    var /= n
    var += eps
    np.sqrt(var, out=var)
    rstd = np.divide(1.0, var).astype(x.dtype)
    xhat *= rstd[:, None]
    out = np.multiply(xhat, w)
    out += b
    g2 = g.reshape(rows.shape)
    gxhat = g2 * xhat
    m1 = _row_dots(g2, w)
    m1 /= n
    m2 = np.divide(_row_dots(gxhat, w), n)
    gx = np.multiply(g2, w)
    gx -= m1[:, None]
    gx -= xhat * m2[:, None]
    gx *= rstd[:, None]
    return out.reshape(x.shape), gx.reshape(x.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_rows_bit_identical(dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 256, 128)).astype(dtype)
    w = rng.standard_normal(128).astype(dtype)
    b = rng.standard_normal(128).astype(dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    xt = na.Tensor(x, requires_grad=True)
    y = F.layer_norm(xt, (128,), na.Tensor(w), na.Tensor(b))
    y.backward(g)
    out, gx = _layer_norm_reference(x, w, b, g)
    assert np.array_equal(y.data, out)
    assert np.array_equal(xt.grad.data, gx)


def test_engine_short_gradient_tuple_still_raises():
    a = na.ones(2, requires_grad=True)
    b = na.ones(2, requires_grad=True)
    node = Node(lambda g: (g,), (a, b), "Short")  # one gradient for two inputs that need one
    with pytest.raises(IndexError):
        _result(a.data * 2, node).sum().backward()


def test_engine_accumulates_shared_inputs_and_casts():
    x = na.Tensor(np.arange(4.0), requires_grad=True)
    h = x * 2.0
    y = (h * h + h.astype(na.float32).astype(na.float64)).sum()
    y.backward()
    assert x.grad.data.tolist() == (8 * np.arange(4.0) + 2).tolist()


def test_attention_broadcast_lead_dims_unchanged():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 5, 4))
    k = rng.standard_normal((1, 3, 5, 4))
    qt, kt = na.Tensor(q, requires_grad=True), na.Tensor(k, requires_grad=True)
    y = F.scaled_dot_product_attention(qt, kt, kt, is_causal=True)
    y.sum().backward()
    ke = na.Tensor(np.broadcast_to(k, q.shape).copy(), requires_grad=True)
    qe = na.Tensor(q, requires_grad=True)
    ye = F.scaled_dot_product_attention(qe, ke, ke, is_causal=True)
    ye.sum().backward()
    assert np.array_equal(y.data, ye.data)
    assert np.array_equal(qt.grad.data, qe.grad.data)
    assert np.allclose(kt.grad.data, ke.grad.data.sum(axis=0, keepdims=True), rtol=0, atol=1e-12)
