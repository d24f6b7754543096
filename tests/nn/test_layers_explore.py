"""Exploring properties of the nn layers beyond attention/MoE against plain NumPy written from
torch's documented semantics: BatchNorm1d/2d (training and eval, running statistics with the
unbiased variance, momentum and momentum=None, affine and track_running_stats off, torch's error
for one value per channel), Linear without bias, Embedding, Dropout (eval, p=0, p=1, the 1/(1-p)
scale), Flatten/Unflatten, LayerNorm, the init fans of conv weights, nn.utils clipping and the
Module API (state_dict strict/non-strict, shared parameters, train/eval, non-persistent buffers).
Forward values and gradients in float64 (<= 1e-10) and float32.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor, nn


def _close(got, want, dtype, what="", f32_atol=1e-4):
    tol = {"atol": 1e-10, "rtol": 1e-10} if np.dtype(dtype) == np.float64 else {"atol": f32_atol, "rtol": 1e-4}
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, err_msg=what, **tol)


def _backward(out, seed=3):
    g = np.random.default_rng(seed).standard_normal(out.shape)
    (out * Tensor(g.astype(out.data.dtype))).sum().backward()
    return g


# ----------------------------------------------------------------------------- BatchNorm
bn_cases = st.fixed_dictionaries({
    "shape": st.sampled_from([(4, 3), (1, 2, 5), (3, 2, 1), (2, 3, 2, 3), (1, 2, 1, 2), (5, 1)]),
    "dtype": st.sampled_from([np.float64, np.float32]), "affine": st.booleans(), "track": st.booleans(),
    "momentum": st.sampled_from([0.1, None, 0.5, 0.0, 1.0]), "eps": st.sampled_from([1e-5, 0.1]),
    "steps": st.integers(1, 3), "offset": st.sampled_from([0.0, 50.0]), "seed": st.integers(0, 2**16),
})


def _bn_reference(x, g, weight, bias, eps, mean, var):
    """(y, dx, dw, db) of (x - mean) / sqrt(var + eps) * w + b with batch statistics."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    rstd = 1 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shape)) * rstd.reshape(shape)
    y = xhat * weight.reshape(shape) + bias.reshape(shape)
    gx = g * weight.reshape(shape)  # d loss / d xhat
    dx = rstd.reshape(shape) * (gx - gx.mean(axis=axes, keepdims=True)
                                - xhat * (gx * xhat).mean(axis=axes, keepdims=True))
    return y, dx, (g * xhat).sum(axis=axes), g.sum(axis=axes)


@settings(max_examples=25)
@given(bn_cases)
@example({"shape": (1, 2, 5), "dtype": np.float64, "affine": True, "track": True, "momentum": None, "eps": 1e-5,
          "steps": 3, "offset": 0.0, "seed": 0}).via("one sample of length 5 is 5 values per channel: allowed")
@example({"shape": (2, 3, 2, 3), "dtype": np.float32, "affine": False, "track": False, "momentum": 0.1,
          "eps": 1e-5, "steps": 2, "offset": 50.0, "seed": 1}).via("no affine, no running stats, eval uses the batch")
