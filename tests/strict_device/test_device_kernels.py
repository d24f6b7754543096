"""The device kernels (neural_arch.core.device_kernels) on the strict fake device: each kernel equals its
unfused formula in float32 and float64, the fused ops' device paths launch them, and their values and
gradients equal the NumPy path's, all without the host waiting for the device or copying to it.

On the fake device a kernel's CUDA C source is evaluated over the fake's arrays (what a GPU compiles
is what runs here); ``benchmarks/gpu_check.py`` compiles the same kernels on a GPU.
"""

from __future__ import annotations

import copy

import fake_device as fd
import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import backend, optim
from neural_arch.core import device_kernels
from neural_arch.core.device_kernels.kernel import ElementwiseKernel, ReductionKernel
from neural_arch.core.tensor import Tensor
from neural_arch.nn.parameter import Parameter

pytestmark = pytest.mark.usefixtures("fake")

DTYPES = [np.float32, np.float64]
#: per dtype: (rtol, atol) of "equal" -- float64 to the rounding of a reordered sum, float32 to its own
TOL = {np.float32: (2e-6, 2e-6), np.float64: (1e-12, 1e-12)}


def _to_fake(a):
    return backend.to_device(a, "fake") if isinstance(a, np.ndarray) else a


def _host(a):
    return backend.to_host(a) if backend.is_device_array(a) else np.asarray(a)


def _tuple(r):
    return r if isinstance(r, tuple) else (r,)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(device_kernels.KERNELS))
def test_each_kernel_equals_its_unfused_formula(name, dtype):
    kernel = device_kernels.KERNELS[name]
    args, kwargs = kernel.example(np.random.default_rng(7), dtype)
    fused_args = [_to_fake(copy.deepcopy(a)) for a in args]
    unfused_args = [_to_fake(copy.deepcopy(a)) for a in args]
    with fd.counting() as ev:
        fused = _tuple(kernel(fd.xp, *fused_args, **kwargs))
    unfused = _tuple(kernel.reference(fd.xp, *unfused_args, **kwargs))
    assert ev.host_waits == [] and ev.from_host == [], f"{name} left the device: {ev}"
    assert len(fused) == len(unfused)
    rtol, atol = TOL[dtype]
    for i, (f, u) in enumerate(zip(fused, unfused)):
        assert type(f) is fd.FakeArray, f"{name}: output {i} is not a device array"
        assert f.dtype == dtype, f"{name}: output {i} is {f.dtype}, not {np.dtype(dtype)} (a silent promotion)"
        np.testing.assert_allclose(_host(f), _host(u), rtol=rtol, atol=atol, err_msg=f"{name} output {i}")


def test_a_kernel_refuses_mismatched_dtypes_as_cupy_does():
    x32, x64 = fd.wrap(np.ones(3, np.float32)), fd.wrap(np.ones(3))
    with pytest.raises(TypeError, match="mismatched"):
        device_kernels.KERNELS["softmax_out"](fd.xp, x32, x64, x64)


# ------------------------------------------------------------------------------------ the ops' device paths
@pytest.fixture
def launched(monkeypatch):
    """The names of the kernels evaluated while the test runs."""
    names = []
    for cls in (ElementwiseKernel, ReductionKernel):
        original = cls.evaluate

        def spy(self, *args, _original=original, **kwargs):
            names.append(self.name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "evaluate", spy)
    return names


def _ce(x):
    return F.cross_entropy(x, np.array([0, 2, 1, 3, 2]), label_smoothing=0.1)


def _ce_3d(x):
    return F.cross_entropy(x.reshape(1, 5, 4).transpose(0, 2, 1), np.array([[0, 3, -100, 1, 2]]), reduction="sum")


