"""Checkpoints and files from someone else: they may read, delete and allocate only inside their own directory.

A checkpoint directory (``dcp``) or a ``neural_arch.save`` file may be downloaded or planted by
someone else. Each test here is an attack that used to work: ``.metadata`` naming files outside
the directory (read into the model's arrays, or deleted by the next save into that directory),
symbolic links, devices and FIFOs named like our data files, sizes that make the loader allocate
gigabytes, and crafted JSON that raised bare ``RecursionError``/``TypeError``. All of them now
raise :class:`CheckpointError` (``ValueError`` for ``neural_arch.load``) before a byte reaches a
destination array, and nothing outside the directory is touched.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
import sys
import zlib

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import neural_arch as na
import neural_arch.distributed.checkpoint as dcp
from neural_arch.distributed.checkpoint import CheckpointError, CheckpointManager
from neural_arch.serialization import WeightsOnlyUnpicklingError

SECRET = b"the victim's private key: hunter2 " * 8  # 272 bytes = 34 float64


_LOAD_PEAK = """
import sys, tracemalloc
import neural_arch.distributed.checkpoint as dcp
tracemalloc.start()
try:
    dcp.load({"optim": {}}, sys.argv[1], verify=False)
    error = "no error"
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(tracemalloc.get_traced_memory()[1])
print(error)
"""


def _load_peak(ckpt) -> tuple[str, int]:
    """Load ``ckpt`` in a fresh interpreter (no other test's threads allocating beside it); returns the
    error it raised and the peak bytes Python allocated during the load."""
    proc = subprocess.run([sys.executable, "-c", _LOAD_PEAK, str(ckpt)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    peak, error = proc.stdout.split("\n", 1)
    return error.strip(), int(peak)


def _saved(folder: pathlib.Path, n: int = 34) -> dict:
    """A real checkpoint of one float64 array ``w`` of ``n`` elements; its metadata as a dict."""
    dcp.save({"w": np.arange(float(n))}, folder)
    return json.loads((folder / ".metadata").read_text())


def _write_meta(folder: pathlib.Path, meta: dict) -> None:
    (folder / ".metadata").write_text(json.dumps(meta))


def _point_at(meta: dict, name: str, size: int, offset: int = 0, data: bytes | None = None) -> dict:
    """The metadata with ``w``'s only chunk moved to the file ``name`` (its CRCs made right when
    ``data`` is given, as an attacker who knows the bytes would)."""
    meta = copy.deepcopy(meta)
    (old,) = meta["files"]
    info = meta["files"].pop(old)
    meta["files"][name] = dict(info, size=size)
    chunk = meta["tensors"]["w"]["chunks"][0]
    chunk.update(file=name, offset=offset)
    if data is not None:
        chunk["crc32"] = [zlib.crc32(data[offset:offset + chunk["nbytes"]])]
    return meta


# ------------------------------------------------------------------ reading outside the directory
@pytest.mark.parametrize("how", ["relative", "absolute"])
@pytest.mark.parametrize("verify", [False, True])
def test_metadata_cannot_name_a_file_outside_the_directory(tmp_path, how, verify):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    ckpt = tmp_path / "ckpt"
    meta = _saved(ckpt)
    name = "../secret.txt" if how == "relative" else str(secret)
    _write_meta(ckpt, _point_at(meta, name, len(SECRET), data=SECRET))
    out = {"w": np.full(34, -1.0)}
    with pytest.raises(CheckpointError, match="not a checkpoint data file name"):
        dcp.load(out, ckpt, verify=verify)
    assert (out["w"] == -1.0).all(), "bytes of the secret file reached the model"
    with pytest.raises(CheckpointError, match="not a checkpoint data file name"):
        dcp.verify(ckpt)


@pytest.mark.parametrize("target", ["secret", "dev-zero", "fifo"])
def test_a_planted_link_device_or_fifo_named_like_a_data_file_is_refused(tmp_path, target):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    ckpt = tmp_path / "ckpt"
    meta = _saved(ckpt)
    (name,) = meta["files"]
    real_size = meta["files"][name]["size"]
    os.unlink(ckpt / name)
    keep = None
    if target == "secret":
        os.symlink(secret, ckpt / name)
        attacks = [_point_at(meta, name, len(SECRET), data=SECRET)]
    else:
        if target == "dev-zero":
            os.symlink("/dev/zero", ckpt / name)
        else:
            os.mkfifo(ckpt / name)
            keep = os.open(ckpt / name, os.O_RDWR | os.O_NONBLOCK)  # a writer: an open for reading would not wait
        # size 0 is what fstat says of a device or FIFO (the attack); the real size reaches the file check
        attacks = [_point_at(meta, name, 0, data=bytes(272)), _point_at(meta, name, real_size, data=bytes(272))]
    out = {"w": np.full(34, -1.0)}
    try:
        for meta in attacks:
            _write_meta(ckpt, meta)
            with pytest.raises(CheckpointError, match="regular file|end past"):
                dcp.load(out, ckpt, verify=False)
            with pytest.raises(CheckpointError, match="regular file|end past"):
                dcp.verify(ckpt)
    finally:
        if keep is not None:
            os.close(keep)
    assert (out["w"] == -1.0).all()


def test_dev_zero_metadata_allocates_nothing(tmp_path):
    """The 426-byte attack: a chunk of 256 MiB 'in' /dev/zero, loaded into a fresh container."""
    ckpt = tmp_path / "ckpt"
    meta = _saved(ckpt)
    n = 32 << 20  # float64 elements: 256 MiB
    meta = _point_at(meta, "/dev/zero", 0)
    entry = meta["tensors"].pop("w")
    entry["global_shape"], entry["path"] = [n], ["optim", "big"]
    entry["chunks"][0].update(sizes=[n], nbytes=8 * n, crc32=[0] * (8 * n >> 20))
    meta["tensors"]["optim.big"] = entry
    _write_meta(ckpt, meta)
    error, peak = _load_peak(ckpt)
    assert "CheckpointError" in error, error
    assert peak < 8 << 20, f"the load allocated {peak >> 20} MiB for a crafted metadata"


def test_a_declared_size_larger_than_the_file_allocates_nothing(tmp_path):
    """Our own file name, but the metadata claims 256 MiB of it: refused before allocating."""
    ckpt = tmp_path / "ckpt"
    meta = _saved(ckpt)
    (name,) = meta["files"]
    n = 32 << 20
    meta["files"][name]["size"] = 8 * n + 4096
    entry = meta["tensors"].pop("w")
    entry["global_shape"], entry["path"] = [n], ["optim", "big"]
    entry["chunks"][0].update(sizes=[n], nbytes=8 * n, crc32=[0] * (8 * n >> 20))
    meta["tensors"]["optim.big"] = entry
    _write_meta(ckpt, meta)
    error, peak = _load_peak(ckpt)
    assert "CheckpointError" in error and "bytes, the metadata says" in error, error
    assert peak < 8 << 20, f"the load allocated {peak >> 20} MiB for a crafted metadata"


def test_a_chunk_past_the_end_of_its_file_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    meta = _saved(ckpt)
    meta["tensors"]["w"]["chunks"][0]["offset"] += 64
    _write_meta(ckpt, meta)
    out = {"w": np.full(34, -1.0)}
    with pytest.raises(CheckpointError, match="end past the"):
        dcp.load(out, ckpt, verify=False)
    assert (out["w"] == -1.0).all()


@pytest.mark.parametrize("layout", ["whole", "column shard"])
def test_bytes_that_fail_their_checksum_do_not_stay_in_the_destination(tmp_path, layout):
    """verify=True: a damaged block raises, and its bytes are not left in the caller's array."""
    ckpt = tmp_path / "ckpt"
    meta = _saved(ckpt, n=100_000)
    (name,) = meta["files"]
    at = meta["tensors"]["w"]["chunks"][0]["offset"] + 500 * 8 + 3
    blob = bytearray((ckpt / name).read_bytes())
    blob[at] ^= 0x40
    (ckpt / name).write_bytes(bytes(blob))
    bad = np.frombuffer(bytes(blob[at - 3:at + 5]), np.float64)[0]
    if layout == "whole":
        out = {"w": np.full(100_000, -1.0)}
    else:  # a column shard of a tall matrix (50000 runs): read whole into scratch, then copied
        meta = json.loads((ckpt / ".metadata").read_text())
        meta["tensors"]["w"]["global_shape"] = [50_000, 2]
        meta["tensors"]["w"]["chunks"][0]["sizes"] = [50_000, 2]
        meta["tensors"]["w"]["chunks"][0]["offsets"] = [0, 0]
        _write_meta(ckpt, meta)
        out = {"w": dcp.ShardedArray(np.full((50_000, 1), -1.0), (50_000, 2), offsets=(0, 0))}  # holds element 500
    with pytest.raises(CheckpointError, match="checksum"):
        dcp.load(out, ckpt)
    local = out["w"].local if layout != "whole" else out["w"]
    assert not np.any(local == bad), "bytes that failed verification stayed in the destination"


