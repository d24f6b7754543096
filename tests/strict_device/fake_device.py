"""A NumPy-backed stand-in for a GPU array library, for the CPU-run "strict device" tests.

Real CuPy cannot run here (no GPU), yet most CUDA bugs are host-side Python bugs: an array
module picked wrongly, a silent host copy, a ``bool()`` on a device scalar that stalls the GPU.
``FakeArray`` behaves like a CuPy array in every way those bugs depend on:

* it is **not** an ``np.ndarray`` and its ``.data`` is a foreign object (CuPy's is a
  ``MemoryPointer``), so code that reads ``getattr(x, "data", x)`` sees a non-array;
* it **refuses implicit conversion** to NumPy (``np.asarray(x)`` raises ``TypeError``, as CuPy's
  ``__array__`` does) and refuses to mix with host arrays in arithmetic;
* it **counts** every device-to-host transfer (``.get()``, ``asnumpy``, ``tolist``, pickling)
  and every synchronisation (``bool()``, ``int()``, ``float()``, ``.item()``, ``__index__``,
  boolean-mask indexing, ``nonzero``...), and every host-to-device copy, with the code location
  that caused it.

Its namespace :data:`xp` mirrors the part of ``numpy``/``cupy`` the framework uses: every NumPy
function and ufunc, wrapped so that results come back as device arrays (0-d arrays, never Python
or NumPy scalars, as CuPy does), plus ``asarray``/``asnumpy``/``random``. ``np.<func>(fake)``
works too (``__array_ufunc__`` / ``__array_function__``), as it does for CuPy.

Usage::

    import fake_device as fd
    with fd.installed("fake"):                     # registers the device type with the backend
        x = Tensor(np.ones(3), device="fake")
        with fd.counting() as ev:
            (x * 2).sum()
        assert ev.syncs == [] and ev.to_host == []

``installed("cuda")`` maps the device string ``"cuda"`` to the fake instead (strict CUDA mode).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import types

import numpy as np

__all__ = [
    "Events",
    "FakeArray",
    "FakeDevice",
    "FakeMemoryPointer",
    "HostSyncError",
    "counting",
    "forbid",
    "install",
    "installed",
    "reset_totals",
    "to_host",
    "totals",
    "uninstall",
    "wrap",
    "xp",
]

_THIS_FILE = os.path.normcase(os.path.abspath(__file__))
_BACKEND_FILE = os.path.normcase(os.path.join("neural_arch", "backend.py"))


class HostSyncError(RuntimeError):
    """Raised inside :func:`forbid` when code synchronises with or copies from the device."""


# ============================================================================ event bookkeeping
class Events:
    """What happened while :func:`counting` was active: ``(what, where)`` pairs per kind."""

    def __init__(self):
        self.to_host: list = []     # device -> host copies (each one also synchronises)
        self.syncs: list = []       # host waits for a device value: bool/int/float/item/...
        self.from_host: list = []   # host -> device copies

    def _add(self, kind: str, what: str, where: str) -> None:
        getattr(self, kind).append((what, where))

    @property
    def host_waits(self) -> list:
        """Everything that makes the host wait for the device: transfers out plus syncs."""
        return self.to_host + self.syncs

    def __repr__(self) -> str:
        def fmt(items):
            return "[" + "; ".join(f"{w} @ {loc}" for w, loc in items) + "]"

        return (f"Events(to_host={fmt(self.to_host)}, syncs={fmt(self.syncs)}, "
                f"from_host={fmt(self.from_host)})")


_lock = threading.Lock()
_recorders: list = []
_forbidden: set = set()
_totals = {"to_host": 0, "syncs": 0, "from_host": 0}


def totals() -> dict:
    """Counts of every event since the last :func:`reset_totals` (all threads)."""
    with _lock:
        return dict(_totals)


def reset_totals() -> None:
    with _lock:
        for k in _totals:
            _totals[k] = 0


def _where() -> str:
    """The innermost code location outside this module and backend.py (the culprit)."""
    f = sys._getframe(2)
    chain = []
    while f is not None and len(chain) < 3:
        fn = os.path.normcase(os.path.abspath(f.f_code.co_filename))
        if fn != _THIS_FILE and not fn.endswith(_BACKEND_FILE):
            chain.append(f"{os.path.basename(fn)}:{f.f_lineno} ({f.f_code.co_name})")
        f = f.f_back
    return " <- ".join(chain) or "?"


def _event(kind: str, what: str) -> None:
    with _lock:
        _totals[kind] += 1
        active = list(_recorders)
        forbidden = kind in _forbidden
    if not active and not forbidden:
        return
    where = _where()
    for rec in active:
        rec._add(kind, what, where)
    if forbidden:
        raise HostSyncError(
            f"{what} on a device array at {where}: this makes the host wait for the device "
            f"({kind}); keep the value on the device (or read it only when the user asks)")


@contextlib.contextmanager
def counting():
    """Record every transfer and synchronisation (from any thread) into the yielded Events."""
    rec = Events()
    with _lock:
        _recorders.append(rec)
    try:
        yield rec
    finally:
        with _lock:
            _recorders.remove(rec)


@contextlib.contextmanager
def forbid(*kinds: str):
    """Raise :class:`HostSyncError` at the first event of ``kinds`` (default: to_host and syncs)."""
    kinds = set(kinds or ("to_host", "syncs"))
    with _lock:
        saved = set(_forbidden)
        _forbidden.update(kinds)
    try:
        yield
    finally:
        with _lock:
            _forbidden.clear()
            _forbidden.update(saved)


# ============================================================================ the array type
class FakeMemoryPointer:
    """What ``FakeArray.data`` returns: like CuPy's ``MemoryPointer``, an object that is not an array."""

    __slots__ = ("device_id", "ptr")

    def __init__(self, ptr: int, device_id: int = 0):
        self.ptr = ptr
        self.device_id = device_id

    def __repr__(self) -> str:
        return f"<FakeMemoryPointer 0x{self.ptr:x} device={self.device_id}>"


