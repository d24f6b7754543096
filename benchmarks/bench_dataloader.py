#!/usr/bin/env python3
"""DataLoader throughput with a Python-heavy transform at 0, 1, 2 worker processes, and the cost of
the batch transport (shared memory vs pickling through the result queue).

1. **Python transform**: each sample is a 32x32x3 float32 image put through a per-pixel-row Python
   loop (a stand-in for PIL/augmentation code that holds the GIL); batch 32. Samples per second
   at ``num_workers`` 0, 1, 2 (the default ``fork`` context; worker start-up is included, one
   iterator per epoch, as a training loop sees it).
2. **Transport**: a ``TensorDataset`` of large rows (cheap to load, heavy to move: batch 64 x
   ``--row-floats`` float64) at 2 workers, batches through ``/dev/shm`` vs pickled (the first
   version's way), and num_workers=0 for reference.

Numbers depend on the machine's free cores: with fewer than ``num_workers + 1`` idle cores the
workers and the main process share them. The environment (CPU count, load) is saved with the result.

Run::

    python benchmarks/bench_dataloader.py            # table + benchmarks/results/bench_dataloader.json
    python benchmarks/bench_dataloader.py --samples 2048 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import numpy as np

from benchmarks.common import format_table, write_json
from neural_arch.data import (
    DataLoader,
    Dataset,
    TensorDataset,
    shared_batch,
)


class PythonTransform(Dataset):
    """Images whose transform is plain Python (it holds the GIL, as PIL-style augmentation does)."""

    def __init__(self, n: int, work: int):
        self.n, self.work = n, work
        self.images = np.random.default_rng(0).random((n, 32, 32, 3), dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        image = self.images[i]
        acc = 0.0
        for k in range(self.work):            # the Python-heavy part
            acc += (k * 31 + i) % 7
        flipped = image[:, ::-1] if acc % 2 else image
        return flipped * np.float32(1.0 / (1.0 + acc % 3)), i % 10


def _epoch_seconds(makers: dict, repeat: int) -> dict:
    """Seconds per epoch of each loader maker, the configurations interleaved round by round so that
    a change in the machine's load hits all of them alike."""
    times: dict = {name: [] for name in makers}
    for _ in range(repeat):
        for name, make_loader in makers.items():
            loader = make_loader()
            start = time.perf_counter()
            for _batch in loader:
                pass
            times[name].append(time.perf_counter() - start)
            del loader
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--work", type=int, default=20000, help="Python loop iterations per sample")
    parser.add_argument("--row-floats", type=int, default=16384, help="float64 per row in the transport test")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "bench_dataloader.json"))
    args = parser.parse_args()

    heavy = PythonTransform(args.samples, args.work)
    rows, results = [], {"python_transform": [], "transport": []}
    timed = _epoch_seconds({w: (lambda w=w: DataLoader(heavy, batch_size=32, num_workers=w)) for w in args.workers},
                           args.repeat)
    base = None
    for workers, times in timed.items():
        med = statistics.median(times)
        rate = args.samples / med
        base = base or rate
        results["python_transform"].append({"num_workers": workers, "epoch_s": times, "samples_per_s": rate})
        rows.append([workers, f"{med:.3f}", f"{rate:,.0f}", f"{rate / base:.2f}x"])
    table1 = format_table(rows, ["num_workers", "epoch s (median)", "samples/s", "vs 0 workers"])

    big = TensorDataset(np.random.default_rng(1).random((args.samples, args.row_floats)), np.arange(args.samples))
    batch_mb = 64 * args.row_floats * 8 / 2**20
    saved = shared_batch.MIN_SHARED_BYTES

    def transport(workers, threshold):
        def make():
            shared_batch.MIN_SHARED_BYTES = threshold   # read by pack() in the workers this epoch forks
            return DataLoader(big, batch_size=64, num_workers=workers)
        return make

    makers = {"0 workers (in process)": transport(0, saved), "2 workers, shared memory": transport(2, saved),
              "2 workers, pickled": transport(2, 1 << 62)}
    try:
        timed = _epoch_seconds(makers, args.repeat)
    finally:
        shared_batch.MIN_SHARED_BYTES = saved
    rows = []
    for label, times in timed.items():
        med = statistics.median(times)
        gbps = args.samples * args.row_floats * 8 / med / 1e9
        results["transport"].append({"mode": label, "epoch_s": times, "GB_per_s": gbps})
        rows.append([label, f"{med:.3f}", f"{gbps:.2f}"])
    table2 = format_table(rows, ["transport", "epoch s (median)", "GB/s"])

    print(f"Python-heavy transform: {args.samples} samples of 32x32x3, {args.work} Python loop steps each, batch 32, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(table1)
    print(f"\nTransport: {args.samples} rows of {args.row_floats} float64, batch 64 ({batch_mb:.1f} MiB a batch)")
    print(table2)
    path = write_json(args.out, {"args": vars(args), "loadavg_1min": os.getloadavg()[0], **results,
                                 "tables": {"python_transform": table1, "transport": table2}})
    print(f"\nraw: {os.path.relpath(path, REPO)}")


if __name__ == "__main__":
    main()
