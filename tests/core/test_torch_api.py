"""The PyTorch-compatible surface: creation functions, dtype objects, ``Tensor.to``, ``size()``,
shape methods, comparisons, ``max(dim)`` / ``min(dim)``, ``keepdim``, in-place ops and
``no_grad`` as a decorator. References are hand-written NumPy (torch is not a dependency)."""

from __future__ import annotations

import numpy as np
import pytest
from core_testutils import check_grad, randn
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neural_arch as na
from neural_arch.core.tensor import Tensor

SETTINGS = settings(deadline=None, max_examples=15)
seeds = st.integers(0, 2**16)


# ----------------------------------------------------------------------------- dtypes
def test_dtype_objects_are_numpy_dtypes_with_torch_names():
    assert na.float32 == np.float32 and na.float64 == np.float64 and na.float16 == np.float16
    assert na.int64 == np.int64 and na.int32 == np.int32 and na.int8 == np.int8 and na.uint8 == np.uint8
    assert na.bool == np.bool_ and na.long is na.int64 and na.float is na.float32
    assert na.double is na.float64 and na.half is na.float16 and na.int is na.int32
    assert na.bfloat16.name == "bfloat16" and na.bfloat16.itemsize == 2
    assert isinstance(na.float32, na.dtype)
    assert "float" not in na.__all__  # star-imports must not shadow Python's float


def test_dtype_accepted_everywhere():
    x = na.tensor([1.5, 2.5])
    for dt in (na.float64, na.float16, na.bfloat16, na.int64, na.int32, na.bool, na.uint8):
        assert x.to(dt).dtype == dt
        assert x.to(dtype=dt).dtype == dt
        assert na.zeros(2, dtype=dt).dtype == dt
        assert Tensor([1.0], dtype=dt).dtype == dt
        assert na.tensor([1.0], dtype=dt).dtype == dt
    assert x.to("cpu") is x and x.to(na.float32) is x and x.to("cpu", na.float32) is x
    assert x.to("cpu", na.float64).dtype == np.float64
    assert x.to(na.zeros(1, dtype=na.int64)).dtype == np.int64  # to(other): its dtype and device
    assert x.to(na.device("cpu")) is x
    assert x.to("float64").dtype == np.float64  # a dtype name is accepted too
    assert x.to(na.float32, copy=True) is not x
    with pytest.raises(ValueError, match="not a device"):
        x.to("tpu")


def test_bfloat16_tensors():
    x = na.tensor([1.5, -2.0], requires_grad=True)
    b = x.to(na.bfloat16)
    assert b.dtype == na.bfloat16 and b.requires_grad  # casting between floats stays differentiable
    assert b.tolist() == [1.5, -2.0] and na.tensor(3.0).bfloat16().item() == 3.0
    (b.float() * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    assert na.zeros(2, dtype=na.bfloat16, requires_grad=True).requires_grad
    assert b.is_floating_point() and not na.tensor([1]).is_floating_point()


def test_python_scalar_defaults_follow_torch():
    assert na.tensor([1, 2]).dtype == np.int64
    assert na.tensor([1.0, 2]).dtype == np.float32
    assert na.tensor(True).dtype == np.bool_
    assert na.tensor(1 + 2j).dtype == np.complex64
    assert na.tensor(np.arange(3, dtype=np.int16)).dtype == np.int16  # arrays keep their dtype
    assert na.tensor(np.float64(1.0)).dtype == np.float64
    assert na.tensor([0.1], dtype=na.float64).item() == 0.1  # cast once, not through float32
    assert Tensor([1, 2]).dtype == np.float32  # the class constructor is torch.Tensor: float32
    with pytest.raises(TypeError, match="floating-point"):
        na.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match="non-numeric"):
        na.tensor([1, "a"])


def test_tensor_copies_and_from_numpy_shares():
    a = np.zeros(3)
    t = na.tensor(a)
    t.data[0] = 1
    assert a[0] == 0
    f = na.from_numpy(a)
    f.data[1] = 5
    assert a[1] == 5 and f.dtype == np.float64
    src = na.ones(2, requires_grad=True)
    c = na.tensor(src)
    assert not c.requires_grad and not np.shares_memory(c.data, src.data)
    with pytest.raises(TypeError, match="np.ndarray"):
        na.from_numpy([1, 2])