OPS = {  # name -> (function of the input Tensor, the kernels its forward and backward launch)
    "gelu": (lambda x: F.gelu(x), {"gelu_erf_grad"}),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), {"gelu_tanh_grad"}),
    "softmax": (lambda x: F.softmax(x, dim=-1), {"sum_exp_shifted", "softmax_out", "sum_product", "softmax_grad"}),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1), {"log_sum_exp_shifted", "log_softmax_out",
                                                         "log_softmax_grad"}),
    "layer_norm": (None, {"sum_squared_deviation", "layer_norm_out", "sum_product", "sum_product3",
                          "layer_norm_grad"}),
    "layer_norm_plain": (lambda x: F.layer_norm(x, (4,)), {"sum_squared_deviation", "layer_norm_out", "sum_product",
                                                            "layer_norm_grad"}),
    "cross_entropy": (_ce, {"log_sum_exp_shifted", "log_softmax_out", "cross_entropy_grad"}),
    "cross_entropy_3d": (_ce_3d, {"log_sum_exp_shifted", "log_softmax_out", "cross_entropy_grad"}),
}


def _run(op, dtype, device):
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((5, 4)).astype(dtype), device=device, requires_grad=True)
    params = []
    if op == "layer_norm":
        w = Tensor(rng.standard_normal(4).astype(dtype), device=device, requires_grad=True)
        b = Tensor(rng.standard_normal(4).astype(dtype), device=device, requires_grad=True)
        params = [w, b]
        out = F.layer_norm(x, (4,), w, b)
    else:
        out = OPS[op][0](x)
    upstream = Tensor(rng.standard_normal(out.shape).astype(out.dtype), device=device)
    with fd.counting() as ev:
        out.backward(upstream)
    return out, [x] + params, ev


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_the_device_path_runs_the_kernels_and_equals_the_numpy_path(op, dtype, launched):
    with fd.counting() as ev_forward:
        out_d, leaves_d, ev_backward = _run(op, dtype, "fake")
    assert set(launched) == OPS[op][1], f"{op} launched {sorted(set(launched))}"
    for ev in (ev_forward, ev_backward):
        assert ev.host_waits == [], f"{op} made the host wait for the device: {ev}"
    assert ev_backward.from_host == [], f"{op}'s backward copied to the device: {ev_backward}"
    del launched[:]
    out_h, leaves_h, _ = _run(op, dtype, "cpu")
    assert launched == [], "the NumPy path launched a device kernel"
    rtol, atol = TOL[dtype]
    assert out_d.dtype == out_h.dtype == dtype
    np.testing.assert_allclose(_host(out_d.data), out_h.data, rtol=rtol, atol=atol, err_msg=f"{op} forward")
    for i, (a, b) in enumerate(zip(leaves_d, leaves_h)):
        assert a.grad.dtype == dtype, f"{op}: gradient {i} is {a.grad.dtype}"
        np.testing.assert_allclose(_host(a.grad.data), b.grad.data, rtol=rtol, atol=atol, err_msg=f"{op} grad {i}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("optimizer", ["AdamW", "Adam-l2", "AdamW-amsgrad"])
def test_the_adam_step_is_one_kernel_equal_to_the_numpy_step(optimizer, dtype, launched):
    name, _, variant = optimizer.partition("-")
    kwargs = {"weight_decay": 0.1, "amsgrad": variant == "amsgrad"}
    rng = np.random.default_rng(5)
    start, grads = rng.standard_normal((3, 4)).astype(dtype), [rng.standard_normal((3, 4)).astype(dtype)
                                                               for _ in range(3)]
    finals = {}
    for device in ("fake", "cpu"):
        p = Parameter(start.copy(), device=device)
        opt = getattr(optim, name)([p], lr=0.01, **kwargs)
        with fd.counting() as ev:
            for g in grads:
                p.grad = Tensor(g, device=device)
                with fd.counting() as ev_step:
                    opt.step()
                assert ev_step.host_waits == [] and ev_step.from_host == [], f"the step left the device: {ev_step}"
        assert ev.host_waits == []
        finals[device] = _host(p.data)
        assert finals[device].dtype == dtype
    expected = {"AdamW": "adamw", "Adam-l2": "adam_l2", "AdamW-amsgrad": "adamw_amsgrad"}[optimizer]
    assert launched == [expected] * 3
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(finals["fake"], finals["cpu"], rtol=rtol, atol=atol)