def test_batchnorm_train_then_eval_matches_numpy(case):
    shape, dtype, c = case["shape"], case["dtype"], case["shape"][1]
    cls = nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm1d
    bn = cls(c, eps=case["eps"], momentum=case["momentum"], affine=case["affine"],
             track_running_stats=case["track"], dtype=dtype)
    rng = np.random.default_rng(case["seed"])
    weight, bias = rng.normal(1, 0.5, c), rng.normal(0, 0.5, c)
    if case["affine"]:
        bn.weight.data[...], bn.bias.data[...] = weight, bias
        weight, bias = bn.weight.data.astype(np.float64), bn.bias.data.astype(np.float64)
    else:
        weight, bias = np.ones(c), np.zeros(c)
    axes = (0,) + tuple(range(2, len(shape)))
    count = int(np.prod(shape)) // c

    def close(got, want, what, var):
        # float32 loses ulp(offset) in x - mean, amplified by 1/sqrt(var + eps) twice in gradients
        rstd = 1 / np.sqrt(var.min() + case["eps"])
        _close(got, want, dtype, what, f32_atol=1e-4 + 1e-6 * case["offset"] * rstd ** 2)

    run_mean, run_var = np.zeros(c), np.ones(c)
    for step in range(1, case["steps"] + 1):
        x64 = (case["offset"] + rng.normal(0, 2, shape)).astype(dtype).astype(np.float64)
        x = Tensor(x64.astype(dtype), requires_grad=True)
        if count <= 1:
            with pytest.raises(ValueError, match="more than 1 value per channel"):
                bn(x)
            return
        if case["affine"]:
            bn.weight.grad = bn.bias.grad = None
        out = bn(x)
        assert out.dtype == dtype and out.shape == shape
        g = _backward(out)
        mean, var = x64.mean(axis=axes), x64.var(axis=axes)
        y, dx, dw, db = _bn_reference(x64, g, weight, bias, case["eps"], mean, var)
        close(out.data, y, "output", var)
        close(x.grad.data, dx, "input gradient", var)
        if case["affine"]:
            close(bn.weight.grad.data, dw, "weight gradient", var)
            close(bn.bias.grad.data, db, "bias gradient", var)
        # torch: running_var takes the unbiased variance; momentum None is a cumulative average
        factor = 1.0 / step if case["momentum"] is None else case["momentum"]
        run_mean = (1 - factor) * run_mean + factor * mean
        run_var = (1 - factor) * run_var + factor * var * count / (count - 1)
        if case["track"]:
            assert int(bn.num_batches_tracked.data) == step
            _close(bn.running_mean.data, run_mean, dtype, "running_mean")
            _close(bn.running_var.data, run_var, dtype, "running_var")
        else:
            assert bn.running_mean is None and bn.running_var is None and "running_mean" not in bn.state_dict()
    bn.eval()
    x64 = (case["offset"] + rng.normal(0, 2, (1,) + shape[1:])).astype(dtype).astype(np.float64)
    x = Tensor(x64.astype(dtype), requires_grad=True)
    if not case["track"] and x64.size // c <= 1:  # batch statistics of one value: torch's error too
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            bn(x)
        return
    out = bn(x)
    g = _backward(out)
    if case["track"]:  # running statistics are constants: the gradient is a per-channel scale
        bshape = (1, c) + (1,) * (len(shape) - 2)
        scale = (weight / np.sqrt(run_var + case["eps"])).reshape(bshape)
        _close(out.data, (x64 - run_mean.reshape(bshape)) * scale + bias.reshape(bshape), dtype, "eval output")
        _close(x.grad.data, g * scale, dtype, "eval input gradient")
        assert int(bn.num_batches_tracked.data) == case["steps"]  # eval does not count batches
    else:  # eval without running statistics: this batch's (torch)
        y, dx, _, _ = _bn_reference(x64, g, weight, bias, case["eps"], x64.mean(axis=axes), x64.var(axis=axes))
        var = x64.var(axis=axes)
        close(out.data, y, "eval output (batch statistics)", var)
        close(x.grad.data, dx, "eval input gradient (batch statistics)", var)


def test_batchnorm_arguments_and_inputs_are_checked():
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        nn.BatchNorm1d(3)(np.ones((2, 3, 1, 1)))
    with pytest.raises(ValueError, match="channels are dim 1"):
        nn.BatchNorm2d(3)(np.ones((2, 4, 2, 2)))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm2d(3)(np.ones((1, 3, 1, 1)))
    assert nn.BatchNorm2d(3).eval()(np.ones((1, 3, 1, 1))).shape == (1, 3, 1, 1)  # eval: any batch


# ----------------------------------------------------------------------------- Linear, Embedding, Dropout
@settings(max_examples=15)
@given(st.sampled_from([(3,), (2, 3), (2, 1, 3), (0, 3)]), st.integers(1, 3), st.booleans(),
       st.sampled_from([np.float64, np.float32]))
@example((3,), 2, False, np.float64).via("an unbatched vector, no bias")
def test_linear_matches_numpy(lead, out_features, bias, dtype):
    layer = nn.Linear(lead[-1], out_features, bias=bias, dtype=dtype)
    assert (layer.bias is None) == (not bias) and len(list(layer.parameters())) == 1 + bias
    x64 = np.random.default_rng(0).standard_normal(lead).astype(dtype).astype(np.float64)
    x = Tensor(x64.astype(dtype), requires_grad=True)
    out = layer(x)
    w = layer.weight.data.astype(np.float64)
    want = x64 @ w.T + (layer.bias.data.astype(np.float64) if bias else 0)
    assert out.shape == want.shape and out.dtype == dtype
    _close(out.data, want, dtype)
    g = _backward(out)
    _close(x.grad.data, g @ w, dtype, "input gradient")
    _close(layer.weight.grad.data, g.reshape(-1, out_features).T @ x64.reshape(-1, lead[-1]), dtype, "weight")
    if bias:
        _close(layer.bias.grad.data, g.reshape(-1, out_features).sum(axis=0), dtype, "bias")


