"""Exploring properties of the transposed convolutions (``F.conv_transpose1d`` / ``F.conv_transpose2d``,
``nn.ConvTranspose1d`` / ``nn.ConvTranspose2d``) against a direct float64 NumPy loop written from torch's
definition: each input pixel, times the kernel, is added into the output ``stride`` apart (``dilation``
between kernel taps), then ``padding`` rows/columns are cropped from each side and ``output_padding``
rows/columns kept at the end. Forward values, torch's output size, input/weight/bias gradients for a
random upstream gradient (float64 <= 1e-10, float32 close), central finite differences, the adjoint
identity with ``conv2d`` (the transposed convolution is conv2d's input gradient), torch's layout and
init, ``output_size``, autocast, the strict fake device (the CuPy path), and bad arguments as clear
errors at the call.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor, nn
from neural_arch.amp import LOWER_PRECISION_OPS, autocast
from neural_arch.nn import functional as F


# ----------------------------------------------------------------------------- reference
def _ct_ref(x, w, b, stride, padding, output_padding, dilation, groups, g=None):
    """Forward and (dx, dw, db) of a 2-d transposed convolution, one input pixel and kernel tap at a time."""
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = stride, padding, output_padding, dilation
    n, ci, h, wd = x.shape
    _, cog, kh, kw = w.shape
    hf, wf = (h - 1) * sh + dh * (kh - 1) + 1 + oph, (wd - 1) * sw + dw * (kw - 1) + 1 + opw
    ho, wo = hf - 2 * ph, wf - 2 * pw
    full = np.zeros((n, cog * groups, hf, wf))
    gfull = np.zeros_like(full)
    if g is not None:
        gfull[:, :, ph:ph + ho, pw:pw + wo] = g
    dx, dwt = np.zeros_like(x), np.zeros_like(w)
    cg = ci // groups
    for c in range(ci):
        oc = slice((c // cg) * cog, (c // cg + 1) * cog)   # the output channels of c's group
        for i in range(h):
            for j in range(wd):
                for u in range(kh):
                    for v in range(kw):
                        r, q = i * sh + u * dh, j * sw + v * dw
                        full[:, oc, r, q] += x[:, c, i, j][:, None] * w[c, :, u, v][None, :]
                        dx[:, c, i, j] += gfull[:, oc, r, q] @ w[c, :, u, v]
                        dwt[c, :, u, v] += x[:, c, i, j] @ gfull[:, oc, r, q]
    out = full[:, :, ph:ph + ho, pw:pw + wo].copy()
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    if g is None:
        return out, None, None, None
    return out, dx, dwt, (g.sum(axis=(0, 2, 3)) if b is not None else None)


def _torch_out_size(size, k, s, p, op, d):
    """torch's documented output size of ConvTranspose2d."""
    return (size - 1) * s - 2 * p + d * (k - 1) + op + 1


