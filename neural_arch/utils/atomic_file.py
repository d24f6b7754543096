"""Files that readers never see half-written: a temp file beside the target, fsynced, then renamed.

The one owner of the pattern for ``neural_arch.save``, the distributed checkpoint's data and
metadata files and the launcher's restart checkpoints. Every temp file's name carries
:data:`TMP_MARK`, which is how a cleanup after a crash recognises leftovers
(``distributed.elastic.checkpoint_restart.remove_interrupted_writes``, ``checkpoint.chunkio``).

Example::

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> atomic_write_bytes(path, b"abc")
    >>> open(path, "rb").read()
    b'abc'
    >>> with atomic_file(path) as fd:        # streaming writers get the raw descriptor
    ...     write_all(fd, memoryview(b"abcd"))
    >>> os.path.getsize(path)
    4
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TMP_MARK", "atomic_file", "atomic_write_bytes", "fsync_dir", "write_all"]

TMP_MARK = ".tmp-"


def write_all(fd: int, view: memoryview) -> None:
    """``os.write`` until every byte of ``view`` is written (a write may be short).

    Example::

        >>> import os, tempfile
        >>> from neural_arch.utils.atomic_file import write_all
        >>> fd, path = tempfile.mkstemp()
        >>> write_all(fd, memoryview(b"hello"))
        >>> os.close(fd)
        >>> open(path, "rb").read()
        b'hello'
    """
    while len(view):
        view = view[os.write(fd, view):]


@contextmanager
def atomic_file(path: str, *, sync_dir: bool = False, make_dirs: bool = False) -> Iterator[int]:
    """Yield a raw descriptor of a temp file in ``path``'s folder (created first with ``make_dirs``);
    on a clean exit the data is fsynced before the rename onto ``path`` (and, with ``sync_dir``, the
    rename itself is made durable); on an error the temp file is removed and ``path`` is untouched.

    Example::

        >>> import os, tempfile
        >>> from neural_arch.utils.atomic_file import atomic_file
        >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
        >>> with atomic_file(path) as fd:
        ...     _ = os.write(fd, b"data")
        >>> open(path, "rb").read()
        b'data'
    """
    folder = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + TMP_MARK)
    try:
        try:
            yield fd
            os.fsync(fd)  # the data is on disk before the name points at it
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(folder)


def atomic_write_bytes(path: str, data: bytes, *, sync_dir: bool = False, make_dirs: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`).

    Example::

        >>> import os, tempfile
        >>> from neural_arch.utils.atomic_file import atomic_write_bytes
        >>> path = os.path.join(tempfile.mkdtemp(), "sub", "x.bin")
        >>> atomic_write_bytes(path, b"abc", make_dirs=True)
        >>> open(path, "rb").read()
        b'abc'
    """
    with atomic_file(path, sync_dir=sync_dir, make_dirs=make_dirs) as fd:
        write_all(fd, memoryview(data))


def fsync_dir(folder: str) -> None:
    """Make renames inside ``folder`` durable (a no-op where directories cannot be opened).

    Example::

        >>> import tempfile
        >>> from neural_arch.utils.atomic_file import fsync_dir
        >>> fsync_dir(tempfile.mkdtemp())
    """
    try:  # POSIX only: a folder cannot be opened this way on Windows
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