@settings(max_examples=15)
@given(st.integers(1, 6), st.integers(1, 3), st.lists(st.integers(0, 5), min_size=0, max_size=7),
       st.sampled_from([np.float64, np.float32]))
@example(3, 2, [1, 1, 1, 0], np.float64).via("repeated indices accumulate their gradients")
def test_embedding_rows_and_scatter_gradient(num, dim, ids, dtype):
    emb = nn.Embedding(num, dim, dtype=dtype)
    ids = np.array([i % num for i in ids], dtype=np.int64).reshape(-1, 1)
    out = emb(ids)
    assert out.shape == (len(ids), 1, dim)
    np.testing.assert_array_equal(out.data, emb.weight.data[ids])
    g = _backward(out)
    want = np.zeros((num, dim))
    np.add.at(want, ids.ravel(), g.reshape(-1, dim))
    _close(emb.weight.grad.data, want, dtype, "weight gradient")


@settings(max_examples=10)
@given(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]), st.sampled_from([np.float64, np.float32]),
       st.sampled_from(["Dropout", "Dropout2d"]))
@example(1.0, np.float32, "Dropout").via("p=1 drops everything (no division by zero)")
def test_dropout_train_scale_and_eval_identity(p, dtype, kind):
    na.manual_seed(0)
    layer = getattr(nn, kind)(p)
    x = Tensor(np.random.default_rng(0).uniform(1, 2, (4, 5, 3, 3)).astype(dtype), requires_grad=True)
    out = layer(x)
    assert out.dtype == dtype and out.shape == x.shape
    kept = out.data != 0
    if p == 1.0:
        assert not kept.any()
    else:
        # every kept value is x / (1 - p); p=0 returns the input itself
        np.testing.assert_allclose(out.data[kept], (x.data / dtype(1 - p))[kept], rtol=1e-6)
        if p == 0.0:
            assert out is x
        if kind == "Dropout2d":  # whole channels
            assert (kept.all(axis=(2, 3)) | ~kept.any(axis=(2, 3))).all()
    if out is not x:
        out.sum().backward()
        scale = 0.0 if p == 1.0 else 1 / (1 - p)
        np.testing.assert_allclose(x.grad.data, np.where(kept, scale, 0.0), rtol=1e-6)
    layer.eval()
    assert layer(x) is x


# ----------------------------------------------------------------------------- Flatten, Unflatten, LayerNorm
@settings(max_examples=15)
@given(st.sampled_from([(2, 3, 4), (1, 1), (2, 0, 3), (5,)]), st.integers(-3, 2), st.integers(-3, 2))
@example((2, 0, 3), 1, -1).via("an empty dim")
def test_flatten_matches_numpy_reshape(shape, start, end):
    nd = len(shape)
    if not (-nd <= start < nd and -nd <= end < nd) or start % nd > end % nd:
        with pytest.raises((ValueError, IndexError, RuntimeError)):  # torch: IndexError / RuntimeError
            nn.Flatten(start, end)(np.zeros(shape))
        return
    s, e = start % nd, end % nd
    want = shape[:s] + (int(np.prod(shape[s:e + 1])),) + shape[e + 1:]
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    out = nn.Flatten(start, end)(x)
    np.testing.assert_array_equal(out.data, x.reshape(want))


@pytest.mark.parametrize("dim,sizes,shape,want", [
    (1, (2, 3), (4, 6), (4, 2, 3)), (-1, (2, -1), (4, 6), (4, 2, 3)), (0, (1, 4), (4, 6), (1, 4, 6)),
])
def test_unflatten_matches_numpy(dim, sizes, shape, want):
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    out = nn.Unflatten(dim, sizes)(x)
    np.testing.assert_array_equal(out.data, x.reshape(want))
    with pytest.raises(ValueError):
        nn.Unflatten(dim, (5, 5))(x)  # the sizes must multiply to the unflattened dim