# ------------------------------------------------------------------ deleting outside the directory
@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_saving_over_a_planted_metadata_deletes_nothing_outside(tmp_path, how):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    name = "../victim.txt" if how == "relative" else str(victim)
    _write_meta(ckpt, {"version": 2, "uid": "x", "world_size": 1, "created": 0.0, "extra": {}, "objects": {},
                       "tensors": {}, "files": {name: {"size": 8, "block_bytes": 1 << 20, "header_crc32": 0}}})
    stray = ckpt / "notes.txt"  # a file of the user's in the directory, not one of ours
    stray.write_bytes(b"mine")
    dcp.save({"w": np.ones(3)}, ckpt)
    assert victim.read_bytes() == b"precious"
    assert stray.read_bytes() == b"mine"
    out = {"w": np.zeros(3)}
    dcp.load(out, ckpt)
    assert out["w"].tolist() == [1.0] * 3


def test_manager_cleanup_does_not_follow_a_planted_step_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _saved(elsewhere)  # someone else's checkpoint, with its .metadata
    root = tmp_path / "ckpts"
    mgr = CheckpointManager(root, keep_last=1)
    root.mkdir()
    os.symlink(elsewhere, root / "step_00000001")
    for step in (2, 3):
        mgr.save({"w": np.full(3, float(step))}, step=step)
    assert [c[0] for c in mgr.checkpoints()] == [3]
    assert (elsewhere / ".metadata").exists(), "cleanup deleted a file outside its directory"
    assert os.listdir(elsewhere) and (root / "step_00000001").is_symlink()


