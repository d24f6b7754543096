#!/usr/bin/env python3
"""Fully sharded training of a small GPT (FSDP + activation checkpointing + mixed precision).

Same synthetic task as ``train_gpt_ddp.py`` (``x[t] = (x[t-1] + x[t-2]) mod V``). Each
transformer block is one FSDP unit; every rank keeps 1/N of the parameters, gradients and Adam
state. Start it any way::

    python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/train_gpt_fsdp.py
    mpiexec -n 2 python examples/train_gpt_fsdp.py
    python examples/train_gpt_fsdp.py

Options: ``--steps``, ``--batch-size`` (per rank), ``--lr``, ``--strategy``
(FULL_SHARD/SHARD_GRAD_OP/NO_SHARD), ``--activation-checkpointing``, ``--bf16`` (autocast to
bfloat16, loss in float32), ``--clip``, ``--cpu-offload``, ``--checkpoint PATH`` (full state dict,
written by rank 0), ``--seed``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank (set before numpy loads)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import neural_arch.distributed as dist
import neural_arch.nn.functional as F
from neural_arch import memory, nn, optim
from neural_arch.amp import autocast
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import DataLoader, TensorDataset, make_token_sequences
from neural_arch.distributed.fsdp import (
    CPUOffload,
    FullyShardedDataParallel,
    ModuleWrapPolicy,
    ShardingStrategy,
)
from neural_arch.utils.checkpoint import apply_activation_checkpointing


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=32)
    p.add_argument("--strategy", default="FULL_SHARD", choices=["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--bf16", action="store_true", help="autocast linear/matmul to bfloat16")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--cpu-offload", action="store_true")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(args.seed)

    X, Y = make_token_sequences(4096, args.seq_len, args.vocab, seed=args.seed, task="sum")
    data = TensorDataset(X, Y)
    sampler = dist.DistributedSampler(data, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = nn.GPT(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                   n_embd=args.n_embd)
    if args.activation_checkpointing:
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.TransformerBlock))
    fsdp = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerBlock}),
                                    sharding_strategy=ShardingStrategy[args.strategy],
                                    cpu_offload=CPUOffload(offload_params=args.cpu_offload),
                                    sync_module_states=True)
    opt = optim.AdamW(fsdp.parameters(), lr=args.lr, weight_decay=0.01)
    if rank == 0:
        shard = sum(p.numel() for p in fsdp.parameters())
        print(f"GPT {model.num_parameters()} parameters; {world} rank(s), {args.strategy}: "
              f"{shard} parameters per rank", flush=True)

    memory.reset_peak_memory_stats()
    step, epoch, t0, first = 0, 0, time.perf_counter(), None
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            with autocast("cpu", dtype="bfloat16", enabled=args.bf16):
                logits = fsdp(Tensor(x))
                b, t, v = logits.shape
                loss = F.cross_entropy(logits.reshape(b * t, v), y.reshape(b * t))
            loss.backward()
            fsdp.clip_grad_norm_(args.clip)
            opt.step()
            opt.zero_grad()
            step += 1
            first = float(loss.item()) if first is None else first
            if rank == 0 and (step % 25 == 0 or step == 1):
                print(f"step {step:4d}  train loss {float(loss.item()):.4f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0
    peak = memory.max_memory_allocated()
    state = fsdp.state_dict()  # a collective: every rank takes part
    if rank == 0:
        print(f"final: train loss {first:.3f} -> {float(loss.item()):.3f}; {step} steps in {elapsed:.1f} s; "
              f"peak host memory {peak / 2**20:.1f} MiB on rank 0", flush=True)
        if args.checkpoint:
            from neural_arch.distributed.elastic.checkpoint_restart import save_npz_atomic

            os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
            save_npz_atomic(args.checkpoint, **{f"model/{k}": v for k, v in state.items()})
            print(f"checkpoint written to {args.checkpoint}", flush=True)
    memory.stop()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