# ----------------------------------------------------------------------------- creation
def test_creation_functions():
    assert na.zeros(2, 3).shape == (2, 3) and na.zeros((2, 3)).shape == (2, 3)
    assert na.zeros([2, 3]).dtype == np.float32 and na.ones(size=(4,)).tolist() == [1, 1, 1, 1]
    assert na.zeros(()).shape == () and na.empty(0, 2).shape == (0, 2)
    assert na.full((2,), 7).dtype == np.int64 and na.full((2,), 7.0).dtype == np.float32
    assert na.full((2,), True).dtype == np.bool_ and na.full((1,), 3, dtype=na.float64).dtype == np.float64
    assert na.arange(4).tolist() == [0, 1, 2, 3] and na.arange(4).dtype == np.int64
    assert na.arange(1, 7, 2).tolist() == [1, 3, 5]
    assert na.arange(0, 1, 0.25).dtype == np.float32
    np.testing.assert_allclose(na.arange(0, 1, 0.25).numpy(), [0, 0.25, 0.5, 0.75])
    assert na.arange(5, dtype=na.float64).dtype == np.float64
    assert na.linspace(0, 1, 5).tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert na.eye(3).numpy().trace() == 3
    z = na.zeros(2, requires_grad=True)
    assert z.requires_grad and z.is_leaf
    with pytest.raises(TypeError, match="unexpected keyword"):
        na.zeros(2, bogus=1)
    with pytest.raises(RuntimeError, match="negative"):
        na.ones(-1)


def test_like_functions_keep_shape_dtype_device():
    x = na.zeros(2, 3, dtype=na.float64)
    for f in (na.zeros_like, na.ones_like, na.empty_like, na.randn_like, na.rand_like):
        y = f(x)
        assert y.shape == (2, 3) and y.dtype == np.float64 and y.device == "cpu"
        assert f(x, dtype=na.float32).dtype == np.float32
    assert na.full_like(x, 4).tolist() == [[4.0] * 3] * 2 and na.full_like(x, 4).dtype == np.float64
    assert na.ones_like(x, requires_grad=True).requires_grad
    r = na.randint_like(na.zeros(5, dtype=na.int64), 3)
    assert r.dtype == np.int64 and set(r.tolist()) <= {0, 1, 2}
    assert x.new_zeros(4).dtype == np.float64 and x.new_ones((1, 2)).shape == (1, 2)
    assert x.new_full((2,), 1).dtype == np.float64 and x.new_tensor([1, 2]).dtype == np.float64


def test_random_functions_are_seeded():
    na.manual_seed(0)
    a = na.randn(3, 4)
    b, c = na.rand(5), na.randint(0, 10, (100,))
    na.manual_seed(0)
    np.testing.assert_array_equal(a.numpy(), na.randn(3, 4).numpy())
    np.testing.assert_array_equal(b.numpy(), na.rand(5).numpy())
    np.testing.assert_array_equal(c.numpy(), na.randint(0, 10, (100,)).numpy())
    assert a.dtype == np.float32 and na.randn(2, dtype=na.float64).dtype == np.float64
    assert c.dtype == np.int64 and 0 <= c.numpy().min() and c.numpy().max() < 10
    assert na.randint(3, (4,)).numpy().max() < 3 and na.randint(low=2, high=3, size=(2,)).tolist() == [2, 2]
    assert ((b.numpy() >= 0) & (b.numpy() < 1)).all()
    assert sorted(na.randperm(6).tolist()) == list(range(6))
    gen = np.random.default_rng(1)
    assert na.randn(2, generator=gen).shape == (2,)
    with pytest.raises(TypeError, match="floating"):
        na.randn(2, dtype=na.int64)
    big = na.randn(20000, dtype=na.float64).numpy()
    assert abs(big.mean()) < 0.05 and abs(big.std() - 1) < 0.05


def test_cat_stack_and_top_level_names():
    a, b = na.ones(2, 3), na.zeros(1, 3)
    assert na.cat([a, b]).shape == (3, 3) and na.cat((a, a), dim=1).shape == (2, 6)
    assert na.stack([a, a]).shape == (2, 2, 3) and na.stack([a, a], dim=-1).shape == (2, 3, 2)
    for name in ("randn", "rand", "randint", "zeros", "ones", "full", "arange", "empty", "zeros_like",
                 "ones_like", "full_like", "empty_like", "randn_like", "rand_like", "from_numpy",
                 "tensor", "cat", "stack", "manual_seed", "no_grad", "save", "load"):
        assert callable(getattr(na, name)), name