@settings(max_examples=15)
@given(st.sampled_from([((2, 3), 3), ((2, 3, 4), (3, 4)), ((1, 5), 5), ((2, 1), 1)]), st.booleans(),
       st.sampled_from([np.float64, np.float32]), st.sampled_from([1e-5, 0.5]))
@example(((2, 1), 1), True, np.float64, 1e-5).via("a single normalised element: the output is the bias")
def test_layernorm_matches_numpy(shapes, affine, dtype, eps):
    shape, normalized = shapes
    norm = nn.LayerNorm(normalized, eps=eps, elementwise_affine=affine, dtype=dtype)
    k = 1 if isinstance(normalized, int) else len(normalized)
    rng = np.random.default_rng(1)
    w = rng.normal(1, 0.3, shape[-k:]) if affine else np.ones(shape[-k:])
    b = rng.normal(0, 0.3, shape[-k:]) if affine else np.zeros(shape[-k:])
    if affine:
        norm.weight.data[...], norm.bias.data[...] = w, b
        w, b = norm.weight.data.astype(np.float64), norm.bias.data.astype(np.float64)
    x64 = (10 + rng.standard_normal(shape)).astype(dtype).astype(np.float64)
    x = Tensor(x64.astype(dtype), requires_grad=True)
    out = norm(x)
    axes = tuple(range(len(shape) - k, len(shape)))
    mean, var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
    xhat = (x64 - mean) / np.sqrt(var + eps)
    _close(out.data, xhat * w + b, dtype, "output")
    g = _backward(out)
    gx = g * w
    want = (gx - gx.mean(axis=axes, keepdims=True) - xhat * (gx * xhat).mean(axis=axes, keepdims=True)) / np.sqrt(
        var + eps)
    _close(x.grad.data, want, dtype, "input gradient")
    if affine:
        lead = tuple(range(len(shape) - k))
        _close(norm.weight.grad.data, (g * xhat).sum(axis=lead), dtype, "weight gradient")
        _close(norm.bias.grad.data, g.sum(axis=lead), dtype, "bias gradient")


# ----------------------------------------------------------------------------- init
@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (4, 2, 5), (6, 4), (5, 1, 1, 1)])
def test_init_fans_follow_torch_for_conv_weights(shape):
    """torch: fan_in = shape[1] * prod(shape[2:]), fan_out = shape[0] * prod(shape[2:])."""
    receptive = int(np.prod(shape[2:]))
    # 200 output rows: enough samples to see the bound; fan_out grows with them
    p = nn.Parameter(np.zeros((200,) + shape[1:]))
    fan_in_big, fan_out_big = shape[1] * receptive, 200 * receptive
    checks = [
        (lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)), math.sqrt(3) * math.sqrt(2 / 6) / math.sqrt(fan_in_big)),
        (lambda t: nn.init.kaiming_uniform_(t, mode="fan_out", nonlinearity="relu"),
         math.sqrt(3) * math.sqrt(2) / math.sqrt(fan_out_big)),
        (lambda t: nn.init.xavier_uniform_(t, gain=2.0), 2.0 * math.sqrt(6 / (fan_in_big + fan_out_big))),
    ]
    for fill, bound in checks:
        fill(p)
        assert np.abs(p.data).max() <= bound and np.abs(p.data).max() > 0.9 * bound
    nn.init.kaiming_normal_(p, nonlinearity="relu")
    assert abs(p.data.std() / (math.sqrt(2) / math.sqrt(fan_in_big)) - 1) < 0.1
    conv = nn.Conv2d(shape[1], 8, 3) if len(shape) == 4 else None
    if conv is not None:  # the layer default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        assert np.abs(conv.weight.data).max() <= 1 / math.sqrt(shape[1] * 9)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        nn.init.xavier_uniform_(nn.Parameter(np.zeros(3)))
    assert nn.init.calculate_gain("leaky_relu") == math.sqrt(2 / (1 + 0.01 ** 2))
    assert nn.init.calculate_gain("conv2d") == nn.init.calculate_gain("sigmoid") == 1.0


