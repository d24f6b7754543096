"""Devices and array namespaces: parsing, clear errors without CuPy, lazy imports, and GPU
tests (marked ``gpu``; skipped where CuPy or a GPU is missing)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from neural_arch import backend
from neural_arch.core.tensor import Tensor


def test_parse_device():
    assert backend.parse_device("cpu") == backend.Device("cpu", 0)
    assert backend.parse_device("cuda") == backend.Device("cuda", 0)
    assert backend.parse_device("cuda:3") == backend.Device("cuda", 3)
    assert backend.parse_device(None).type == "cpu"
    assert str(backend.parse_device("cuda:2")) == "cuda:2"
    for bad in ("tpu", "cuda:x", "cuda:-1", ""):
        with pytest.raises(ValueError, match="cuda:N"):
            backend.parse_device(bad)
    with pytest.raises(TypeError):
        backend.parse_device(3)


def test_cpu_helpers():
    a = np.zeros(3)
    assert backend.get_array_module(a) is np
    assert backend.get_array_module(Tensor(a)) is np
    assert backend.get_array_module(1.0) is np
    assert backend.xp_for_device("cpu") is np
    assert backend.device_of(a) == "cpu"
    assert backend.to_device(a, "cpu") is a
    assert isinstance(backend.is_cupy_available(), bool)


def test_import_does_not_load_cupy_or_distributed():
    code = (
        "import sys, neural_arch, neural_arch.core, neural_arch.nn.functional, neural_arch.backend\n"
        "import numpy as np\n"
        "t = neural_arch.Tensor([1.0], requires_grad=True); (t * 2).sum().backward()\n"
        "bad = [m for m in ('cupy', 'neural_arch.distributed') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cuda_without_cupy_names_the_gpu_extra(monkeypatch):
    # Pretend CuPy is not installed (it may be, on some machines).
    monkeypatch.setattr(backend, "_cupy_checked", True)
    monkeypatch.setattr(backend, "_cupy_module", None)
    for call in (
        lambda: Tensor([1.0], device="cuda"),
        lambda: Tensor([1.0]).to("cuda:0"),
        lambda: backend.xp_for_device("cuda:1"),
        lambda: backend.to_device(np.zeros(2), "cuda"),
        lambda: Tensor([1.0]).cuda(),
    ):
        with pytest.raises(RuntimeError, match=r"neural_arch\[gpu\]"):
            call()


def test_cuda_with_cupy_but_no_gpu_is_a_clear_error():
    if backend._try_cupy() is None or backend.is_cupy_available():
        pytest.skip("needs CuPy installed on a machine without a GPU")
    with pytest.raises(RuntimeError, match="no usable CUDA GPU|does not exist"):
        Tensor([1.0], device="cuda")


def test_check_same_device_message():
    class FakeGpuArray:  # device_of() only knows numpy/cupy; emulate a mismatch directly
        pass

    backend.check_same_device(np.zeros(1), np.zeros(1))
    orig = backend.device_of
    try:
        backend.device_of = lambda a: "cuda:0" if isinstance(a, FakeGpuArray) else "cpu"
        with pytest.raises(RuntimeError, match=r"cpu and cuda:0"):
            backend.check_same_device(np.zeros(1), FakeGpuArray(), "add")
    finally:
        backend.device_of = orig


# ----------------------------------------------------------------------------- GPU (lent machine)
@pytest.mark.gpu
def test_gpu_forward_backward_matches_cpu():
    import cupy as cp

    import neural_arch.nn.functional as F

    rng = np.random.default_rng(0)
    xs, ws, bs = rng.standard_normal((8, 5)), rng.standard_normal((3, 5)), rng.standard_normal(3)
    target = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    grads = {}
    for dev in ("cpu", "cuda:0"):
        x = Tensor(xs, device=dev)
        w = Tensor(ws, requires_grad=True, device=dev)
        b = Tensor(bs, requires_grad=True, device=dev)
        assert w.device == dev
        h = F.layer_norm(F.gelu(F.linear(x, w, b)), 3)
        tgt = target if dev == "cpu" else cp.asarray(target)
        loss = F.cross_entropy(h, tgt) + F.softmax(h).sum() + h[np.array([0, 0, 1])].sum() * 0.1
        loss.backward()
        assert w.grad.device == dev
        grads[dev] = (loss.item(), w.grad.numpy(), b.grad.numpy())
    np.testing.assert_allclose(grads["cpu"][0], grads["cuda:0"][0], rtol=1e-6)
    np.testing.assert_allclose(grads["cpu"][1], grads["cuda:0"][1], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grads["cpu"][2], grads["cuda:0"][2], rtol=1e-6, atol=1e-9)


@pytest.mark.gpu
def test_gpu_device_mixing_is_a_clear_error():
    a = Tensor([1.0, 2.0], device="cuda")
    b = Tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="different devices"):
        a + b
    with pytest.raises(RuntimeError, match="different devices"):
        b * a
    with pytest.raises(RuntimeError, match="different devices"):
        a @ b


@pytest.mark.gpu
def test_gpu_to_and_back_is_differentiable():
    x = Tensor(np.arange(3.0), requires_grad=True)
    y = x.to("cuda") * 2.0
    assert backend.get_array_module(y.data).__name__ == "cupy"
    y.cpu().sum().backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.data, 2.0)
