"""Checkpoint-restart helpers for scripts run under ``--max_restarts``.

The launcher restarts the *whole* group after a failure; a script survives that by saving a
checkpoint regularly and resuming from the newest one at start-up::

    import numpy as np
    from neural_arch.distributed import find_latest_checkpoint
    from neural_arch.distributed.elastic.checkpoint_restart import restart_count, save_npz_atomic

    path = find_latest_checkpoint("ckpts")              # newest "step_000042.npz", or None
    state = dict(np.load(path)) if path else {"w": np.zeros(3), "step": np.array(0)}
    print("attempt", restart_count())                   # 0 on the first start
    for step in range(int(state["step"]), 100):
        ...                                             # train
        state["step"] = np.array(step + 1)
        if rank == 0:
            save_npz_atomic(f"ckpts/step_{step + 1:06d}.npz", **state)

Why atomic: a rank can be SIGKILLed in the middle of writing. Writing to a temporary file in the
same folder, ``fsync`` and ``os.replace`` means a reader sees either the old complete file or the new
complete file, never half of one; :func:`~neural_arch.distributed.checkpoint.manager.find_latest_checkpoint` ignores leftover temporary files.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping

from neural_arch import config
from neural_arch.utils.atomic_file import TMP_MARK as _TMP_MARK
from neural_arch.utils.atomic_file import atomic_write_bytes as _atomic_write_bytes

__all__ = ["atomic_write_bytes", "remove_interrupted_writes", "restart_count", "save_npz_atomic"]



def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times the launcher has restarted this job (0 on the first attempt).

    >>> restart_count({"NEURAL_ARCH_RESTART_COUNT": "2"})
    2
    >>> restart_count({})
    0
    """
    env = os.environ if environ is None else environ
    try:
        ours = config.get("NEURAL_ARCH_RESTART_COUNT", env)
    except ValueError as exc:  # the table's message names the value; say what it means here
        raise ValueError(f"{exc}: the restart count is not an integer") from None
    value = ours or env.get("TORCHELASTIC_RESTART_COUNT") or "0"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"NEURAL_ARCH_RESTART_COUNT={value!r} is not an integer") from None


def remove_interrupted_writes(directory: str) -> int:
    """Delete temp files that interrupted atomic writes left in ``directory``; return how many.

    A writer killed between creating its temp file and ``os.replace`` leaves ``name.tmp-XXXX``
    behind (the checkpoint it was replacing is untouched). Call this once at start-up from the
    job's single writer, before it writes again: the previous attempt's processes are gone then,
    so nothing deletes a file that is still being written.

    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp()
    >>> _ = (pathlib.Path(d) / "step_3.npz.tmp-abc").write_bytes(b"half")
    >>> remove_interrupted_writes(d), os.listdir(d)
    (1, [])
    """
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if _TMP_MARK in entry.name:
            try:
                os.unlink(entry.path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers never see a partial file (temp + fsync + replace;
    the folder is created if missing). See :mod:`neural_arch.utils.atomic_file`.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "sub" / "blob.bin"
        >>> atomic_write_bytes(str(path), b"abc")
        >>> path.read_bytes()
        b'abc'
    """
    _atomic_write_bytes(path, data, make_dirs=True)


def save_npz_atomic(path: str, **arrays) -> None:
    """``numpy.savez`` to ``path`` atomically (see
    :func:`~neural_arch.distributed.elastic.checkpoint_restart.atomic_write_bytes`).

    Example:
        >>> import tempfile, pathlib
        >>> import numpy as np
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "step_000001.npz"
        >>> save_npz_atomic(str(path), w=np.zeros(3), step=np.array(1))
        >>> int(np.load(path)["step"])
        1
    """
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())
