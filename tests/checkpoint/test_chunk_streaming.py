"""Streaming data files (chunkio): safetensors compatibility, partial reads straight into the
destination with per-block CRCs, corruption naming file/chunk/bytes, and format-1 checkpoints."""

import hashlib
import json
import os
import pathlib
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from neural_arch.distributed import checkpoint as dcp
from neural_arch.distributed.checkpoint import CheckpointError, ShardedArray, chunkio
from neural_arch.distributed.checkpoint.sharded import Region, copy_overlap, overlap_runs


@st.composite
def _region(draw, shape):
    if draw(st.booleans()):
        total = int(np.prod(shape))
        a = draw(st.integers(0, total))
        return Region(shape, flat_offset=a, flat_size=draw(st.integers(a, total)) - a)
    offs, sizes = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        offs.append(a)
        sizes.append(draw(st.integers(a, n)) - a)
    return Region(shape, tuple(offs), tuple(sizes))


def _local(full, region):
    if region.is_flat:
        return full.reshape(-1)[region.flat_offset:region.flat_offset + region.flat_size].copy()
    return np.ascontiguousarray(full[tuple(slice(o, o + n) for o, n in zip(region.offsets, region.sizes))])


_cases = st.lists(st.integers(1, 6), min_size=0, max_size=3).flatmap(
    lambda s: st.tuples(st.just(tuple(s)), _region(tuple(s)), _region(tuple(s)), st.sampled_from([4, 8, 24, 4096]),
                        st.booleans(), st.sampled_from([1, 40, 8 << 20]), st.booleans(), st.booleans()))


@settings(deadline=None, max_examples=150)
@given(_cases)
def test_partial_reads_match_copy_overlap(tmp_path_factory, case):
    """Any source chunk read into any destination piece, with blocks far smaller than the chunk,
    on both the run-by-run path and the read-whole-then-copy path, read in one batch or many,
    verified or not (in the reading thread or the helper), equals the NumPy oracle."""
    shape, src, dst, block, whole, batch, verify, helper = case
    full = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) + 1
    folder = tmp_path_factory.mktemp("c")
    info, chunks = chunkio.write_data_file(str(folder / "f.safetensors"), {"c": _local(full, src)}, block=block)
    meta = {"files": {"f.safetensors": info}}
    entry = {"global_shape": list(shape), "dtype": "<f8"}
    chunk = dict(src.to_json(), name="c", file="f.safetensors", **chunks["c"])
    want = _local(np.zeros_like(full) - 1, dst)
    expect_n = copy_overlap(src, _local(full, src), dst, want)
    got = _local(np.zeros_like(full) - 1, dst)
    old = chunkio._RUN_LIMIT, chunkio._IO_BATCH, chunkio._INLINE_CHECK, chunkio._CHECK_LAG
    chunkio._RUN_LIMIT, chunkio._IO_BATCH = (0 if whole else old[0]), batch
    if helper:  # every check through the helper thread, lagging by up to two batches
        chunkio._INLINE_CHECK, chunkio._CHECK_LAG = 0, 2 * batch
    try:
        with chunkio.ChunkReader(str(folder), meta, verify=verify) as reader:
            n = reader.read_into("k", entry, chunk, dst, got)
    finally:
        chunkio._RUN_LIMIT, chunkio._IO_BATCH, chunkio._INLINE_CHECK, chunkio._CHECK_LAG = old
    assert n == expect_n and np.array_equal(got, want)
    runs = overlap_runs(src, dst)
    assert sum(r[2] for r in runs) == expect_n


def test_data_files_are_plain_safetensors(tmp_path):
    state = {"f32": np.arange(12, dtype=np.float32).reshape(3, 4), "f16": np.ones(5, np.float16),
             "b": np.array([True, False]), "i64": np.arange(3), "s": np.float64(2.5), "empty": np.zeros((0, 3)),
             "c": np.array([1 + 2j, 3 - 1j]), "t": np.arange(6.0).reshape(2, 3).T,  # not contiguous
             "be": np.arange(3, dtype=">f8")}
    dcp.save(state, tmp_path)
    meta = json.loads((tmp_path / ".metadata").read_text())
    (fname,) = meta["files"]
    raw = safetensors.numpy.load_file(str(tmp_path / fname))
    for key, value in state.items():
        got = raw[f"{key}#0"]
        if key in ("c", "be"):  # no safetensors dtype: stored as its bytes
            assert got.dtype == np.uint8 and got.tobytes() == value.tobytes()
        else:
            assert got.dtype == value.dtype and np.array_equal(got.reshape(np.shape(value)), value)
    out = {k: np.zeros_like(v) if isinstance(v, np.ndarray) else np.float64(0) for k, v in state.items()}
    dcp.load(out, tmp_path)
    for key, value in state.items():
        assert np.asarray(out[key]).tobytes() == np.ascontiguousarray(value).tobytes(), key
    assert out["be"].tolist() == [0.0, 1.0, 2.0]
    assert dcp.verify(tmp_path)["version"] == 2


