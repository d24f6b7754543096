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

A checkpoint may come from someone else, so ``.metadata`` is checked whole before anything acts on
it (:func:`read_metadata`): every file it names must be one of ours (``__<rank>_<id>.safetensors``,
:func:`is_data_file_name`: no path separators, so nothing outside the directory is ever read or, by
a later save that replaces the checkpoint, deleted); every dtype is a plain numeric one; every
chunk lies inside its array and its file; the chunks of an array add up to exactly its bytes
(so a load never allocates more than the data files hold); nested values are bounded. Anything
else raises :class:`CheckpointError` naming the entry, never a bare ``TypeError``/``RecursionError``.

>>> is_data_file_name(data_file_name(3, "a1b2c3")), is_data_file_name("../../etc/passwd")
(True, False)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat

import numpy as np

from neural_arch.utils.atomic_file import atomic_write_bytes, fsync_dir  # fsync_dir re-exported (__all__)

__all__ = [
    "METADATA_NAME",
    "CheckpointError",
    "CheckpointMismatchError",
    "byte_view",
    "chunk_digest",
    "data_file_name",
    "file_sha256",
    "fsync_dir",
    "is_checkpoint_file_name",
    "is_data_file_name",
    "manifest_name",
    "open_checkpoint_file",
    "read_metadata",
    "validate_metadata",
    "write_json_atomic",
]

METADATA_NAME = ".metadata"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, or does not fit the state dict it is loaded into.

    Example:
        >>> import tempfile
        >>> try:
        ...     read_metadata(tempfile.mkdtemp())       # an empty directory is no checkpoint
        ... except CheckpointError as exc:
        ...     print(str(exc).split(":")[0])
        no complete checkpoint at '...'
    """


class CheckpointMismatchError(CheckpointError):
    """The checkpoint is sound but does not fit the state dict it is loaded into: a key is missing,
    or a shape, dtype or kind (array or plain value) differs. Unlike a corrupt or incomplete
    checkpoint, an older checkpoint is no way out: ``CheckpointManager.load_latest`` raises it
    instead of falling back (which would resume from an older step, or from scratch, silently).

    Example::

        try:
            dcp.load({"w": np.zeros(4)}, "ckpt")        # saved as shape (3,)
        except CheckpointMismatchError as exc:
            print(exc)                                  # load: 'w' has shape (3,) in the checkpoint ...
    """


def data_file_name(rank: int, uid: str) -> str:
    """The name of the data file ``rank`` writes in the save ``uid``.

    Example:
        >>> data_file_name(3, "1f2e")
        '__3_1f2e.safetensors'
    """
    return f"__{rank}_{uid}.safetensors"


def manifest_name(rank: int, uid: str) -> str:
    """The name of the manifest ``rank`` writes in the save ``uid`` (what its data file holds).

    Example:
        >>> manifest_name(3, "1f2e")
        '__3_1f2e.manifest.json'
    """
    return f"__{rank}_{uid}.manifest.json"


# The only names a save creates (the save id is hex; format 1 ids were short words): a name from a
# .metadata that does not match is never opened, and never deleted.
_DATA_FILE = re.compile(r"__(?:0|[1-9][0-9]{0,8})_[A-Za-z0-9]{1,64}\.safetensors")
_MANIFEST = re.compile(r"__(?:0|[1-9][0-9]{0,8})_[A-Za-z0-9]{1,64}\.manifest\.json")
MAX_METADATA_BYTES = 1 << 30  # a .metadata larger than this is refused unread
_MAX_BLOCK = 1 << 28          # largest checksum block a reader accepts (the writer uses 1 MiB)
_MAX_NDIM = 64                # NumPy's limit
_MAX_DEPTH = 64               # nesting of stored plain values (lists/tuples/dicts) and of paths


def is_data_file_name(name) -> bool:
    """True for a name :func:`data_file_name` makes (a plain name, no directory part).

    Example:
        >>> is_data_file_name("__0_1f2e.safetensors"), is_data_file_name("../__0_1f2e.safetensors")
        (True, False)
    """
    return isinstance(name, str) and _DATA_FILE.fullmatch(name) is not None


def is_checkpoint_file_name(name) -> bool:
    """True for a data file or manifest name a save makes: the only names a save may delete.

    Example:
        >>> is_checkpoint_file_name("__0_1f2e.manifest.json"), is_checkpoint_file_name("notes.txt")
        (True, False)
    """
    return isinstance(name, str) and (_DATA_FILE.fullmatch(name) is not None or _MANIFEST.fullmatch(name) is not None)


def _plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "\0" not in name and "/" not in name \
        and not (os.sep != "/" and os.sep in name) and not (os.altsep and os.altsep in name)


def open_checkpoint_file(directory: str, name: str) -> tuple[int, int]:
    """``(fd, size)`` of the regular file ``name`` in ``directory``, opened read-only.

    ``name`` must be a plain file name (no directory part: :func:`read_metadata` has already
    required the project's own names); a symbolic link is not followed (``O_NOFOLLOW``) and
    anything but a regular file (a FIFO, a device such as ``/dev/zero``) is refused before a
    byte is read (``O_NONBLOCK``: opening a FIFO does not wait for a writer). Raises
    :class:`CheckpointError`; ``FileNotFoundError`` when it does not exist.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = open(os.path.join(d, "__0_ab.safetensors"), "wb").write(b"12345")
        >>> fd, size = open_checkpoint_file(d, "__0_ab.safetensors"); os.close(fd); size
        5
    """
    if not _plain_name(name):
        raise CheckpointError(f"{directory!r}: {str(name)[:80]!r} is not a file name in the checkpoint directory; "
                              "the metadata is corrupt or was crafted (only __<rank>_<id>.safetensors files of the "
                              "directory are read)")
    path = os.path.join(directory, name)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symbolic link; EACCES, ...
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({exc.strerror})"
        raise CheckpointError(f"{path} is {kind}; checkpoint files must be regular files in the checkpoint "
                              "directory") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path} is not a regular file; checkpoint files must be regular files in the "
                                  "checkpoint directory")
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def chunk_digest(array: np.ndarray) -> str:
    """blake2b-128 of a chunk's bytes (C order): format 1's checksum, still checked when reading one.

    Example:
        >>> len(chunk_digest(np.arange(4.0)))     # 16 bytes, in hex
        32
    """
    return hashlib.blake2b(byte_view(array), digest_size=16).hexdigest()


def byte_view(array) -> np.ndarray:
    """``array``'s bytes as a flat ``uint8`` array (a copy only when it is not C-contiguous); unlike
    ``memoryview(...).cast("B")`` it takes arrays with a zero in their shape (an empty shard).

    Example:
        >>> byte_view(np.zeros((0, 3))).size, byte_view(np.arange(2, dtype=np.int16)).size
        (0, 4)
    """
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def file_sha256(path: str, block: int = 1 << 24) -> str:
    """sha256 of a whole file: format 1's file checksum (``verify`` of an old checkpoint).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "__0_ab.safetensors")
        >>> _ = open(path, "wb").write(b"")
        >>> file_sha256(path)[:16]
        'e3b0c44298fc1c14'
    """
    h = hashlib.sha256()
    fd, _ = open_checkpoint_file(os.path.dirname(path), os.path.basename(path))  # a regular file, no link
    with open(fd, "rb") as f:
        while True:
            data = f.read(block)
            if not data:
                return h.hexdigest()
            h.update(data)


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see the old file or the new one, never half.

    Example:
        >>> import json, os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "run", "info.json")
        >>> write_json_atomic(path, {"step": 3})
        >>> json.load(open(path))
        {'step': 3}
    """
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode(), make_dirs=True)