# ----------------------------------------------------------------------------- size / shape methods
def test_size_is_torch_method():
    t = na.zeros(2, 3, 4)
    assert t.size() == (2, 3, 4) and t.size(0) == 2 and t.size(-1) == 4 and t.size(dim=1) == 3
    assert t.dim() == 3 and t.ndimension() == 3 and t.numel() == 24 and t.nelement() == 24
    assert na.tensor(1.0).size() == () and na.tensor(1.0).numel() == 1
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.size(3)


def test_view_clone_contiguous():
    x = na.arange(6.0).reshape(2, 3)
    v = x.view(3, 2)
    v.data[0, 0] = 9  # a view: shares memory
    assert x.data[0, 0] == 9 and x.view(-1).shape == (6,) and x.view((6,)).shape == (6,)
    assert x.view_as(na.zeros(6)).shape == (6,) and x.reshape_as(na.zeros(3, 2)).shape == (3, 2)
    with pytest.raises(RuntimeError, match="reshape"):
        x.T.view(6)  # not contiguous: torch refuses a copying view
    assert x.T.contiguous().view(6).tolist() == [9.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    assert x.contiguous() is x
    c = x.clone()
    assert not np.shares_memory(c.data, x.data) and c.tolist() == x.tolist()
    assert x.view(na.int32).dtype == np.int32  # view(dtype) reinterprets the bytes
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        x.view(4)


def test_squeeze_unsqueeze_expand_flatten_permute():
    x = na.zeros(2, 1, 3, 1)
    assert x.squeeze().shape == (2, 3) and x.squeeze(1).shape == (2, 3, 1)
    assert x.squeeze(0).shape == (2, 1, 3, 1)  # not size 1: left alone, like torch
    assert x.squeeze((1, 3)).shape == (2, 3) and x.squeeze(-1).shape == (2, 1, 3)
    assert na.zeros(2, 3).unsqueeze(-1).shape == (2, 3, 1) and na.zeros(2, 3).unsqueeze(1).shape == (2, 1, 3)
    y = na.zeros(3, 1)
    assert y.expand(3, 4).shape == (3, 4) and y.expand(2, -1, 5).shape == (2, 3, 5)
    assert y.expand_as(na.zeros(3, 6)).shape == (3, 6)
    with pytest.raises(RuntimeError, match="leading"):
        y.expand(-1, 3, 4)
    z = na.zeros(2, 3, 4, 5)
    assert z.flatten().shape == (120,) and z.flatten(1).shape == (2, 60) and z.flatten(1, 2).shape == (2, 12, 5)
    assert z.permute(3, 0, 2, 1).shape == (5, 2, 4, 3) and z.permute((0, -1, 1, 2)).shape == (2, 5, 3, 4)
    assert z.transpose(0, 2).shape == (4, 3, 2, 5)


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=3), seed=seeds)
def test_shape_methods_gradients(shape, seed):
    x = randn(seed, shape)
    check_grad(lambda t: t.clone() * 2.0, x)
    check_grad(lambda t: t.view(-1) * 1.5, x)
    check_grad(lambda t: t.unsqueeze(0).expand(2, *shape) * 1.5, x)
    check_grad(lambda t: t[:, :1].expand(-1, 4, *shape[2:]) * 1.5, x)
    check_grad(lambda t: t.transpose(0, 1).contiguous() * 1.5, x)
    check_grad(lambda t: t.squeeze(0).flatten(0) * 1.5, x)


# ----------------------------------------------------------------------------- comparisons, reductions
def test_comparison_methods():
    x = na.tensor([1.0, 2.0, 3.0])
    assert x.eq(2).tolist() == [False, True, False] and x.ne(2).tolist() == [True, False, True]
    assert x.lt(2).tolist() == [True, False, False] and x.le(2).tolist() == [True, True, False]
    assert x.gt(na.tensor([0.0, 5.0, 3.0])).tolist() == [True, False, False]
    assert x.ge(3).dtype == np.bool_
    assert x.equal(na.tensor([1.0, 2.0, 3.0])) and not x.equal(na.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="expected a Tensor"):
        x.eq(None)


