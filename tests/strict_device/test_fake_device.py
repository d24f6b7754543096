"""The fake device itself, and the backend's dispatch of CuPy-like arrays (the root cause of the
broken CUDA training: a CuPy array's ``.data`` is a MemoryPointer, so reading
``getattr(x, "data", x)`` first reported every device array as NumPy)."""

from __future__ import annotations

import pickle

import fake_device as fd
import numpy as np
import pytest

from neural_arch import backend
from neural_arch.core.tensor import Tensor


def test_fake_array_behaves_like_cupy():
    a = fd.wrap(np.arange(6.0).reshape(2, 3))
    assert not isinstance(a, np.ndarray)
    assert isinstance(a.data, fd.FakeMemoryPointer) and not hasattr(a.data, "shape")
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError, match="host"):
        a + np.ones(3)
    with pytest.raises(TypeError, match="host"):
        np.ones(3) * a
    # numpy functions and ufuncs stay on the device, as with CuPy's __array_function__/__array_ufunc__
    assert type(np.exp(a)) is fd.FakeArray and type(np.concatenate([a, a])) is fd.FakeArray
    assert type(a.sum()) is fd.FakeArray and a.sum().ndim == 0  # reductions give 0-d arrays
    assert a.astype(a.dtype, copy=False) is a


def test_events_are_counted_with_their_location():
    a = fd.wrap(np.arange(4.0))
    with fd.counting() as ev:
        b = (a * 2).sum()
        c = a[1:3] + 1
    assert ev.syncs == [] and ev.to_host == [] and ev.from_host == []
    with fd.counting() as ev:
        float(b)
        bool(c[0] > 0)
        b.item()
        a[a > 1]  # a boolean mask: the result size depends on the data
        a.get()
        pickle.dumps(a)
        fd.xp.asarray(np.ones(2))
    kinds = [w for w, _ in ev.syncs]
    assert kinds == ["float()", "bool()", ".item()", "indexing with a boolean mask"]
    assert [w for w, _ in ev.to_host] == [".get()", "pickle"]
    assert len(ev.from_host) == 1
    assert "test_fake_device.py" in ev.syncs[0][1]
    with fd.forbid(), pytest.raises(fd.HostSyncError, match="float"):
        float(b)


def test_get_array_module_sees_through_data_attribute(fake):
    a = fd.wrap(np.ones(3))
    assert backend.get_array_module(a) is fake  # was numpy: getattr(a, "data", a) is not an array
    assert backend.get_array_module(Tensor._wrap(a)) is fake
    assert backend.get_array_module(np.ones(2)) is np
    assert backend.get_array_module(np.float32(1)) is np and backend.get_array_module(2.0) is np
    assert backend.get_array_module(Tensor(np.ones(2))) is np
    assert backend.is_array(a) and backend.is_device_array(a)
    assert backend.is_array(np.ones(1)) and not backend.is_device_array(np.ones(1))
    assert not backend.is_array(np.float64(1.0)) and not backend.is_array([1.0])
    assert backend.device_of(a) == "fake:0" and backend.device_of(Tensor._wrap(a)) == "fake:0"
    assert backend.xp_for_device("fake") is fake and backend.xp_for_device("fake:0") is fake
    assert str(backend.parse_device("fake:0")) == "fake:0"


def test_unregistered_device_type_is_refused():
    fd.uninstall("fake")
    with pytest.raises(ValueError, match="cuda:N"):
        backend.parse_device("fake")


def test_to_host_and_to_device_like(fake):
    a = fd.wrap(np.arange(3.0))
    with fd.counting() as ev:
        h = backend.to_host(a)
    assert type(h) is np.ndarray and h.tolist() == [0.0, 1.0, 2.0] and len(ev.to_host) == 1
    host = np.arange(4.0)
    assert backend.to_host(host) is host  # no copy for host arrays
    back = backend.to_device_like(h * 10, a)
    assert type(back) is fd.FakeArray and backend.to_host(back).tolist() == [0.0, 10.0, 20.0]
    assert backend.to_device_like(h, np.zeros(1)) is h
    # in place into the device array (what a CPU communication backend does after a recv)
    out = backend.to_device_like(np.full(3, 7.0), a, out=a)
    assert out is a and backend.to_host(a).tolist() == [7.0] * 3
    dst = np.zeros(3)
    assert backend.to_device_like(np.ones(3), dst, out=dst) is dst and dst.tolist() == [1.0] * 3
    with pytest.raises(TypeError, match="like"):
        backend.to_device_like(h, [1, 2])


def test_tensor_moves_between_host_and_fake_device(fake):
    t = Tensor(np.arange(4.0), device="fake", requires_grad=True)
    assert t.device == "fake:0" and type(t.data) is fd.FakeArray
    with fd.counting() as ev:
        (t * 3).sum().backward()
    assert ev.host_waits == [] and ev.from_host == []
    assert type(t.grad.data) is fd.FakeArray
    np.testing.assert_array_equal(t.grad.numpy(), np.full(4, 3.0))
    c = t.to("cpu")
    assert type(c.data) is np.ndarray
    assert backend.to_device(np.ones(2), "fake:0").shape == (2,)


def test_strict_cuda_maps_the_cuda_device_string(strict_cuda):
    t = Tensor(np.ones(3), device="cuda")
    assert type(t.data) is fd.FakeArray and t.device == "cuda:0"
    assert backend.xp_for_device("cuda") is strict_cuda