def read_metadata(checkpoint_id: str) -> dict:
    """The checkpoint's ``.metadata``, checked whole by :func:`validate_metadata`.

    Raises :class:`CheckpointError` when it is missing, not a regular file, not JSON, or not a
    metadata this code wrote (whatever is wrong with it).

    Example:
        >>> import tempfile
        >>> import neural_arch.distributed.checkpoint as dcp
        >>> d = tempfile.mkdtemp()
        >>> _ = dcp.save({"w": np.arange(3.0), "epoch": 3}, checkpoint_id=d)   # a world of one
        >>> meta = read_metadata(d)
        >>> meta["tensors"]["w"]["global_shape"], meta["objects"]["epoch"]["value"]
        ([3], 3)
    """
    directory = os.fspath(checkpoint_id)
    path = os.path.join(directory, METADATA_NAME)
    try:
        fd, size = open_checkpoint_file(directory, METADATA_NAME)
    except FileNotFoundError:
        raise CheckpointError(f"no complete checkpoint at {checkpoint_id!r}: {METADATA_NAME} is missing (the save "
                              "did not finish, or this is not a checkpoint directory)") from None
    try:
        if size > MAX_METADATA_BYTES:
            raise CheckpointError(f"{path}: {size} bytes, more than a metadata can be ({MAX_METADATA_BYTES}); "
                                  "the checkpoint is corrupt")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(size + 1)
    finally:
        os.close(fd)
    try:
        meta = json.loads(data)
    except RecursionError:
        raise CheckpointError(f"{path} nests too deeply to be a checkpoint's metadata; the checkpoint is corrupt "
                              "or was crafted") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{path} is not valid JSON ({exc}); the checkpoint is corrupt") from None
    if not isinstance(meta, dict) or meta.get("version") not in READABLE_VERSIONS or isinstance(meta.get("version"), bool):
        version = meta.get("version") if isinstance(meta, dict) else None
        raise CheckpointError(f"{path}: format version {version!r}, this code reads "
                              f"{' and '.join(map(str, READABLE_VERSIONS))}")
    validate_metadata(meta, path)
    return meta


