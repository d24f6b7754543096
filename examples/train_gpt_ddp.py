#!/usr/bin/env python3
"""Data-parallel training of a small GPT on a synthetic next-token task.

The task (``make_token_sequences(task="sum")``): ``x[t] = (x[t-1] + x[t-2]) mod V``, so every
token after the second is predictable from the two before it. The loss starts near ``ln V`` and
drops as the model learns the rule. Start it any way::

    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/train_gpt_ddp.py
    mpiexec -n 2 python examples/train_gpt_ddp.py
    python examples/train_gpt_ddp.py
    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/train_gpt_ddp.py --device cuda

Options: ``--steps``, ``--batch-size`` (per rank), ``--lr``, ``--vocab``, ``--seq-len``,
``--n-layer``, ``--n-embd``, ``--checkpoint PATH`` (optional), ``--seed``, ``--device cpu|cuda``
(each rank uses ``cuda:LOCAL_RANK % device_count``; nccl when every rank has its own GPU).
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
import neural_arch.nn.functional as F
from neural_arch import nn, optim
from neural_arch.backend import to_device, to_host
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import DataLoader, TensorDataset, make_token_sequences
from neural_arch.distributed.run.device import select_device


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=32)
    p.add_argument("--checkpoint", default=None, help="write model + optimizer state here at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: each rank uses cuda:LOCAL_RANK %% device_count")
    return p.parse_args(argv)


def lm_loss(model, x, y, device="cpu"):
    logits = model(Tensor(x, device=device))
    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), to_device(y.reshape(b * t), device))


def main(argv=None) -> int:
    args = parse_args(argv)
    device, backend = select_device(args.device)  # ("cpu", None) or e.g. ("cuda:1", "nccl")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(args.seed)

    X, Y = make_token_sequences(4096, args.seq_len, args.vocab, seed=args.seed, task="sum")
    X_val, Y_val = make_token_sequences(256, args.seq_len, args.vocab, seed=args.seed + 1, task="sum")
    data = TensorDataset(X, Y)
    sampler = dist.DistributedSampler(data, shuffle=True, seed=args.seed)  # replicas/rank from the group
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = nn.GPT(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                   n_embd=args.n_embd).to(device)
    ddp = dist.DistributedDataParallel(model)
    opt = optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)

    def val_loss():
        def per_token_ce(out, tgt):  # distributed_evaluate averages per *sequence*: mean over tokens first
            logits = out.reshape(-1, out.shape[-1]).astype(np.float64)
            z = logits - logits.max(axis=1, keepdims=True)
            ce = np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(z)), tgt.reshape(-1)]
            return ce.reshape(tgt.shape).mean(axis=1)
        per_token_ce.__name__ = "loss"
        return dist.distributed_evaluate(ddp, (X_val, Y_val), metric=per_token_ce, batch_size=128)["loss"]

    first = val_loss()
    if rank == 0:
        print(f"GPT {model.num_parameters()} parameters, {world} rank(s); validation loss {first:.3f} "
              f"(ln V = {np.log(args.vocab):.3f})", flush=True)
    step, epoch, t0 = 0, 0, time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = lm_loss(ddp, x, y, device)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if rank == 0 and (step % 25 == 0 or step == 1):
                print(f"step {step:4d}  train loss {float(loss.item()):.4f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0
    last = val_loss()
    if rank == 0:
        print(f"final: validation loss {first:.3f} -> {last:.3f}; {step} steps in {elapsed:.1f} s, "
              f"{step * args.batch_size * world / elapsed:.0f} sequences/s", flush=True)
        if args.checkpoint:
            from neural_arch.distributed.elastic.checkpoint_restart import save_npz_atomic

            os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
            save_npz_atomic(args.checkpoint, **{f"model/{k}": to_host(v) for k, v in ddp.state_dict().items()})
            print(f"checkpoint written to {args.checkpoint}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