@st.composite
def transposed_cases(draw, one_d: bool = False, op_below_stride: bool = False):
    """A valid (shapes, stride, padding, output_padding, dilation, groups, bias) draw (``op_below_stride``:
    output padding below the stride, not merely below the stride or the dilation)."""
    groups = draw(st.integers(1, 2))
    cg, cog = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    n = draw(st.integers(1, 2))
    dims = 1 if one_d else 2
    size = [draw(st.integers(1, 4)) for _ in range(dims)]
    k = [draw(st.integers(1, 3)) for _ in range(dims)]
    s = [draw(st.integers(1, 3)) for _ in range(dims)]
    d = [draw(st.integers(1, 2)) for _ in range(dims)]
    op = [draw(st.integers(0, (si if op_below_stride else max(si, di)) - 1)) for si, di in zip(s, d)]
    p = []
    for i in range(dims):
        full = (size[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 + op[i]
        p.append(min(draw(st.integers(0, 2)), (full - 1) // 2))   # keep at least one output row
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2 ** 16))
    return {"n": n, "groups": groups, "cg": cg, "cog": cog, "size": size, "k": k, "s": s, "p": p, "op": op,
            "d": d, "bias": bias, "seed": seed}


def _arrays(case, dtype=np.float64):
    rng = np.random.default_rng(case["seed"])
    ci = case["cg"] * case["groups"]
    x = rng.standard_normal((case["n"], ci, *case["size"])).astype(dtype)
    w = rng.standard_normal((ci, case["cog"], *case["k"])).astype(dtype)
    b = rng.standard_normal(case["cog"] * case["groups"]).astype(dtype) if case["bias"] else None
    return x, w, b


def _run(fn, x, w, b, upstream_seed, **kwargs):
    """Forward, then backward with a random upstream gradient: (out, g, dx, dw, db) as arrays."""
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    bt = None if b is None else Tensor(b, requires_grad=True)
    out = fn(xt, wt, bt, **kwargs)
    g = np.random.default_rng(upstream_seed).standard_normal(out.shape).astype(out.dtype)
    out.backward(Tensor(g))
    return out, g, xt.grad.data, wt.grad.data, (None if bt is None else bt.grad.data)


def _case(groups=1, cg=1, cog=1, n=1, size=(2, 2), k=(2, 2), s=(1, 1), p=(0, 0), op=(0, 0), d=(1, 1),
          bias=True, seed=0):
    return {"n": n, "groups": groups, "cg": cg, "cog": cog, "size": list(size), "k": list(k), "s": list(s),
            "p": list(p), "op": list(op), "d": list(d), "bias": bias, "seed": seed}


# ----------------------------------------------------------------------------- 2-d against the loop
@settings(deadline=None)
@given(transposed_cases())
@example(_case(size=(1, 1), k=(1, 1)))                                          # size-1 input and kernel
@example(_case(size=(1, 1), k=(3, 2), s=(3, 2), p=(1, 0), op=(2, 1)))           # size-1 input, output padding
@example(_case(size=(3, 2), k=(2, 2), s=(3, 3), bias=False))                    # stride > kernel: gaps stay 0
@example(_case(size=(2, 3), k=(3, 2), s=(1, 2), d=(2, 2), op=(1, 1)))           # op < dilation though >= stride
@example(_case(groups=2, cg=2, cog=1, n=2, size=(3, 3), k=(2, 3), s=(2, 1), p=(1, 1), op=(1, 0)))
@example(_case(size=(2, 2), k=(3, 3), s=(1, 1), p=(1, 1)))                      # conv2d's 'same' undone
@example(_case(size=(1, 2), k=(2, 2), p=(1, 0), d=(2, 1)))                      # padding crops all but one row
def test_conv_transpose2d_matches_the_loop_in_float64(case):
    x, w, b = _arrays(case)
    kw = {"stride": tuple(case["s"]), "padding": tuple(case["p"]), "output_padding": tuple(case["op"]),
              "groups": case["groups"], "dilation": tuple(case["d"])}
    out, g, dx, dw, db = _run(F.conv_transpose2d, x, w, b, case["seed"] + 1, **kw)
    ref, rdx, rdw, rdb = _ct_ref(x, w, b, kw["stride"], kw["padding"], kw["output_padding"], kw["dilation"],
                                 case["groups"], g)
    shape = tuple(_torch_out_size(case["size"][i], case["k"][i], case["s"][i], case["p"][i], case["op"][i],
                                  case["d"][i]) for i in range(2))
    assert out.shape == (case["n"], case["cog"] * case["groups"]) + shape
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.data, ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(dx, rdx, rtol=0, atol=1e-10)
    np.testing.assert_allclose(dw, rdw, rtol=0, atol=1e-10)
    if b is not None:
        np.testing.assert_allclose(db, rdb, rtol=0, atol=1e-10)


@settings(deadline=None)
@given(transposed_cases())
def test_conv_transpose2d_in_float32_stays_float32_and_close(case):
    x, w, b = _arrays(case, np.float32)
    kw = {"stride": tuple(case["s"]), "padding": tuple(case["p"]), "output_padding": tuple(case["op"]),
              "groups": case["groups"], "dilation": tuple(case["d"])}
    out, g, dx, dw, db = _run(F.conv_transpose2d, x, w, b, case["seed"] + 1, **kw)
    ref, rdx, rdw, rdb = _ct_ref(x.astype(np.float64), w.astype(np.float64),
                                 None if b is None else b.astype(np.float64), kw["stride"], kw["padding"],
                                 kw["output_padding"], kw["dilation"], case["groups"], g.astype(np.float64))
    for got, want in ((out.data, ref), (dx, rdx), (dw, rdw)) + (((db, rdb),) if b is not None else ()):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- 1-d: the 2-d loop at height 1
@settings(deadline=None)
@given(transposed_cases(one_d=True), st.booleans())
@example(_case(size=(1,), k=(1,), s=(1,), p=(0,), op=(0,), d=(1,)), False)      # size-1 everything
@example(_case(groups=2, cg=1, cog=2, size=(3,), k=(3,), s=(2,), p=(1,), op=(1,), d=(2,), bias=False), True)
def test_conv_transpose1d_matches_the_loop_in_float64(case, unbatched):
    x, w, b = _arrays(case)
    if unbatched:
        x = x[0]
    kw = {"stride": case["s"][0], "padding": case["p"][0], "output_padding": case["op"][0], "groups": case["groups"],
              "dilation": case["d"][0]}
    out, g, dx, dw, db = _run(F.conv_transpose1d, x, w, b, case["seed"] + 1, **kw)
    x4 = (x[None] if unbatched else x)[:, :, None, :]
    g4 = (g[None] if unbatched else g)[:, :, None, :]
    ref, rdx, rdw, rdb = _ct_ref(x4, w[:, :, None, :], b, (1, kw["stride"]), (0, kw["padding"]),
                                 (0, kw["output_padding"]), (1, kw["dilation"]), case["groups"], g4)
    length = _torch_out_size(case["size"][0], case["k"][0], case["s"][0], case["p"][0], case["op"][0],
                             case["d"][0])
    lead = () if unbatched else (case["n"],)
    assert out.shape == lead + (case["cog"] * case["groups"], length)
    np.testing.assert_allclose(out.data, ref[0, :, 0] if unbatched else ref[:, :, 0], rtol=0, atol=1e-10)
    np.testing.assert_allclose(dx, rdx[0, :, 0] if unbatched else rdx[:, :, 0], rtol=0, atol=1e-10)
    np.testing.assert_allclose(dw, rdw[:, :, 0], rtol=0, atol=1e-10)
    if b is not None:
        np.testing.assert_allclose(db, rdb, rtol=0, atol=1e-10)


def test_unbatched_conv_transpose2d_is_the_batch_of_one():
    x, w, b = _arrays(_case(groups=2, cg=1, cog=2, size=(2, 3), k=(2, 2)))
    single = F.conv_transpose2d(Tensor(x[0]), Tensor(w), Tensor(b), stride=2, padding=1, output_padding=1,
                                groups=2)
    grouped = F.conv_transpose2d(Tensor(x), Tensor(w), Tensor(b), 2, 1, 1, 2)   # torch's positional order
    assert single.shape == grouped.shape[1:]
    np.testing.assert_allclose(single.data, grouped.data[0], rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- finite differences, adjoint
def test_gradients_match_central_finite_differences():
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((1, 2, 2, 3)), rng.standard_normal((2, 1, 2, 3)), rng.standard_normal(2)
    kw = {"stride": (2, 1), "padding": (1, 1), "output_padding": (1, 0), "groups": 2, "dilation": (1, 2)}
    probe = rng.standard_normal(F.conv_transpose2d(Tensor(x), Tensor(w), Tensor(b), **kw).shape)

    def loss(xa, wa, ba):
        return float((F.conv_transpose2d(Tensor(xa), Tensor(wa), Tensor(ba), **kw).data * probe).sum())

    xt, wt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, w, b))
    (F.conv_transpose2d(xt, wt, bt, **kw) * Tensor(probe)).sum().backward()
    eps = 1e-6
    for which, (arr, grad) in enumerate(((x, xt.grad.data), (w, wt.grad.data), (b, bt.grad.data))):
        numeric = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            args = [x.copy(), w.copy(), b.copy()]
            args[which][idx] += eps
            up = loss(*args)
            args[which][idx] -= 2 * eps
            numeric[idx] = (up - loss(*args)) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7)