def test_max_min_with_dim_return_values_and_indices():
    x = na.tensor([[1.0, 5.0, 5.0], [7.0, 2.0, 0.0]])
    r = x.max(dim=1)
    values, indices = r  # a tuple...
    assert r.values is values and r.indices is indices  # ... with names, like torch.return_types
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0] and indices.dtype == np.int64
    assert "return_types.max" in repr(r)
    assert x.min(0).values.tolist() == [1.0, 2.0, 0.0] and x.min(0).indices.tolist() == [0, 1, 1]
    assert x.max(1, keepdim=True).values.shape == (2, 1) and x.max(axis=1, keepdims=True).indices.shape == (2, 1)
    assert na.nn.functional.max(x, 1).indices.tolist() == [1, 0]
    assert x.max().item() == 7.0 and x.min().item() == 0.0
    assert x.max(na.full((2, 3), 4.0)).tolist() == [[4, 5, 5], [7, 4, 4]]  # elementwise
    with pytest.raises(TypeError, match="amax"):
        x.max(dim=(0, 1))
    assert x.amax(dim=(0, 1)).item() == 7.0 and x.amin(1).tolist() == [1.0, 0.0]
    s = na.tensor(3.0).max(0)
    assert s.values.item() == 3.0 and s.indices.item() == 0


def test_max_dim_gradient_goes_to_the_selected_index():
    x = na.tensor([[1.0, 5.0, 5.0], [7.0, 2.0, 7.0]], requires_grad=True)
    x.max(dim=1).values.sum().backward()
    assert x.grad.tolist() == [[0, 1, 0], [1, 0, 0]]  # ties: the first index only (torch)
    y = na.tensor([1.0, 3.0, 3.0], requires_grad=True)
    y.max().backward()  # full reduction: ties share (torch's max() / amax)
    assert y.grad.tolist() == [0.0, 0.5, 0.5]


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), keepdim=st.booleans(),
       seed=seeds, data=st.data())
def test_max_min_dim_gradcheck(shape, keepdim, seed, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = randn(seed, shape, spread=True)
    check_grad(lambda t: t.max(dim, keepdim=keepdim).values * 1.5, x)
    check_grad(lambda t: t.min(dim=dim, keepdim=keepdim).values * 1.5, x)
    ref = x.argmax(axis=dim)
    got = Tensor(x).max(dim).indices.numpy()
    np.testing.assert_array_equal(got, ref)


@SETTINGS
@given(shp=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3), seed=seeds)
def test_maximum_minimum_gradcheck(shp, seed):
    sa, sb = shp.input_shapes
    a, b = randn(seed, sa), randn(seed + 7, sb) + 0.01  # no ties: finite differences are smooth
    check_grad(lambda p, q: na.nn.functional.maximum(p, q), a, b)
    check_grad(lambda p, q: p.minimum(q), a, b)
    t = na.tensor([1.0, 2.0], requires_grad=True)
    t.maximum(na.tensor([1.0, 0.0])).sum().backward()
    assert t.grad.tolist() == [0.5, 1.0]  # a tie sends half the gradient to each side


def test_keepdim_everywhere_and_numpy_aliases():
    x = na.arange(6.0).reshape(2, 3)
    for name in ("sum", "mean", "var", "std", "amax", "amin", "argmax", "argmin"):
        f = getattr(x, name)
        assert f(1, keepdim=True).shape == (2, 1), name
        assert f(dim=1, keepdim=True).shape == (2, 1), name
        assert f(axis=1, keepdims=True).shape == (2, 1), name
        assert f(1).shape == (2,), name
    assert x.argmax().item() == 5 and x.argmax(dim=0).tolist() == [1, 1, 1] and x.argmax(1).dtype == np.int64
    assert x.any(1).tolist() == [True, True] and x.all(dim=1, keepdim=True).shape == (2, 1)
    assert x.sum(dim=(0, 1)).item() == 15
    np.testing.assert_allclose(x.var().item(), np.var(np.arange(6.0), ddof=1))  # torch: unbiased
    np.testing.assert_allclose(x.var(unbiased=False).item(), np.var(np.arange(6.0)))
    np.testing.assert_allclose(x.std(1, correction=0).numpy(), np.arange(6.0).reshape(2, 3).std(1))
    assert np.isnan(na.tensor([1.0]).var().item())  # n - 1 = 0, like torch
    with pytest.raises(TypeError, match="not both"):
        x.sum(dim=0, axis=0)
    check_grad(lambda t: t.std(0) + t.var(1, keepdim=True).sum(), randn(1, (3, 4)))