# ------------------------------------------------------------------ crafted metadata: one error type
def _crafted(meta: dict) -> list:
    """(label, metadata text) of hand-made attacks on a valid metadata ``meta``."""
    deep = "[" * 100_000 + "]" * 100_000
    out = [("deep JSON", deep), ("a list", "[1, 2]"), ("version true", json.dumps(dict(meta, version=True)))]

    def with_(fn):
        m = copy.deepcopy(meta)
        fn(m)
        return json.dumps(m)
    cases = {
        "files a list": lambda m: m.update(files=[]),
        "object dtype": lambda m: m["tensors"]["w"].update(dtype="|O"),
        "huge void dtype": lambda m: m["tensors"]["w"].update(dtype="|V1099511627776"),
        "structured dtype": lambda m: m["tensors"]["w"].update(dtype="i4,f8"),
        "negative dim": lambda m: m["tensors"]["w"].update(global_shape=[-34]),
        "float offset": lambda m: m["tensors"]["w"]["chunks"][0].update(offsets=[0.5]),
        "chunk outside": lambda m: m["tensors"]["w"]["chunks"][0].update(offsets=[1]),
        "chunks a dict": lambda m: m["tensors"]["w"].update(chunks={}),
        "no crc list": lambda m: m["tensors"]["w"]["chunks"][0].update(crc32=None),
        "path a string": lambda m: m["tensors"]["w"].update(path="w"),
        "unlisted file": lambda m: m["tensors"]["w"]["chunks"][0].update(file="__7_abc.safetensors"),
        "deep object": lambda m: m["objects"].update(
            step={"path": ["step"], "value": json.loads("[" * 900 + "]" * 900)}),
        "bad __dict__": lambda m: m["objects"].update(step={"path": ["step"], "value": {"__dict__": 5}}),
        "huge block": lambda m: [f.update(block_bytes=1 << 40) for f in m["files"].values()],
        "path through a leaf": lambda m: m["objects"]["step"].update(path=["w", "step"]),
    }
    out += [(label, with_(fn)) for label, fn in cases.items()]
    return out


def test_crafted_metadata_raises_checkpoint_error(tmp_path):
    ckpt = tmp_path / "ckpt"
    dcp.save({"w": np.arange(34.0), "step": 3}, ckpt)
    meta = json.loads((ckpt / ".metadata").read_text())
    for label, text in _crafted(meta):
        (ckpt / ".metadata").write_text(text)
        out = {"w": np.full(34, -1.0), "step": 0}
        try:
            dcp.load(out, ckpt, verify=False)
        except CheckpointError:
            pass
        except BaseException as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{label}: load raised {type(exc).__name__}: {str(exc)[:200]}, not CheckpointError")
        else:
            pytest.fail(f"{label}: load accepted a crafted metadata")
        assert (out["w"] == -1.0).all(), label
        for call in (dcp.verify, lambda p: dcp.load({}, p), lambda p: dcp.load({"w": {}}, p, strict=False)):
            with pytest.raises(CheckpointError):
                call(ckpt)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 1 << 40) | st.floats(allow_nan=False) | st.text(max_size=4),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                     max_leaves=6)


def _nodes(tree, path=()):
    yield path
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _nodes(v, path + (i,))