class FakeDevice:
    """``array.device``: like ``cupy.cuda.Device`` (an ``id``, a context manager, ``synchronize``)."""

    __slots__ = ("id",)

    def __init__(self, id: int = 0):
        self.id = id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        _event("syncs", "Device.synchronize()")

    def __eq__(self, other):
        return isinstance(other, FakeDevice) and other.id == self.id

    def __hash__(self):
        return hash(("FakeDevice", self.id))

    def __repr__(self) -> str:
        return f"<FakeDevice {self.id}>"


_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed (fake device, as in CuPy). "
             "Please use `.get()` / backend.to_host() to construct a NumPy array explicitly.")
_HOST_MIX = ("fake device: a host (NumPy) array was mixed with a device array; CuPy raises here too. "
             "Move it first with backend.to_device(array, device) / backend.to_device_like(array, like)")


def _reject_host(x):
    if isinstance(x, np.ndarray):
        raise TypeError(_HOST_MIX + f" (got a NumPy array of shape {x.shape}, dtype {x.dtype})")
    return x


def _unwrap(x, reject_host: bool):
    """Backing arrays for FakeArrays, recursively through lists/tuples; host arrays refused if asked."""
    if type(x) is FakeArray:
        return x._a
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, reject_host) for v in x)
    if reject_host:
        _reject_host(x)
    return x


def _wrap(r, owner=None):
    """Results back onto the device: arrays and scalars become FakeArrays (0-d for scalars)."""
    if isinstance(r, np.ndarray):
        if owner is not None and r is owner._a:
            return owner
        return FakeArray(r)
    if isinstance(r, (np.generic, bool, int, float, complex)):
        return FakeArray(np.asarray(r))
    if isinstance(r, (list, tuple)):
        return type(r)(_wrap(v) for v in r)
    return r


def _is_index_array(i) -> bool:
    return isinstance(i, np.ndarray) or type(i) is FakeArray