# ----------------------------------------------------------------------------- conversions
def test_conversion_methods():
    x = na.tensor([1.7, -2.2])
    assert x.long().tolist() == [1, -2] and x.long().dtype == np.int64 and x.int().dtype == np.int32
    assert x.double().dtype == np.float64 and x.half().dtype == np.float16 and x.float().dtype == np.float32
    assert x.bool().tolist() == [True, True] and x.byte().dtype == np.uint8
    assert x.type_as(na.zeros(1, dtype=na.float64)).dtype == np.float64
    assert na.tensor([[1, 2]]).tolist() == [[1, 2]] and isinstance(na.tensor(3).item(), int)
    assert isinstance(na.tensor(2.5).item(), float) and x.element_size() == 4


# ----------------------------------------------------------------------------- in-place
def test_inplace_on_constants_changes_the_array_and_its_aliases():
    t = na.zeros(3)
    alias = t
    t += 1
    t *= 4
    t -= 1
    t /= 3
    assert t is alias and t.tolist() == [1.0, 1.0, 1.0]
    assert t.add_(na.ones(3), alpha=2) is t and t.tolist() == [3.0, 3.0, 3.0]
    t.sub_(1).mul_(2).div_(4)
    assert t.tolist() == [1.0, 1.0, 1.0]
    t.copy_(np.array([5.0, -5.0, 0.5])).clamp_(-1, 1)
    assert t.tolist() == [1.0, -1.0, 0.5]
    t.clamp_(min=0)
    assert t.tolist() == [1.0, 0.0, 0.5]
    assert t.fill_(2).tolist() == [2.0] * 3 and t.zero_().tolist() == [0.0] * 3
    i = na.tensor([1, 2])
    i += 1
    assert i.tolist() == [2, 3] and i.dtype == np.int64
    with pytest.raises(RuntimeError, match="promoted dtype"):
        i /= 2  # torch: result type Float can't be cast to Long


def test_inplace_on_leaf_requiring_grad_raises_like_torch():
    w = na.ones(2, requires_grad=True)
    for op in (lambda: w.__iadd__(1), lambda: w.add_(1), lambda: w.mul_(2), lambda: w.clamp_(0, 1),
               lambda: w.zero_(), lambda: w.fill_(1), lambda: w.copy_(np.zeros(2))):
        with pytest.raises(RuntimeError, match="leaf tensor that requires grad.*no_grad"):
            op()
    with pytest.raises(RuntimeError, match="no_grad"):
        w += 1
    with na.no_grad():  # the optimizer pattern
        w -= 0.5
        w.mul_(4)
    assert w.tolist() == [2.0, 2.0] and w.is_leaf and w.grad_fn is None


def test_inplace_with_autograd():
    w = na.tensor([1.0, 2.0], requires_grad=True)
    h = w * 3
    h += 1  # non-leaf: rebinds to the out-of-place result, gradients stay right
    assert h.grad_fn is not None
    with pytest.raises(RuntimeError, match="recorded op"):
        h.add_(1)  # the method form cannot rebind: refused
    acc = na.zeros(2)
    acc += h  # a constant accumulating a graph tensor becomes part of the graph
    assert acc.requires_grad and not acc.is_leaf
    const = na.zeros(2)
    alias = const
    const.add_(w, alpha=2)  # method form on a constant: it becomes the op's output, same object
    assert alias is const and const.requires_grad and const.grad_fn is not None
    (acc + const).sum().backward()
    assert w.grad.tolist() == [5.0, 5.0]
    c = na.zeros(2)
    c.copy_(w)
    (c * c).sum().backward()  # copy_ is differentiable w.r.t. its source, as in torch
    assert w.grad.tolist() == [7.0, 9.0]


# ----------------------------------------------------------------------------- grad mode
def test_no_grad_as_decorator_and_context_manager():
    x = na.ones(2, requires_grad=True)

    @na.no_grad()
    def f(t):
        return t * 2

    @na.no_grad
    def g(t):
        return t * 2

    @na.inference_mode()
    def h(t):
        return t * 2

    assert not f(x).requires_grad and not g(x).requires_grad and not h(x).requires_grad
    with na.no_grad():
        assert not (x * 2).requires_grad
        with na.enable_grad():
            assert (x * 2).requires_grad
    assert (x * 2).requires_grad and na.is_grad_enabled()
    assert f.__name__ == "f"
