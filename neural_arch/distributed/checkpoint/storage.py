"""Files of a checkpoint directory: safetensors data files, per-rank manifests, the metadata.

Layout of ``checkpoint_id/`` after a save with id ``U`` by 3 ranks::

    __0_U.safetensors        rank 0's chunks (each chunk one tensor, named "<key>#<n>")
    __2_U.safetensors        rank 1 owned no chunk, so it wrote no data file
    .metadata                JSON, written last: every key's shape, dtype and chunks (file, byte
                             offset, size, CRC-32 per block); every file's size and header CRC

Data files are written by :mod:`~neural_arch.distributed.checkpoint.chunkio` in one streaming
pass (temp file + fsync + rename). During a save each rank also writes
``__<rank>_U.manifest.json`` (its file's size and each chunk's offset and checksums) which rank 0
collects and deletes when it commits. Small files go through
:func:`neural_arch.utils.atomic_file.atomic_write_bytes` (temp file + fsync + rename), and
the directory is fsynced after each rename, so a crash leaves either the old or the new file.

Format versions: 2 (CRC-32 per block, offsets in the metadata) is written; 1 (a blake2b digest
per chunk, a sha256 per file) is still read.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from neural_arch.utils.atomic_file import atomic_write_bytes, fsync_dir  # fsync_dir re-exported (__all__)

__all__ = [
    "METADATA_NAME",
    "CheckpointError",
    "chunk_digest",
    "data_file_name",
    "file_sha256",
    "fsync_dir",
    "manifest_name",
    "read_metadata",
    "write_json_atomic",
]

METADATA_NAME = ".metadata"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, or does not fit the state dict it is loaded into."""


def data_file_name(rank: int, uid: str) -> str:
    return f"__{rank}_{uid}.safetensors"


def manifest_name(rank: int, uid: str) -> str:
    return f"__{rank}_{uid}.manifest.json"


def chunk_digest(array: np.ndarray) -> str:
    """blake2b-128 of a chunk's bytes (C order): format 1's checksum, still checked when reading one."""
    return hashlib.blake2b(memoryview(np.ascontiguousarray(array)).cast("B"), digest_size=16).hexdigest()


def file_sha256(path: str, block: int = 1 << 24) -> str:
    """sha256 of a whole file: format 1's file checksum (``verify`` of an old checkpoint)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            data = f.read(block)
            if not data:
                return h.hexdigest()
            h.update(data)


def write_json_atomic(path: str, obj) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode(), make_dirs=True)


def read_metadata(checkpoint_id: str) -> dict:
    path = os.path.join(os.fspath(checkpoint_id), METADATA_NAME)
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"no complete checkpoint at {checkpoint_id!r}: {METADATA_NAME} is missing (the save "
                              "did not finish, or this is not a checkpoint directory)") from None
    except ValueError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); the checkpoint is corrupt") from None
    if meta.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"{path}: format version {meta.get('version')!r}, this code reads "
                              f"{' and '.join(map(str, READABLE_VERSIONS))}")
    return meta