def _convert_index(idx, what: str):
    """Unwrap an index; count host index arrays (a copy to the device) and boolean masks (a sync)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    out = []
    for i in items:
        if isinstance(i, np.ndarray):
            _event("from_host", f"{what} with a host index array")
        elif isinstance(i, list):
            _event("from_host", f"{what} with a list index")
        if _is_index_array(i):
            arr = i._a if type(i) is FakeArray else i
            if arr.dtype == bool:
                # The result's size depends on the mask's contents: CuPy must read it (nonzero).
                _event("syncs", f"{what} with a boolean mask")
            i = arr
        out.append(i)
    return tuple(out) if isinstance(idx, tuple) else out[0]


def _is_operand(x) -> bool:
    return isinstance(x, (FakeArray, np.ndarray, np.generic, bool, int, float, complex))


def _ufunc_call(ufunc, method: str, inputs, kwargs):
    args = [_unwrap(x, True) for x in inputs]
    out = kwargs.get("out")
    kw = dict(kwargs)
    if out is not None:
        outs = out if isinstance(out, tuple) else (out,)
        kw["out"] = tuple(_unwrap(o, True) for o in outs)
    if "where" in kw:
        kw["where"] = _unwrap(kw["where"], True)
    with np.errstate(all="ignore"):  # CuPy never warns about division by zero or overflow
        r = getattr(ufunc, method)(*args, **kw)
    if method == "at":
        return None
    if out is not None:
        outs = out if isinstance(out, tuple) else (out,)
        return outs[0] if len(outs) == 1 else outs
    return _wrap(r)


def _binop(ufunc):
    def op(self, other):
        if not _is_operand(other):
            return NotImplemented
        return _ufunc_call(ufunc, "__call__", (self, other), {})

    def rop(self, other):
        if not _is_operand(other):
            return NotImplemented
        return _ufunc_call(ufunc, "__call__", (other, self), {})

    def iop(self, other):
        if not _is_operand(other):
            return NotImplemented
        _ufunc_call(ufunc, "__call__", (self, other), {"out": (self,)})
        return self

    return op, rop, iop


def _unop(ufunc):
    def op(self):
        return _ufunc_call(ufunc, "__call__", (self,), {})

    return op


def _method(name: str, sync: bool = False):
    def m(self, *args, **kwargs):
        if sync:
            _event("syncs", f".{name}()")
        args = _unwrap(args, False)
        kwargs = {k: _unwrap(v, False) for k, v in kwargs.items()}
        with np.errstate(all="ignore"):
            r = getattr(self._a, name)(*args, **kwargs)
        return _wrap(r, self)

    m.__name__ = name
    return m


class FakeArray:
    """A device array backed by host memory (see the module docstring). Build with :func:`wrap`."""

    __slots__ = ("__weakref__", "_a")
    __array_priority__ = 100  # CuPy's value; Tensor (1000) still wins reflected operators
    __hash__ = None  # type: ignore[assignment]  (unhashable, like ndarray)

    def __init__(self, backing: np.ndarray):
        self._a = backing

    # -- metadata (never a transfer) ------------------------------------------------------
    @property
    def data(self) -> FakeMemoryPointer:
        return FakeMemoryPointer(self._a.__array_interface__["data"][0])

    @property
    def device(self) -> FakeDevice:
        return FakeDevice(0)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: FakeArray(self._a.T))
    mT = property(lambda self: FakeArray(self._a.swapaxes(-1, -2)))
    real = property(lambda self: FakeArray(self._a.real))
    imag = property(lambda self: FakeArray(self._a.imag))
    base = property(lambda self: None)

    def __len__(self) -> int:
        if self._a.ndim == 0:
            raise TypeError("len() of unsized object")
        return self._a.shape[0]

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (FakeArray(self._a[i]) for i in range(self._a.shape[0]))

    # -- conversions: each one is an explicit transfer or a synchronisation ------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(_IMPLICIT)

    def get(self, stream=None, order="C", out=None, blocking=True):
        """Copy to a new NumPy array (a device-to-host transfer), like ``cupy.ndarray.get``."""
        _event("to_host", ".get()")
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order, copy=True)

    def set(self, arr, stream=None) -> None:
        """Copy a NumPy array into this one (host-to-device), like ``cupy.ndarray.set``."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"set() needs a numpy.ndarray, got {type(arr).__name__}")
        if arr.shape != self._a.shape:
            raise ValueError(f"set(): shape mismatch {arr.shape} vs {self._a.shape}")
        _event("from_host", ".set()")
        np.copyto(self._a, arr, casting="unsafe")

    def tolist(self):
        _event("to_host", ".tolist()")
        return self._a.tolist()

    def tobytes(self, order="C"):
        _event("to_host", ".tobytes()")
        return self._a.tobytes(order)

    def item(self, *args):
        _event("syncs", ".item()")
        return self._a.item(*args)

    def __bool__(self) -> bool:
        _event("syncs", "bool()")
        return bool(self._a)

    def __int__(self) -> int:
        _event("syncs", "int()")
        return int(self._a)

    def __float__(self) -> float:
        _event("syncs", "float()")
        return float(self._a)

    def __complex__(self) -> complex:
        _event("syncs", "complex()")
        return complex(self._a)

    def __index__(self) -> int:
        _event("syncs", "__index__")
        return self._a.__index__()

    def __format__(self, spec: str) -> str:
        _event("syncs", "format()")
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __repr__(self) -> str:  # not counted: it only runs while debugging or reporting a failure
        return "fake_device." + repr(self._a)

    __str__ = __repr__

    def __reduce__(self):
        _event("to_host", "pickle")
        return (_from_pickle, (np.array(self._a, copy=True),))

    def __copy__(self):
        return FakeArray(self._a.copy())

    def __deepcopy__(self, memo):
        return FakeArray(copy.deepcopy(self._a, memo))

    # -- indexing ---------------------------------------------------------------------------
    def __getitem__(self, idx):
        r = self._a[_convert_index(idx, "indexing")]
        return _wrap(r)

    def __setitem__(self, idx, value):
        idx = _convert_index(idx, "index assignment")
        if type(value) is FakeArray:
            value = value._a
        elif isinstance(value, np.ndarray) and value.ndim:
            # CuPy refuses this (``x[...] = host_array`` raises "non-scalar numpy.ndarray cannot be used
            # for fill"): the value must be moved to the device explicitly first
            raise TypeError("index assignment of a non-scalar host numpy.ndarray into a device array: "
                            "convert it with xp.asarray(value) first (CuPy raises here)")
        elif isinstance(value, np.ndarray):
            _event("from_host", "index assignment of a host array")
        elif isinstance(value, (list, tuple)):
            _event("from_host", "index assignment of a list")
        self._a[idx] = value

    # -- methods (results stay on the device) ------------------------------------------------
    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        r = self._a.astype(dtype, order=order, copy=copy)
        return self if r is self._a else FakeArray(r)

    def copy(self, order="C"):
        return FakeArray(self._a.copy(order=order))

    def nonzero(self):
        _event("syncs", ".nonzero()")
        return tuple(FakeArray(i) for i in self._a.nonzero())

    # -- NumPy protocol: np.<ufunc>(fake) and np.<function>(fake) stay on the device -----------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for x in inputs + tuple(kwargs.get("out", ()) or ()):
            if not _is_operand(x):
                return NotImplemented
        return _ufunc_call(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        return _call(func, args, kwargs)


for _name in ("reshape", "transpose", "swapaxes", "sum", "mean", "max", "min", "argmax", "argmin", "any",
              "all", "ravel", "flatten", "view", "fill", "clip", "dot", "squeeze", "var", "std", "prod",
              "cumsum", "cumprod", "round", "conj", "repeat", "take", "sort", "argsort", "diagonal",
              "trace", "put"):
    setattr(FakeArray, _name, _method(_name))

for _op, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                 ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power),
                 ("matmul", np.matmul), ("and", np.bitwise_and), ("or", np.bitwise_or),
                 ("xor", np.bitwise_xor), ("lshift", np.left_shift), ("rshift", np.right_shift)):
    _f, _rf, _if = _binop(_uf)
    setattr(FakeArray, f"__{_op}__", _f)
    setattr(FakeArray, f"__r{_op}__", _rf)
    setattr(FakeArray, f"__i{_op}__", _if)