# ----------------------------------------------------------------------------- nn.utils
@settings(max_examples=20)
@given(st.lists(st.sampled_from([(3,), (2, 2), (0,), (1,)]), min_size=1, max_size=3),
       st.sampled_from([2.0, 1.0, math.inf, 3.0]), st.sampled_from([0.5, 1e3]), st.integers(0, 100))
@example([(0,)], 2.0, 0.5, 0).via("only empty gradients: the norm is 0 and nothing changes")
def test_clip_grad_norm_matches_numpy(shapes, norm_type, max_norm, seed):
    rng = np.random.default_rng(seed)
    params = [nn.Parameter(np.zeros(s)) for s in shapes]
    grads = [rng.standard_normal(s) * 3 for s in shapes]
    for p, g in zip(params, grads):
        p.grad = Tensor(g.copy())
    flat = np.concatenate([g.ravel() for g in grads])
    total = (np.abs(flat).max(initial=0.0) if math.isinf(norm_type)
             else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type))
    got = nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    assert abs(float(got) - total) <= 1e-10 * max(total, 1)
    coef = min(1.0, max_norm / (total + 1e-6))
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.data, g * coef, rtol=1e-12, atol=1e-300)


def test_clip_grad_norm_nonfinite_and_clip_grad_value():
    p = nn.Parameter(np.zeros(3))
    p.grad = Tensor(np.array([1.0, np.nan, 2.0]))
    with pytest.raises(RuntimeError, match="nonfinite|NaN|inf"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isnan(float(nn.utils.clip_grad_norm_([p], 1.0)))
    q = nn.Parameter(np.zeros(4))
    q.grad = Tensor(np.array([-3.0, -0.5, 0.25, 9.0]))
    nn.utils.clip_grad_value_([q], 0.5)
    np.testing.assert_array_equal(q.grad.data, [-0.5, -0.5, 0.25, 0.5])


# ----------------------------------------------------------------------------- Module API
class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2, dtype=np.float64)
        self.b = nn.Linear(2, 2, dtype=np.float64)
        self.b.weight = self.a.weight  # tied
        self.shared = self.a           # the same module under two names
        self.register_buffer("scale", Tensor(np.ones(2)))
        self.register_buffer("cache", Tensor(np.zeros(2)), persistent=False)
        self.drop = nn.Sequential(nn.Dropout(0.5), nn.Sequential(nn.BatchNorm1d(2)))


def test_module_parameters_state_dict_and_modes():
    m = _Tied()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["a.weight", "a.bias", "b.bias", "drop.1.0.weight", "drop.1.0.bias"]  # each once
    assert len(list(m.parameters())) == len(set(map(id, m.parameters())))
    sd = m.state_dict()
    assert "cache" not in sd and "scale" in sd and "drop.1.0.running_var" in sd
    # a tied parameter is saved under each of its names (torch)
    assert {"a.weight", "b.weight"} <= set(sd)
    m.eval()
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(mod.training for mod in m.modules())
    with pytest.raises(ValueError):
        m.train("yes")

    fresh = _Tied()
    result = fresh.load_state_dict(sd)
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    np.testing.assert_array_equal(fresh.a.weight.data, m.a.weight.data)
    sd["a.weight"][...] = 7.0  # the module holds a copy, not the checkpoint's array
    assert not (fresh.a.weight.data == 7.0).any()

    partial = {k: v for k, v in m.state_dict().items() if k != "a.bias"} | {"extra": np.ones(1), "cache": np.ones(2)}
    with pytest.raises(RuntimeError, match="a.bias") as err:
        _Tied().load_state_dict(partial)
    assert "extra" in str(err.value) and "cache" in str(err.value)  # a non-persistent buffer is unexpected
    other = _Tied()
    before = other.a.bias.data.copy()
    result = other.load_state_dict(partial, strict=False)
    assert list(result.missing_keys) == ["a.bias"] and sorted(result.unexpected_keys) == ["cache", "extra"]
    np.testing.assert_array_equal(other.a.bias.data, before)
    np.testing.assert_array_equal(other.b.bias.data, m.b.bias.data)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _Tied().load_state_dict(m.state_dict() | {"a.bias": np.zeros(3)}, strict=False)


@settings(max_examples=10)
@given(st.lists(st.sampled_from([(2, 3), (1,), (0,), (2, 1, 2)]), min_size=1, max_size=4),
       st.sampled_from([np.float64, np.float32]))
