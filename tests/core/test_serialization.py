"""``neural_arch.save`` / ``load``: round trips of state dicts, optimizer state and nested
containers; the file is plain safetensors; writes are atomic; ``weights_only=True`` never
unpickles (a malicious pickle must not run)."""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neural_arch as na
from neural_arch import nn, optim
from neural_arch.serialization import WeightsOnlyUnpicklingError


def _same(a, b):
    """Deep equality that also checks container types, dtypes and Tensor flags."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, na.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b)
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def _roundtrip(obj, tmp_path, **load_kwargs):
    path = tmp_path / "obj.safetensors"
    na.save(obj, path)
    return na.load(path, **load_kwargs)


def _trained():
    na.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.9))
    for _ in range(2):
        loss = model(na.randn(4, 1, 4, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def test_state_dict_and_optimizer_roundtrip(tmp_path):
    model, opt = _trained()
    ckpt = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "name": "run-1",
            "best": None, "loss": 0.25, "flags": [True, False], "shape": (2, 3)}
    back = _roundtrip(ckpt, tmp_path)
    _same(ckpt, back)
    assert isinstance(back["model"], OrderedDict) and 0 in back["optim"]["state"]  # int keys kept
    assert back["model"]["1.num_batches_tracked"].dtype == np.int64
    # and it loads back into fresh objects
    model2, opt2 = _trained()
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])
    x = na.randn(2, 1, 4, 4)
    model.eval()
    model2.eval()
    np.testing.assert_array_equal(model(x).numpy(), model2(x).numpy())


def test_the_file_is_plain_safetensors_named_by_key(tmp_path):
    import safetensors.numpy

    model, _ = _trained()
    path = tmp_path / "model.safetensors"
    na.save(model.state_dict(), path)
    arrays = safetensors.numpy.load_file(str(path))
    assert set(arrays) == set(model.state_dict())
    np.testing.assert_array_equal(arrays["0.weight"], model.state_dict()["0.weight"])
    # a foreign safetensors file (no neural_arch metadata) loads as a dict of arrays
    safetensors.numpy.save_file({"w": np.arange(3.0)}, str(tmp_path / "foreign.safetensors"))
    assert na.load(tmp_path / "foreign.safetensors")["w"].tolist() == [0.0, 1.0, 2.0]


def test_tensors_parameters_and_special_values(tmp_path):
    p = nn.Parameter(na.randn(2, 2))
    t = na.tensor([1, 2, 3])
    leaf = na.ones(3, requires_grad=True)
    obj = {
        "p": p, "p_again": p, "t": t, "leaf": leaf, "nonleaf": leaf * 2, "scalar": np.float32(1.5),
        "int_scalar": np.int64(7), "zero_d": na.tensor(2.0), "empty": np.zeros((0, 3)),
        "strided": np.arange(12.0).reshape(3, 4)[:, ::2], "bf16": na.tensor([1.5, -2.0]).to(na.bfloat16),
        "c": np.array([1 + 2j]), "nan": float("nan"), "inf": -float("inf"), "cplx": 1 - 1j,
        "bytes": b"\x00\xff", "dtype": na.float16, "u8": np.arange(3, dtype=np.uint8),
        "bools": np.array([True, False]), "nested": [{"a": (1, [2.0, "x"])}, ()],
        1: "int key", 2.5: "float key", None: "none key",
    }
    back = _roundtrip(obj, tmp_path)
    assert type(back["p"]) is nn.Parameter and back["p"].requires_grad
    assert back["p"] is back["p_again"]  # shared (tied) tensors stay shared
    assert back["leaf"].requires_grad and not back["nonleaf"].requires_grad  # like pickling: detached
    assert back["bf16"].dtype == na.bfloat16 and back["bf16"].tolist() == [1.5, -2.0]
    assert isinstance(back["scalar"], np.float32) and back["dtype"] == np.float16
    assert back["strided"].tolist() == [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]]
    assert back[1] == "int key" and back[2.5] == "float key" and back[None] == "none key"
    obj["nonleaf"] = obj["nonleaf"].detach()
    _same({k: v for k, v in obj.items() if k not in ("p", "p_again")},
          {k: v for k, v in back.items() if k not in ("p", "p_again")})


arrays = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.int8, np.bool_, np.float16]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
)
leaves = st.one_of(arrays, arrays.map(na.from_numpy), st.integers(-2**70, 2**70), st.floats(),
                   st.text(max_size=5), st.booleans(), st.none())
trees = st.recursive(leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.lists(kids, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=4), kids, max_size=3)), max_leaves=8)


@settings(deadline=None, max_examples=25)
@given(obj=trees)
def test_roundtrip_property(obj):
    buf = io.BytesIO()
    na.save(obj, buf)
    buf.seek(0)
    _same(obj, na.load(buf))


def test_atomic_write(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    na.save({"step": 1}, path)
    na.save({"step": 2}, str(path))  # replaces the old file
    assert na.load(path) == {"step": 2}
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # no temp files left behind

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        na.save({"step": 3}, path)
    monkeypatch.undo()
    assert na.load(path) == {"step": 2}  # the old checkpoint is intact...
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # ...and the temp file was removed


class Marker:
    """Unpickling this runs code: it writes the file named by its argument."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_weights_only_never_unpickles(tmp_path):
    marker = tmp_path / "pwned"
    # a raw malicious pickle (what a hostile "checkpoint" would be)
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"weights": Marker(str(marker))}))
    with pytest.raises(WeightsOnlyUnpicklingError, match="weights_only=False"):
        na.load(evil)
    with pytest.raises(pickle.UnpicklingError):  # torch's exception type, for ported except-clauses
        na.load(evil, weights_only=True)
    assert not marker.exists()
    # an object save() cannot store as arrays + JSON falls back to pickle, refused by default
    ours = tmp_path / "ours.bin"
    na.save({"obj": Marker(str(marker)), "w": np.ones(2)}, ours)
    with pytest.raises(WeightsOnlyUnpicklingError, match="Marker"):
        na.load(ours)
    assert not marker.exists()
    # explicitly trusted: the pickle path runs (and, here, proves it ran)
    na.load(ours, weights_only=False)
    assert marker.exists()