for _op, _uf in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                 ("eq", np.equal), ("ne", np.not_equal)):
    setattr(FakeArray, f"__{_op}__", _binop(_uf)[0])

for _op, _uf in (("neg", np.negative), ("pos", np.positive), ("abs", np.absolute), ("invert", np.invert)):
    setattr(FakeArray, f"__{_op}__", _unop(_uf))


def _from_pickle(host):
    return FakeArray(host)


# ============================================================================ the xp namespace
# Functions that only look at metadata: their Python results are not device values.
_METADATA = frozenset({
    "ndim", "shape", "size", "result_type", "promote_types", "can_cast", "min_scalar_type",
    "issubdtype", "isscalar", "iscomplexobj", "isrealobj", "may_share_memory", "shares_memory",
    "broadcast_shapes", "dtype", "finfo", "iinfo", "isdtype", "get_printoptions",
})
# Functions whose result size depends on the data: CuPy reads the device to know it.
_SYNCING = frozenset({"nonzero", "argwhere", "flatnonzero", "unique", "extract", "compress"})
# Functions that take host data and put it on the device.
_FROM_HOST = frozenset({"asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray"})


def _call(func, args, kwargs):
    name = getattr(func, "__name__", "?")
    if name in _SYNCING or (name == "where" and len(args) + len(kwargs) == 1):
        _event("syncs", f"{name}()")
    reject = name not in _METADATA
    args = _unwrap(args, reject)
    kwargs = {k: _unwrap(v, reject and k != "like") for k, v in kwargs.items()}
    with np.errstate(all="ignore"):
        r = func(*args, **kwargs)
    if name in _METADATA:
        return r
    return _wrap(r)


