"""Array namespaces and devices: NumPy for ``"cpu"``, CuPy for ``"cuda"`` / ``"cuda:N"``.

CuPy is imported lazily, only when a CUDA device is asked for, so ``import neural_arch`` works
(and stays fast) on machines without a GPU. Every op finds its array module with
:func:`get_array_module` and computes with it, so the same code runs on both.

Example::

    >>> import numpy as np
    >>> from neural_arch import backend
    >>> backend.get_array_module(np.zeros(3)) is np
    True
    >>> backend.parse_device("cuda:1")
    Device(type='cuda', index=1)
    >>> backend.device_of(np.zeros(3))
    'cpu'
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Device",
    "parse_device",
    "get_array_module",
    "xp_for_device",
    "to_device",
    "device_of",
    "is_cupy_available",
    "check_same_device",
]

_GPU_HINT = "install the GPU extra with `pip install neural_arch[gpu]` (CuPy for CUDA 12)"

_cupy_checked = False
_cupy_module = None


class Device(NamedTuple):
    """A parsed device: ``type`` is ``"cpu"`` or ``"cuda"``; ``index`` is the GPU ordinal (cpu: 0)."""

    type: str
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"cuda:{self.index}"


def parse_device(device: Any) -> Device:
    """Parse ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a :class:`Device`, or ``None`` = cpu).

    >>> parse_device("cuda")
    Device(type='cuda', index=0)
    """
    if device is None:
        return Device("cpu", 0)
    if isinstance(device, Device):
        return device
    if not isinstance(device, str):
        # torch.device-like objects expose .type/.index; accept them for convenience.
        dtype_ = getattr(device, "type", None)
        if dtype_ in ("cpu", "cuda"):
            idx = getattr(device, "index", None)
            return Device(dtype_, 0 if idx is None else int(idx))
        raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {device!r}")
    s = device.strip().lower()
    if s == "cpu":
        return Device("cpu", 0)
    if s in ("cuda", "gpu"):
        return Device("cuda", 0)
    if s.startswith("cuda:"):
        rest = s[5:]
        if rest.isdigit():
            return Device("cuda", int(rest))
    raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N' (N a GPU index)")


def _try_cupy():
    """Import CuPy once; return the module or None (never raises)."""
    global _cupy_checked, _cupy_module
    if not _cupy_checked:
        _cupy_checked = True
        try:
            import cupy  # noqa: PLC0415  (lazy on purpose: importing neural_arch must not import cupy)

            _cupy_module = cupy
        except Exception:  # ImportError, or a broken CUDA install raising something else
            _cupy_module = None
    return _cupy_module


def gpu_unavailable_reason() -> str | None:
    """Why CUDA arrays cannot be used here (a sentence naming the fix), or None when they can.

    Never raises; tests and benchmarks use it to skip with a reason.

    >>> reason = gpu_unavailable_reason()      # e.g. "CuPy is not installed: pip install ..."
    >>> reason is None or isinstance(reason, str)
    True
    """
    cp = _try_cupy()
    if cp is None:
        return f"CuPy is not installed (or fails to import): {_GPU_HINT}"
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA GPU"
    except Exception as exc:  # CuPy installed but no driver / no GPU
        return f"no usable CUDA GPU ({type(exc).__name__}: {str(exc)[:160]})"
    return None


def is_cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return gpu_unavailable_reason() is None


_gpu_count = None


def _require_cupy(device: Device):
    """CuPy, after checking that ``device`` names a GPU that exists (clear errors otherwise)."""
    global _gpu_count
    cp = _try_cupy()
    if cp is None:
        raise RuntimeError(f"device {str(device)!r} needs CuPy, which is not installed: {_GPU_HINT}")
    if _gpu_count is None:
        try:
            _gpu_count = int(cp.cuda.runtime.getDeviceCount())
        except Exception as exc:  # CuPy installed but no driver / no GPU
            raise RuntimeError(
                f"device {str(device)!r}: CuPy is installed but no usable CUDA GPU was found "
                f"({type(exc).__name__}: {exc}); use device='cpu'"
            ) from None
    if device.index >= _gpu_count:
        raise RuntimeError(
            f"device {str(device)!r} does not exist: {_gpu_count} CUDA GPU(s) visible "
            f"(valid: {', '.join(f'cuda:{i}' for i in range(_gpu_count)) or 'none'})"
        )
    return cp


def _cupy_if_loaded():
    # An array can only be a CuPy array if CuPy was already imported by someone, so checking
    # sys.modules is enough and never triggers the (slow) import itself.
    return sys.modules.get("cupy")


def get_array_module(x: Any):
    """Return ``numpy`` or ``cupy`` for an array, a Tensor, or a scalar (scalars → numpy)."""
    if type(x) is np.ndarray:
        return np
    data = getattr(x, "data", x) if not isinstance(x, np.generic) else x
    if type(data) is np.ndarray:
        return np
    cp = _cupy_if_loaded()
    if cp is not None and isinstance(data, cp.ndarray):
        return cp
    return np


def xp_for_device(device: Any):
    """The array module that holds data for ``device`` (``numpy`` for cpu, ``cupy`` for cuda)."""
    dev = parse_device(device)
    if dev.type == "cpu":
        return np
    return _require_cupy(dev)


def device_of(array: Any) -> str:
    """``"cpu"`` for NumPy arrays / scalars, ``"cuda:N"`` for CuPy arrays."""
    if type(array) is np.ndarray or isinstance(array, (np.generic, int, float, bool)):
        return "cpu"
    cp = _cupy_if_loaded()
    if cp is not None and isinstance(array, cp.ndarray):
        return f"cuda:{array.device.id}"
    return "cpu"


def to_device(array: Any, device: Any):
    """Return ``array`` on ``device`` (no copy when it is already there).

    >>> to_device([1.0, 2.0], "cpu")
    array([1., 2.])
    """
    dev = parse_device(device)
    if dev.type == "cpu":
        cp = _cupy_if_loaded()
        if cp is not None and isinstance(array, cp.ndarray):
            return cp.asnumpy(array)
        return np.asarray(array)
    cp = _require_cupy(dev)
    if isinstance(array, cp.ndarray) and array.device.id == dev.index:
        return array
    with cp.cuda.Device(dev.index):
        return cp.asarray(array)


def check_same_device(a: Any, b: Any, op: str = "op") -> None:
    """Raise a clear error when two arrays live on different devices."""
    da, db = device_of(a), device_of(b)
    if da != db:
        raise RuntimeError(
            f"{op}: inputs are on different devices ({da} and {db}); move one with .to({da!r}) "
            f"or .to({db!r}) first"
        )