# ------------------------------------------------------------------------------ metadata checks
_NUMERIC = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
            np.float16, np.float32, np.float64, np.complex64, np.complex128]
# Every spelling of a plain numeric dtype a writer may have recorded (``dtype.str`` in either byte
# order, or its name): the metadata's dtype strings are looked up here, never given to np.dtype()
# (which accepts structured, object and 2**40-byte void dtypes).
_DTYPES = {}
for _t in _NUMERIC:
    for _order in "<>":
        _d = np.dtype(_t).newbyteorder(_order)
        _DTYPES[_d.str] = np.dtype(_d.str)  # the canonical object (native order prints plainly)
    _DTYPES[np.dtype(_t).name] = np.dtype(_t)
del _t, _order, _d
# bfloat16 (ml_dtypes) records itself as two opaque bytes ("<V2"): read back as such, as before.
_DTYPES.update({"<V2": np.dtype("V2"), "|V2": np.dtype("V2")})


def metadata_dtype(name) -> np.dtype:
    """The NumPy dtype a metadata's dtype string stands for; :class:`CheckpointError` unless plain numeric.

    >>> metadata_dtype("<f8") == np.float64, metadata_dtype(">i4").byteorder
    (True, '>')
    """
    found = _DTYPES.get(name) if isinstance(name, str) else None
    if found is None:
        raise CheckpointError(f"dtype {str(name)[:40]!r} is not a checkpoint dtype (bool, int8-64, uint8-64, "
                              "float16-64, complex64/128, bfloat16)")
    return found


class _Bad(Exception):
    """One problem in a metadata (its message is the place and what is wrong)."""


