"""``neural_arch.cuda`` on a machine without CuPy/GPU (clear errors naming the ``gpu`` extra), and
its wiring to CuPy checked against a small stand-in of the CuPy calls it makes. The real thing is
on the "to run on a GPU" list of docs/gpu.md."""

from __future__ import annotations

import types

import pytest

from neural_arch import backend, cuda
from neural_arch.cuda import graphs


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_checked", True)
    monkeypatch.setattr(backend, "_cupy_module", None)


def test_without_cupy(no_cupy):
    assert cuda.is_available() is False
    assert cuda.device_count() == 0
    cuda.manual_seed(0)  # ignored without a GPU, like torch.cuda.manual_seed
    cuda.manual_seed_all(0)
    for call in (cuda.current_device, cuda.synchronize, lambda: cuda.set_device(0), cuda.memory_allocated,
                 cuda.max_memory_allocated, cuda.reset_peak_memory_stats, cuda.memory_reserved,
                 cuda.empty_cache, cuda.get_device_name):
        with pytest.raises(RuntimeError, match=r"pip install neural_arch\[gpu\]"):
            call()
    with pytest.raises(RuntimeError, match=r"GPU-only.*neural_arch\[gpu\]"):
        graphs.make_graphed_step(lambda: None)
    with pytest.raises(TypeError, match="callable"):
        graphs.make_graphed_step(42)


class _FakeCupy:
    """Just the CuPy calls neural_arch.cuda makes, recorded (two GPUs)."""

    def __init__(self):
        self.calls = []
        self.current = 0
        self.used = {0: 100, 1: 0}
        fake = self

        class Device:
            def __init__(self, i=None):
                self.id = fake.current if i is None else i

            def use(self):
                fake.current = self.id

            def synchronize(self):
                fake.calls.append(("sync", self.id))

            def __enter__(self):
                self._prev, fake.current = fake.current, self.id
                return self

            def __exit__(self, *exc):
                fake.current = self._prev

        class Pool:
            def used_bytes(self):
                return fake.used[fake.current]

            def total_bytes(self):
                return fake.used[fake.current] + 1000

            def free_all_blocks(self):
                fake.calls.append(("free_all",))

        class MemoryHook:
            def __enter__(self):
                fake.calls.append(("hook",))
                return self

        pool = Pool()
        runtime = types.SimpleNamespace(getDeviceCount=lambda: 2, getDevice=lambda: fake.current,
                                        getDeviceProperties=lambda i: {"name": b"Fake GPU %d" % i})
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime, MemoryHook=MemoryHook)
        self.random = types.SimpleNamespace(seed=lambda s: fake.calls.append(("seed", fake.current, s)))
        self.get_default_memory_pool = lambda: pool


@pytest.fixture
def fake_cupy(monkeypatch):
    cp = _FakeCupy()
    monkeypatch.setattr(backend, "_cupy_checked", True)
    monkeypatch.setattr(backend, "_cupy_module", cp)
    monkeypatch.setattr("neural_arch.cuda._hook", None)
    monkeypatch.setattr("neural_arch.cuda._peak", {})
    return cp


def test_wiring_to_cupy(fake_cupy):
    cp = fake_cupy
    assert cuda.is_available() and cuda.device_count() == 2
    cuda.set_device("cuda:1")
    assert cuda.current_device() == 1
    cuda.set_device(0)
    cuda.synchronize()
    cuda.synchronize("cuda:1")
    assert ("sync", 0) in cp.calls and ("sync", 1) in cp.calls
    with pytest.raises(ValueError, match="does not exist: 2 GPU"):
        cuda.set_device(2)
    cuda.manual_seed(7)
    cuda.manual_seed_all(8)
    assert ("seed", 0, 7) in cp.calls and ("seed", 0, 8) in cp.calls and ("seed", 1, 8) in cp.calls
    assert cuda.get_device_name(1) == "Fake GPU 1"
    assert cuda.memory_allocated() == 100 and cuda.memory_allocated(1) == 0
    assert cuda.memory_reserved() == 1100
    cuda.reset_peak_memory_stats()
    assert cp.calls.count(("hook",)) == 1  # the peak hook is installed once
    cp.used[0] = 500
    assert cuda.max_memory_allocated() == 500
    cp.used[0] = 200
    assert cuda.max_memory_allocated() == 500  # a peak, not the current usage
    cuda.reset_peak_memory_stats()
    assert cuda.max_memory_allocated() == 200
    assert cp.calls.count(("hook",)) == 1
    cuda.empty_cache()
    assert ("free_all",) in cp.calls