@example([(0,)], np.float64).via("an empty parameter takes no slice")
def test_parameters_to_vector_round_trip(shapes, dtype):
    params = [nn.Parameter(np.random.default_rng(i).standard_normal(s).astype(dtype)) for i, s in enumerate(shapes)]
    vec = nn.utils.parameters_to_vector(params)
    np.testing.assert_array_equal(vec.data, np.concatenate([p.data.ravel() for p in params]))
    (vec * Tensor(np.arange(vec.shape[0], dtype=dtype))).sum().backward()  # differentiable, like torch
    start = 0
    for p in params:
        np.testing.assert_array_equal(p.grad.data.ravel(), np.arange(start, start + p.data.size))
        start += p.data.size
    arrays = [p.data for p in params]
    nn.utils.vector_to_parameters(Tensor(vec.data * 2 + 1), params)
    for p, a in zip(params, arrays):
        assert p.data is a  # in place: optimizers holding the arrays see the values
    np.testing.assert_array_equal(nn.utils.parameters_to_vector(params).data, vec.data * 2 + 1)
    for bad in (np.zeros(vec.shape[0] + 1), np.zeros(max(vec.shape[0] - 1, 0) if vec.shape[0] else 1)):
        with pytest.raises(ValueError, match="elements"):  # torch would silently ignore a longer vector
            nn.utils.vector_to_parameters(Tensor(bad), params)
    with pytest.raises(TypeError, match="expected a Tensor"):
        nn.utils.vector_to_parameters(vec.data, params)


def test_register_never_replaces_another_kind_of_attribute():
    """torch: KeyError "attribute 'x' already exists". register_buffer('weight') used to turn a
    Linear's weight into a buffer, and register_parameter('training') to replace the mode flag."""
    m = nn.Linear(2, 2)
    m.note = "plain attribute"
    for register, name in [(m.register_buffer, "weight"), (m.register_parameter, "training"),
                           (m.register_buffer, "note"), (m.add_module, "bias"), (m.register_parameter, "forward")]:
        value = nn.Parameter(np.ones(1)) if register == m.register_parameter else (
            nn.ReLU() if register == m.add_module else np.ones(1))
        with pytest.raises(KeyError, match="already exists"):
            register(name, value)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"] and m.training is True
    m.register_buffer("stat", np.zeros(1))
    m.register_buffer("stat", np.ones(1))  # the same kind: replaced, as torch
    m.register_parameter("bias", None)
    assert float(m.stat.data[0]) == 1.0 and m.bias is None


def test_container_index_must_be_an_integer():
    """torch: a float index is a TypeError; ModuleList[0.5] used to return item 0."""
    layers = nn.ModuleList([nn.ReLU(), nn.Tanh()])
    with pytest.raises(TypeError):
        layers[0.5]
    with pytest.raises(TypeError):
        nn.Sequential(nn.ReLU())[1.0] = nn.Tanh()
    assert type(layers[np.int64(-1)]).__name__ == "Tanh"


@settings(max_examples=15)
@given(st.integers(2, 6), st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(-6, 5),
       st.sampled_from([None, 0.5, 2.0]), st.sampled_from([1.0, 2.0]))
@example(3, [0, 0, 2, 1], 0, None, 2.0).via("repeated padding index: still no gradient for its row")
@example(4, [3, 1, 3], -1, 0.5, 1.0).via("negative padding_idx counts from the end; max_norm with norm_type 1")
def test_embedding_padding_idx_and_max_norm_follow_torch(num, ids, padding_idx, max_norm, norm_type):
    if not -num <= padding_idx < num:
        with pytest.raises(ValueError, match="padding_idx"):
            nn.Embedding(num, 2, padding_idx=padding_idx)
        return
    emb = nn.Embedding(num, 2, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type, dtype=np.float64)
    pad = padding_idx % num
    assert emb.padding_idx == pad and not emb.weight.data[pad].any()  # the padding row starts at zero
    emb.weight.data[...] = np.random.default_rng(num).normal(0, 2, (num, 2))
    ids = np.array([i % num for i in ids])
    before = emb.weight.data.copy()
    out = emb(ids)
    want_table = before.copy()
    if max_norm is not None:  # rows looked up are renormalised in place, the others untouched
        for r in np.unique(ids):
            norm = (np.abs(before[r]) ** norm_type).sum() ** (1 / norm_type)
            if norm > max_norm:
                want_table[r] = before[r] * max_norm / (norm + 1e-7)
    np.testing.assert_allclose(emb.weight.data, want_table, rtol=1e-12, atol=0)
    np.testing.assert_allclose(out.data, want_table[ids], rtol=1e-12, atol=0)
    g = _backward(out)
    want = np.zeros((num, 2))
    np.add.at(want, ids, g)
    want[pad] = 0
    _close(emb.weight.grad.data, want, np.float64, "weight gradient")


