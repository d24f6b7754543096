"""``DistributedMonitor``: seed 003's per-step log, as CSV (always) and TensorBoard (when installed), on rank 0.

Other ranks accept the same calls and write nothing, so one script runs unchanged on every rank.
The numbers are derived from what the trainer measured (its
:class:`~neural_arch.distributed.metrics.DistributedMetrics`); the monitor times nothing itself.

Example::

    monitor = DistributedMonitor(log_dir="./logs")
    metrics = trainer.train_step(batch, optimizer, criterion, step)
    monitor.log_training_step(loss=metrics["loss"], batch_size=len(batch[0]),
                              step_time=metrics["compute_time"], comm_time=metrics["communication_time"])
    monitor.close()        # ./logs/training_log.csv (+ TensorBoard event files with tensorboardX)
"""

from __future__ import annotations

import csv
import os

__all__ = ["DistributedMonitor"]

_COLUMNS = ("step", "loss", "batch_size", "step_time", "comm_time", "samples_per_second", "comm_overhead_percent")


class DistributedMonitor:
    """Log training steps to ``log_dir`` on rank 0.

    Args:
        log_dir: folder for ``training_log.csv`` and the TensorBoard event files.
        rank: this process's rank (default: the default group's, 0 without one); only rank 0 writes.
        tensorboard: also write TensorBoard scalars when ``tensorboardX`` is installed
            (``pip install 'neural_arch[tensorboard]'``); without it only the CSV is written.

    Example::

        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> monitor = DistributedMonitor(folder, rank=0, tensorboard=False)
        >>> row = monitor.log_training_step(loss=0.5, batch_size=32, step_time=0.1, comm_time=0.01)
        >>> monitor.close()
        >>> os.listdir(folder)
        ['training_log.csv']
    """

    def __init__(self, log_dir, rank: int | None = None, tensorboard: bool = True):
        if rank is None:
            from neural_arch.distributed import groups as dist

            rank = dist.get_rank() if dist.is_initialized() else 0
        self.log_dir = os.fspath(log_dir)
        self.rank = int(rank)
        self.enabled = self.rank == 0
        self.csv_path = os.path.join(self.log_dir, "training_log.csv")
        self.writer = None
        self._file = None
        self._csv = None
        self._step = 0
        if not self.enabled:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        self._file = open(self.csv_path, "a", newline="")  # noqa: SIM115 - closed by close()
        self._csv = csv.writer(self._file)
        if self._file.tell() == 0:
            self._csv.writerow(_COLUMNS)
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                SummaryWriter = None  # CSV only, as documented
            if SummaryWriter is not None:
                self.writer = SummaryWriter(self.log_dir)

    def log_training_step(self, loss: float, batch_size: int, step_time: float, comm_time: float,
                          step: int | None = None) -> dict:
        """Record one step; returns the row (every rank computes it, rank 0 writes it).

        ``samples_per_second`` is ``batch_size / step_time`` (this rank's), ``comm_overhead_percent``
        ``100 * comm_time / step_time``.
        """
        step = self._step if step is None else int(step)
        self._step = step + 1
        step_time, comm_time = float(step_time), float(comm_time)
        row = {"step": step, "loss": float(loss), "batch_size": int(batch_size), "step_time": step_time,
               "comm_time": comm_time,
               "samples_per_second": batch_size / step_time if step_time > 0 else 0.0,
               "comm_overhead_percent": 100.0 * comm_time / step_time if step_time > 0 else 0.0}
        if self.enabled and self._csv is not None:
            self._csv.writerow([row[c] for c in _COLUMNS])
            self._file.flush()
            if self.writer is not None:
                for name in _COLUMNS[1:]:
                    self.writer.add_scalar(f"train/{name}", row[name], step)
        return row

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self._file is not None:
            self._file.close()
            self._file = self._csv = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
