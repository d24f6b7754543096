"""Exploring properties: ``GradScaler`` against torch's documented update rule.

torch's rule per ``update()``: an inf/NaN gradient this iteration multiplies the scale by
``backoff_factor`` and resets the growth tracker; otherwise the tracker counts one more clean step
and, on reaching ``growth_interval``, the scale grows by ``growth_factor`` (if still finite) and the
tracker resets. A step with an inf/NaN gradient is skipped (parameters unchanged); a clean step sees
the gradients divided by the scale.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch import nn, optim
from neural_arch.amp import GradScaler
from neural_arch.core.tensor import Tensor


def _reference_scales(init, growth, backoff, interval, infs):
    scale, tracker, out = init, 0, []
    for bad in infs:
        if bad:
            scale, tracker = scale * backoff, 0
        else:
            tracker += 1
            if tracker == interval:
                scale, tracker = scale * growth, 0
        out.append((scale, tracker))
    return out


@settings(max_examples=25)
@given(infs=st.lists(st.booleans(), min_size=1, max_size=12), interval=st.integers(1, 4),
       growth=st.sampled_from([2.0, 1.5]), backoff=st.sampled_from([0.5, 0.25]),
       dtype=st.sampled_from([np.float64, np.float32, np.float16]), resume_at=st.integers(0, 12))
@example(infs=[False] * 6, interval=2, growth=2.0, backoff=0.5, dtype=np.float16, resume_at=3)
def test_scale_skip_and_update_follow_torch(infs, interval, growth, backoff, dtype, resume_at):
    init = 2.0**4
    scaler = GradScaler(init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    w = nn.Parameter(np.ones(3, dtype=dtype))
    opt = optim.SGD([w], lr=0.125)
    expected_w = np.ones(3, dtype=np.float64)
    true_grad = np.array([0.5, -0.25, 1.0])
    want = _reference_scales(init, growth, backoff, interval, infs)
    for i, bad in enumerate(infs):
        if i == resume_at:  # a checkpoint round trip into a fresh scaler must change nothing
            fresh = GradScaler(init_scale=1.0, growth_factor=3.0, backoff_factor=0.1, growth_interval=99)
            fresh.load_state_dict(copy.deepcopy(scaler.state_dict()))
            scaler = fresh
        scale = scaler.get_scale()
        g = (true_grad * scale).astype(dtype)
        if bad:
            g[1] = np.inf if i % 2 else np.nan
        w.grad = Tensor(g)
        before = w.data.copy()
        scaler.step(opt)
        scaler.update()
        if bad:
            np.testing.assert_array_equal(w.data, before)
        else:
            expected_w = expected_w - 0.125 * true_grad
            np.testing.assert_allclose(w.data.astype(np.float64), expected_w, rtol=0, atol=4e-3 if dtype == np.float16 else 1e-7)
        assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == want[i]


@pytest.mark.parametrize("scale", [2.0**25, 2.0**28, 3.0, 1000.0])
def test_float16_unscale_keeps_small_gradients(scale):
    """1/scale underflows in float16 past 2**24: the unscale must still give the true gradient, as
    torch's float32 multiply does (it used to give exact zeros, and the step went on)."""
    w = nn.Parameter(np.ones(3, np.float16))
    opt = optim.SGD([w], lr=1.0)
    scaler = GradScaler(init_scale=scale)
    true = np.array([1e-6, 3e-5, 2e-4])
    scaled = (true * scale).astype(np.float16)
    assert np.isfinite(scaled).all()
    w.grad = Tensor(scaled.copy())
    scaler.unscale_(opt)
    want = (scaled.astype(np.float32) * np.float32(1 / scale)).astype(np.float16)
    np.testing.assert_array_equal(w.grad.data, want)
    np.testing.assert_allclose(w.grad.data.astype(np.float64), true, rtol=2e-3, atol=1.2e-7)  # subnormal spacing


def test_unscale_then_clip_then_step_clips_true_gradients():
    w = nn.Parameter(np.zeros(4))
    opt = optim.SGD([w], lr=1.0)
    scaler = GradScaler(init_scale=2.0**10)
    true = np.array([3.0, 4.0, 0.0, 0.0])
    w.grad = Tensor(true * scaler.get_scale())
    scaler.unscale_(opt)
    optim.clip_grad_norm_([w], max_norm=1.0)
    scaler.step(opt)  # must not unscale a second time
    scaler.update()
    np.testing.assert_allclose(w.data, -true / 5.0, rtol=1e-6)  # clip_grad_norm_ adds 1e-6 to the norm


def test_misuse_is_a_clear_error():
    w = nn.Parameter(np.zeros(2))
    opt = optim.SGD([w], lr=1.0)
    scaler = GradScaler()
    w.grad = Tensor(np.ones(2))
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=1.0)


def test_autocast_region_casts_only_its_own_thread():
    """torch's autocast state is thread-local. A region open in one thread used to cast the ops of
    every other thread too (an evaluation thread silently computed its linear layers in bfloat16)."""
    import threading

    import neural_arch as na
    import neural_arch.nn.functional as F
    from neural_arch.amp import autocast, is_autocast_enabled

    layer = nn.Linear(4, 3)
    x = na.ones(2, 4)
    entered, checked, seen = threading.Event(), threading.Event(), {}

    def other_thread():
        entered.wait(30)
        seen["dtype"] = F.linear(x, layer.weight, layer.bias).dtype
        seen["enabled"] = is_autocast_enabled()
        checked.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with autocast("cpu"):
        assert F.linear(x, layer.weight, layer.bias).dtype.name == "bfloat16"
        entered.set()
        assert checked.wait(30)
    worker.join(30)
    assert seen == {"dtype": np.dtype(np.float32), "enabled": False}
    assert F.linear(x, layer.weight, layer.bias).dtype == np.float32
