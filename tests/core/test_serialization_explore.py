"""Exploring properties of ``neural_arch.save`` / ``load`` against what torch's ``save``/``load`` keep.

Nested state-dict-like objects (every dtype ``save`` writes, bfloat16 included; 0-d, empty and
non-contiguous arrays; Tensors and Parameters with their ``requires_grad``; the same Tensor under two
keys; tuples vs lists; None; awkward key names) must come back bit for bit, with their types. A
truncated file, or a file written for another shape, is a clear error, never a partial or quiet load.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import nn

_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int64", "uint8", "uint64", "bool", "complex64"]
_LAYOUTS = ["c", "transposed", "reversed", "strided"]
# names a state dict may really hold, and ones that collide with the file's own entry names
_KEYS = ["weight", "bias", "layer.0.weight", "", "tensor", "tensor#1", "__metadata__", "a.b"]


def _array(rng, dtype: str, shape: tuple, layout: str) -> np.ndarray:
    values = np.asarray(rng.standard_normal(shape)) * 50
    if dtype == "complex64":
        arr = (values + 1j * np.asarray(rng.standard_normal(shape))).astype(np.complex64)
    elif dtype == "bool":
        arr = values > 0
    else:
        arr = values.astype(na.bfloat16 if dtype == "bfloat16" else dtype)
    if dtype.startswith("float") and arr.size:
        arr.flat[0] = np.nan  # special values must survive bit for bit
        arr.flat[-1] = -np.inf
    if layout == "transposed":
        return arr.T
    if layout == "reversed" and arr.ndim:
        return arr[::-1]
    if layout == "strided" and arr.ndim:
        return arr[..., ::2]
    return arr


@st.composite
def _state(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    state = {}
    for key in draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=4, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        arr = _array(rng, draw(st.sampled_from(_DTYPES)), shape, draw(st.sampled_from(_LAYOUTS)))
        kind = draw(st.sampled_from(["array", "tensor", "grad", "parameter", "scalar", "nested"]))
        if kind == "tensor":
            state[key] = na.Tensor(arr)
        elif kind == "grad" and arr.dtype.kind == "f" and arr.dtype != na.bfloat16:
            state[key] = na.Tensor(arr, requires_grad=True)
        elif kind == "parameter" and arr.dtype.kind == "f" and arr.dtype != na.bfloat16:
            state[key] = nn.Parameter(arr, requires_grad=draw(st.booleans()))
        elif kind == "scalar" and arr.size:
            state[key] = arr.ravel()[0]  # a NumPy scalar of the array's dtype
        elif kind == "nested":
            state[key] = {"step": draw(st.integers(-2**40, 2**40)), "betas": (0.9, 0.999), "ids": [1, None],
                          "lr": draw(st.floats(allow_nan=False)), "buf": arr}
        else:
            state[key] = arr
    if draw(st.booleans()):  # tied: the same Tensor object under a second key (torch keeps it shared)
        shared = na.Tensor(rng.standard_normal(3))
        state["tied_a"], state["tied_b"] = shared, shared
    return state


def _same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, na.Tensor):
        assert a.requires_grad == b.requires_grad
        a, b = a.numpy(), b.numpy()
    if isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b)
        # bits, not values: nan payloads and -0.0 too
        np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _roundtrip(obj):
    buffer = io.BytesIO()
    na.save(obj, buffer)
    return na.load(io.BytesIO(buffer.getvalue())), buffer.getvalue()


@settings(max_examples=25)
@given(state=_state())
@example(state={"__metadata__": np.ones(2)})  # bug: the file was written, then no reader could open it
@example(state={"": np.float32(1), "tensor": np.zeros((0, 3)), "tensor#1": np.array(5, np.int8)})
def test_state_dicts_come_back_bit_for_bit_with_their_types(state):
    back, _ = _roundtrip(state)
    _same(state, back)
    if "tied_a" in state:
        assert back["tied_a"] is back["tied_b"]


def test_a_foreign_bfloat16_safetensors_file_loads():
    """Most published weights are BF16 safetensors files; ``safetensors.numpy`` cannot read BF16, and
    ``load`` called such a valid file "corrupt"."""
    bits = np.array([0x3F80, 0xC000, 0x7FC0], dtype="<u2")  # 1.0, -2.0, nan as bfloat16
    header = {"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}, "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    body = bits.tobytes() + np.float32(3.5).tobytes()
    back = na.load(io.BytesIO(struct.pack("<Q", len(raw)) + raw + body))
    assert back["w"].dtype == na.bfloat16 and back["w"][:2].tolist() == [1.0, -2.0] and np.isnan(back["w"][2])
    assert back["b"].tolist() == [3.5]
    header["w"]["shape"] = [4]  # more elements than its bytes: still a clear error
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with pytest.raises(ValueError, match="corrupt"):
        na.load(io.BytesIO(struct.pack("<Q", len(raw)) + raw + body))


def test_every_truncation_of_a_file_is_a_clear_error():
    _, raw = _roundtrip({"w": np.arange(6.0), "step": 3, "bf": np.ones(2, na.bfloat16)})
    for cut in range(len(raw)):
        with pytest.raises(ValueError):
            na.load(io.BytesIO(raw[:cut]))


def test_loading_a_state_dict_of_another_shape_is_a_clear_error():
    back, _ = _roundtrip(nn.Linear(4, 2).state_dict())
    with pytest.raises(RuntimeError, match="shape mismatch"):
        nn.Linear(3, 2).load_state_dict(back)


class _Opaque:
    """Only pickle can hold this: a file with it is a pickle file."""


def test_weights_only_none_is_torchs_default_and_never_unpickles():
    """torch's ``load(weights_only=None)`` means its default, True; here None used to be falsy and
    unpickled the file (a pickle can run code while loading)."""
    buffer = io.BytesIO()
    na.save({"x": _Opaque()}, buffer)
    with pytest.raises(na.serialization.WeightsOnlyUnpicklingError):
        na.load(io.BytesIO(buffer.getvalue()), weights_only=None)
    assert type(na.load(io.BytesIO(buffer.getvalue()), weights_only=False)["x"]) is _Opaque