Point = namedtuple("Point", "x y")


def test_other_objects_need_weights_only_false(tmp_path):
    obj = {"set": {1, 2}, "point": Point(1, 2)}
    with pytest.raises(WeightsOnlyUnpicklingError, match="set"):
        _roundtrip(obj, tmp_path)
    assert _roundtrip(obj, tmp_path, weights_only=False) == obj


def test_malformed_and_foreign_files(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"PK\x03\x04 a zip, like torch's format")
    with pytest.raises(ValueError, match="not a file written by neural_arch.save"):
        na.load(bad)
    import safetensors.numpy

    bad.write_bytes(safetensors.numpy.save({"0": np.zeros(1)}, metadata={
        "neural_arch": '{"format": "neural_arch.save/1", "root": {"exec": "import os"}}'}))
    with pytest.raises(ValueError, match="malformed"):
        na.load(bad)
    bad.write_bytes(safetensors.numpy.save({"0": np.zeros(1)}, metadata={
        "neural_arch": '{"format": "neural_arch.save/1", "root": {"array": {"name": "missing"}}}'}))
    with pytest.raises(ValueError, match="missing"):
        na.load(bad)


def test_map_location(tmp_path):
    obj = {"t": na.ones(2), "a": np.zeros(2)}
    assert _roundtrip(obj, tmp_path, map_location="cpu")["t"].device == "cpu"
    assert _roundtrip(obj, tmp_path, map_location={"cpu": "cpu"})["a"].tolist() == [0.0, 0.0]
    seen = []

    def where(array, saved_on):
        seen.append(saved_on)
        return array * 2

    back = _roundtrip(obj, tmp_path, map_location=where)
    assert back["t"].tolist() == [2.0, 2.0] and seen == ["cpu", "cpu"]
    if na.backend.gpu_unavailable_reason():
        with pytest.raises(RuntimeError, match="map_location='cpu'"):
            _roundtrip(obj, tmp_path, map_location="cuda")


def test_save_accepts_file_objects_and_pathlike(tmp_path):
    buf = io.BytesIO()
    na.save([na.ones(1)], buf)
    assert na.load(io.BytesIO(buf.getvalue()))[0].tolist() == [1.0]
    na.save({"x": 1}, tmp_path / "p.st")
    with open(tmp_path / "p.st", "rb") as f:
        assert na.load(f) == {"x": 1}