class _BusyHelper(ThreadPoolExecutor):
    """A checker whose one thread is busy until shutdown: as when no core is free for it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._gate = threading.Event()
        self.submit(self._gate.wait, 60)

    def shutdown(self, *args, **kwargs):
        self._gate.set()
        super().shutdown(*args, **kwargs)


@pytest.mark.parametrize("helper", ["inline", "helper", "busy-helper"],
                         ids=["inline-check", "helper-thread-check", "helper-never-free"])
def test_corrupt_block_is_named_and_only_needed_blocks_are_read(tmp_path, monkeypatch, helper):
    monkeypatch.setattr(chunkio, "CHECK_BLOCK", 1024)
    monkeypatch.setattr(chunkio, "_IO_BATCH", 4096)  # reads in 8 batches
    if helper != "inline":  # checks lag the reads by up to 3 batches: the error still surfaces from load()
        monkeypatch.setattr(chunkio, "_INLINE_CHECK", 0)
        monkeypatch.setattr(chunkio, "_CHECK_LAG", 3 * 4096)
    threads = []
    if helper == "busy-helper":  # the reader must take every check back (it would wait forever otherwise)
        monkeypatch.setattr(chunkio, "ThreadPoolExecutor", _BusyHelper)
        check = chunkio._check_stream

        def recording(*args):
            threads.append(threading.current_thread())
            return check(*args)
        monkeypatch.setattr(chunkio, "_check_stream", recording)
    w = np.arange(64 * 64, dtype=np.float64).reshape(64, 64)  # 32 KiB: 32 blocks of 1 KiB (2 rows each)
    dcp.save({"w": w}, tmp_path)
    meta = json.loads((tmp_path / ".metadata").read_text())
    (chunk,) = meta["tensors"]["w"]["chunks"]
    assert len(chunk["crc32"]) == 32
    path = tmp_path / chunk["file"]
    blob = bytearray(path.read_bytes())
    blob[chunk["offset"] + 20 * 1024 + 3] ^= 0x40  # inside block 20: rows 40-41
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=r"chunk 'w#0' of 'w' fails its checksum in bytes \[20480, 21504\)"):
        dcp.load({"w": np.zeros_like(w)}, tmp_path)
    with pytest.raises(CheckpointError, match=f"{chunk['file']}: chunk 'w#0' of 'w' fails its checksum"):
        dcp.verify(tmp_path)
    top = {"w": ShardedArray(np.zeros((32, 64)), (64, 64), offsets=(0, 0))}
    dcp.load(top, tmp_path)  # rows 0-31 never touch block 20: read and verified without it
    assert np.array_equal(top["w"].local, w[:32])
    if helper == "busy-helper":
        assert threads and set(threads) == {threading.current_thread()}
    blob[10] ^= 0x01  # the JSON header
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="header fails its checksum"):
        dcp.verify(tmp_path)


@pytest.mark.parametrize("module", ["isal.isal_zlib", "zlib_ng.zlib_ng"])
def test_accelerated_crc32_files_read_with_zlib_and_back(tmp_path, monkeypatch, module):
    """The fast CRC-32 (when installed) gives zlib's values: a checkpoint reads on a bare install."""
    fast = pytest.importorskip(module).crc32
    data = memoryview(np.random.default_rng(0).integers(0, 256, (2 << 20) + 5, dtype=np.uint8))
    for n in (0, 1, 7, 4095, 1 << 20, len(data)):
        assert fast(data[:n]) == zlib.crc32(data[:n]) and fast(data[3:n], 0xDEADBEEF) == zlib.crc32(data[3:n], 0xDEADBEEF)
    w = np.random.default_rng(1).standard_normal((300, 1000))  # 2.4 MB: three CRC blocks
    for write, read in ((fast, zlib.crc32), (zlib.crc32, fast)):
        monkeypatch.setattr(chunkio, "_crc32", write)
        dcp.save({"w": w}, tmp_path / write.__module__)
        monkeypatch.setattr(chunkio, "_crc32", read)
        out = {"w": np.zeros_like(w)}
        dcp.load(out, tmp_path / write.__module__)
        assert np.array_equal(out["w"], w)
        dcp.verify(tmp_path / write.__module__)


def test_format_1_checkpoints_still_load_and_verify(tmp_path):
    """A checkpoint as the first writer left it: serialized by safetensors, blake2b per chunk."""
    w, b = np.arange(6.0).reshape(2, 3), np.array(4.0)
    safetensors.numpy.save_file({"w#0": w, "b#0": np.ascontiguousarray(b)}, str(tmp_path / "__0_old.safetensors"))
    data = (tmp_path / "__0_old.safetensors").read_bytes()

    def digest(a):
        return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()
    meta = {"version": 1, "uid": "old", "world_size": 1, "created": 0.0, "extra": {}, "objects": {},
            "files": {"__0_old.safetensors": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}},
            "tensors": {k: {"path": [k], "global_shape": list(a.shape), "dtype": a.dtype.str,
                            "chunks": [{"offsets": [0] * a.ndim, "sizes": list(a.shape), "name": f"{k}#0",
                                        "file": "__0_old.safetensors", "digest": digest(a)}]}
                        for k, a in (("w", w), ("b", b))}}
    (tmp_path / ".metadata").write_text(json.dumps(meta))
    out = {"w": np.zeros((2, 3)), "b": np.zeros(())}
    dcp.load(out, tmp_path)
    assert np.array_equal(out["w"], w) and out["b"] == 4.0
    dcp.verify(tmp_path)
    (tmp_path / "__0_old.safetensors").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="checksum"):
        dcp.load(out, tmp_path)


def test_a_failed_write_leaves_no_file(tmp_path):
    with pytest.raises(TypeError, match="Python objects"):
        chunkio.write_data_file(str(tmp_path / "x.safetensors"), {"a": np.ones(3), "o": np.array([None])})
    assert os.listdir(tmp_path) == []
    assert not pathlib.Path(tmp_path / "x.safetensors").exists()
