"""Image layers: ``Conv2d``, pooling, ``BatchNorm1d/2d`` (train/eval, running statistics,
momentum, ``num_batches_tracked``), ``Dropout2d``, ``Flatten``, ``Identity``, ``nn.utils`` and a
small CNN that learns; plus the doctests of the new modules."""

from __future__ import annotations

import doctest
import importlib
import math

import numpy as np
import pytest

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch import nn, optim


# ----------------------------------------------------------------------------- Conv2d
def test_conv2d_layer_shapes_init_and_repr():
    na.manual_seed(0)
    conv = nn.Conv2d(4, 6, (3, 2), stride=2, padding=1, dilation=(2, 1), groups=2)
    assert conv.weight.shape == (6, 2, 3, 2) and conv.bias.shape == (6,)
    assert repr(conv) == ("Conv2d(4, 6, kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), "
                          "dilation=(2, 1), groups=2)")
    bound = 1 / math.sqrt(2 * 3 * 2)  # fan_in = in_channels / groups * kH * kW
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.bias.numpy()).max() <= bound
    x = na.randn(3, 4, 9, 8)
    y = conv(x)
    np.testing.assert_allclose(
        y.numpy(), F.conv2d(x, conv.weight, conv.bias, 2, 1, (2, 1), 2).numpy())
    assert y.shape == (3, 6, 4, 5) and y.dtype == np.float32
    assert nn.Conv2d(3, 8, 3, bias=False).bias is None
    assert nn.Conv2d(3, 8, 4, padding="same")(na.randn(1, 3, 7, 7)).shape == (1, 8, 7, 7)
    assert nn.Conv2d(3, 8, 3, dtype=na.float64).weight.dtype == np.float64
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 6, 3, groups=2)
    with pytest.raises(ValueError, match="strided"):
        nn.Conv2d(3, 6, 3, stride=2, padding="same")


@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")])
def test_conv2d_padding_modes(mode, np_mode):
    conv = nn.Conv2d(2, 3, 3, padding=(1, 2), padding_mode=mode, dtype=na.float64)
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5))
    ref = F.conv2d(na.tensor(np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)), mode=np_mode)), conv.weight, conv.bias)
    np.testing.assert_allclose(conv(x).numpy(), ref.numpy(), atol=1e-12)
    assert f"padding_mode='{mode}'" in repr(conv)


# ----------------------------------------------------------------------------- pooling, misc layers
def test_pooling_flatten_identity_layers():
    x = na.randn(2, 3, 7, 7)
    assert nn.MaxPool2d(2)(x).shape == (2, 3, 3, 3)
    assert nn.MaxPool2d(2, ceil_mode=True)(x).shape == (2, 3, 4, 4)
    out, idx = nn.MaxPool2d(3, stride=2, return_indices=True)(x)
    assert out.shape == idx.shape == (2, 3, 3, 3) and idx.dtype == np.int64
    assert nn.AvgPool2d(3, stride=2, padding=1)(x).shape == (2, 3, 4, 4)
    assert nn.AdaptiveAvgPool2d(1)(x).shape == (2, 3, 1, 1)
    np.testing.assert_allclose(nn.AdaptiveAvgPool2d((1, 1))(x).numpy()[..., 0, 0],
                               x.numpy().mean(axis=(2, 3)), rtol=1e-5)
    assert nn.Flatten()(x).shape == (2, 147) and nn.Flatten(0, 1)(x).shape == (6, 7, 7)
    assert nn.Identity(54, unused="x")(x) is x
    assert repr(nn.MaxPool2d(2)) == "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
    assert repr(nn.AdaptiveAvgPool2d((2, 3))) == "AdaptiveAvgPool2d(output_size=(2, 3))"


def test_dropout2d_layer_train_and_eval():
    na.manual_seed(0)
    layer = nn.Dropout2d(0.5)
    x = na.ones(8, 16, 4, 4)
    y = layer(x).numpy().reshape(8, 16, 16)
    assert (y.min(axis=2) == y.max(axis=2)).all() and 0.25 < (y[:, :, 0] == 0).mean() < 0.75
    assert layer.eval()(x) is x
    assert repr(nn.Dropout2d(0.2)) == "Dropout2d(p=0.2)"
    with pytest.raises(ValueError, match="p must be"):
        nn.Dropout2d(2.0)


# ----------------------------------------------------------------------------- BatchNorm
def test_batchnorm2d_train_then_eval_matches_manual_running_stats():
    rng = np.random.default_rng(0)
    bn = nn.BatchNorm2d(3, momentum=0.2, dtype=na.float64)
    rm, rv = np.zeros(3), np.ones(3)
    for _ in range(3):
        x = rng.standard_normal((4, 3, 2, 5)) * 3 + 1
        y = bn(x)
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        ref = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
        np.testing.assert_allclose(y.numpy(), ref, atol=1e-10)
        rm = 0.8 * rm + 0.2 * mean
        rv = 0.8 * rv + 0.2 * x.var(axis=(0, 2, 3), ddof=1)  # running var is unbiased (torch)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, atol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, atol=1e-12)
    assert bn.num_batches_tracked.item() == 3 and bn.num_batches_tracked.dtype == np.int64
    bn.eval()
    x = rng.standard_normal((1, 3, 2, 2))
    ref = (x - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5)
    np.testing.assert_allclose(bn(x).numpy(), ref, atol=1e-10)
    assert bn.num_batches_tracked.item() == 3  # eval does not count batches


