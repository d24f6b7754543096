"""``save`` / ``load``: torch's checkpoint functions, without pickle on the default path.

``save(obj, f)`` writes a `safetensors <https://github.com/huggingface/safetensors>`_ file: the
arrays of ``obj`` (Tensors, NumPy/CuPy arrays, NumPy scalars) as safetensors entries, and the
structure around them (dicts, OrderedDicts, lists, tuples, numbers, strings, None, dtypes) as JSON
in the file's metadata. A state dict therefore opens in any safetensors reader, with its own keys
as entry names. ``load(f)`` rebuilds the object; with ``weights_only=True`` (the default, as in
torch >= 2.6) it never unpickles anything, so a malicious file cannot run code.

A damaged or crafted file makes ``load`` raise ``ValueError`` ("malformed neural_arch file ..."),
never a bare ``RecursionError``/``TypeError``: the structure's nesting is bounded (200 levels) and
its dtypes must be ones ``save`` writes (bool, int/uint 8-64, float16-64, bfloat16, complex).

Objects outside that set (your own classes, sets, functions...) cannot be written that way: then
``save`` falls back to pickle, and ``load`` reads such a file only with ``weights_only=False``.
**Only unpickle files from sources you trust**: a pickle can run arbitrary code while loading.

Writing to a path is atomic: a temp file in the same folder (``name.tmp-XXXX``, the pattern the
elastic agent's ``remove_interrupted_writes`` cleans up), ``fsync``, then ``os.replace``. A reader
sees the old file or the new one, never half of one, even if the writer is killed.

Example::

    >>> import os, tempfile
    >>> import neural_arch as na
    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(3, 2)
    >>> opt = optim.Adam(model.parameters())
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
    >>> na.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 7}, path)
    >>> ckpt = na.load(path)
    >>> ckpt["step"], sorted(ckpt["model"])
    (7, ['bias', 'weight'])
    >>> _ = model.load_state_dict(ckpt["model"])
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import struct
import sys
from collections import OrderedDict

import numpy as np

from . import backend as _backend
from .core import dtypes as _dtypes
from .core.tensor import Tensor
from .utils.atomic_file import atomic_write_bytes

__all__ = ["WeightsOnlyUnpicklingError", "load", "save"]

_FORMAT = "neural_arch.save/1"
_META_KEY = "neural_arch"
_PICKLE_MAGIC = b"NEURAL_ARCH_PICKLE/1\n"
_SAFETENSORS_DTYPES = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                       "float16", "float32", "float64"}
_SAFE_TYPES = "Tensors, NumPy/CuPy arrays and scalars, dict/OrderedDict/list/tuple, str, int, float, bool, None"


class WeightsOnlyUnpicklingError(pickle.UnpicklingError):
    """``load(weights_only=True)`` met a file that only pickle could read (nothing was unpickled).

    Example::

        >>> import io
        >>> import neural_arch as na
        >>> buffer = io.BytesIO()
        >>> na.save({"fn": len}, buffer)                      # a builtin function: only pickle holds it
        >>> try:
        ...     na.load(io.BytesIO(buffer.getvalue()))
        ... except na.serialization.WeightsOnlyUnpicklingError:
        ...     print("refused")
        refused
    """


class _Unsupported(Exception):
    def __init__(self, path: str, obj):
        super().__init__(f"{type(obj).__module__}.{type(obj).__qualname__} at {path or '<root>'}")


# ============================================================================ encoding
class _Encoder:
    """Walk ``obj`` into a JSON tree plus a ``{name: array}`` dict for safetensors."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self.memo: dict[int, dict] = {}  # the same Tensor/array twice is stored once (tied weights)
        self.keep = []  # keep memoised objects alive so their ids stay unique while encoding

    def name_for(self, path: str) -> str:
        name = path or "tensor"
        # "__metadata__" is the safetensors header's own key: an entry of that name writes a file that
        # no reader can open (a state dict key of that name gets a suffix, like any repeated name)
        if name in self.arrays or name == "__metadata__":
            k = 1
            while f"{name}#{k}" in self.arrays:
                k += 1
            name = f"{name}#{k}"
        return name

    def add_array(self, arr, path: str) -> dict:
        device = _backend.device_of(arr)
        host = _backend.to_device(arr, "cpu")
        if not host.flags.c_contiguous:  # (not ascontiguousarray: it turns 0-d into 1-d)
            host = host.copy(order="C")
        dtype = host.dtype
        if dtype.name == "bfloat16":
            host = host.view(np.uint16)  # safetensors.numpy cannot read BF16 back: store the bits
        elif dtype.kind == "c":  # complex: (real, imag) pairs in a trailing axis
            host = np.stack([host.real, host.imag], axis=-1)
        elif dtype.name not in _SAFETENSORS_DTYPES:
            raise _Unsupported(path, arr)
        name = self.name_for(path)
        self.arrays[name] = host
        return {"name": name, "dtype": dtype.name, "device": device}

    def encode(self, obj, path: str):
        # Exact types only: a subclass (an IntEnum, a namedtuple, a Tensor subclass) would come
        # back as its base class, so it goes to the pickle path instead of silently changing type.
        t = type(obj)
        if obj is None or t in (bool, str, int):
            return obj
        if t is float:
            return obj if math.isfinite(obj) else {"float": repr(obj)}  # JSON has no nan/inf
        if t is complex:
            return {"complex": [self.encode(obj.real, path), self.encode(obj.imag, path)]}
        if t is Tensor or _is_parameter(obj):
            key = id(obj)
            if key in self.memo:
                return {"ref": self.memo[key]["tensor"]["name"]}
            entry = self.add_array(obj.data, path)
            node = {"tensor": entry, "requires_grad": bool(obj.requires_grad and obj.grad_fn is None),
                    "parameter": _is_parameter(obj)}
            self.memo[key] = node
            self.keep.append(obj)
            return node
        if isinstance(obj, np.generic):
            return {"scalar": self.add_array(np.asarray(obj), path)}
        if type(obj) is np.ndarray or hasattr(obj, "__cuda_array_interface__"):
            key = id(obj)
            if key in self.memo:
                return {"ref": self.memo[key]["array"]["name"]}
            node = {"array": self.add_array(obj, path)}
            self.memo[key] = node
            self.keep.append(obj)
            return node
        if isinstance(obj, np.dtype):
            return {"dtype": obj.name}
        if t is bytes:
            return {"bytes": base64.b64encode(obj).decode("ascii")}
        if type(obj) in (dict, OrderedDict):
            items = []
            for k, v in obj.items():
                if not (k is None or type(k) in (str, int, float, bool)):
                    raise _Unsupported(f"{path} (a {type(k).__name__} key)", k)
                items.append([self.encode(k, path), self.encode(v, _join(path, k))])
            return {"odict" if type(obj) is OrderedDict else "dict": items}
        if type(obj) in (list, tuple):
            kind = "list" if type(obj) is list else "tuple"
            return {kind: [self.encode(v, _join(path, i)) for i, v in enumerate(obj)]}
        raise _Unsupported(path, obj)


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def _is_parameter(obj) -> bool:
    # Looked up lazily so that serialization never imports nn: without nn loaded there are no
    # Parameters to find.
    mod = sys.modules.get("neural_arch.nn.parameter")
    return mod is not None and type(obj) is mod.Parameter