@pytest.fixture(scope="module")
def valid_checkpoint(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("mutated")
    dcp.save({"w": np.arange(34.0), "b": np.ones((2, 3), np.float32), "step": 3, "opt": {"lr": [0.1, (1, 2)]}}, ckpt)
    return ckpt, json.loads((ckpt / ".metadata").read_text())


@settings(max_examples=100)
@given(data=st.data())
def test_any_mutated_metadata_loads_or_raises_checkpoint_error(valid_checkpoint, data):
    """Replace any one node of a valid metadata by any JSON value: the load works, or raises
    CheckpointError; it never raises anything else (nor does verify)."""
    ckpt, meta = valid_checkpoint
    meta = copy.deepcopy(meta)
    where = data.draw(st.sampled_from(list(_nodes(meta))[1:]), label="node")
    new = data.draw(_JSON, label="value")
    node = meta
    for p in where[:-1]:
        node = node[p]
    node[where[-1]] = new
    (ckpt / ".metadata").write_text(json.dumps(meta))
    out = {"w": np.full(34, -1.0), "b": np.zeros((2, 3), np.float32), "step": 0, "opt": {}}
    try:
        dcp.load(out, ckpt)
    except CheckpointError:
        pass
    try:
        dcp.verify(ckpt)
    except CheckpointError:
        pass


# ------------------------------------------------------------------ neural_arch.load
def _na_file(folder: pathlib.Path, info_json: str) -> pathlib.Path:
    path = folder / "crafted.safetensors"
    path.write_bytes(safetensors.numpy.save({"0": np.zeros(2)}, metadata={"neural_arch": info_json}))
    return path


_NA_CRAFTED = {
    "deep list": '{"format": "neural_arch.save/1", "root": ' + '{"list": [' * 20_000 + "1" + "]}" * 20_000 + "}",
    "deep JSON": "[" * 100_000 + "]" * 100_000,
    "not an object": "[1, 2]",
    "object dtype array": '{"format": "neural_arch.save/1", "root": {"array": {"name": "0", "dtype": "object"}}}',
    "structured dtype": '{"format": "neural_arch.save/1", "root": {"dtype": "i4,O"}}',
    "void dtype": '{"format": "neural_arch.save/1", "root": {"dtype": "V1099511627776"}}',
    "unhashable key": '{"format": "neural_arch.save/1", "root": {"dict": [[{"list": []}, 1]]}}',
    "complex of three": '{"format": "neural_arch.save/1", "root": {"complex": [1, 2, 3]}}',
}


def test_crafted_neural_arch_files_raise_value_error(tmp_path):
    for label, text in _NA_CRAFTED.items():
        path = _na_file(tmp_path, text)
        try:
            na.load(path)
        except ValueError:
            continue
        except BaseException as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{label}: neural_arch.load raised {type(exc).__name__}: {str(exc)[:200]}, not ValueError")
        pytest.fail(f"{label}: neural_arch.load accepted a crafted file")


@pytest.fixture(scope="module")
def saved_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("na") / "ok.safetensors"
    na.save({"w": na.ones(3), "n": np.arange(4, dtype=np.int8), "meta": {"lr": 0.1, "betas": (0.9, 0.99)},
             "dt": np.dtype(np.float16), "c": 1 + 2j}, path)
    with safetensors.safe_open(str(path), framework="numpy") as f:
        info = json.loads(f.metadata()["neural_arch"])
    return path.read_bytes(), info


@settings(max_examples=100)
@given(data=st.data())
def test_mutated_neural_arch_files_load_or_raise_value_error(tmp_path_factory, saved_file, data):
    """Replace any node of a saved file's structure by any JSON value, or flip bytes anywhere:
    ``load`` returns something or raises ValueError (WeightsOnlyUnpicklingError, a pickle error,
    when the bytes now look like a pickle: it never unpickles)."""
    blob, info = saved_file
    folder = tmp_path_factory.mktemp("m")
    if data.draw(st.booleans(), label="structure"):
        info = copy.deepcopy(info)
        where = data.draw(st.sampled_from(list(_nodes(info))), label="node")
        new = data.draw(_JSON, label="value")
        if not where:
            info = new
        else:
            node = info
            for p in where[:-1]:
                node = node[p]
            node[where[-1]] = new
        path = _na_file(folder, json.dumps(info))
    else:
        raw = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 4), label="edits")):
            at = data.draw(st.integers(0, len(raw) - 1), label="at")
            raw[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        path = folder / "f.bin"
        path.write_bytes(bytes(raw))
    try:
        na.load(path)
    except (ValueError, WeightsOnlyUnpicklingError):
        pass
