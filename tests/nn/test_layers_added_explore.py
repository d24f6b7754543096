"""Exploring properties of the 1-d layers and ``BatchNorm3d`` a ported torch script calls: ``conv1d`` /
``Conv1d`` (stride, int/'same'/'valid' padding, dilation, groups, bias, every ``padding_mode``),
``max_pool1d`` / ``MaxPool1d`` (padding, dilation, ceil_mode, return_indices), ``avg_pool1d`` /
``AvgPool1d`` (ceil_mode, count_include_pad), ``adaptive_avg_pool1d`` / ``AdaptiveAvgPool1d`` and
``BatchNorm3d`` (training statistics, running statistics, eval).

Each runs over the 2-d op on ``(N, C, 1, L)``; here it meets direct float64 NumPy loops written from
torch's documented formulas: values within 1e-10 in float64 (3e-5 in float32), and the gradient of the
input, weight and bias against central finite differences of the reference for a random upstream
gradient. Unbatched ``(C, L)`` input works as torch's; bad arguments raise at the call, in 1-d terms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from neural_arch import Tensor
from neural_arch.core.ops_conv import adaptive_avg_pool1d, avg_pool1d, conv1d, max_pool1d
from neural_arch.nn.batchnorm import BatchNorm3d
from neural_arch.nn.conv import Conv1d
from neural_arch.nn.pooling import AdaptiveAvgPool1d, AvgPool1d, MaxPool1d

TOL = {np.float64: 1e-10, np.float32: 3e-5}
GRAD_TOL = {np.float64: 1e-6, np.float32: 2e-4}
DTYPES = st.sampled_from([np.float64, np.float32])
SEEDS = st.integers(0, 2**16)
_NP_PAD = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


# ----------------------------------------------------------------------------- references (float64)
def ref_conv1d(x, w, b, stride, left, right, dilation, groups, mode="zeros"):
    n, _, length = x.shape
    co, cg, k = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (left, right)), mode=_NP_PAD[mode])
    lo = (length + left + right - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((n, co, lo))
    cog = co // groups
    for o in range(co):
        grp = o // cog
        for i in range(lo):
            for j in range(k):
                out[:, o, i] += xp[:, grp * cg:(grp + 1) * cg, i * stride + j * dilation] @ w[o, :, j]
    return out if b is None else out + b.reshape(1, -1, 1)


def _pool_len(length, k, s, p, d, ceil_mode):
    """torch's output length, with its rule that the last window starts inside the input or left pad."""
    num = length + 2 * p - d * (k - 1) - 1
    out = (math.ceil(num / s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= length + p:
        out -= 1
    return out


def ref_max_pool1d(x, k, s, p, d, ceil_mode):
    n, c, length = x.shape
    lo = _pool_len(length, k, s, p, d, ceil_mode)
    out, idx = np.zeros((n, c, lo)), np.zeros((n, c, lo), dtype=np.int64)
    for i in range(lo):
        positions = [i * s - p + j * d for j in range(k)]
        positions = [q for q in positions if 0 <= q < length]
        vals = x[:, :, positions]
        arg = vals.argmax(axis=-1)
        out[:, :, i] = vals.max(axis=-1)
        idx[:, :, i] = np.asarray(positions)[arg]
    return out, idx


def ref_avg_pool1d(x, k, s, p, ceil_mode, count_include_pad):
    n, c, length = x.shape
    lo = _pool_len(length, k, s, p, 1, ceil_mode)
    out = np.zeros((n, c, lo))
    for i in range(lo):
        start = i * s - p
        end = min(start + k, length + p)
        pool = end - start
        lo_in, hi_in = max(start, 0), min(end, length)
        total = x[:, :, lo_in:hi_in].sum(axis=-1)
        out[:, :, i] = total / (pool if count_include_pad else hi_in - lo_in)
    return out


def ref_adaptive_avg_pool1d(x, size):
    length = x.shape[-1]
    return np.stack([x[..., (i * length) // size:-(-((i + 1) * length) // size)].mean(axis=-1)
                     for i in range(size)], axis=-1)


# ----------------------------------------------------------------------------- the shared check
def _finite_differences(scalar, arrays: dict, name: str, h: float = 1e-6) -> np.ndarray:
    base = arrays[name]
    grad = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        for sign in (1, -1):
            moved = base.copy()
            moved[i] += sign * h
            grad[i] += sign * scalar({**arrays, name: moved})
    return grad / (2 * h)


def check_op(ours, reference, arrays: dict, dtype, seed: int):
    """``ours(**tensors)`` (every array requires grad) against ``reference(**arrays)``: value and dtype,
    then each gradient against finite differences of the reference in float64."""
    arrays = {k: np.asarray(v, dtype=dtype).astype(np.float64) for k, v in arrays.items() if v is not None}
    tensors = {k: Tensor(v.astype(dtype), requires_grad=True) for k, v in arrays.items()}
    out = ours(**tensors)
    want = reference(**arrays)
    assert out.dtype == dtype and out.shape == want.shape, (out.shape, want.shape)
    np.testing.assert_allclose(np.asarray(out.data, np.float64), want, rtol=TOL[dtype],
                               atol=TOL[dtype] * (1 + np.abs(want).max(initial=0)), err_msg="value")
    upstream = np.random.default_rng(seed + 1).standard_normal(want.shape)
    out.backward(Tensor(upstream.astype(dtype)))
    for name in arrays:
        got = tensors[name].grad
        assert got is not None and got.shape == arrays[name].shape and got.dtype == dtype, name
        fd = _finite_differences(lambda a: float((upstream * reference(**a)).sum()), arrays, name)
        tol = GRAD_TOL[dtype]
        np.testing.assert_allclose(np.asarray(got.data, np.float64), fd, rtol=tol,
                                   atol=tol * (1 + np.abs(fd).max(initial=0)), err_msg=f"d out / d {name}")
    return out


# ----------------------------------------------------------------------------- conv1d
@settings(max_examples=30)
@given(n=st.sampled_from([1, 2]), groups=st.sampled_from([1, 2]), cg=st.sampled_from([1, 2]),
       og=st.sampled_from([1, 2]), length=st.integers(1, 7), k=st.integers(1, 3), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), padding=st.sampled_from([0, 1, 2, "same", "valid"]), bias=st.booleans(),
       dtype=DTYPES, seed=SEEDS)
@example(n=1, groups=1, cg=1, og=1, length=5, k=2, stride=1, dilation=1, padding="same", bias=False,
         dtype=np.float64, seed=0)  # an even kernel: torch puts the odd padding element at the end
@example(n=2, groups=2, cg=1, og=2, length=6, k=3, stride=2, dilation=2, padding=2, bias=True,
         dtype=np.float64, seed=1)  # depthwise-style groups, strided and dilated
def test_conv1d_matches_torch_formula(n, groups, cg, og, length, k, stride, dilation, padding, bias, dtype, seed):
    if padding == "same":
        assume(stride == 1)
    total = {"same": dilation * (k - 1), "valid": 0}[padding] if isinstance(padding, str) else 2 * padding
    left = total // 2  # 'same': torch puts the odd element at the end
    assume(length + total - dilation * (k - 1) - 1 >= 0)
    rng = np.random.default_rng(seed)
    c, co = cg * groups, og * groups
    arrays = {"x": rng.standard_normal((n, c, length)), "w": rng.standard_normal((co, cg, k)),
              "b": rng.standard_normal(co) if bias else None}
    out = check_op(lambda x, w, b=None: conv1d(x, w, b, stride, padding, dilation, groups),
                   lambda x, w, b=None: ref_conv1d(x, w, b, stride, left, total - left, dilation, groups),
                   arrays, dtype, seed)
    if padding == "same":
        assert out.shape[-1] == length


@settings(max_examples=12)
@given(mode=st.sampled_from(["zeros", "reflect", "replicate", "circular"]), padding=st.sampled_from([1, 2, "same"]),
       seed=SEEDS)
def test_conv1d_module_padding_modes_match_numpy_pad(mode, padding, seed):
    rng = np.random.default_rng(seed)
    conv = Conv1d(2, 3, 3, padding=padding, padding_mode=mode, dtype=np.float64)
    x = rng.standard_normal((2, 2, 5))
    p = 1 if padding == "same" else padding
    want = ref_conv1d(x, conv.weight.data, conv.bias.data, 1, p, p, 1, 1, mode)
    np.testing.assert_allclose(conv(x).data, want, rtol=1e-10, atol=1e-12)
    # unbatched (C, L) input: the same numbers without the batch dim
    np.testing.assert_allclose(conv(x[1]).data, want[1], rtol=1e-10, atol=1e-12)


def test_conv1d_module_init_repr_and_gradients_flow():
    conv = Conv1d(4, 6, 3, stride=2, groups=2, bias=True)
    bound = 1 / math.sqrt(2 * 3)  # fan_in = in_channels / groups * kernel_size (torch)
    assert conv.weight.shape == (6, 2, 3) and conv.weight.dtype == np.float32
    assert np.abs(conv.bias.data).max() <= bound and np.abs(conv.weight.data).max() <= bound
    assert repr(conv) == "Conv1d(4, 6, kernel_size=(3,), stride=(2,), groups=2)"
    assert repr(Conv1d(1, 1, 2, padding="same", bias=False)) == \
        "Conv1d(1, 1, kernel_size=(2,), stride=(1,), padding='same', bias=False)"
    y = conv(Tensor(np.ones((1, 4, 9), np.float32)))
    y.sum().backward()
    assert y.shape == (1, 6, 4) and conv.weight.grad.shape == (6, 2, 3) and conv.bias.grad.shape == (6,)
    assert sorted(conv.state_dict()) == ["bias", "weight"]


# ----------------------------------------------------------------------------- pooling
@settings(max_examples=30)
@given(length=st.integers(1, 8), k=st.integers(1, 3), stride=st.sampled_from([None, 1, 2, 3]),
       padding=st.integers(0, 1), dilation=st.integers(1, 2), ceil_mode=st.booleans(), dtype=DTYPES, seed=SEEDS)
@example(length=5, k=2, stride=2, padding=1, dilation=1, ceil_mode=True, dtype=np.float64, seed=0)
@example(length=4, k=3, stride=1, padding=1, dilation=2, ceil_mode=False, dtype=np.float32, seed=1)
def test_max_pool1d_matches_torch_formula(length, k, stride, padding, dilation, ceil_mode, dtype, seed):
    assume(padding <= k // 2)
    s = k if stride is None else stride
    assume(_pool_len(length, k, s, padding, dilation, ceil_mode) >= 1)
    x = np.random.default_rng(seed).permutation(2 * 3 * length).reshape(2, 3, length) / 7.0  # no ties
    check_op(lambda x: max_pool1d(x, k, stride, padding, dilation, ceil_mode),
             lambda x: ref_max_pool1d(x, k, s, padding, dilation, ceil_mode)[0], {"x": x}, dtype, seed)
    out, idx = max_pool1d(Tensor(x), k, stride, padding, dilation, ceil_mode, return_indices=True)
    np.testing.assert_array_equal(idx.data, ref_max_pool1d(x, k, s, padding, dilation, ceil_mode)[1])
    assert idx.dtype == np.int64
    module = MaxPool1d(k, stride, padding, dilation, return_indices=True, ceil_mode=ceil_mode)
    m_out, m_idx = module(Tensor(x[0]))  # unbatched (C, L)
    np.testing.assert_array_equal(m_out.data, out.data[0])
    np.testing.assert_array_equal(m_idx.data, idx.data[0])


@settings(max_examples=30)
@given(length=st.integers(1, 8), k=st.integers(1, 4), stride=st.sampled_from([None, 1, 2, 3]),
       padding=st.integers(0, 2), ceil_mode=st.booleans(), count_include_pad=st.booleans(), dtype=DTYPES,
       seed=SEEDS)
@example(length=5, k=2, stride=2, padding=1, ceil_mode=True, count_include_pad=True, dtype=np.float64, seed=0)
@example(length=5, k=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False, dtype=np.float64, seed=0)
def test_avg_pool1d_matches_torch_formula(length, k, stride, padding, ceil_mode, count_include_pad, dtype, seed):
    assume(padding <= k // 2)
    s = k if stride is None else stride
    assume(_pool_len(length, k, s, padding, 1, ceil_mode) >= 1)
    x = np.random.default_rng(seed).standard_normal((2, 2, length))
    out = check_op(lambda x: avg_pool1d(x, k, stride, padding, ceil_mode, count_include_pad),
                   lambda x: ref_avg_pool1d(x, k, s, padding, ceil_mode, count_include_pad), {"x": x}, dtype, seed)
    module = AvgPool1d(k, stride, padding, ceil_mode, count_include_pad)
    np.testing.assert_array_equal(module(Tensor(x.astype(dtype))).data, out.data)
    assert repr(module) == f"AvgPool1d(kernel_size=({k},), stride=({s},), padding=({padding},))"


@settings(max_examples=25)
@given(length=st.integers(1, 9), size=st.integers(1, 6), dtype=DTYPES, seed=SEEDS)
@example(length=5, size=3, dtype=np.float64, seed=0)  # overlapping bins
@example(length=2, size=5, dtype=np.float64, seed=0)  # more bins than elements
def test_adaptive_avg_pool1d_matches_torch_bins(length, size, dtype, seed):
    x = np.random.default_rng(seed).standard_normal((2, 3, length))
    out = check_op(lambda x: adaptive_avg_pool1d(x, size), lambda x: ref_adaptive_avg_pool1d(x, size), {"x": x},
                   dtype, seed)
    np.testing.assert_array_equal(AdaptiveAvgPool1d(size)(Tensor(x.astype(dtype)[0])).data, out.data[0])
    np.testing.assert_array_equal(adaptive_avg_pool1d(Tensor(x.astype(dtype)), (size,)).data, out.data)


# ----------------------------------------------------------------------------- BatchNorm3d
def _ref_batch_norm(x, w, b, eps=1e-5):
    axes = (0, 2, 3, 4)
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w.reshape(1, -1, 1, 1, 1) + b.reshape(1, -1, 1, 1, 1)


@settings(max_examples=10)
@given(dtype=DTYPES, seed=SEEDS, momentum=st.sampled_from([0.1, None]))
@example(dtype=np.float64, seed=0, momentum=0.1)
def test_batchnorm3d_trains_and_evaluates_like_torch(dtype, seed, momentum):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 2, 2, 1, 3)) * 3 + 1
    bn = BatchNorm3d(2, momentum=momentum, dtype=dtype)
    bn.weight.data[...] = rng.uniform(0.5, 2, 2)
    bn.bias.data[...] = rng.standard_normal(2)
    w, b = bn.weight.data.astype(np.float64), bn.bias.data.astype(np.float64)
    check_op(lambda x: bn(x), lambda x: _ref_batch_norm(x, w, b), {"x": x}, dtype, seed)
    # check_op ran the layer once (its finite differences use the reference): one update from the defaults
    xr = x.astype(dtype).astype(np.float64)
    factor = 1.0 if momentum is None else momentum  # a cumulative average of one batch is that batch
    count = xr.size // 2
    want_mean = factor * xr.mean(axis=(0, 2, 3, 4))
    want_var = (1 - factor) + factor * xr.var(axis=(0, 2, 3, 4)) * count / (count - 1)  # unbiased, as torch
    np.testing.assert_allclose(bn.running_mean.data, want_mean, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(bn.running_var.data, want_var, rtol=TOL[dtype], atol=TOL[dtype])
    assert int(bn.num_batches_tracked.item()) == 1


def test_batchnorm3d_eval_uses_running_stats_and_refuses_other_ranks():
    bn = BatchNorm3d(3, dtype=np.float64).eval()
    bn.running_mean.data[...] = [1.0, 2.0, 3.0]
    bn.running_var.data[...] = [4.0, 1.0, 0.25]
    x = np.random.default_rng(0).standard_normal((1, 3, 2, 2, 2))
    want = (x - bn.running_mean.data.reshape(1, 3, 1, 1, 1)) / np.sqrt(
        bn.running_var.data.reshape(1, 3, 1, 1, 1) + 1e-5)
    np.testing.assert_allclose(bn(x).data, want, rtol=1e-12)
    assert repr(bn) == "BatchNorm3d(3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"
    with pytest.raises(ValueError, match="expected 5D input"):
        bn(np.zeros((1, 3, 2, 2)))
    with pytest.raises(ValueError, match="channels"):
        bn(np.zeros((1, 4, 2, 2, 2)))


# ----------------------------------------------------------------------------- bad input
X = Tensor(np.ones((1, 2, 5)))
W = Tensor(np.ones((3, 2, 3)))
BAD = [
    (lambda: conv1d(X, Tensor(np.ones((3, 2)))), ValueError, "weight must be 3-D"),
    (lambda: conv1d(X, Tensor(np.ones((3, 1, 3)))), ValueError, "channels"),
    (lambda: conv1d(X, W, groups=2), ValueError, "groups"),
    (lambda: conv1d(X, W, stride=0), ValueError, "stride"),
    (lambda: conv1d(X, W, dilation=0), ValueError, "dilation"),
    (lambda: conv1d(X, W, padding=-1), ValueError, "padding"),
    (lambda: conv1d(X, W, padding=(1, 1)), ValueError, "padding"),
    (lambda: conv1d(X, W, padding="full"), ValueError, "padding"),
    (lambda: conv1d(X, W, stride=2, padding="same"), ValueError, "same"),
    (lambda: conv1d(X, Tensor(np.ones((3, 2, 7)))), ValueError, "kernel"),
    (lambda: conv1d(Tensor(np.ones((1, 1, 2, 5))), W), ValueError, "2D .unbatched. or 3D"),
    (lambda: conv1d(X, W, np.ones(2)), ValueError, "bias"),
    (lambda: max_pool1d(X, 2, padding=2), ValueError, "pad"),
    (lambda: max_pool1d(X, 0), ValueError, "kernel_size"),
    (lambda: max_pool1d(X, 6), ValueError, "too small"),
    (lambda: max_pool1d(X, (2, 2)), ValueError, "kernel_size"),
    (lambda: max_pool1d(X, 2, stride=True), TypeError, "stride"),
    (lambda: avg_pool1d(X, 2, stride=0), ValueError, "stride"),
    (lambda: avg_pool1d(Tensor(np.ones(5)), 2), ValueError, "2D .unbatched. or 3D"),
    (lambda: adaptive_avg_pool1d(X, 0), ValueError, "output_size"),
    (lambda: adaptive_avg_pool1d(X, (2, 2)), ValueError, "output_size"),
    (lambda: Conv1d(3, 4, 3, groups=2), ValueError, "groups"),
    (lambda: Conv1d(2, 2, 3, stride=2, padding="same"), ValueError, "same"),
    (lambda: Conv1d(2, 2, 3, padding_mode="mirror"), ValueError, "padding_mode"),
    (lambda: MaxPool1d(2, padding=3), ValueError, "pad"),
    (lambda: AvgPool1d(0), ValueError, "kernel_size"),
    (lambda: AdaptiveAvgPool1d(-1), ValueError, "output_size"),
    (lambda: BatchNorm3d(0), ValueError, "num_features"),
]


@pytest.mark.parametrize("call, error, words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_arguments_are_clear_errors_at_the_call(call, error, words):
    with pytest.raises(error, match=words):
        call()


# ----------------------------------------------------------------------------- CuPy (the lent GPU)
@pytest.mark.gpu
def test_layers_on_cupy_match_numpy():
    import cupy as cp  # noqa: F401  (the marker skips without it)

    rng = np.random.default_rng(0)
    xs, ws, bs = rng.standard_normal((2, 4, 9)), rng.standard_normal((6, 2, 3)), rng.standard_normal(6)
    calls = [
        lambda x, w, b: conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
        lambda x, w, b: conv1d(x, w, None, padding="same", groups=2),
        lambda x, w, b: max_pool1d(x, 3, 2, 1, ceil_mode=True) * w.sum(),
        lambda x, w, b: avg_pool1d(x, 3, 2, 1, count_include_pad=False) * w.sum(),
        lambda x, w, b: adaptive_avg_pool1d(x, 4) * w.sum(),
        lambda x, w, b: BatchNorm3d(4, dtype=np.float64).to(x.device)(x.reshape(2, 4, 3, 1, 3)) * w.sum(),
    ]
    for call in calls:
        results = {}
        for dev in ("cpu", "cuda:0"):
            x, w = Tensor(xs, requires_grad=True, device=dev), Tensor(ws, requires_grad=True, device=dev)
            out = call(x, w, Tensor(bs, device=dev))
            out.backward(Tensor(np.ones(out.shape), device=dev))
            results[dev] = (out.numpy(), x.grad.numpy(), w.grad.numpy())
        for cpu, gpu in zip(results["cpu"], results["cuda:0"]):
            np.testing.assert_allclose(gpu, cpu, rtol=1e-10, atol=1e-12)