class _FakeUfunc:
    """A NumPy ufunc whose calls (``__call__``, ``at``, ``reduce``...) stay on the device."""

    def __init__(self, ufunc):
        self._uf = ufunc
        self.__name__ = ufunc.__name__
        self.nin, self.nout = ufunc.nin, ufunc.nout

    def __call__(self, *args, **kwargs):
        return _ufunc_call(self._uf, "__call__", args, kwargs)

    def at(self, a, indices, b=None):
        if type(a) is not FakeArray:
            raise TypeError(_HOST_MIX)
        idx = _convert_index(indices, f"{self.__name__}.at")
        args = (a._a, idx) if b is None else (a._a, idx, _unwrap(b, True))
        self._uf.at(*args)

    def reduce(self, *args, **kwargs):
        return _ufunc_call(self._uf, "reduce", args, kwargs)

    def accumulate(self, *args, **kwargs):
        return _ufunc_call(self._uf, "accumulate", args, kwargs)

    def outer(self, *args, **kwargs):
        return _ufunc_call(self._uf, "outer", args, kwargs)

    def __repr__(self) -> str:
        return f"<fake ufunc '{self.__name__}'>"


def _function(func):
    def f(*args, **kwargs):
        return _call(func, args, kwargs)

    f.__name__ = getattr(func, "__name__", "f")
    f.__doc__ = f"Device version of numpy.{f.__name__}."
    return f


class _Namespace(types.ModuleType):
    """Wraps a NumPy namespace (``numpy``, ``numpy.linalg``): attribute access gives device versions."""

    def __init__(self, name: str, source):
        super().__init__(name)
        self._source = source
        self._cache: dict = {}

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        cache = self.__dict__["_cache"]
        if name in cache:
            return cache[name]
        obj = getattr(self.__dict__["_source"], name)  # AttributeError when NumPy has no such name
        if isinstance(obj, np.ufunc):
            obj = _FakeUfunc(obj)
        elif isinstance(obj, type) or not callable(obj):
            pass  # dtypes, finfo/iinfo, constants: shared with NumPy (as CuPy shares them)
        elif name in _METADATA:
            pass
        else:
            obj = _function(obj)
        cache[name] = obj
        return obj


def asarray(a, dtype=None, order=None, *, blocking=False):
    """Device array from device or host data (host data: a copy to the device)."""
    if type(a) is FakeArray:
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    _event("from_host", "asarray(host data)")
    if isinstance(a, (list, tuple)) and any(type(v) is FakeArray for v in a):
        raise TypeError(_IMPLICIT)
    return FakeArray(np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(obj, dtype=None, copy=True, order="K", ndmin=0):
    """Like ``cupy.array``: a device copy (from device data) or a host-to-device copy."""
    if type(obj) is FakeArray:
        r = np.array(obj._a, dtype=dtype, copy=copy, order=order, ndmin=ndmin)
        return obj if r is obj._a else FakeArray(r)
    _event("from_host", "array(host data)")
    if isinstance(obj, (list, tuple)) and any(type(v) is FakeArray for v in obj):
        raise TypeError(_IMPLICIT)
    return FakeArray(np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin))


def ascontiguousarray(a, dtype=None):
    if type(a) is FakeArray:
        r = np.ascontiguousarray(a._a, dtype=dtype)
        return a if r is a._a else FakeArray(r)
    return asarray(np.ascontiguousarray(a, dtype=dtype))


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """Like ``cupy.asnumpy``: a device-to-host copy (host inputs pass through)."""
    if type(a) is FakeArray:
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*arrays):
    return xp if any(type(a) is FakeArray for a in arrays) else np


