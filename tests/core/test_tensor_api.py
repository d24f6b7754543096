"""Tensor construction, dtype rules, attributes, conversions and in-place helpers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch.core.tensor import Tensor, get_generator, manual_seed


# ----------------------------------------------------------------------------- construction / dtype
def test_default_dtypes():
    assert Tensor([1.0, 2.0]).dtype == np.float32
    assert Tensor(3.0).dtype == np.float32 and Tensor(3.0).shape == ()
    assert Tensor([[1, 2, 3]]).dtype == np.float32  # python lists default to float32
    assert Tensor(np.zeros(2)).dtype == np.float64  # ndarrays keep their dtype
    assert Tensor(np.zeros(2, np.float16)).dtype == np.float16
    assert Tensor(np.arange(3)).dtype.kind == "i"
    assert Tensor(np.float64(2.0)).dtype == np.float64
    assert Tensor([True, False]).dtype == bool
    assert Tensor([1, 2], dtype=np.int32).dtype == np.int32
    assert Tensor(np.zeros(2), dtype="float32").dtype == np.float32


def test_ndarray_not_copied():
    a = np.zeros(3, np.float32)
    t = Tensor(a)
    t.data[0] = 5
    assert a[0] == 5


def test_integer_tensor_cannot_require_grad():
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.arange(3), requires_grad=True)
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.arange(3)).requires_grad_()


def test_bad_data_errors():
    with pytest.raises(TypeError, match="Tensor\\(data\\)"):
        Tensor([1.0, "a", None])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_preserved_through_ops_and_grads(dtype):
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 3)).astype(dtype), requires_grad=True)
    w = Tensor(rng.standard_normal((2, 3)).astype(dtype), requires_grad=True)
    b = Tensor(np.zeros(2, dtype), requires_grad=True)
    h = F.linear(x, w, b)
    y = F.gelu(h) * 2.0 + F.sigmoid(h) - 1.0
    y = F.layer_norm(y, 2) / 3.0
    loss = F.cross_entropy(y, np.array([0, 1, 1, 0])) + F.mse_loss(y, np.zeros((4, 2), dtype)) + (y**2).mean()
    for t in (h, y, loss, F.softmax(y), F.log_softmax(y), y.var(), y.sum(axis=0), y.max(axis=1).values,
              y.amax(axis=1)):
        assert t.dtype == dtype, t
    loss.backward()
    for p in (x, w, b):
        assert p.grad.dtype == dtype
        assert np.isfinite(p.grad.data).all()


def test_python_scalars_never_upcast_but_arrays_promote():
    x = Tensor(np.ones(2, np.float32), requires_grad=True)
    assert (x * 2.0).dtype == np.float32
    assert (2.0 * x).dtype == np.float32
    assert (x + 1).dtype == np.float32
    assert (x**2).dtype == np.float32
    assert (1.0 / x).dtype == np.float32
    y = Tensor(np.ones(2, np.float64), requires_grad=True)
    z = x * y  # numpy promotion: float32 * float64 -> float64
    assert z.dtype == np.float64
    z.sum().backward()
    assert x.grad.dtype == np.float32 and y.grad.dtype == np.float64
    h = Tensor(np.ones(2, np.float16))
    assert (h * 3.0).dtype == np.float16


def test_integer_ops_carry_no_grad():
    i = Tensor(np.arange(4))
    x = Tensor(np.ones(4), requires_grad=True)
    out = x * i
    assert out.requires_grad
    out.sum().backward()
    np.testing.assert_allclose(x.grad.data, np.arange(4))
    assert not (i + 1).requires_grad


def test_comparisons_return_bool_tensors_without_grad():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    for r in (x > 1.5, x >= 2, x < 2, x <= 2, x == 2.0, x != 2.0, x > Tensor([0.0, 5.0, 1.0])):
        assert r.dtype == bool and not r.requires_grad
    assert (x > 1.5).tolist() == [False, True, True]
    assert hash(x) == id(x) or isinstance(hash(x), int)
    assert x in {x}
    assert (x == None) is False and (x != None) is True  # noqa: E711


def test_setitem():
    import neural_arch as na

    x = Tensor(np.zeros(4), requires_grad=True)
    with na.no_grad():                       # a leaf that requires grad: written under no_grad, as torch
        x[1] = 5.0
        x[np.array([2, 3])] = Tensor(np.array([1.0, 2.0]))
    assert x.tolist() == [0.0, 5.0, 1.0, 2.0]
    y = x * 2.0
    with pytest.raises(RuntimeError, match="in-place"):
        y[0] = 1.0
    # torch's leaf rule: an op may have saved x (here y = x * w), so writing it would change w's gradient
    w = Tensor(np.array([3.0, 4.0]), requires_grad=True)
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    z = (x * w).sum()
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x[0] = 5.0
    z.backward()
    assert w.grad.tolist() == [1.0, 2.0]
    c = Tensor(np.zeros(2))                  # a constant takes values, but not a value that needs its gradient
    c[0] = 1.0
    with pytest.raises(RuntimeError, match="gradient would be lost"):
        c[1] = w[0]
    c[1] = w[0].detach()
    assert c.tolist() == [1.0, 3.0]


# ----------------------------------------------------------------------------- attributes
def test_attributes_and_conversions():
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.shape == (2, 3) and t.ndim == 2 and t.size() == (2, 3) and t.size(1) == 3 and t.numel() == 6
    assert len(t) == 2
    assert t.device == "cpu"
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert isinstance(t.numpy(), np.ndarray)
    assert Tensor([[4.0]]).item() == 4.0
    with pytest.raises(ValueError, match="exactly one element"):
        t.item()
    assert t.cpu() is t and t.to("cpu") is t
    assert t.to(dtype=np.float64).dtype == np.float64
    assert np.asarray(t).shape == (2, 3)
    assert t.T.shape == (3, 2)
    assert "Tensor(" in repr(t) and "requires_grad=True" in repr(Tensor([1.0], requires_grad=True))
    assert "grad_fn" in repr(Tensor([1.0], requires_grad=True) * 2.0)
    with pytest.raises(TypeError):
        len(Tensor(1.0))
    assert float(Tensor(2.5)) == 2.5 and int(Tensor(3.0)) == 3


def test_method_mirrors():
    x = Tensor(np.arange(1.0, 7.0).reshape(2, 3))
    assert x.sum().item() == 21 and x.sum(axis=0).shape == (3,)
    assert x.sum(axis=1, keepdims=True).shape == (2, 1)
    assert x.mean().item() == 3.5 and x.max().item() == 6 and x.min().item() == 1
    np.testing.assert_allclose(x.var(correction=0).item(), np.var(np.arange(1.0, 7.0)))
    np.testing.assert_allclose(x.var().item(), np.var(np.arange(1.0, 7.0), ddof=1))  # torch default
    assert x.reshape(3, 2).shape == (3, 2) and x.reshape((6,)).shape == (6,) and x.view(-1).shape == (6,)
    assert x.transpose().shape == (3, 2) and x.transpose(1, 0).shape == (3, 2)
    assert x.permute(1, 0).shape == (3, 2)
    for name in ("exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu"):
        assert getattr(x, name)().shape == (2, 3)
    assert x.clip(2, 4).max().item() == 4
    assert x.astype(np.float32).dtype == np.float32
    assert x.argmax().item() == 5


def test_inplace_helpers():
    x = Tensor(np.ones((2, 2)), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x.zero_()  # torch refuses in-place changes to a leaf that requires grad outside no_grad
    with na.no_grad():
        assert x.zero_() is x and (x.data == 0).all()
        x.fill_(3.0)
        assert (x.data == 3).all()
        x.copy_(np.arange(4.0).reshape(2, 2))
        assert x.data.tolist() == [[0, 1], [2, 3]]
        x.copy_(Tensor(np.full((2, 2), 9.0)))
    assert (x.data == 9).all()
    assert x.is_leaf and x.grad_fn is None


def test_data_assignment_is_used_by_later_ops():
    x = Tensor(np.ones(3), requires_grad=True)
    x.data = np.full(3, 2.0)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.data, 4.0)


def test_numpy_array_on_left_dispatches_to_tensor():
    x = Tensor(np.ones(3), requires_grad=True)
    y = np.full(3, 2.0) * x
    assert isinstance(y, Tensor) and y.requires_grad
    z = np.ones((2, 3)) @ x
    assert isinstance(z, Tensor) and z.shape == (2,)


# ----------------------------------------------------------------------------- random
def test_manual_seed_determinism():
    manual_seed(123)
    a = get_generator().standard_normal(5)
    manual_seed(123)
    b = na.get_generator().standard_normal(5)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="seed"):
        manual_seed("x")


@settings(deadline=None, max_examples=10)
@given(st.integers(0, 2**31 - 1))
def test_manual_seed_any_int(seed):
    manual_seed(seed)
    assert isinstance(get_generator(), np.random.Generator)


# ----------------------------------------------------------------------------- package surface
def test_package_exports():
    import neural_arch.core as core

    assert na.Tensor is Tensor and na.__version__
    for name in ("Tensor", "no_grad", "queue_callback", "is_backward_running", "linear", "cross_entropy"):
        assert hasattr(core, name), name
    for name in ("linear", "relu", "gelu", "tanh", "sigmoid", "softmax", "log_softmax", "dropout",
                 "embedding", "layer_norm", "cross_entropy", "mse_loss", "where", "clip", "cat",
                 "concatenate", "stack", "split", "chunk", "exp", "log", "sqrt", "abs", "matmul",
                 "sum", "mean", "max", "min", "var"):
        assert callable(getattr(F, name)), name
    assert na.nn.functional is F


def test_pickle_and_deepcopy():
    import copy
    import pickle

    x = Tensor(np.ones(3), requires_grad=True)
    x.register_hook(lambda g: None)
    y = x * 2.0
    y.sum().backward()
    x2 = pickle.loads(pickle.dumps(x))
    assert x2.requires_grad and x2.is_leaf and x2.grad.tolist() == [2.0, 2.0, 2.0]
    y2 = pickle.loads(pickle.dumps(y))  # non-leaf: arrives detached
    assert y2.is_leaf and not y2.requires_grad and y2.tolist() == [2.0, 2.0, 2.0]
    x3 = copy.deepcopy(x)
    assert not np.shares_memory(x3.data, x.data) and x3._hooks is None


def test_torch_dim_aliases_and_empty_arrays():
    x = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    assert F.softmax(x, dim=0).shape == (2, 3) and F.log_softmax(x, dim=1).shape == (2, 3)
    assert x.sum(dim=1).shape == (2,) and x.mean(dim=0).shape == (3,)
    assert x.max(dim=1).values.tolist() == [2.0, 5.0] and x.min(dim=0).values.tolist() == [0.0, 1.0, 2.0]
    assert F.cat([x, x], dim=1).shape == (2, 6) and F.stack([x, x], dim=2).shape == (2, 3, 2)
    assert len(F.split(x, 1, dim=0)) == 2 and len(F.chunk(x, 3, dim=1)) == 3
    e = Tensor(np.zeros((0, 3)), requires_grad=True)
    (e * 2.0).sum().backward()
    assert e.grad.shape == (0, 3)
    assert F.linear(e, Tensor(np.ones((4, 3)))).shape == (0, 4)
