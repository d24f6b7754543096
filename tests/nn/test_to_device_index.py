"""``.to(0)`` / ``.to(device_id)``: an integer is that CUDA device, as in torch, on Tensor.to and
Module.to; without a GPU the error names what is missing; with the strict fake device registered as
"cuda" the integer path really moves the data."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import neural_arch as na
from neural_arch import backend, nn


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_checked", True)
    monkeypatch.setattr(backend, "_cupy_module", None)


@pytest.fixture
def strict_cuda():
    path = pathlib.Path(__file__).parents[1] / "strict_device" / "fake_device.py"
    spec = importlib.util.spec_from_file_location("fake_device_for_to", path)
    fd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fd)
    with fd.installed("cuda") as xp:
        yield xp


@pytest.mark.parametrize("call", [lambda: na.ones(2).to(1), lambda: na.ones(2).to(device=0),
                                  lambda: na.ones(2).to(np.int64(0), na.float64),
                                  lambda: nn.Linear(2, 2).to(1), lambda: nn.Linear(2, 2).to(device=0)])
def test_an_integer_is_a_cuda_device_and_without_a_gpu_the_error_says_what_is_missing(no_cupy, call):
    with pytest.raises(RuntimeError, match=r"'cuda:[01]' needs CuPy.*pip install neural_arch\[gpu\]"):
        call()


def test_negative_indices_and_bools_are_not_devices():
    with pytest.raises(ValueError, match=">= 0"):
        na.ones(2).to(-1)
    with pytest.raises(ValueError, match=">= 0"):
        nn.Linear(2, 2).to(-1)
    t = na.ones(2)
    assert t.to("cpu", na.float64, True).dtype == np.float64   # a bool positional is non_blocking, not cuda:1


def test_an_integer_moves_to_that_cuda_device_on_the_strict_fake(strict_cuda):
    t = na.ones(3).to(0)
    assert isinstance(t.data, strict_cuda.ndarray) and t.device == na.ones(3).to("cuda:0").device
    model = nn.Linear(2, 2).to(0)
    assert all(isinstance(p.data, strict_cuda.ndarray) for p in model.parameters())
    assert str(model.weight.device) == str(na.ones(1).to("cuda:0").device)