@settings(deadline=None)
@given(transposed_cases(op_below_stride=True))
def test_it_is_the_adjoint_of_conv2d(case):
    """<conv2d(y, W), x> == <y, conv_transpose2d(x, W)>: the transposed convolution is conv2d's input
    gradient, for every stride, padding, output padding, dilation and group count. (An output padding
    of at least the stride, allowed below the dilation, adds columns conv2d would read as more outputs:
    there the transposed output has no conv2d that maps it back to the input's size.)"""
    x, w, _ = _arrays(case)
    kw = {"stride": tuple(case["s"]), "padding": tuple(case["p"]), "dilation": tuple(case["d"]),
          "groups": case["groups"]}
    z = F.conv_transpose2d(Tensor(x), Tensor(w), output_padding=tuple(case["op"]), **kw)
    y = np.random.default_rng(case["seed"] + 7).standard_normal(z.shape)
    back = F.conv2d(Tensor(y), Tensor(w), **kw)
    assert back.shape == x.shape   # conv2d of the transposed output size gives the input size back
    np.testing.assert_allclose((back.data * x).sum(), (y * z.data).sum(), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- modules
def test_modules_have_torchs_layout_init_repr_and_output_size():
    na.manual_seed(0)
    up = nn.ConvTranspose2d(4, 6, kernel_size=(3, 2), stride=2, padding=1, output_padding=(1, 0), groups=2,
                            dilation=(1, 2))
    assert up.weight.shape == (4, 3, 3, 2) and up.bias.shape == (6,)
    bound = 1 / math.sqrt(3 * 3 * 2)   # fan_in = out_channels / groups * kH * kW (dim 1 of torch's layout)
    assert np.abs(up.weight.data).max() <= bound and np.abs(up.bias.data).max() <= bound
    assert np.abs(up.weight.data).max() > 0.8 * bound and up.weight.dtype == np.float32
    assert repr(up) == ("ConvTranspose2d(4, 6, kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), "
                        "dilation=(1, 2), output_padding=(1, 0), groups=2)")
    x = na.randn(2, 4, 3, 5)
    y = up(x)
    assert y.shape == (2, 6, 6, 9)
    np.testing.assert_allclose(y.data, F.conv_transpose2d(x, up.weight, up.bias, 2, 1, (1, 0), 2, (1, 2)).data)
    # output_size picks the output padding; the spatial sizes or the whole shape
    assert up(x, output_size=[5, 9]).shape == (2, 6, 5, 9) and up(x, output_size=(2, 6, 6, 9)).shape == y.shape
    one = nn.ConvTranspose1d(2, 3, 4, stride=3, bias=False, dtype=np.float64)
    assert one.weight.shape == (2, 3, 4) and one.bias is None and one.weight.dtype == np.float64
    assert repr(one) == "ConvTranspose1d(2, 3, kernel_size=(4,), stride=(3,), bias=False)"
    assert one(na.randn(2, 5).astype(np.float64), output_size=[3, 17]).shape == (3, 17)
    out = one(na.randn(1, 2, 5).astype(np.float64))
    out.sum().backward()
    assert out.shape == (1, 3, 16) and one.weight.grad.shape == (2, 3, 4)


# ----------------------------------------------------------------------------- bad input
def _x(shape=(1, 2, 3, 3)):
    return Tensor(np.ones(shape))


@pytest.mark.parametrize("call, error, match", [
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), stride=1, output_padding=1), ValueError,
     "output padding must be smaller than either stride or dilation"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), stride=(2, 1), output_padding=(1, 1)), ValueError,
     "output padding must be smaller"),
    (lambda: F.conv_transpose1d(_x((1, 2, 3)), _x((2, 1, 2)), stride=2, dilation=3, output_padding=3), ValueError,
     r"conv_transpose1d: output padding .* output_padding=\(3,\)"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), padding=-1), ValueError, "padding must be non-negative"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), output_padding=-1), ValueError, "output_padding"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), stride=0), ValueError, "stride must be positive"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), dilation=0), ValueError, "dilation must be positive"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), stride=(1.5, 2)), TypeError, "stride"),
    (lambda: F.conv2d(_x(), _x((2, 2, 2, 2)), stride=(1.5, 2)), TypeError, "stride"),   # was run as (1, 2)
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), groups=1.5), TypeError, "groups"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), groups=0), ValueError, "groups"),
    (lambda: F.conv_transpose2d(_x((1, 3, 3, 3)), _x((3, 1, 2, 2)), groups=2), ValueError, "divisible by 2"),
    (lambda: F.conv_transpose2d(_x(), _x((3, 1, 2, 2))), ValueError, "to have 3 channels, but got 2"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2))), ValueError, "weight must be 4-D"),
    (lambda: F.conv_transpose1d(_x((1, 2, 3)), _x((2, 1, 2, 2))), ValueError, "weight must be 3-D"),
    (lambda: F.conv_transpose2d(_x(), _x((2, 2, 2, 2)), bias=_x((2,)), groups=2), ValueError,
     r"bias to be 1-D with 4 elements"),   # C_out = weight.shape[1] * groups
    (lambda: F.conv_transpose2d(_x(), _x((2, 1, 2, 2)), bias=_x((1, 1))), ValueError, "bias"),
    (lambda: F.conv_transpose2d(_x((1, 2, 1, 1)), _x((2, 1, 1, 1)), padding=1), ValueError, "too small"),
    (lambda: F.conv_transpose2d(_x((2, 3)), _x((2, 1, 2, 2))), ValueError, "3D .* or 4D"),
    (lambda: F.conv_transpose1d(_x((1, 2, 3)), _x((2, 1, 2)), padding=(1, 1)), ValueError, "padding"),
    (lambda: nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect"), ValueError, "only 'zeros' padding_mode"),
    (lambda: nn.ConvTranspose2d(2, 2, 3, stride=2, output_padding=2), ValueError, "output padding must be"),
    (lambda: nn.ConvTranspose2d(3, 2, 3, groups=2), ValueError, "divisible by groups"),
    (lambda: nn.Conv2d(3, 3, 3, groups=1.5), TypeError, "groups must be an int"),   # ran as groups=1
    (lambda: nn.ConvTranspose2d(2, 2, 3, stride=2)(_x(), output_size=[9, 7]), ValueError,
     "valid sizes range from 7 to 8"),
    (lambda: nn.ConvTranspose1d(2, 2, 3)(_x((1, 2, 3)), output_size=[5, 5]), ValueError, "output_size must have"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_arguments_are_clear_errors_at_the_call(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------------------- autocast
def test_autocast_runs_the_convolutions_in_the_lower_precision_as_torch():
    # torch's CPU and CUDA lists both cast conv1d, conv2d, conv_transpose1d and conv_transpose2d
    for name in ("conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d"):
        assert name in LOWER_PRECISION_OPS
    na.manual_seed(1)
    layers = [(nn.ConvTranspose2d(2, 3, 2, stride=2), na.randn(1, 2, 3, 3)),
              (nn.ConvTranspose1d(2, 3, 2, stride=2), na.randn(1, 2, 3)),
              (nn.Conv1d(2, 3, 2), na.randn(1, 2, 3))]   # Conv1d called core conv1d: autocast missed it
    for layer, x in layers:
        plain = layer(x)
        with autocast("cpu", dtype=na.bfloat16):
            low = layer(x)
        assert low.dtype == na.bfloat16 and layer.weight.dtype == np.float32, type(layer).__name__
        np.testing.assert_allclose(low.data.astype(np.float32), plain.data, rtol=3e-2, atol=3e-2)
        low.astype(np.float32).sum().backward()
        assert layer.weight.grad.dtype == np.float32


# ----------------------------------------------------------------------------- the CuPy path
@pytest.fixture(scope="module")
def fd():
    path = pathlib.Path(__file__).parents[1] / "strict_device" / "fake_device.py"
    spec = importlib.util.spec_from_file_location("fake_device_for_conv_transpose", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fn, shapes, kwargs", [
    (F.conv_transpose2d, [(2, 2, 2, 3), (2, 2, 2, 3), (4,)],
     {"stride": (2, 1), "padding": (1, 0), "output_padding": (1, 0), "groups": 2, "dilation": (1, 2)}),
    (F.conv_transpose1d, [(1, 2, 3), (2, 1, 3), (1,)], {"stride": 2, "padding": 1, "output_padding": 1}),
], ids=["2d", "1d"])
def test_the_strict_fake_device_gives_the_host_results_without_waiting(fd, fn, shapes, kwargs):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s) for s in shapes]
    fd.assert_host_and_device_agree(lambda *leaves: fn(*leaves, **kwargs), arrays,
                                    lambda shape: np.random.default_rng(6).standard_normal(shape))
