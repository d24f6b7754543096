"""``F.interpolate`` (``neural_arch.nn.functional.resampling``) and ``nn.Upsample`` against float64
references written per output element from ATen's rules (``UpSample.h``): nearest's float32
``floor(dst * scale)`` with its scale-1/scale-2 shortcuts, nearest-exact's ``floor((dst + 0.5) * scale)``,
the linear modes' ``align_corners`` source index and clamped neighbours, ``scale = 1 / scale_factor``
unless ``recompute_scale_factor``, the output size ``floor(in * scale_factor)``; gradients by finite
differences; torch's argument errors; pinned cases where float32 index rounding decides torch's answer."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import itertools
import math
import os
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.core.tensor import Tensor
from neural_arch.nn.functional.resampling import interpolate
from neural_arch.nn.upsample import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "core"))
from core_testutils import check_grad

TOL = {np.float64: 1e-12, np.float32: 3e-6}
SEEDS = st.integers(0, 2**16)
LINEAR = {3: "linear", 4: "bilinear", 5: "trilinear"}


# ----------------------------------------------------------------------------- references
def ref_nearest_src(dst, n_in, n_out, scale, exact):
    """ATen's ``nearest_idx`` / ``nearest_exact_idx`` for one output index (the scale is a C float)."""
    if not exact and n_out == n_in:
        return dst
    if not exact and n_out == 2 * n_in:
        return dst // 2
    s = np.float32(1.0 / scale) if scale else np.float32(n_in) / np.float32(n_out)
    v = np.float32((dst + 0.5) * float(s)) if exact else np.float32(dst) * s
    return min(math.floor(v), n_in - 1)


def ref_linear_taps(dst, n_in, n_out, scale, align):
    """``[(index, weight), (index, weight)]`` of one output index: ATen's
    ``compute_source_index_and_lambda`` in double."""
    if n_out == n_in:
        return [(dst, 1.0)]
    if n_out <= 1:
        ratio = 0.0
    elif align:
        ratio = (n_in - 1) / (n_out - 1)
    else:
        ratio = 1.0 / scale if scale else n_in / n_out
    real = ratio * dst if align else max(ratio * (dst + 0.5) - 0.5, 0.0)
    i0 = min(math.floor(real), n_in - 1)
    lam = min(max(real - i0, 0.0), 1.0)
    return [(i0, 1.0 - lam), (i0 + (1 if i0 < n_in - 1 else 0), lam)]


def ref_area_taps(dst, n_in, n_out):
    lo, hi = (dst * n_in) // n_out, -((-(dst + 1) * n_in) // n_out)
    return [(i, 1.0 / (hi - lo)) for i in range(lo, hi)]


def reference(x, out, scales, mode, align):
    """Every output element as the weighted sum over the product of per-dim taps, in float64."""
    x = x.astype(np.float64)
    spatial = x.shape[2:]
    y = np.zeros(x.shape[:2] + tuple(out))
    for pos in itertools.product(*[range(o) for o in out]):
        per_dim = []
        for d, dst in enumerate(pos):
            s = scales[d] if scales else None
            if mode in ("nearest", "nearest-exact"):
                per_dim.append([(ref_nearest_src(dst, spatial[d], out[d], s, mode == "nearest-exact"), 1.0)])
            elif mode == "area":
                per_dim.append(ref_area_taps(dst, spatial[d], out[d]))
            else:
                per_dim.append(ref_linear_taps(dst, spatial[d], out[d], s, align))
        for taps in itertools.product(*per_dim):
            w = np.prod([t[1] for t in taps])
            y[(Ellipsis,) + pos] += w * x[(Ellipsis,) + tuple(t[0] for t in taps)]
    return y


# ----------------------------------------------------------------------------- values and gradients
@settings(max_examples=25)
@given(ndim=st.sampled_from([3, 4, 5]), kind=st.sampled_from(["nearest", "nearest-exact", "linear", "area"]),
       spatial=st.lists(st.integers(1, 4), min_size=3, max_size=3), by_size=st.booleans(),
       out=st.lists(st.integers(1, 6), min_size=3, max_size=3),
       sf=st.lists(st.sampled_from([0.5, 0.7, 1.0, 1.3, 1.5, 1.7, 2.0, 2.5, 3.0]), min_size=3, max_size=3),
       align=st.booleans(), recompute=st.sampled_from([None, False, True]),
       dtype=st.sampled_from([np.float64, np.float32]), seed=SEEDS)
@example(ndim=4, kind="linear", spatial=[2, 3, 1], by_size=False, out=[1, 1, 1], sf=[2.0, 1.7, 1.0], align=False,
         recompute=None, dtype=np.float64, seed=0)   # scale_factor 1.7 used as given: differs from in/out