def test_batchnorm_momentum_none_is_a_cumulative_average():
    bn = nn.BatchNorm1d(2, momentum=None, dtype=na.float64)
    rng = np.random.default_rng(1)
    means = []
    for _ in range(4):
        x = rng.standard_normal((5, 2)) + 3
        bn(x)
        means.append(x.mean(axis=0))
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean(means, axis=0), atol=1e-12)


def test_batchnorm_options_and_gradients():
    x = np.random.default_rng(2).standard_normal((6, 3, 4))
    bn = nn.BatchNorm1d(3, affine=False, track_running_stats=False, dtype=na.float64)
    assert list(bn.parameters()) == [] and bn.running_mean is None and bn.num_batches_tracked is None
    assert sorted(bn.state_dict()) == []
    y_train = bn(x).numpy()
    np.testing.assert_allclose(bn.eval()(x).numpy(), y_train)  # no running stats: batch stats in eval
    bn2 = nn.BatchNorm1d(3, eps=1e-3, dtype=na.float64)
    xt = na.tensor(x, requires_grad=True)
    out = bn2(xt)
    (out * na.tensor(np.arange(72.0).reshape(6, 3, 4))).sum().backward()
    assert xt.grad.shape == x.shape and bn2.weight.grad.shape == (3,) and bn2.bias.grad.shape == (3,)
    np.testing.assert_allclose(xt.grad.numpy().sum(axis=(0, 2)), 0, atol=1e-9)  # mean removed
    assert repr(bn2) == "BatchNorm1d(3, eps=0.001, momentum=0.1, affine=True, track_running_stats=True)"
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        bn2(na.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(3)(na.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="channels"):
        nn.BatchNorm2d(3)(na.zeros(2, 4, 4, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm1d(3)(na.zeros(1, 3))


def test_batchnorm_state_dict_save_load_and_dtype_moves(tmp_path):
    bn = nn.BatchNorm2d(2)
    bn(na.randn(3, 2, 4, 4) * 5)
    na.save(bn.state_dict(), tmp_path / "bn.safetensors")
    fresh = nn.BatchNorm2d(2)
    fresh.load_state_dict(na.load(tmp_path / "bn.safetensors"))
    np.testing.assert_array_equal(fresh.running_var.numpy(), bn.running_var.numpy())
    assert fresh.num_batches_tracked.item() == 1
    fresh.to(na.float64)
    assert fresh.running_mean.dtype == np.float64 and fresh.num_batches_tracked.dtype == np.int64
    fresh.reset_running_stats()
    assert fresh.num_batches_tracked.item() == 0 and fresh.running_var.numpy().tolist() == [1.0, 1.0]


# ----------------------------------------------------------------------------- nn.utils, training
def test_nn_utils_reexports_clipping():
    from neural_arch.optim import clip

    assert nn.utils.clip_grad_norm_ is clip.clip_grad_norm_
    assert nn.utils.clip_grad_value_ is clip.clip_grad_value_
    p = nn.Parameter(na.zeros(3))
    p.grad = na.tensor([0.5, -2.0, 3.0])
    nn.utils.clip_grad_value_([p], 1.0)
    assert p.grad.tolist() == [0.5, -1.0, 1.0]


def _bars(n, rng):
    """8x8 images of a horizontal, vertical, diagonal or anti-diagonal bar at a random offset."""
    X = rng.normal(0, 0.3, size=(n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 4, size=n)
    for i, (label, off) in enumerate(zip(y, rng.integers(0, 8, size=n))):
        if label == 0:
            X[i, 0, off, :] += 1
        elif label == 1:
            X[i, 0, :, off] += 1
        elif label == 2:
            X[i, 0] += np.eye(8, k=int(off) - 4, dtype=np.float32)
        else:
            X[i, 0] += np.fliplr(np.eye(8, k=int(off) - 4, dtype=np.float32))
    return na.tensor(X), na.tensor(y)


def test_small_cnn_learns():
    na.manual_seed(0)
    rng = np.random.default_rng(0)
    X, y = _bars(256, rng)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Dropout(0.1), nn.Linear(16, 4),
    )
    opt = optim.Adam(model.parameters(), lr=0.02)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for step in range(40):
        idx = slice((step % 4) * 64, (step % 4 + 1) * 64)
        loss = loss_fn(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4]), losses
    model.eval()
    Xt, yt = _bars(256, rng)
    with na.no_grad():
        acc = (model(Xt).argmax(dim=1) == yt).float().mean().item()
    assert acc > 0.8, acc


@pytest.mark.parametrize("name", ["neural_arch.nn.conv", "neural_arch.nn.pooling", "neural_arch.nn.batchnorm",
                                  "neural_arch.nn.flatten", "neural_arch.nn.utils", "neural_arch.nn.normalization"])
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
