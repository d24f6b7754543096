"""Array namespaces and devices: NumPy for ``"cpu"``, CuPy for ``"cuda"`` / ``"cuda:N"``.

CuPy is imported lazily, only when a CUDA device is asked for, so ``import neural_arch`` works
(and stays fast) on machines without a GPU. Every op finds its array module with
:func:`get_array_module` and computes with it, so the same code runs on both.

Moving arrays between host and device goes through one helper pair, used by everything that
must stage device data on the host (checkpoints, CPU communication backends, samplers):
:func:`to_host` (any array -> NumPy) and :func:`to_device_like` (NumPy -> the device of a given
array, optionally into an existing array). Never duck-type ``getattr(x, "data", x)`` to find an
array: a CuPy array *has* a ``.data`` attribute (its ``MemoryPointer``).

Other array libraries can be plugged in with :func:`register_device_type` (the CPU-run strict
device tests register a NumPy-backed fake that behaves like CuPy: it refuses implicit conversion
and counts every host transfer and synchronisation).

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
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Device",
    "DeviceType",
    "check_same_device",
    "device_of",
    "get_array_module",
    "gpu_unavailable_reason",
    "is_array",
    "is_cupy_available",
    "is_device_array",
    "parse_device",
    "is_registered_device_type",
    "register_device_type",
    "to_device",
    "to_device_like",
    "to_host",
    "unregister_device_type",
    "xp_for_device",
]

_GPU_HINT = "install the GPU extra with `pip install neural_arch[gpu]` (CuPy for CUDA 12)"

_cupy_checked = False
_cupy_module = None


class Device(NamedTuple):
    """A parsed device: ``type`` is ``"cpu"``, ``"cuda"`` (or a registered type); ``index`` is the
    device ordinal (cpu: 0).

    Example::

        >>> from neural_arch.backend import Device
        >>> Device("cuda", 1)
        Device(type='cuda', index=1)
    """

    type: str
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"{self.type}:{self.index}"


class DeviceType(NamedTuple):
    """A registered array library (see :func:`register_device_type`).

    Example::

        >>> import numpy as np
        >>> from neural_arch.backend import register_device_type, unregister_device_type
        >>> kind = register_device_type("fake", xp=np, array_type=np.memmap,
        ...                             to_host=np.asarray, from_host=lambda a, index: a)
        >>> kind.name
        'fake'
        >>> unregister_device_type("fake")
    """

    name: str
    xp: Any
    array_types: tuple
    to_host: Callable[[Any], np.ndarray]
    from_host: Callable[[np.ndarray, int], Any]
    index_of: Callable[[Any], int]


# name -> DeviceType, and exact array type -> DeviceType (the fast path of get_array_module).
_DEVICE_TYPES: dict[str, DeviceType] = {}
_ARRAY_TYPES: dict[type, DeviceType] = {}


def register_device_type(name: str, *, xp, array_type, to_host: Callable[[Any], np.ndarray],
                         from_host: Callable[[np.ndarray, int], Any],
                         index_of: Callable[[Any], int] | None = None) -> DeviceType:
    """Teach the backend a device array library (used by the strict-device tests' fake).

    Args:
        name: the device type in device strings (``"fake"`` gives ``"fake"``/``"fake:N"``). Registering
            ``"cuda"`` routes ``"cuda"`` to this library instead of CuPy (strict CUDA mode in tests).
        xp: the library's array module (what :func:`get_array_module` returns for its arrays).
        array_type: its array class (or a tuple of classes).
        to_host: ``array -> np.ndarray``, a new host copy.
        from_host: ``(np.ndarray, index) -> array`` on device ``index``.
        index_of: ``array -> int``, the device index of an array (default 0).

    Returns the :class:`DeviceType`; undo with :func:`unregister_device_type`.

    Example::

        >>> import numpy as np
        >>> from neural_arch.backend import register_device_type, unregister_device_type, xp_for_device
        >>> _ = register_device_type("fake", xp=np, array_type=np.memmap,
        ...                          to_host=np.asarray, from_host=lambda a, index: a)
        >>> xp_for_device("fake:0") is np
        True
        >>> unregister_device_type("fake")
    """
    name = str(name).strip().lower()
    if not name or name == "cpu" or ":" in name:
        raise ValueError(f"register_device_type: invalid device type name {name!r}")
    types_ = tuple(array_type) if isinstance(array_type, (tuple, list)) else (array_type,)
    if any(t is np.ndarray for t in types_):
        raise ValueError("register_device_type: numpy.ndarray is the host array type, not a device one")
    unregister_device_type(name)
    dt = DeviceType(name, xp, types_, to_host, from_host, index_of or (lambda a: 0))
    _DEVICE_TYPES[name] = dt
    for t in types_:
        _ARRAY_TYPES[t] = dt
    return dt


def unregister_device_type(name: str) -> None:
    """Forget a type registered with :func:`register_device_type` (no error when unknown).

    Example::

        >>> from neural_arch.backend import unregister_device_type
        >>> unregister_device_type("never-registered")         # no error
    """
    dt = _DEVICE_TYPES.pop(str(name).strip().lower(), None)
    if dt is not None:
        for t in dt.array_types:
            if _ARRAY_TYPES.get(t) is dt:
                del _ARRAY_TYPES[t]


def is_registered_device_type(name: str) -> bool:
    """Whether ``name`` was registered with :func:`register_device_type` (``"cuda"``: strict CUDA
    mode, a stand-in instead of CuPy).

    >>> is_registered_device_type("cuda")
    False
    """
    return str(name).strip().lower() in _DEVICE_TYPES


def _registered_type_of(x) -> DeviceType | None:
    dt = _ARRAY_TYPES.get(type(x))
    if dt is None and _DEVICE_TYPES:
        for cand in _DEVICE_TYPES.values():
            if isinstance(x, cand.array_types):
                return cand
    return dt


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
        if dtype_ in ("cpu", "cuda") or dtype_ in _DEVICE_TYPES:
            idx = getattr(device, "index", None)
            return Device(dtype_, 0 if idx is None else int(idx))
        raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {device!r}")
    s = device.strip().lower()
    if s == "cpu":
        return Device("cpu", 0)
    if s in ("cuda", "gpu"):
        return Device("cuda", 0)
    kind, sep, rest = s.partition(":")
    if kind == "cuda" or kind in _DEVICE_TYPES:
        if not sep:
            return Device(kind, 0)
        if rest.isdigit():
            return Device(kind, int(rest))
    raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N' (N a GPU index)")


def _try_cupy():
    """Import CuPy once; return the module or None (never raises)."""
    global _cupy_checked, _cupy_module
    if not _cupy_checked:
        _cupy_checked = True
        try:
            import cupy

            _cupy_module = cupy
        except Exception:  # noqa: BLE001  (ImportError, or a broken CUDA install raising something else)
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
    except Exception as exc:  # noqa: BLE001  (CuPy installed but no driver / no GPU)
        return f"no usable CUDA GPU ({type(exc).__name__}: {str(exc)[:160]})"
    return None


def is_cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device.

    Example::

        >>> from neural_arch.backend import is_cupy_available
        >>> device = "cuda" if is_cupy_available() else "cpu"
    """
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
        except Exception as exc:  # noqa: BLE001  (CuPy installed but no driver / no GPU)
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


def _tensor_class():
    # The Tensor class without importing core (core imports this module): a Tensor can only
    # exist once neural_arch.core.tensor has been imported, so sys.modules is enough.
    mod = sys.modules.get("neural_arch.core.tensor")
    return getattr(mod, "Tensor", None) if mod is not None else None


def get_array_module(x: Any):
    """Return ``numpy`` or ``cupy`` (or a registered module) for an array, a Tensor, or a scalar.

    Order matters: a NumPy array first (the hot path), then registered device types and CuPy by
    type, then a Tensor (its ``.data``). Never ``getattr(x, "data", x)`` on an unknown object: a
    CuPy array's ``.data`` is a ``MemoryPointer``, which is how CUDA arrays used to be reported as
    NumPy. Objects exposing ``__cuda_array_interface__`` (Numba, ...) map to CuPy. Scalars,
    lists and anything unknown map to NumPy.

    >>> get_array_module(np.zeros(2)) is np, get_array_module(3.0) is np
    (True, True)
    """
    t = type(x)
    if t is np.ndarray:
        return np
    dt = _ARRAY_TYPES.get(t)
    if dt is not None:
        return dt.xp
    cp = _cupy_if_loaded()
    if cp is not None and isinstance(x, cp.ndarray):
        return cp
    if isinstance(x, (np.ndarray, np.generic)):
        return np
    tensor_cls = _tensor_class()
    if tensor_cls is not None and isinstance(x, tensor_cls):
        return get_array_module(x.data)
    dt = _registered_type_of(x)
    if dt is not None:
        return dt.xp
    if hasattr(t, "__cuda_array_interface__"):
        cp = cp or _try_cupy()
        if cp is not None:
            return cp
    return np


def is_device_array(x: Any) -> bool:
    """True for an array that lives on a device: a CuPy array or a registered device type.

    Example::

        >>> import numpy as np
        >>> from neural_arch.backend import is_device_array
        >>> is_device_array(np.ones(2))
        False
    """
    if type(x) is np.ndarray:
        return False
    if _registered_type_of(x) is not None:
        return True
    cp = _cupy_if_loaded()
    return cp is not None and isinstance(x, cp.ndarray)


def is_array(x: Any) -> bool:
    """True for a NumPy array (not a NumPy scalar) or a device array (CuPy / registered).

    Example::

        >>> import numpy as np
        >>> from neural_arch.backend import is_array
        >>> is_array(np.ones(2)), is_array(np.float32(1)), is_array([1, 2])
        (True, False, False)
    """
    return isinstance(x, np.ndarray) or is_device_array(x)


def to_host(array: Any) -> np.ndarray:
    """``array`` as a NumPy array: NumPy arrays as they are (no copy); device arrays copied to a new
    host array (a device-to-host transfer, which waits for the device); a Tensor's data likewise.

    The one function to stage device data on the host (pair: :func:`to_device_like`).

    >>> a = np.arange(3.0)
    >>> to_host(a) is a
    True
    """
    if type(array) is np.ndarray:
        return array
    dt = _registered_type_of(array)
    if dt is not None:
        return dt.to_host(array)
    cp = _cupy_if_loaded()
    if cp is not None and isinstance(array, cp.ndarray):
        return array.get()
    if isinstance(array, np.ndarray):
        return np.asarray(array)  # a subclass (np.memmap, ...) as a plain ndarray view
    tensor_cls = _tensor_class()
    if tensor_cls is not None and isinstance(array, tensor_cls):
        return to_host(array.data)
    return np.asarray(array)


def to_device_like(host: Any, like: Any, out: Any = None):
    """``host`` (a NumPy array) on the device of the array ``like``; the inverse of :func:`to_host`.

    * ``like`` a NumPy array: ``host`` itself (``np.asarray``, no copy);
    * ``like`` a CuPy / registered device array: a new array on ``like``'s device (a copy).

    With ``out`` (an array on ``like``'s device, usually ``like`` itself) the values are copied into
    ``out`` in place, and ``out`` is returned: what a CPU communication backend does after
    receiving into a host staging buffer.

    >>> dst = np.zeros(2)
    >>> to_device_like(np.ones(2), dst, out=dst) is dst, dst.tolist()
    (True, [1.0, 1.0])
    """
    if out is not None:
        if isinstance(out, np.ndarray):
            if out is not host:
                out[...] = host
            return out
        if out is host:
            return out
        cp = _cupy_if_loaded()
        if (cp is not None and isinstance(out, cp.ndarray) and isinstance(host, np.ndarray)
                and host.shape == out.shape and host.dtype == out.dtype
                and out.flags.c_contiguous and host.flags.c_contiguous):
            out.set(host)  # one host-to-device copy straight into out
        else:
            out[...] = to_device_like(np.ascontiguousarray(host), out)
        return out
    if type(like) is np.ndarray or like is None:
        return np.asarray(host)
    dt = _registered_type_of(like)
    if dt is not None:
        if _registered_type_of(host) is dt:
            return host
        return dt.from_host(to_host(host), dt.index_of(like))
    cp = _cupy_if_loaded()
    if cp is not None and isinstance(like, cp.ndarray):
        if isinstance(host, cp.ndarray) and host.device.id == like.device.id:
            return host
        with cp.cuda.Device(like.device.id):
            return cp.asarray(to_host(host))
    if isinstance(like, np.ndarray):
        return np.asarray(host)
    raise TypeError(f"to_device_like: `like` must be a NumPy, CuPy or registered device array, "
                    f"got {type(like).__name__}")


def xp_for_device(device: Any):
    """The array module that holds data for ``device`` (``numpy`` for cpu, ``cupy`` for cuda).

    Example::

        >>> from neural_arch.backend import xp_for_device
        >>> xp_for_device("cpu").__name__
        'numpy'
    """
    dev = parse_device(device)
    if dev.type == "cpu":
        return np
    dt = _DEVICE_TYPES.get(dev.type)
    if dt is not None:
        return dt.xp
    return _require_cupy(dev)


def device_of(array: Any) -> str:
    """``"cpu"`` for NumPy arrays / scalars, ``"cuda:N"`` for CuPy arrays (``"<type>:N"`` for a
    registered device type); a Tensor's device for a Tensor.

    Example::

        >>> import numpy as np
        >>> from neural_arch.backend import device_of
        >>> device_of(np.ones(2)), device_of(np.float32(1))
        ('cpu', 'cpu')
    """
    if type(array) is np.ndarray or isinstance(array, (np.generic, int, float, bool)):
        return "cpu"
    dt = _registered_type_of(array)
    if dt is not None:
        return f"{dt.name}:{dt.index_of(array)}"
    cp = _cupy_if_loaded()
    if cp is not None and isinstance(array, cp.ndarray):
        return f"cuda:{array.device.id}"
    tensor_cls = _tensor_class()
    if tensor_cls is not None and isinstance(array, tensor_cls):
        return device_of(array.data)
    return "cpu"


def to_device(array: Any, device: Any):
    """Return ``array`` on ``device`` (no copy when it is already there).

    >>> to_device([1.0, 2.0], "cpu")
    array([1., 2.])
    """
    dev = parse_device(device)
    if dev.type == "cpu":
        return to_host(array)
    dt = _DEVICE_TYPES.get(dev.type)
    if dt is not None:
        if isinstance(array, dt.array_types) and dt.index_of(array) == dev.index:
            return array
        return dt.from_host(to_host(array), dev.index)
    cp = _require_cupy(dev)
    if isinstance(array, cp.ndarray) and array.device.id == dev.index:
        return array
    with cp.cuda.Device(dev.index):
        return cp.asarray(array)


def check_same_device(a: Any, b: Any, op: str = "op") -> None:
    """Raise a clear error when two arrays live on different devices.

    Example::

        >>> import numpy as np
        >>> from neural_arch.backend import check_same_device
        >>> check_same_device(np.ones(2), np.ones(2), "add")       # both on the CPU: no error
    """
    da, db = device_of(a), device_of(b)
    if da != db:
        raise RuntimeError(
            f"{op}: inputs are on different devices ({da} and {db}); move one with .to({da!r}) "
            f"or .to({db!r}) first"
        )
