"""Exploring properties of the reductions against float64 NumPy references
(``tests/core/ops_references.py``): sum/mean/amax/amin/var/std over ``None``, an int or a tuple of
dims (negative dims too), ``keepdim`` on and off; ``max``/``min`` with a dim returning
``(values, indices)`` with the gradient going to the returned index, the full ``max()``/``min()``
sharing it among ties (torch); ``correction``/``unbiased``. Shapes with size-1 and empty dims,
transposed (non-contiguous) inputs, float32 and float64.

Example of what one property checks::

    >>> import numpy as np
    >>> from neural_arch import Tensor
    >>> x = Tensor(np.array([[1.0, 3.0], [3.0, 2.0]]), requires_grad=True)
    >>> x.amax(dim=(0, 1)).backward()
    >>> x.grad.tolist()
    [[0.0, 0.5], [0.5, 0.0]]
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch import Tensor
from tests.core import ops_references as ref

TOL = {np.float64: 1e-10, np.float32: 3e-5}
DTYPES = st.sampled_from([np.float64, np.float32])


def _close(got, want, dtype, what=""):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=what)


@st.composite
def reduction_case(draw, allow_empty=True):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0 if allow_empty else 1, 3), min_size=ndim, max_size=ndim)))
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        dim = None
    elif kind == "int":
        dim = draw(st.integers(-ndim, ndim - 1))
    else:
        picked = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        dim = tuple(d - ndim if draw(st.booleans()) else d for d in picked)  # negative spellings too
    return shape, dim, draw(st.booleans())


def _data(seed, shape, dtype, transposed, ties=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape[::-1] if transposed else shape)
    if ties:
        a = np.round(a)
    a = np.asarray(a).astype(dtype)
    return a.T if transposed else a


@settings(max_examples=50)
@given(case=reduction_case(), op=st.sampled_from(["sum", "mean"]), dtype=DTYPES,
       seed=st.integers(0, 2**16), transposed=st.booleans())
@example(case=((2, 0), 1, False), op="mean", dtype=np.float64, seed=0, transposed=False)
def test_sum_mean_match_numpy(case, op, dtype, seed, transposed):
    shape, dim, keepdim = case
    a = _data(seed, shape, dtype, transposed and len(shape) >= 2)
    x = Tensor(a, requires_grad=True)
    out = getattr(x, op)(dim=dim, keepdim=keepdim)
    dims = ref.norm_dims(dim, len(shape))
    with np.errstate(all="ignore"):
        want = getattr(a.astype(np.float64), op)(axis=dims, keepdims=keepdim)
    g = np.asarray(_data(seed + 1, want.shape, dtype, False))
    out.backward(Tensor(g))
    n = int(np.prod([shape[d] for d in dims]))
    gx = ref.expand_back(g.astype(np.float64), shape, dims, keepdim) * np.ones(shape)
    if op == "mean":
        gx = gx / n if n else gx * np.nan
    assert out.dtype == dtype
    _close(out.data, want, dtype, "forward")
    _close(x.grad.data, gx, dtype, "grad")


@settings(max_examples=40)
@given(case=reduction_case(allow_empty=False), op=st.sampled_from(["amax", "amin"]), dtype=DTYPES,
       seed=st.integers(0, 2**16), transposed=st.booleans())
def test_amax_amin_share_the_gradient_among_ties(case, op, dtype, seed, transposed):
    shape, dim, keepdim = case
    a = _data(seed, shape, dtype, transposed and len(shape) >= 2, ties=True)
    x = Tensor(a, requires_grad=True)
    out = getattr(x, op)(dim=dim, keepdim=keepdim)
    dims = ref.norm_dims(dim, len(shape))
    xf = a.astype(np.float64)
    want = (xf.max if op == "amax" else xf.min)(axis=dims, keepdims=keepdim)
    g = np.asarray(_data(seed + 1, want.shape, dtype, False)).astype(np.float64)
    out.backward(Tensor(g.astype(dtype)))
    hit = xf == ref.expand_back(want, shape, dims, keepdim)
    gx = hit * ref.expand_back(g, shape, dims, keepdim) / hit.sum(axis=dims, keepdims=True)
    _close(out.data, want, dtype, "forward")
    _close(x.grad.data, gx, dtype, "grad")


@settings(max_examples=40)
@given(case=reduction_case(allow_empty=False), which=st.sampled_from(["max", "min"]), dtype=DTYPES,
       seed=st.integers(0, 2**16), transposed=st.booleans())
def test_max_min_with_dim_return_values_indices_and_route_the_gradient(case, which, dtype, seed, transposed):
    shape, dim, keepdim = case
    if not isinstance(dim, int):
        dim = -1
    a = _data(seed, shape, dtype, transposed and len(shape) >= 2, ties=True)
    x = Tensor(a, requires_grad=True)
    values, indices = getattr(x, which)(dim=dim, keepdim=keepdim)
    xf = a.astype(np.float64)
    want = (xf.max if which == "max" else xf.min)(axis=dim, keepdims=keepdim)
    idx = indices.data if keepdim else np.expand_dims(indices.data, dim)
    assert indices.dtype == np.int64 and indices.shape == want.shape
    # the index points at an extreme value (torch documents no tie order: any extreme is valid)
    _close(np.take_along_axis(xf, idx, axis=dim), ref.expand_back(want, shape, (dim % len(shape),), keepdim),
           dtype, "indexed values")
    g = np.asarray(_data(seed + 1, want.shape, dtype, False))
    values.backward(Tensor(g))
    gx = np.zeros(shape)
    np.put_along_axis(gx, idx, ref.expand_back(g.astype(np.float64), shape, (dim % len(shape),), keepdim),
                      axis=dim)
    _close(values.data, want, dtype, "forward")
    _close(x.grad.data, gx, dtype, "grad")


@settings(max_examples=50)
@given(case=reduction_case(), op=st.sampled_from(["var", "std"]), dtype=DTYPES, seed=st.integers(0, 2**16),
       spelling=st.sampled_from(["default", "unbiased=False", "correction=0", "correction=2"]),
       transposed=st.booleans())
@example(case=((1,), None, False), op="std", dtype=np.float64, seed=0, spelling="default", transposed=False)
@example(case=((0,), None, False), op="var", dtype=np.float64, seed=0, spelling="unbiased=False",
         transposed=False)  # was 0, torch: nan
@example(case=((2,), None, False), op="var", dtype=np.float64, seed=0, spelling="correction=2",
         transposed=False)  # n <= correction: inf (torch), was nan
def test_var_std_match_numpy_with_torch_corrections(case, op, dtype, seed, spelling, transposed):
    shape, dim, keepdim = case
    a = _data(seed, shape, dtype, transposed and len(shape) >= 2)
    x = Tensor(a, requires_grad=True)
    kwargs = {"default": {}, "unbiased=False": {"unbiased": False}, "correction=0": {"correction": 0},
              "correction=2": {"correction": 2}}[spelling]
    correction = 1 if spelling == "default" else (2 if spelling == "correction=2" else 0)
    out = getattr(x, op)(dim=dim, keepdim=keepdim, **kwargs)
    dims = ref.norm_dims(dim, len(shape))
    g = np.asarray(_data(seed + 1, out.shape, dtype, False)).astype(np.float64)
    want, gx = ref.var_reference(a.astype(np.float64), dims, correction, keepdim, g)
    if op == "std":
        with np.errstate(all="ignore"):
            want = np.sqrt(want)
            _, gx = ref.var_reference(a.astype(np.float64), dims, correction, keepdim,
                                      g / (2 * np.where(want == 0, np.nan, want)))
    out.backward(Tensor(g.astype(dtype)))
    assert out.dtype == dtype
    _close(out.data, want, dtype, "forward")
    finite = np.isfinite(gx)  # where the reference is nan (n <= correction, a zero std) torch is too
    _close(np.where(finite, x.grad.data, 0.0), np.where(finite, gx, 0.0), dtype, "grad")


def test_reductions_refuse_an_empty_max_and_repeated_dims():
    with pytest.raises((ValueError, RuntimeError)):
        Tensor(np.zeros(0)).max()
    with pytest.raises((ValueError, RuntimeError)):
        Tensor(np.zeros((2, 3))).sum(dim=(1, -1))


def test_max_of_a_tensor_holding_nan_sends_the_gradient_to_the_nans():
    """Pin: ``max()`` of ``[1, nan, 2]`` gave a nan gradient everywhere; torch gives the NaNs (the
    result) the gradient, shared among them. ``amax`` keeps torch's plain mask (NaN gradients)."""
    x = Tensor(np.array([[1.0, np.nan, np.nan], [1.0, 3.0, 3.0]]), requires_grad=True)
    x.max().backward()
    assert x.grad.tolist() == [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]
    x = Tensor(np.array([1.0, np.nan, 2.0]), requires_grad=True)
    x.min().backward()
    assert x.grad.tolist() == [0.0, 1.0, 0.0]