def _int(value, where: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f" in [{low}, {high}]" if high is not None else f" >= {low}"
        raise _Bad(f"{where} is {str(value)[:40]!r}, not an integer{bound}")
    return value


def _dict(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"{where} is a {type(value).__name__}, not an object")
    return value


def _list(value, where: str) -> list:
    if not isinstance(value, list):
        raise _Bad(f"{where} is a {type(value).__name__}, not a list")
    return value


def _check_value(value, where: str) -> None:
    """A stored plain value (``flatten.encode_object``'s JSON): bounded nesting, the shapes it writes."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise _Bad(f"{where} nests deeper than {_MAX_DEPTH} levels")
        if isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, dict):
            if "__tuple__" in node:
                stack.append((_list(node["__tuple__"], where + ".__tuple__"), depth + 1))
            elif "__dict__" in node:
                for item in _list(node["__dict__"], where + ".__dict__"):
                    if not isinstance(item, list) or len(item) != 2 or isinstance(item[0], (list, dict)):
                        raise _Bad(f"{where}: a __dict__ item must be a [key, value] pair with a plain key")
                    stack.append((item[1], depth + 1))
            else:
                stack.extend((v, depth + 1) for v in node.values())


def _check_path(path, where: str) -> list:
    path = _list(path, where)
    if not path or len(path) > _MAX_DEPTH or any(type(p) not in (str, int) for p in path):
        raise _Bad(f"{where} must be a non-empty list of at most {_MAX_DEPTH} strings and integers")
    return path


def _check_chunk(chunk, key: str, n: int, gshape: tuple, itemsize: int, files: dict, version: int) -> int:
    """One chunk entry; returns how many elements it holds."""
    where = f"tensors[{key!r}].chunks[{n}]"
    chunk = _dict(chunk, where)
    total = math.prod(gshape)
    if "flat_offset" in chunk:
        off = _int(chunk["flat_offset"], where + ".flat_offset")
        numel = _int(chunk.get("flat_size"), where + ".flat_size")
        if off + numel > total:
            raise _Bad(f"{where}: flat range [{off}, {off + numel}) is outside the {total} elements of {key!r}")
    else:
        offsets = _list(chunk.get("offsets"), where + ".offsets")
        sizes = _list(chunk.get("sizes"), where + ".sizes")
        if len(offsets) != len(gshape) or len(sizes) != len(gshape):
            raise _Bad(f"{where}: offsets and sizes need {len(gshape)} entries (the rank of {key!r})")
        for d, (o, z, g) in enumerate(zip(offsets, sizes, gshape)):
            _int(o, f"{where}.offsets[{d}]")
            _int(z, f"{where}.sizes[{d}]")
            if o + z > g:
                raise _Bad(f"{where}: dimension {d}: [{o}, {o + z}) is outside [0, {g})")
        numel = math.prod(sizes)
    if not isinstance(chunk.get("name"), str):
        raise _Bad(f"{where}.name is missing")
    fname = chunk.get("file")
    if not is_data_file_name(fname):
        raise _Bad(f"{where}.file {str(fname)[:80]!r} is not a checkpoint data file name (__<rank>_<id>.safetensors)")
    if fname not in files:
        raise _Bad(f"{where}.file {fname!r} is not listed in files")
    if version == 1:
        if not isinstance(chunk.get("digest"), str):
            raise _Bad(f"{where}.digest is missing")
        return numel
    size, block = files[fname]["size"], files[fname]["block_bytes"]
    offset = _int(chunk.get("offset"), where + ".offset")
    nbytes = _int(chunk.get("nbytes"), where + ".nbytes")
    if nbytes != numel * itemsize:
        raise _Bad(f"{where}: {nbytes} bytes, its region needs {numel * itemsize}")
    if offset + nbytes > size:
        raise _Bad(f"{where}: bytes [{offset}, {offset + nbytes}) end past the {size} bytes of {fname}")
    crcs = _list(chunk.get("crc32"), where + ".crc32")
    if len(crcs) != -(-nbytes // block) or any(type(c) is not int for c in crcs):
        raise _Bad(f"{where}.crc32 must hold {-(-nbytes // block)} integers (one per {block}-byte block)")
    return numel


def validate_metadata(meta: dict, where: str = METADATA_NAME) -> None:
    """Check a metadata dict whole (see the module docstring); :class:`CheckpointError` if anything is off.

    After it passes, a reader may index every field without further checks: names are ours,
    dtypes plain, shapes, regions, offsets and checksum lists consistent with each other.

    Example:
        >>> try:
        ...     validate_metadata({"version": 2})
        ... except CheckpointError as exc:
        ...     print(type(exc).__name__)
        CheckpointError
    """
    try:
        version = meta["version"]
        files = _dict(meta.get("files"), "files")
        for fname, info in files.items():
            if not is_data_file_name(fname):
                raise _Bad(f"files: {fname[:80]!r} is not a checkpoint data file name (__<rank>_<id>.safetensors)")
            info = _dict(info, f"files[{fname!r}]")
            _int(info.get("size"), f"files[{fname!r}].size")
            if version == 1:
                if not isinstance(info.get("sha256"), str):
                    raise _Bad(f"files[{fname!r}].sha256 is missing")
            else:
                _int(info.get("block_bytes"), f"files[{fname!r}].block_bytes", 1, _MAX_BLOCK)
                _int(info.get("header_crc32"), f"files[{fname!r}].header_crc32")
        for key, entry in _dict(meta.get("tensors"), "tensors").items():
            entry = _dict(entry, f"tensors[{key!r}]")
            _check_path(entry.get("path"), f"tensors[{key!r}].path")
            gshape = _list(entry.get("global_shape"), f"tensors[{key!r}].global_shape")
            if len(gshape) > _MAX_NDIM:
                raise _Bad(f"tensors[{key!r}].global_shape has {len(gshape)} dimensions (at most {_MAX_NDIM})")
            gshape = tuple(_int(g, f"tensors[{key!r}].global_shape") for g in gshape)
            try:
                itemsize = metadata_dtype(entry.get("dtype")).itemsize
            except CheckpointError as exc:
                raise _Bad(f"tensors[{key!r}]: {exc}") from None
            chunks = _list(entry.get("chunks"), f"tensors[{key!r}].chunks")
            held = sum(_check_chunk(c, key, n, gshape, itemsize, files, version) for n, c in enumerate(chunks))
            # Chunks tile their array (a save checks that): more or fewer elements is corruption,
            # and a load allocates the global shape only after this, so the allocation is bounded
            # by the chunks' bytes, which are bounded by the data files' sizes.
            if held != math.prod(gshape):
                raise _Bad(f"tensors[{key!r}]: the chunks hold {held} elements, the shape {gshape} has "
                           f"{math.prod(gshape)}")
        paths = {tuple(entry["path"]): key for key, entry in meta["tensors"].items()}
        for key, item in _dict(meta.get("objects"), "objects").items():
            item = _dict(item, f"objects[{key!r}]")
            paths[tuple(_check_path(item.get("path"), f"objects[{key!r}].path"))] = key
            if "value" not in item:
                raise _Bad(f"objects[{key!r}].value is missing")
            _check_value(item["value"], f"objects[{key!r}].value")
        # A leaf's path must not run through another leaf (a load that builds missing containers
        # would index into an array or a number).
        for path, key in paths.items():
            for n in range(1, len(path)):
                if path[:n] in paths:
                    raise _Bad(f"the path of {key!r} runs through the leaf {paths[path[:n]]!r}")
        if not isinstance(meta.get("extra", {}), dict):
            raise _Bad("extra is not an object")
    except _Bad as exc:
        raise CheckpointError(f"{where}: {exc}; the checkpoint is corrupt or was crafted") from None
