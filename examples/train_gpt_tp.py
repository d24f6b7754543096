#!/usr/bin/env python3
"""Tensor-parallel (optionally x data-parallel) training of a small GPT on a synthetic next-token task.

The world is a ``(dp, tp)`` mesh: each tensor-parallel group of ``--tp`` ranks holds one copy of
the model split Megatron-style (heads and MLP columns per rank, vocabulary-parallel embedding,
LM head and loss); DDP averages gradients across the ``--dp`` copies. The task is
``x[t] = (x[t-1] + x[t-2]) mod V`` (loss falls from ``ln V``). Start it any way::

    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/train_gpt_tp.py --tp 2
    python -m neural_arch.distributed.launcher --nproc_per_node 4 examples/train_gpt_tp.py --tp 2 --dp 2
    mpiexec -n 2 python examples/train_gpt_tp.py --tp 2
    python examples/train_gpt_tp.py                      # one process: tp = dp = 1

Options: ``--tp``, ``--dp`` (default: world / tp), ``--steps``, ``--batch-size`` (per data-parallel
replica), ``--lr``, ``--vocab``, ``--seq-len``, ``--n-layer``, ``--n-head``, ``--n-embd``, ``--seed``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank (set before numpy loads)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import neural_arch.distributed as dist
from neural_arch import nn, optim
from neural_arch.core.tensor import manual_seed
from neural_arch.data import make_token_sequences
from neural_arch.distributed.device_mesh import init_device_mesh
from neural_arch.distributed.tensor.parallel import (
    full_state_dict,
    parallelize_gpt,
    vocab_parallel_cross_entropy,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: the whole world)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size (default: world / tp)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per data-parallel replica per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp or world
    dp = args.dp or world // tp
    if tp * dp != world:
        raise SystemExit(f"--tp {tp} x --dp {dp} = {tp * dp} ranks, but the world has {world}; "
                         "start tp * dp processes")
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    if rank == 0:
        print(mesh, flush=True)

    manual_seed(args.seed)          # same seed everywhere: every TP shard is a slice of one model
    model = nn.GPT(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                   n_embd=args.n_embd)
    full_params = model.num_parameters()
    parallelize_gpt(model, mesh["tp"], loss_parallel=True)
    tp_group = mesh.get_group("tp")
    trained = dist.DistributedDataParallel(model, process_group=mesh.get_group("dp")) if dp > 1 else model
    opt = optim.AdamW(trained.parameters(), lr=args.lr, weight_decay=0.01)

    X, Y = make_token_sequences(4096, args.seq_len, args.vocab, seed=args.seed, task="sum")
    rng = np.random.default_rng(args.seed)       # same draws on every rank; each dp replica takes its rows
    dp_rank, B = mesh.get_local_rank("dp"), args.batch_size
    if rank == 0:
        print(f"GPT {full_params} parameters; {model.num_parameters()} on each rank (tp={tp}, dp={dp}); "
              f"ln V = {np.log(args.vocab):.3f}", flush=True)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = rng.integers(0, len(X), size=B * dp)[dp_rank * B:(dp_rank + 1) * B]
        loss = vocab_parallel_cross_entropy(trained(X[rows]), Y[rows], process_group=tp_group)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0 and (step % 25 == 0 or step == 1):
            print(f"step {step:4d}  train loss {float(loss.item()):.4f}", flush=True)
    elapsed = time.perf_counter() - t0
    state = full_state_dict(model)                   # collective over each tp group
    if rank == 0:
        print(f"final: {args.steps} steps in {elapsed:.1f} s; full state dict of {len(state)} tensors, "
              f"{sum(v.size for v in state.values())} values", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