@example(ndim=3, kind="nearest", spatial=[4, 1, 1], by_size=True, out=[1, 1, 1], sf=[1.0] * 3, align=False,
         recompute=None, dtype=np.float64, seed=0)   # down to one element
@example(ndim=5, kind="linear", spatial=[2, 3, 2], by_size=True, out=[3, 5, 1], sf=[1.0] * 3, align=True,
         recompute=None, dtype=np.float64, seed=1)   # trilinear, align_corners with an output of 1
def test_matches_reference_and_gradients(ndim, kind, spatial, by_size, out, sf, align, recompute, dtype, seed):
    k = ndim - 2
    spatial, out, sf = spatial[:k], out[:k], sf[:k]
    if kind == "area" and ndim == 5:
        kind = "nearest"
    mode = LINEAR[ndim] if kind == "linear" else kind
    if not by_size and min(math.floor(i * s) for i, s in zip(spatial, sf)) < 1:
        by_size = True                        # a factor that shrinks a dim to nothing: torch's error, tested below
    x = np.random.default_rng(seed).standard_normal((2, 2) + tuple(spatial)).astype(dtype)
    kw = {"mode": mode}
    if kind == "linear":
        kw["align_corners"] = align
    if by_size:
        kw["size"] = out if len(set(out)) > 1 else out[0]   # an int for every dim, or one per dim
        scales = None
    else:
        kw["scale_factor"] = sf if len(set(sf)) > 1 else sf[0]
        kw["recompute_scale_factor"] = recompute
        out = [math.floor(i * s) for i, s in zip(spatial, sf)]
        scales = None if recompute or kind == "area" else sf
    got = interpolate(Tensor(x), **kw)
    assert got.shape == x.shape[:2] + tuple(out) and got.dtype == dtype
    np.testing.assert_allclose(got.data, reference(x, out, scales, mode, kw.get("align_corners")),
                               rtol=TOL[dtype], atol=TOL[dtype])
    if dtype == np.float64:
        check_grad(lambda a: interpolate(a, **kw), x[:1, :1])


def test_torch_values_pinned():
    x = Tensor(np.arange(5.0).reshape(1, 1, 5))
    # nearest is OpenCV's floor(dst * in / out); nearest-exact is the pixel-centre rule
    assert interpolate(x, size=2).tolist() == [[[0.0, 2.0]]]
    assert interpolate(x, size=2, mode="nearest-exact").tolist() == [[[1.0, 3.0]]]
    small = Tensor(np.arange(3.0).reshape(1, 1, 3))
    assert interpolate(small, size=5).tolist() == [[[0.0, 0.0, 1.0, 1.0, 2.0]]]
    assert interpolate(small, size=5, mode="nearest-exact").tolist() == [[[0.0, 0.0, 1.0, 2.0, 2.0]]]
    # the scale is a C float: 37 * float32(6 / 74) falls just under 3, so torch copies source 2
    six = Tensor(np.arange(6.0).reshape(1, 1, 6))
    assert interpolate(six, size=74).data[0, 0, 37] == 2.0
    sixteen = Tensor(np.arange(16.0).reshape(1, 1, 16))
    # and float32(1 / 2.2) rounds up: 33 * it is just over 15, where 33 / 2.2 in double is just under
    assert interpolate(sixteen, scale_factor=2.2).data[0, 0, 33] == 15.0
    # scale_factor as given vs recomputed from the output size (in 5, factor 1.7 -> 8 outputs)
    given_scale = interpolate(x, scale_factor=1.7, mode="linear").data[0, 0]
    recomputed = interpolate(x, scale_factor=1.7, mode="linear", recompute_scale_factor=True).data[0, 0]
    np.testing.assert_allclose(given_scale[3], 3.5 / 1.7 - 0.5, rtol=1e-15)
    np.testing.assert_allclose(recomputed[3], 3.5 * 5 / 8 - 0.5, rtol=1e-15)
    img = Tensor(np.arange(4.0).reshape(1, 1, 2, 2))
    np.testing.assert_allclose(interpolate(img, scale_factor=2, mode="bilinear").data[0, 0],
                               [[0, .25, .75, 1], [.5, .75, 1.25, 1.5], [1.5, 1.75, 2.25, 2.5], [2, 2.25, 2.75, 3]])


