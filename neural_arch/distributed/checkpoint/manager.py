"""``CheckpointManager``: numbered checkpoints in one folder, resume, cleanup and the best model.

Each checkpoint is a :func:`~neural_arch.distributed.checkpoint.save` directory ``step_<N>``; its
metrics live in its own metadata, so they become visible atomically with it. A directory without
``.metadata`` (a save that crashed) is never listed, never "latest", and is removed by cleanup.
A ``step_<N>`` that is a symbolic link is not one of ours: never listed, loaded or deleted through.

Example (seed 003's resume / cleanup / best-model tracking)::

    mgr = CheckpointManager("ckpts", keep_last=3, best_metric="val_loss", mode="min")
    start = mgr.load_latest(state) or 0          # fills ``state`` in place; the step, or None
    for step in range(start, 100):
        ...
        mgr.save(state, step=step + 1, metrics={"val_loss": loss})   # collective; keeps 3 + the best
    mgr.best()                                   # (step, path, metrics) of the lowest val_loss
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import shutil

from neural_arch.distributed.checkpoint.api import async_save, load, save, verify
from neural_arch.distributed.checkpoint.storage import (
    METADATA_NAME,
    CheckpointError,
    CheckpointMismatchError,
    read_metadata,
)
from neural_arch.utils.atomic_file import TMP_MARK as _TMP_MARK

__all__ = ["CheckpointManager", "find_latest_checkpoint"]

_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointManager:
    """Keep the last ``keep_last`` checkpoints of ``directory`` (plus the best by ``best_metric``).

    Args:
        directory: the folder holding ``step_<N>`` checkpoint directories (shared by all ranks).
        keep_last: how many of the newest checkpoints to keep (None: keep all).
        best_metric: a key of the ``metrics`` given to :meth:`save`; the best checkpoint by it is
            never deleted (None: no best-model tracking).
        mode: ``"min"`` or ``"max"``: which direction of ``best_metric`` is better.
        process_group: the group that saves (default: the default group, or a world of one).

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> manager = CheckpointManager(tempfile.mkdtemp(), keep_last=2)
        >>> for step in (1, 2, 3):
        ...     _ = manager.save({"w": np.full(3, float(step))}, step=step, metrics={"loss": 1.0 / step})
        >>> [step for step, _, _ in manager.checkpoints()]          # the oldest was deleted
        [2, 3]
        >>> state = {"w": np.zeros(3)}
        >>> manager.load_latest(state), state["w"].tolist()
        (3, [3.0, 3.0, 3.0])
    """

    def __init__(self, directory, keep_last: int | None = 3, best_metric: str | None = None, mode: str = "min",
                 process_group=None):
        if keep_last is not None and int(keep_last) < 1:
            raise ValueError(f"CheckpointManager: keep_last must be >= 1 or None, got {keep_last}")
        if mode not in ("min", "max"):
            raise ValueError(f"CheckpointManager: mode must be 'min' or 'max', got {mode!r}")
        self.directory = os.fspath(directory)
        self.keep_last = None if keep_last is None else int(keep_last)
        self.best_metric, self.mode = best_metric, mode
        self.process_group = process_group

    # -- listing --------------------------------------------------------------------------------
    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{int(step):08d}")

    def checkpoints(self) -> list[tuple[int, str, dict]]:
        """Committed checkpoints as ``(step, path, metrics)``, oldest first."""
        out = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return out
        for name in names:
            m = _STEP_DIR.match(name)
            if not m:
                continue
            path = os.path.join(self.directory, name)
            if os.path.islink(path):
                continue  # not a save's: cleanup would delete inside wherever the link points
            try:
                meta = read_metadata(path)
            except CheckpointError:
                continue  # incomplete: its save never committed
            out.append((int(m.group(1)), path, meta.get("extra", {}).get("metrics", {})))
        return sorted(out)

    def latest(self) -> tuple[int, str, dict] | None:
        """``(step, path, metrics)`` of the newest committed checkpoint (the rule of
        :func:`~neural_arch.distributed.checkpoint.manager.find_latest_checkpoint`)."""
        path = find_latest_checkpoint(self.directory, "step_*")
        m = _STEP_DIR.match(os.path.basename(path)) if path else None
        if m is None or not os.path.isdir(path):
            return None
        return int(m.group(1)), path, read_metadata(path).get("extra", {}).get("metrics", {})

    def best(self) -> tuple[int, str, dict] | None:
        """The checkpoint with the best ``best_metric`` (ties: the newest), or None."""
        if self.best_metric is None:
            raise ValueError("CheckpointManager.best(): no best_metric was given to the constructor")
        scored = [c for c in self.checkpoints() if _finite(c[2].get(self.best_metric))]
        if not scored:
            return None
        sign = 1.0 if self.mode == "min" else -1.0
        return min(scored, key=lambda c: (sign * float(c[2][self.best_metric]), -c[0]))

    # -- saving and loading ---------------------------------------------------------------------
    def save(self, state_dict, step: int, metrics: dict | None = None, asynchronous: bool = False):
        """Save ``state_dict`` as checkpoint ``step`` (collective), then clean up on rank 0.

        With ``asynchronous=True`` returns the :func:`~neural_arch.distributed.checkpoint.api.async_save`
        future (cleanup runs when rank 0's commit finishes); otherwise the metadata (rank 0) or None.
        """
        extra = {"step": int(step), "metrics": {k: float(v) for k, v in (metrics or {}).items()}}
        if asynchronous:
            future = async_save(state_dict, self.path(step), self.process_group, extra=extra)
            if self._rank() == 0:
                future.add_done_callback(lambda f: f.exception() is None and self.cleanup())
            return future
        meta = save(state_dict, self.path(step), self.process_group, extra=extra)
        if self._rank() == 0:
            self.cleanup()
        return meta

    def load_latest(self, state_dict, verify_files: bool = False) -> int | None:
        """Load the newest committed checkpoint into ``state_dict`` in place; its step, or None.

        A checkpoint that fails verification is skipped (with the next older one tried). A state
        dict that does not fit the checkpoint (a key missing, a shape or dtype changed) raises
        ``CheckpointMismatchError``: an older checkpoint would not fit either, and falling back
        (to None: a fresh start) would resume the wrong run with exit 0.
        """
        for step, path, _ in reversed(self.checkpoints()):
            try:
                if verify_files:
                    verify(path)
                load(state_dict, path)
                return step
            except CheckpointMismatchError:
                raise
            except CheckpointError:
                continue
        return None

    def load_best(self, state_dict) -> int | None:
        found = self.best()
        if found is None:
            return None
        load(state_dict, found[1])
        return found[0]

    def cleanup(self) -> list[str]:
        """Delete checkpoints beyond ``keep_last`` (never the best) and crashed saves older than
        the latest committed one. Returns the removed paths. Call from one rank (rank 0)."""
        found = self.checkpoints()
        keep = {c[1] for c in (found if self.keep_last is None else found[-self.keep_last:])}
        if self.best_metric is not None:
            best = self.best()
            if best is not None:
                keep.add(best[1])
        removed = [p for _, p, _ in found if p not in keep]
        latest_step = found[-1][0] if found else None
        if latest_step is not None and os.path.isdir(self.directory):
            for name in os.listdir(self.directory):  # crashed saves (no metadata) older than the latest
                m = _STEP_DIR.match(name)
                path = os.path.join(self.directory, name)
                if m and int(m.group(1)) < latest_step and not os.path.islink(path) \
                        and not os.path.lexists(os.path.join(path, METADATA_NAME)):
                    removed.append(path)
        for path in removed:
            try:  # un-list it first: a crash during rmtree must not leave a listed, broken checkpoint
                os.unlink(os.path.join(path, METADATA_NAME))
            except FileNotFoundError:
                pass
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def _rank(self) -> int:
        from neural_arch.distributed import groups
        from neural_arch.distributed.resolve import _resolve_group

        if self.process_group is None and not groups.is_initialized():
            return 0
        return _resolve_group(self.process_group).backend.rank


def _step_of(name: str) -> int | None:
    numbers = re.findall(r"\d+", name)
    return int(numbers[-1]) if numbers else None


def find_latest_checkpoint(directory: str, pattern: str = "*") -> str | None:
    """Path of the newest checkpoint in ``directory`` matching ``pattern``, or None: the one rule
    for "latest" (:meth:`~neural_arch.distributed.checkpoint.manager.CheckpointManager.latest` and the launcher's restart helpers use it).

    A checkpoint is a file (``step_000042.npz``) or a *committed* checkpoint directory (one with
    DCP's ``.metadata``: a save that crashed has none and never counts). "Newest" is the largest
    *last number in the name* (``step_000120.npz`` > ``step_99.npz``); names without a number rank
    below numbered ones, ties and unnumbered names go by modification time. Temporary files from
    interrupted atomic writes and symbolic links to directories are skipped. A missing folder gives None.

    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp()
    >>> for n in (2, 10, 9):
    ...     _ = (pathlib.Path(d) / f"step_{n}.npz").write_bytes(b"x")
    >>> os.path.basename(find_latest_checkpoint(d, "step_*.npz"))
    'step_10.npz'
    """
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return None
    best, best_key = None, None
    for entry in entries:
        if _TMP_MARK in entry.name or not fnmatch.fnmatch(entry.name, pattern):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if not os.path.isfile(os.path.join(entry.path, METADATA_NAME)):
                    continue  # a save that never committed
            elif not entry.is_file() or entry.is_symlink() and os.path.isdir(entry.path):
                continue
            mtime = entry.stat().st_mtime
        except FileNotFoundError:
            continue  # removed while we looked (another rank pruning old checkpoints)
        step = _step_of(entry.name)
        key = (step is not None, step if step is not None else -1, mtime, entry.name)
        if best_key is None or key > best_key:
            best, best_key = entry.path, key
    return best


def _finite(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
