#!/usr/bin/env python3
"""Optimizer step time, per-tensor loop vs multi-tensor (``foreach``), on a model of many small parameters.

The model is ``--layers`` blocks of ``nn.Linear(width, width)`` plus a ``LayerNorm`` (four small
tensors per block: weight, bias, norm weight, norm bias), so a step is dominated by per-parameter
Python and NumPy call overhead — what the foreach path removes by updating a whole group with a
few calls on flat vectors. Each optimizer is timed with ``foreach=False``, ``foreach=True`` and the
default ``foreach=None`` (flat for tensors of at most 16384 elements, a loop for larger ones)
(median of ``--repeat`` steps after a warm-up, gradients fixed), at the same BLAS thread count,
and the final parameters of both paths are checked to agree.

Run::

    python benchmarks/bench_optim.py                 # table on stdout
    python benchmarks/bench_optim.py --json benchmarks/results/bench_optim.json

Example::

    >>> rows = run(layers=2, width=4, repeat=2, names=["RMSprop"])
    >>> rows[0][0], rows[0][1]
    ('RMSprop', 8)
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import limit_threads, median_time, print_table, write_json
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor

FACTORIES = {
    "RMSprop": lambda ps, fe: optim.RMSprop(ps, lr=1e-3, momentum=0.9, foreach=fe),
    "Adagrad": lambda ps, fe: optim.Adagrad(ps, lr=1e-2, foreach=fe),
    "LAMB": lambda ps, fe: optim.LAMB(ps, lr=1e-3, weight_decay=0.01, foreach=fe),
    "LARS": lambda ps, fe: optim.LARS(ps, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=fe),
}


def _model(layers: int, width: int):
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.LayerNorm(width)]
    return [p for b in blocks for p in b.parameters()]


def run(layers: int = 200, width: int = 16, repeat: int = 30, names=None) -> list[list]:
    """Rows ``[name, n_params, loop_ms, foreach_ms, speed-up]`` (float32 parameters)."""
    rows = []
    for name in names or list(FACTORIES):
        times, finals = {}, {}
        for fe in (False, True, None):
            params = _model(layers, width)
            rng = np.random.default_rng(0)
            for p in params:
                p.data[...] = rng.normal(size=p.shape).astype(p.data.dtype)
                p.grad = Tensor(rng.normal(size=p.shape).astype(p.data.dtype))
            opt = FACTORIES[name](params, fe)
            times[fe] = median_time(opt.step, repeat=repeat, warmup=3)["median"] * 1e3
            finals[fe] = params
        # Both paths ran the same number of steps on the same gradients: they must agree.
        for fe in (True, None):
            for a, b in zip(finals[False], finals[fe]):
                np.testing.assert_allclose(a.data, b.data, rtol=1e-4, atol=1e-6)
        rows.append([name, len(finals[True]), round(times[False], 3), round(times[True], 3),
                     round(times[None], 3), round(times[False] / times[None], 2)])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    headers = ["optimizer", "params", "loop ms/step", "foreach=True ms/step", "default ms/step",
               "default speed-up"]
    results = {}
    with limit_threads(args.threads):
        # The case (many small tensors), then a few large ones: foreach=None must not lose there.
        for label, (layers, width) in (("small", (args.layers, args.width)), ("large", (4, 1024))):
            print(f"\n{label} tensors: {layers} x (Linear({width}, {width}) + LayerNorm({width}))")
            results[label] = run(layers, width, args.repeat)
            print_table(results[label], headers)
    if args.json:
        write_json(args.json, {"args": vars(args), "headers": headers, "rows": results})


if __name__ == "__main__":
    main()