def test_embedding_padding_row_still_learns_through_a_tied_use_and_from_pretrained():
    emb = nn.Embedding(3, 2, padding_idx=1, dtype=np.float64)
    emb.weight.data[...] = 1.0
    out = emb(np.array([1, 1])).sum() + (Tensor(np.ones((1, 2))) @ emb.weight.T).sum()  # a tied head
    out.backward()
    np.testing.assert_array_equal(emb.weight.grad.data, np.ones((3, 2)))  # only the head's gradient
    frozen = nn.Embedding.from_pretrained(np.eye(3))
    assert not frozen.weight.requires_grad and frozen(np.array([2])).tolist() == [[0.0, 0.0, 1.0]]
    assert nn.Embedding.from_pretrained(np.eye(3), freeze=False).weight.requires_grad
    with pytest.raises(NotImplementedError):
        nn.Embedding(3, 2, sparse=True)
    assert repr(nn.Embedding(3, 2, padding_idx=-1)) == "Embedding(3, 2, padding_idx=2)"


@pytest.mark.parametrize("name", ["neural_arch.nn.linear", "neural_arch.nn.utils.convert_parameters",
                                  "neural_arch.nn.module", "neural_arch.nn.container", "neural_arch.nn.init"])
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0 and result.attempted > 0, f"{result.failed} docstring example(s) failed in {name}"


@pytest.mark.parametrize("mean,std,a,b", [(0.0, 1.0, 10.0, 11.0), (1.0, 2.0, -30.0, -20.0), (0.0, 1.0, 2.0, 2.01),
                                          (0.0, 0.02, -0.04, 0.04)])
def test_trunc_normal_in_a_far_tail_ends_and_has_the_right_mean(mean, std, a, b):
    """Rejection sampling used to loop forever when [a, b] lies far in a tail (10 std: never)."""
    p = nn.Parameter(np.zeros((100, 100)))
    nn.init.trunc_normal_(p, mean=mean, std=std, a=a, b=b)
    alpha, beta = (a - mean) / std, (b - mean) / std
    if alpha > 0:  # the same law mirrored into the left tail, where erfc keeps its digits
        alpha, beta, sign = -beta, -alpha, -1.0
    else:
        sign = 1.0
    cdf = lambda z: 0.5 * math.erfc(-z / math.sqrt(2))
    pdf = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    want = mean + sign * std * (pdf(alpha) - pdf(beta)) / (cdf(beta) - cdf(alpha))
    assert a <= p.data.min() and p.data.max() <= b
    assert abs(p.data.mean() - want) < 0.02 * (b - a), (p.data.mean(), want)
    with pytest.raises(ValueError, match="a < b"):
        nn.init.trunc_normal_(p, a=1.0, b=-1.0)


def test_embedding_max_norm_checks_the_indices_before_rescaling_any_row():
    """A bad index fails before the in-place renorm (found: -1 rescaled the last row, 1.5 row 1)."""
    emb = nn.Embedding(5, 3, max_norm=0.5, dtype=np.float64)
    emb.weight.data[...] = 2.0
    before = emb.weight.data.copy()
    for bad, error in ((np.array([-1]), IndexError), (np.array([1.5]), TypeError)):
        with pytest.raises(error):
            emb(bad)
        assert np.array_equal(emb.weight.data, before)


def test_rms_norm_default_eps_works_in_bfloat16():
    """eps=None is the dtype's machine epsilon; NumPy's finfo refuses bfloat16 (found: a ValueError)."""
    import neural_arch.nn.functional as F
    from neural_arch.core import dtypes

    out = F.rms_norm(Tensor(np.ones((2, 4), dtype=dtypes.bfloat16)), (4,))
    assert out.dtype == dtypes.bfloat16 and np.allclose(out.data.astype(np.float32), 1.0, atol=1e-2)