def test_new_tensor_integer_nearest_and_empty_batch():
    x = Tensor(np.arange(6.0).reshape(1, 2, 3))
    y = interpolate(x, size=3)
    y.data[...] = -1
    assert x.data.min() == 0.0                          # same size: still a copy, as torch
    ints = interpolate(Tensor(np.arange(3).reshape(1, 1, 3)), scale_factor=2)
    assert ints.dtype == np.int64 and ints.tolist() == [[[0, 0, 1, 1, 2, 2]]]
    assert interpolate(Tensor(np.zeros((0, 2, 3, 3))), size=(4, 5), mode="bilinear").shape == (0, 2, 4, 5)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, error, match", [
    ({"size": 4, "scale_factor": 2}, ValueError, "only one of size or scale_factor should be defined"),
    ({}, ValueError, "either size or scale_factor should be defined"),
    ({"size": 4, "align_corners": True}, ValueError, "align_corners option can only be set with the interpolating"),
    ({"size": 4, "mode": "nearest-exact", "align_corners": False}, ValueError, "align_corners option"),
    ({"size": (4, 4)}, ValueError, "Input and output must have the same number of spatial dimensions"),
    ({"scale_factor": (2, 2)}, ValueError, "Input and scale_factor must have the same number of spatial"),
    ({"size": 4, "recompute_scale_factor": True}, ValueError, "recompute_scale_factor is not meaningful"),
    ({"size": 4, "mode": "bilinear"}, NotImplementedError, "Got 3D input, but bilinear mode needs 4D input"),
    ({"size": 4, "mode": "bicubic"}, NotImplementedError, "bicubic"),
    ({"size": 4, "mode": "cubic"}, NotImplementedError, "unknown mode"),
    ({"size": 4, "antialias": True}, ValueError, "Anti-alias option is restricted"),
    ({"size": 0}, RuntimeError, "Input and output sizes should be greater than 0"),
    ({"scale_factor": 0.2}, RuntimeError, "Input and output sizes should be greater than 0"),
    ({"size": (4.0,)}, TypeError, "expected size to be one of int"),
])
def test_errors_are_torchs(kwargs, error, match):
    with pytest.raises(error, match=match):
        interpolate(Tensor(np.ones((1, 1, 3))), **kwargs)


def test_more_errors():
    with pytest.raises(NotImplementedError, match="Got 4D input, but linear mode needs 3D input"):
        interpolate(Tensor(np.ones((1, 1, 3, 3))), size=4, mode="linear")
    with pytest.raises(NotImplementedError, match="antialias=True is not implemented"):
        interpolate(Tensor(np.ones((1, 1, 3, 3))), size=4, mode="bilinear", antialias=True)
    with pytest.raises(NotImplementedError, match="Only 3D, 4D and 5D input"):
        interpolate(Tensor(np.ones((3, 3))), size=4)
    with pytest.raises(RuntimeError, match="needs a floating input"):
        interpolate(Tensor(np.ones((1, 1, 3), dtype=np.int64)), size=4, mode="linear")


# ----------------------------------------------------------------------------- the CuPy path
@pytest.fixture(scope="module")
def fd():
    path = pathlib.Path(__file__).parents[1] / "strict_device" / "fake_device.py"
    spec = importlib.util.spec_from_file_location("fake_device_for_interpolate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape, kwargs", [
    ((1, 2, 3, 2), {"size": (5, 4), "mode": "bilinear"}),
    ((1, 1, 2, 3, 2), {"scale_factor": 1.5, "mode": "trilinear", "align_corners": True}),
    ((2, 1, 5), {"scale_factor": 0.7, "mode": "nearest"}),
    ((1, 2, 2, 3), {"size": (4, 7), "mode": "nearest-exact"}),
], ids=["bilinear", "trilinear", "nearest", "nearest-exact"])
def test_the_strict_fake_device_gives_the_host_results_without_waiting(fd, shape, kwargs):
    # indices and weights are made on the input's device: no host copy, no wait
    fd.assert_host_and_device_agree(lambda t: interpolate(t, **kwargs), [np.random.default_rng(1).standard_normal(shape)],
                                    lambda s: np.random.default_rng(2).standard_normal(s))


# ----------------------------------------------------------------------------- nn.Upsample
def test_upsample_module():
    up = Upsample(scale_factor=2, mode="bilinear", align_corners=True)
    assert up.scale_factor == 2.0 and isinstance(up.scale_factor, float)
    assert repr(up) == "Upsample(scale_factor=2.0, mode='bilinear')"
    assert repr(Upsample(size=(3, 4))) == "Upsample(size=(3, 4), mode='nearest')"
    assert Upsample(scale_factor=(2, 3)).scale_factor == (2.0, 3.0)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3))
    np.testing.assert_array_equal(up(Tensor(x)).data,
                                  interpolate(Tensor(x), scale_factor=2.0, mode="bilinear", align_corners=True).data)
    np.testing.assert_array_equal(UpsamplingBilinear2d(scale_factor=2)(Tensor(x)).data, up(Tensor(x)).data)
    np.testing.assert_array_equal(UpsamplingNearest2d(size=5)(Tensor(x)).data, interpolate(Tensor(x), size=5).data)
    assert list(up.state_dict()) == []


@pytest.mark.parametrize("module", ["neural_arch.nn.functional.resampling", "neural_arch.nn.upsample"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), verbose=False)
    assert result.failed == 0 and result.attempted > 3
