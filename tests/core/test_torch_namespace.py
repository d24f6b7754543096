"""torch's top-level functions on ``neural_arch`` (``na.exp(x)``, ``na.max(x, 1)``, ``na.transpose(x,
0, 1)``...): every name a ported script calls resolves, agrees with the Tensor method, takes torch's
signature, and gives torch's result; plus the silent wrong results this face once gave, each pinned:

- ``max``/``min(x, dim)`` with ``dim`` out of range wrapped around (``x.max(2)`` of a matrix gave
  the max over dim 0) instead of torch's ``IndexError``; a bool dim (``x.max(True)``) was dim 1;
- ``sum``/``mean``/``amax``/``amin``/``var``/``std`` with ``dim=()`` reduced nothing (NumPy's
  ``axis=()``) where torch reduces every dim;
- ``var(x, False)``/``std(x, True)`` (torch's ``var(input, unbiased)`` overload) was an error;
- ``where(cond, 1.0, 0.0)`` gave float64 (torch: the default float32), a float condition was read
  as "non-zero" (torch refuses it), ``int_tensor ** 0.5`` gave float64 (torch: float32);
- ``softmax`` of an integer tensor gave float64 (torch refuses it; ``dtype=`` casts first);
- ``permute`` with a repeated dim and ``swapaxes`` out of range were NumPy's or Python's errors.

Example::

    >>> import neural_arch as na
    >>> x = na.tensor([[1.0, 5.0], [7.0, 2.0]])
    >>> na.max(x, 1).indices.tolist(), na.transpose(x, 0, 1).tolist(), na.sum(x, dim=()).item()
    ([1, 0], [[1.0, 7.0], [5.0, 2.0]], 15.0)
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor, return_types

X = np.array([[1.0, -2.0, 4.0], [3.0, 0.5, -9.0]])


def _t(a=X, **kw):
    return Tensor(np.array(a), **kw)


#: (top-level name, the Tensor method that must agree with it or None, positional args after the tensor)
AGREES = [
    ("exp", "exp", ()), ("log", "log", ()), ("sqrt", "sqrt", ()), ("abs", "abs", ()), ("tanh", "tanh", ()),
    ("sigmoid", "sigmoid", ()), ("relu", "relu", ()), ("softmax", "softmax", (1,)),
    ("log_softmax", "log_softmax", (0,)), ("sin", "sin", ()), ("cos", "cos", ()), ("erf", "erf", ()),
    ("expm1", "expm1", ()), ("log1p", "log1p", ()), ("log2", "log2", ()), ("floor", "floor", ()),
    ("ceil", "ceil", ()), ("round", "round", ()), ("sign", "sign", ()), ("nan_to_num", "nan_to_num", ()),
    ("clamp", "clamp", (-1.0, 1.0)), ("clip", "clip", (0.0, 2.0)), ("sum", "sum", (1,)), ("mean", "mean", (0,)),
    ("max", "max", ()), ("min", "min", ()), ("amax", "amax", (1,)), ("amin", "amin", (0,)),
    ("argmax", "argmax", (1,)), ("argmin", "argmin", ()), ("var", "var", (1,)), ("std", "std", ()),
    ("any", "any", (1,)), ("all", "all", ()), ("pow", "pow", (2,)), ("prod", "prod", (1,)),
    ("cumsum", "cumsum", (1,)), ("cumprod", "cumprod", (0,)), ("logsumexp", "logsumexp", (1,)),
    ("norm", "norm", ()), ("sort", "sort", (1,)), ("argsort", "argsort", ()), ("topk", "topk", (2,)),
    ("count_nonzero", "count_nonzero", ()), ("nonzero", "nonzero", ()),
    ("reshape", "reshape", ((3, 2),)), ("transpose", "transpose", (0, 1)), ("swapaxes", "swapaxes", (1, 0)),
    ("swapdims", "swapdims", (0, -1)), ("permute", "permute", ((1, 0),)), ("squeeze", "squeeze", ()),
    ("unsqueeze", "unsqueeze", (1,)), ("flatten", "flatten", ()), ("split", "split", (1, 1)),
    ("chunk", "chunk", (2,)), ("flip", "flip", ((0,),)), ("roll", "roll", (1, 1)), ("unbind", "unbind", (1,)),
    ("narrow", "narrow", (1, 1, 2)), ("movedim", "movedim", (0, 1)), ("moveaxis", "moveaxis", (1, 0)),
    ("tile", "tile", ((2,),)), ("diagonal", "diagonal", ()), ("diag", "diag", (1,)),
    ("repeat_interleave", "repeat_interleave", (2,)), ("clone", "clone", ()),
    ("maximum", "maximum", (_t(X[::-1].copy()),)), ("minimum", "minimum", (_t(X[::-1].copy()),)),
    ("matmul", "matmul", (_t(X.T.copy()),)), ("outer", "outer", (_t([1.0, 2.0]),)),
    ("atan2", "atan2", (_t(X[::-1].copy()),)), ("lerp", "lerp", (_t(X[::-1].copy()), 0.3)),
    ("isclose", "isclose", (_t(X),)), ("allclose", "allclose", (_t(X),)),
    ("masked_select", "masked_select", (_t(X > 0),)), ("masked_fill", "masked_fill", (_t(X > 0), 0.0)),
    ("where", None, (1.0, 0.0)), ("einsum", None, ()), ("bmm", "bmm", ()), ("add", "add", (1.0,)),
    ("sub", "sub", (1.0,)), ("mul", "mul", (2.0,)), ("div", "div", (2.0,)), ("neg", "neg", ()),
    ("remainder", "remainder", (2.0,)), ("broadcast_to", "broadcast_to", ((2, 2, 3),)),
]


def _plain(r):
    if isinstance(r, (tuple, list)):
        return [_plain(v) for v in r]
    return (str(r.dtype), r.tolist()) if isinstance(r, Tensor) else r


@pytest.mark.parametrize("name,method,args", AGREES, ids=[a[0] for a in AGREES])
def test_every_top_level_function_resolves_and_agrees_with_the_method(name, method, args):
    fn = getattr(na, name)
    x = _t(np.abs(X) + 0.5) if name in ("log", "sqrt", "log2", "log1p") else _t()
    if name == "outer":
        x = _t([3.0, 4.0])
    if name == "diag" or name == "bmm":
        x = _t(X[None] if name == "bmm" else X)
        args = (_t(X.T.copy()[None]),) if name == "bmm" else args
    if name == "where":
        assert _plain(fn(x > 0, *args)) == [("float32", [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])][0]
        return
    if name == "einsum":
        assert _plain(fn("ij->j", x)) == _plain(x.sum(0))
        return
    got = fn(x, *args)
    assert _plain(got) == _plain(getattr(x, method)(*args)), name
    if isinstance(got, tuple) and name in ("sort", "topk"):
        assert isinstance(got, getattr(return_types, name)) and got.values is got[0]


def test_all_names_resolve_and_the_star_import_keeps_pythons_builtins():
    missing = [n for n in na.__all__ if not hasattr(na, n)]
    assert not missing
    # `from neural_arch import *` must not shadow sum/max/min/abs/any/all/pow/round (they stay importable)
    code = ("from neural_arch import *\n"
            "assert sum([1, 2]) == 3 and max(1, 2) == 2 and min(1, 2) == 1 and abs(-1) == 1\n"
            "assert any([1]) and all([1]) and pow(2, 3) == 8 and round(1.25, 1) == 1.2\n"
            "import neural_arch as na\n"
            "assert na.sum is not sum and na.round(na.tensor([1.5])).tolist() == [2.0]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ================================================================================ torch's signatures
def test_torch_signatures_of_the_shape_functions():
    x = _t()
    assert na.transpose(x, 0, 1).shape == (3, 2) and na.transpose(x, dim0=-1, dim1=0).shape == (3, 2)
    with pytest.raises(TypeError):
        na.transpose(x)                                  # torch's function needs both dims
    assert na.transpose(na.ones(2, 3, 4), 0, 2).shape == (4, 3, 2)
    assert na.swapaxes(x, 0, 1).shape == na.swapdims(x, 1, 0).shape == (3, 2)
    assert [p.shape for p in na.split(x, 2, 1)] == [(2, 2), (2, 1)]
    assert [p.shape for p in na.split(x, [1, 2], dim=1)] == [(2, 1), (2, 2)]
    assert [p.shape for p in na.chunk(x, 3, 1)] == [(2, 1)] * 3
    assert na.reshape(x, (3, -1)).shape == (3, 2) and na.permute(x, (1, 0)).shape == (3, 2)
    assert na.squeeze(na.ones(1, 2, 1), (0, 2)).shape == (2,) and na.unsqueeze(x, -1).shape == (2, 3, 1)
    assert na.flatten(na.ones(2, 3, 4), 1).shape == (2, 12)
    assert na.narrow(x, 1, 0, 2).tolist() == X[:, :2].tolist()


def test_torch_signatures_of_the_reductions():
    x = _t()
    values, indices = na.max(x, 1)
    assert isinstance(na.max(x, 1), return_types.max) and values.tolist() == [4.0, 3.0]
    assert indices.tolist() == [2, 0] and na.min(x, dim=0, keepdim=True).values.shape == (1, 3)
    assert na.max(x).item() == 4.0 and na.max(x, _t(np.zeros(3))).tolist() == np.maximum(X, 0).tolist()
    assert na.clamp(x, min=0.0).tolist() == np.maximum(X, 0).tolist()
    assert na.clamp(x, max=1.0).tolist() == np.minimum(X, 1).tolist()
    assert na.argmax(x).item() == 2 and na.argmax(x, 1, True).shape == (2, 1)
    assert na.any(x > 3).item() and na.all(x > -10, dim=1).tolist() == [True, True]
    assert na.std(x, 1, keepdim=True).shape == (2, 1)
    assert na.softmax(x, 1).shape == (2, 3) and na.softmax(x, dim=0, dtype=na.float64).dtype == np.float64


def test_torch_signatures_of_the_arithmetic():
    x = _t()
    assert na.add(x, x, alpha=2).tolist() == (3 * X).tolist() and na.add(1.0, x).tolist() == (1 + X).tolist()
    assert na.sub(x, x, alpha=2).tolist() == (-X).tolist() and na.sub(1.0, x).tolist() == (1 - X).tolist()
    assert na.mul(2.0, x).tolist() == (2 * X).tolist() and na.div(1.0, _t([4.0])).tolist() == [0.25]
    assert na.pow(2.0, _t([3.0])).tolist() == [8.0] and na.pow(_t([3.0]), 2).tolist() == [9.0]
    with pytest.raises(TypeError, match="Tensor"):
        na.pow(2, 3)
    with pytest.raises(ValueError, match="rounding_mode"):
        na.div(x, 2, rounding_mode="round")
    with pytest.raises(RuntimeError, match="division by zero"):
        na.div(na.tensor([1]), na.tensor([0]), rounding_mode="floor")
    w = Tensor(X.copy(), requires_grad=True)
    na.add(w, w, alpha=3).sum().backward()
    assert w.grad.tolist() == np.full(X.shape, 4.0).tolist()


@settings(max_examples=25)
@given(a=st.integers(-20, 20), b=st.integers(-6, 6).filter(bool), floats=st.booleans())
@example(a=-7, b=2, floats=False)      # floor and trunc differ for a negative quotient
@example(a=7, b=-2, floats=True)
@example(a=-6, b=3, floats=False)      # exact: no rounding either way
def test_div_rounding_modes_match_python(a, b, floats):
    dtype = na.float64 if floats else na.int64
    x, y = na.tensor([a], dtype=dtype), na.tensor([b], dtype=dtype)
    assert na.div(x, y, rounding_mode="floor").tolist() == [math.floor(a / b) if floats else a // b]
    assert na.div(x, y, rounding_mode="trunc").tolist() == [math.trunc(a / b)]
    assert na.div(x, y, rounding_mode="floor").dtype == dtype


# ================================================================================ the silent wrong results, pinned
@st.composite
def reduction(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    kind = draw(st.sampled_from(["none", "empty", "int", "tuple", "list"]))
    if kind == "none":
        dim = None
    elif kind == "empty":
        dim = ()
    elif kind == "int":
        dim = draw(st.integers(-ndim, ndim - 1))
    else:
        picked = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        dim = [d - ndim if draw(st.booleans()) else d for d in picked]
        dim = tuple(dim) if kind == "tuple" else dim
    return shape, dim, draw(st.booleans())


@settings(max_examples=25)
@given(case=reduction(), seed=st.integers(0, 2**16))
@example(case=((2, 3), (), False), seed=0)        # dim=(): every dim (was: none reduced)
@example(case=((2, 1, 3), [], True), seed=0)
@example(case=((2, 3), [-1, 0], False), seed=0)
def test_top_level_reductions_match_numpy_for_every_dim_spelling(case, seed):
    shape, dim, keepdim = case
    a = np.random.default_rng(seed).standard_normal(shape)
    axes = tuple(range(len(shape))) if dim is None or len(dim if not isinstance(dim, int) else [0]) == 0 \
        else tuple(d % len(shape) for d in ((dim,) if isinstance(dim, int) else dim))
    n = math.prod(shape[d] for d in axes)
    want = {
        "sum": a.sum(axes, keepdims=keepdim), "mean": a.mean(axes, keepdims=keepdim),
        "amax": a.max(axes, keepdims=keepdim), "amin": a.min(axes, keepdims=keepdim),
        "var": a.var(axes, keepdims=keepdim) * n / (n - 1) if n > 1 else None,
        "std": np.sqrt(a.var(axes, keepdims=keepdim) * n / (n - 1)) if n > 1 else None,
    }
    for name, w in want.items():
        if w is None:
            continue
        got = getattr(na, name)(Tensor(a), dim, keepdim=keepdim)
        assert got.shape == np.shape(w), (name, dim)
        np.testing.assert_allclose(got.data, w, rtol=1e-10, atol=1e-12, err_msg=f"{name} dim={dim}")


@pytest.mark.parametrize("fn", [na.max, na.min, na.sort, na.cumprod, na.argmax, na.sum, na.softmax])
@pytest.mark.parametrize("dim", [2, -3])
def test_a_dim_out_of_range_is_an_index_error_never_a_wrapped_dim(fn, dim):
    # na.max(x, 2) of a matrix gave the max over dim 0 (2 % 2) without a word
    with pytest.raises(IndexError):
        fn(_t(), dim)


def test_a_bool_dim_is_refused_and_var_std_take_torchs_unbiased_overload():
    with pytest.raises(TypeError):
        na.max(_t(), True)                               # was: the max over dim 1
    with pytest.raises(TypeError):
        na.argmax(_t(), False)
    population = X.var()
    assert np.isclose(na.var(_t(), False).item(), population, rtol=1e-12)
    assert np.isclose(_t().var(True).item(), X.var(ddof=1), rtol=1e-12)
    assert np.isclose(_t().std(False).item(), np.sqrt(population), rtol=1e-12)
    assert np.allclose(na.var(_t(), 1, False, True).data, X.var(1, keepdims=True), rtol=1e-12)


def test_where_follows_torchs_dtypes_and_refuses_a_non_boolean_condition():
    cond = _t(X > 0)
    assert na.where(cond, 1.0, 0.0).dtype == np.float32                    # was float64
    assert na.where(cond, 1, 0).dtype == np.int64
    assert na.where(cond, na.tensor([[1, 2, 3], [4, 5, 6]]), 0.5).dtype == np.float32
    assert na.where(cond, _t(X), 0.0).dtype == np.float64
    f32 = Tensor(X.astype(np.float32))
    assert na.where(cond, f32, 0.0).dtype == np.float32
    with pytest.raises(TypeError, match="boolean"):
        na.where(_t(X), 1.0, 0.0)                                          # was: "non-zero"
    rows, cols = na.where(cond)
    assert rows.tolist() == [0, 0, 1, 1] and cols.tolist() == [0, 2, 0, 1]
    with pytest.raises(TypeError):
        na.where(cond, 1.0)


def test_integer_inputs_promote_or_raise_as_torch():
    ints = na.tensor([1, 4])
    assert (ints ** 0.5).dtype == np.float32 and (ints ** 0.5).tolist() == [1.0, 2.0]     # was float64
    assert (ints ** 2).dtype == np.int64 and na.pow(ints, 2).tolist() == [1, 16]
    assert na.exp(ints).dtype == na.sqrt(ints).dtype == na.log(ints).dtype == np.float32
    with pytest.raises(TypeError, match="floating"):
        na.softmax(ints, 0)                                                # was float64
    with pytest.raises(TypeError, match="floating"):
        na.log_softmax(ints, 0)
    assert na.softmax(ints, 0, dtype=na.float64).dtype == np.float64
    assert na.sign(na.tensor([-5, 0, 3])).tolist() == [-1, 0, 1]
    clamped = na.clamp(na.tensor([1, 5]), 0.5, 2.5)
    assert clamped.dtype == np.float32 and clamped.tolist() == [1.0, 2.5]                 # was float64
    assert na.clamp(na.tensor([1, 5]), 0, 2).dtype == np.int64


def test_permute_and_swapaxes_errors_are_torchs():
    with pytest.raises(RuntimeError, match="multiple times"):
        na.permute(_t(), (0, 0))
    with pytest.raises(RuntimeError, match="multiple times"):
        na.permute(_t(), (1, -1))
    with pytest.raises(IndexError):
        na.permute(_t(), (0, 2))
    with pytest.raises(IndexError):
        _t().swapaxes(0, 2)
    with pytest.raises(IndexError):
        na.transpose(_t(), -3, 0)
