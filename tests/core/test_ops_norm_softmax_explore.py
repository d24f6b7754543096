"""Exploring properties of softmax/log_softmax and layer_norm against float64 NumPy references
(``tests/core/ops_references.py``): softmax along any dim (negative too, size-1 and size-0 dims,
transposed inputs), layer_norm over a ``normalized_shape`` of one to three trailing dims with and
without weight/bias, with eps, through both the fused row path (NumPy float32/float64, matching
weight dtype) and the general path (a weight of another dtype). Float32 and float64.

Example of what one property checks::

    >>> import numpy as np
    >>> import neural_arch.nn.functional as F
    >>> from neural_arch import Tensor
    >>> F.softmax(Tensor(np.zeros((2, 0))), dim=-1).shape
    (2, 0)
"""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch.nn.functional as F
from neural_arch import Tensor
from tests.core import ops_references as ref

TOL = {np.float64: 1e-10, np.float32: 5e-5}
DTYPES = st.sampled_from([np.float64, np.float32])


def _close(got, want, dtype, what=""):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], err_msg=what)


def _data(seed, shape, dtype, transposed=False, scale=1.0):
    rng = np.random.default_rng(seed)
    a = np.asarray(rng.standard_normal(shape[::-1] if transposed else shape) * scale).astype(dtype)
    return a.T if transposed else a


@settings(max_examples=50)
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple), dtype=DTYPES,
       seed=st.integers(0, 2**16), which=st.sampled_from(["softmax", "log_softmax"]), data=st.data(),
       transposed=st.booleans(), scale=st.sampled_from([1.0, 30.0]))
@example(shape=(2, 0), dtype=np.float64, seed=0, which="softmax", data=None, transposed=False, scale=1.0)
def test_softmax_family_matches_numpy_along_any_dim(shape, dtype, seed, which, data, transposed, scale):
    """Pin: a size-0 dim raised a NumPy reduction error (torch returns an empty tensor)."""
    nd = len(shape)
    dim = data.draw(st.integers(-nd, nd - 1)) if data is not None else -1
    a = _data(seed, shape, dtype, transposed and nd >= 2, scale)
    x = Tensor(a, requires_grad=True)
    out = getattr(F, which)(x, dim=dim)
    g = _data(seed + 1, shape, dtype)
    out.backward(Tensor(g))
    xf = a.astype(np.float64)
    fwd = getattr(ref, which)(xf, dim)
    grad = getattr(ref, which + "_grad")(xf, dim, g.astype(np.float64))
    assert out.dtype == dtype
    _close(out.data, fwd, dtype, "forward")
    _close(x.grad.data, grad, dtype, "grad")


@settings(max_examples=50)
@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
       norm=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       affine=st.sampled_from(["both", "weight", "bias", "none"]), dtype=DTYPES, seed=st.integers(0, 2**16),
       eps=st.sampled_from([1e-5, 0.5]), param_dtype=st.sampled_from(["same", "float64"]),
       transposed=st.booleans())
@example(lead=(2,), norm=(1,), affine="both", dtype=np.float64, seed=0, eps=1e-5, param_dtype="same",
         transposed=False)
def test_layer_norm_matches_numpy(lead, norm, affine, dtype, seed, eps, param_dtype, transposed):
    shape = lead + norm
    a = _data(seed, shape, dtype, transposed and len(shape) >= 2)
    pd = dtype if param_dtype == "same" else np.float64
    w = _data(seed + 1, norm, pd) if affine in ("both", "weight") else None
    b = _data(seed + 2, norm, pd) if affine in ("both", "bias") else None
    x = Tensor(a, requires_grad=True)
    tw = Tensor(w, requires_grad=True) if w is not None else None
    tb = Tensor(b, requires_grad=True) if b is not None else None
    out = F.layer_norm(x, norm, tw, tb, eps=eps)
    g = _data(seed + 3, shape, dtype)
    out.backward(Tensor(g))
    def f64(v):
        return None if v is None else v.astype(np.float64)

    want, gx, gw, gb = ref.layer_norm(a.astype(np.float64), len(norm), f64(w), f64(b), eps, g.astype(np.float64))
    tol_dtype = np.float32 if np.float32 in (dtype, pd) else np.float64
    _close(out.data, want, tol_dtype, "forward")
    _close(x.grad.data, gx, tol_dtype, "grad x")
    if tw is not None:
        _close(tw.grad.data, gw, tol_dtype, "grad weight")
    if tb is not None:
        _close(tb.grad.data, gb, tol_dtype, "grad bias")