# ============================================================================ decoding
# The dtypes a file may name (arrays and ``dtype`` values): what ``save`` writes. A name is looked up
# here, never handed to ``np.dtype`` (which builds structured, object or 2**40-byte void dtypes).
_LOADABLE_DTYPES = _SAFETENSORS_DTYPES | {"bfloat16", "complex64", "complex128"}
_MAX_DEPTH = 200  # nesting of a stored object (far more than any state dict; below Python's recursion limit)
# What a crafted or damaged file can make the decoder raise; all become ``ValueError("malformed ...")``.
_MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)


def _loadable_dtype(name) -> np.dtype:
    if not isinstance(name, str) or name not in _LOADABLE_DTYPES:
        raise ValueError(f"dtype {str(name)[:40]!r} is not one save() writes ({', '.join(sorted(_LOADABLE_DTYPES))})")
    return _dtypes.as_dtype(name)


class _Decoder:
    def __init__(self, get_array, map_location):
        self.get_array = get_array
        self.map_location = map_location
        self.by_name: dict[str, object] = {}

    def array(self, entry: dict, place: bool = True):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise TypeError("bad array entry")
        host = self.get_array(entry["name"])
        dtype = _loadable_dtype(entry.get("dtype", host.dtype.name))
        if dtype.name == "bfloat16":
            host = host.view(dtype)
        elif dtype.kind == "c" and host.ndim and host.shape[-1] == 2:
            host = (host[..., 0] + 1j * host[..., 1]).astype(dtype)
        elif host.dtype != dtype:
            raise ValueError(f"{entry['name']}: dtype {host.dtype}, expected {dtype}")
        return _place(host, str(entry.get("device", "cpu")), self.map_location) if place else host

    def decode(self, node, depth: int = 0):
        if node is None or isinstance(node, (bool, str, int, float)):
            return node
        if not isinstance(node, dict) or not node:
            raise TypeError(f"unknown node {str(node)[:40]}")
        if depth > _MAX_DEPTH:
            raise ValueError(f"the stored object nests deeper than {_MAX_DEPTH} levels")
        return self._decode(node, depth + 1)

    def _decode(self, node: dict, depth: int):
        if "tensor" in node:
            arr = self.array(node["tensor"])
            if node.get("parameter"):
                from .nn.parameter import Parameter  # lazy: nn is optional here

                out = Parameter(arr, requires_grad=bool(node.get("requires_grad", True)))
            else:
                out = Tensor(arr, requires_grad=bool(node.get("requires_grad", False)))
            self.by_name[node["tensor"]["name"]] = out
            return out
        if "array" in node:
            out = self.array(node["array"])
            self.by_name[node["array"]["name"]] = out
            return out
        if "ref" in node:
            if node["ref"] not in self.by_name:
                raise ValueError("reference before definition")
            return self.by_name[node["ref"]]
        if "scalar" in node:
            return self.array(node["scalar"], place=False)[()]
        if "float" in node:
            if node["float"] not in ("nan", "inf", "-inf"):
                raise ValueError("bad float")
            return float(node["float"])
        if "complex" in node:
            re, im = node["complex"]
            return complex(self.decode(re, depth), self.decode(im, depth))
        if "dtype" in node:
            return _loadable_dtype(node["dtype"])
        if "bytes" in node:
            return base64.b64decode(node["bytes"])
        for kind, cls in (("dict", dict), ("odict", OrderedDict)):
            if kind in node:
                return cls((self.decode(k, depth), self.decode(v, depth)) for k, v in node[kind])
        if "list" in node:
            return [self.decode(v, depth) for v in node["list"]]
        if "tuple" in node:
            return tuple(self.decode(v, depth) for v in node["tuple"])
        raise ValueError(f"unknown node kind {sorted(node)[:3]}")