class _Random(types.ModuleType):
    """``xp.random``: device random numbers (CuPy's signatures, e.g. ``random(size, dtype)``)."""

    def __init__(self):
        super().__init__("fake_device.xp.random")
        self._gen = np.random.default_rng(0)

    def seed(self, seed=None):
        self._gen = np.random.default_rng(seed)

    def random(self, size=None, dtype=np.float64):
        return FakeArray(np.asarray(self._gen.random(size, dtype=dtype)))

    random_sample = random

    def rand(self, *size):
        return self.random(size)

    def standard_normal(self, size=None, dtype=np.float64):
        return FakeArray(np.asarray(self._gen.standard_normal(size, dtype=dtype)))

    def randn(self, *size, dtype=np.float64):
        return self.standard_normal(size, dtype)

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=np.float64):
        return FakeArray(np.asarray(self._gen.normal(loc, scale, size)).astype(dtype))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=np.float64):
        return FakeArray(np.asarray(self._gen.uniform(low, high, size)).astype(dtype))

    def randint(self, low, high=None, size=None, dtype=np.int64):
        return FakeArray(np.asarray(self._gen.integers(low, high, size, dtype=dtype)))

    def permutation(self, n):
        return FakeArray(self._gen.permutation(n))


#: The fake's array module (``backend.get_array_module(fake_array) is xp``).
xp = _Namespace("fake_device.xp", np)
xp.ndarray = FakeArray
xp.asarray = asarray
xp.array = array
xp.ascontiguousarray = ascontiguousarray
xp.asnumpy = asnumpy
xp.get_array_module = get_array_module
xp.random = _Random()
xp.linalg = _Namespace("fake_device.xp.linalg", np.linalg)
xp.newaxis = None


def wrap(host: np.ndarray) -> FakeArray:
    """Put a NumPy array on the fake device (a counted host-to-device copy)."""
    return asarray(host)


def to_host(a: FakeArray) -> np.ndarray:
    """The backend's ``to_host`` for fake arrays: a counted device-to-host copy."""
    return a.get()


def _from_host(host, index: int = 0) -> FakeArray:
    return asarray(host)


# ============================================================================ backend registration
def install(name: str = "fake"):
    """Register the fake with ``neural_arch.backend`` under device type ``name``."""
    from neural_arch import backend

    return backend.register_device_type(name, xp=xp, array_type=FakeArray, to_host=to_host,
                                        from_host=_from_host)


def uninstall(name: str = "fake") -> None:
    from neural_arch import backend

    backend.unregister_device_type(name)


@contextlib.contextmanager
def installed(name: str = "fake"):
    """``install(name)`` for the duration of a with-block."""
    install(name)
    try:
        yield xp
    finally:
        uninstall(name)


def assert_host_and_device_agree(fn, arrays, upstream, consts=()) -> None:
    """Run ``fn(*leaves, *consts)`` forward and backward on the host and on the fake device (leaves
    made from ``arrays``, the upstream gradient ``upstream(shape)``): on the device the result stays a
    device array and neither pass waits for the device or copies from the host, and the result and
    every leaf's gradient equal the host's (1e-12). What an op's strict-device test asserts.

    Example::

        fd.assert_host_and_device_agree(lambda t: t.exp(), [np.ones(3)], np.ones)
    """
    from neural_arch import backend
    from neural_arch.core.tensor import Tensor

    results = {}
    with installed("fake"):
        for dev in ("cpu", "fake"):
            leaves = [Tensor(a.copy(), device=dev, requires_grad=True) for a in arrays]
            cs = [c if dev == "cpu" else backend.to_device(c, "fake") for c in consts]
            with counting() as ev:
                out = fn(*leaves, *cs)
            grad = Tensor(upstream(out.shape), device=dev)
            with counting() as ev_back:
                out.backward(grad)
            if dev == "fake":
                assert type(out.data) is FakeArray, "the result left the device"
                for events in (ev, ev_back):
                    assert events.host_waits == [] and events.from_host == [], f"the host waited or copied: {events}"
            results[dev] = [np.asarray(backend.to_host(t.data) if dev == "fake" else t.data)
                            for t in [out] + [leaf.grad for leaf in leaves]]
    for host, device in zip(results["cpu"], results["fake"]):
        np.testing.assert_allclose(device, host, rtol=1e-12, atol=1e-12)