def _place(host: np.ndarray, saved_device: str, map_location):
    """Move a loaded host array where ``map_location`` says (default: where it was saved)."""
    target = saved_device
    if callable(map_location):
        return map_location(host, saved_device)
    if isinstance(map_location, dict):
        target = map_location.get(saved_device, saved_device)
    elif map_location is not None:
        target = str(_backend.parse_device(map_location))
    if _backend.parse_device(target).type == "cpu":
        return host
    try:
        return _backend.to_device(host, target)
    except RuntimeError as exc:
        raise RuntimeError(
            f"load: this checkpoint holds data saved on {saved_device}, which cannot be restored "
            f"here ({exc}); pass map_location='cpu' to load it on the CPU"
        ) from None


# ============================================================================ public API
def save(obj, f, *, pickle_protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    """Save ``obj`` to ``f`` (a path, written atomically, or a binary file object).

    Tensors, arrays, numbers, strings, None and dict/list/tuple nests of them go into a
    safetensors file that :func:`load` reads without pickle. Anything else makes the whole file a
    pickle, which only ``load(..., weights_only=False)`` opens (trusted files only).

    Example::

        >>> import os, tempfile
        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
        >>> na.save(nn.Linear(2, 1).state_dict(), path)
        >>> sorted(na.load(path))
        ['bias', 'weight']
    """
    try:
        enc = _Encoder()
        tree = enc.encode(obj, "")
    except _Unsupported as why:
        payload = _PICKLE_MAGIC + json.dumps({"reason": str(why)}).encode() + b"\n" + \
            pickle.dumps(obj, protocol=pickle_protocol)
    else:
        import safetensors.numpy  # lazy: only save/load pay for the import

        meta = {_META_KEY: json.dumps({"format": _FORMAT, "root": tree}, allow_nan=False)}
        payload = safetensors.numpy.save(enc.arrays, metadata=meta)
    _write(f, payload)


def load(f, map_location=None, weights_only: bool | None = True, **pickle_load_args):
    """Load what :func:`save` wrote (or any safetensors file, as a dict of arrays).

    Args:
        f: a path or a binary file object.
        map_location: where to put arrays and tensors: ``None`` (where they were saved),
            ``"cpu"``, ``"cuda:N"``, a dict ``{"cuda:1": "cuda:0"}`` or a callable
            ``fn(host_array, saved_device) -> array``.
        weights_only: ``True`` (default; ``None`` means the default, as in torch) never unpickles: a
            file that needs pickle raises :class:`WeightsOnlyUnpicklingError`. ``False`` also reads
            pickled files; **it can run arbitrary code, so use it only for files you trust**.

    Example::

        >>> import io
        >>> import neural_arch as na
        >>> buffer = io.BytesIO()
        >>> na.save({"w": na.ones(2), "step": 3}, buffer)
        >>> state = na.load(io.BytesIO(buffer.getvalue()))
        >>> state["w"].tolist(), state["step"]
        ([1.0, 1.0], 3)
    """
    data = _read(f)
    if _is_safetensors(data):
        return _load_safetensors(data, map_location)
    if data.startswith(_PICKLE_MAGIC) or data[:1] == b"\x80":  # ours, or a plain pickle file
        reason, body = "", data
        if data.startswith(_PICKLE_MAGIC):
            header_end = data.find(b"\n", len(_PICKLE_MAGIC))
            try:
                reason = str(json.loads(data[len(_PICKLE_MAGIC):header_end]).get("reason", ""))
            except (ValueError, AttributeError):
                reason = ""
            body = data[header_end + 1:]
        if weights_only or weights_only is None:  # torch's None is its default, True: never unpickle
            why = f" (it holds {reason})" if reason else ""
            raise WeightsOnlyUnpicklingError(
                f"load(weights_only=True): this file is a pickle{why}, and unpickling can run "
                f"arbitrary code, so it was not opened. If you trust its source, use "
                f"load(f, weights_only=False). weights_only files hold only {_SAFE_TYPES}."
            )
        # Trusted-only path, documented above: a plain pickle load.
        return _place_tree(pickle.loads(body, **pickle_load_args), map_location)
    raise ValueError(
        "load: not a file written by neural_arch.save (nor a safetensors or pickle file); "
        "PyTorch's zip checkpoints cannot be read: re-save them with safetensors"
    )


def _is_safetensors(data: bytes) -> bool:
    """A safetensors file: 8-byte little-endian header length, then a JSON object."""
    if len(data) < 10:
        return False
    (header_len,) = struct.unpack("<Q", data[:8])
    return header_len <= len(data) - 8 and data[8:9] == b"{"


def _load_safetensors(data: bytes, map_location):
    import safetensors.numpy

    (header_len,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + header_len])
        arrays = _with_bfloat16(data, header_len, header) if _has_bfloat16(header) else safetensors.numpy.load(data)
    except Exception as exc:  # noqa: BLE001  (the Rust reader raises its own error types)
        raise ValueError(f"load: corrupt safetensors file ({type(exc).__name__}: {exc})") from None
    meta = (header.get("__metadata__") or {}).get(_META_KEY)
    if meta is None:  # a foreign safetensors file: its entries, by name
        return {k: _place(v, "cpu", map_location) for k, v in arrays.items()}
    try:
        info = json.loads(meta)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"load: malformed neural_arch file (its structure is not valid JSON: "
                         f"{type(exc).__name__})") from None
    if not isinstance(info, dict) or info.get("format") != _FORMAT:
        found = info.get("format") if isinstance(info, dict) else None
        raise ValueError(f"load: unsupported format {str(found)[:40]!r} (this version reads {_FORMAT})")

    def get(name):
        if name not in arrays:
            raise ValueError(f"missing array {name!r}")
        return arrays[name]

    try:
        return _Decoder(get, map_location).decode(info.get("root"))
    except _MALFORMED as exc:
        raise ValueError(f"load: malformed neural_arch file ({type(exc).__name__}: {str(exc)[:200]})") from None


def _has_bfloat16(header) -> bool:
    return isinstance(header, dict) and any(isinstance(v, dict) and v.get("dtype") == "BF16" for v in header.values())


def _with_bfloat16(data: bytes, header_len: int, header: dict) -> dict:
    """The entries of a safetensors file that holds BF16 ones (most published model weights).

    ``safetensors.numpy`` cannot read BF16 (NumPy has no such dtype): this lets the Rust reader validate
    and read the file with each BF16 entry retyped as U16 (same size), then views those bits as
    ``ml_dtypes.bfloat16``, so a foreign BF16 file loads instead of being called corrupt.
    """
    import safetensors.numpy

    retyped = {k: (dict(v, dtype="U16") if isinstance(v, dict) and v.get("dtype") == "BF16" else v)
               for k, v in header.items()}
    new_header = json.dumps(retyped, separators=(",", ":")).encode()
    new_header += b" " * (-len(new_header) % 8)  # the data section stays 8-byte aligned
    arrays = safetensors.numpy.load(struct.pack("<Q", len(new_header)) + new_header + data[8 + header_len:])
    bf16 = _dtypes.as_dtype("bfloat16")
    return {k: (v.view(bf16) if header[k].get("dtype") == "BF16" else v) for k, v in arrays.items()}


def _place_tree(obj, map_location):
    """Apply ``map_location`` to the tensors of an unpickled object (trusted path)."""
    if map_location is None:
        return obj
    if isinstance(obj, Tensor):
        obj.data = _place(_backend.to_device(obj.data, "cpu"), obj.device, map_location)
        return obj
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _place_tree(obj[k], map_location)
        return obj
    if isinstance(obj, list):
        return [_place_tree(v, map_location) for v in obj]
    if isinstance(obj, tuple) and type(obj) is tuple:
        return tuple(_place_tree(v, map_location) for v in obj)
    return obj


# ============================================================================ file I/O
def _write(f, payload: bytes) -> None:
    if hasattr(f, "write"):
        f.write(payload)
        return
    atomic_write_bytes(os.fspath(f), payload, sync_dir=True)  # the rename itself durable too


def _read(f) -> bytes:
    if hasattr(f, "read"):
        data = f.read()
        return bytes(data) if not isinstance(data, bytes) else data
    with open(os.fspath(f), "rb") as src:
        return src.read()

