#!/usr/bin/env python3
"""Train a small GPT with pipeline x data (x tensor) parallelism on a synthetic next-token task.

World = pp * dp * tp ranks laid out as a (dp, pp, tp) grid (tp innermost: consecutive ranks).
Each pipeline replica cuts the GPT into ``pp * virtual`` stages (embeddings on the first, the
head and loss on the last); each stage's parameters are averaged over its dp group once per step;
with ``--tp`` > 1 every stage is also tensor-parallel (Megatron plan, via ``init_device_mesh``).
Start it any way::

    python -m neural_arch.distributed.launcher --nproc_per_node 4 examples/train_gpt_3d.py --pp 2 --dp 2
    mpiexec -n 2 python examples/train_gpt_3d.py --pp 2 --schedule interleaved --virtual 2
    mpiexec -n 2 python examples/train_gpt_3d.py --pp 2 --schedule zbv    # 4 stages in a V
    mpiexec -n 2 python examples/train_gpt_3d.py --pp 2 --schedule izb --virtual 2  # interleaved zero bubble
    python -m neural_arch.distributed.launcher --nproc_per_node 4 examples/train_gpt_3d.py --pp 2 --tp 2
    python examples/train_gpt_3d.py            # one process: pp = dp = tp = 1

Options: ``--pp``, ``--dp`` (default: what is left of the world), ``--tp``, ``--microbatches``,
``--microbatch-size``, ``--schedule {gpipe,1f1b,interleaved,zbh1,zbv,izb}``, ``--virtual``, ``--steps``,
``--lr``, ``--n-layer``, ``--n-embd``, ``--seed``, and ``--verify``: train in float64 and also a
single-process reference on the global batch, then print the largest parameter difference.
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
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import make_token_sequences
from neural_arch.distributed import pipelining as pl

SCHEDULES = {"gpipe": pl.ScheduleGPipe, "1f1b": pl.Schedule1F1B, "interleaved": pl.ScheduleInterleaved1F1B,
             "zbh1": pl.ScheduleZBH1, "zbv": pl.ScheduleZBVZeroBubble, "izb": pl.ScheduleInterleavedZeroBubble}
#: schedules that run several stages per rank: interleaved 1F1B and interleaved zero bubble (stage s
#: on rank s % pp) and ZB-V (rank r holds stages r and 2 pp - 1 - r: the first and the last stage,
#: so the loss, on rank 0)
MULTI_STAGE = {"interleaved": "loop", "izb": "loop", "zbv": "v"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pp", type=int, default=None, help="pipeline stages (ranks per pipeline); default world/(dp*tp)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel replicas; default world/(pp*tp)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per stage")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--virtual", type=int, default=2, help="stages per rank for --schedule interleaved or izb")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", action="store_true", help="float64, and compare with single-process training")
    return p.parse_args(argv)


def sizes(args, world: int):
    tp = args.tp
    if args.pp is None and args.dp is None:
        pp, dp = world // tp, 1
    elif args.pp is None:
        pp, dp = world // (args.dp * tp), args.dp
    else:
        pp, dp = args.pp, (args.dp if args.dp is not None else world // (args.pp * tp))
    if min(pp, dp, tp) < 1 or pp * dp * tp != world:
        raise SystemExit(f"--pp {pp} x --dp {dp} x --tp {tp} must equal the world size {world}")
    return pp, dp, tp


def build_model(args):
    manual_seed(args.seed)  # same initial weights on every rank
    model = nn.GPT(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                   n_embd=args.n_embd)
    return model.double() if args.verify else model


def lm_loss(logits, target):
    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), np.asarray(target).reshape(b * t))


def make_groups(pp: int, dp: int, tp: int):
    """(pp group, dp group, tp group or None, dp index, pp index) for the (dp, pp, tp) grid."""
    rank = dist.get_rank()
    if tp > 1:
        from neural_arch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
        return (mesh.get_group("pp"), mesh.get_group("dp"), mesh.get_group("tp"),
                mesh.get_local_rank("dp"), mesh.get_local_rank("pp"))
    world = pp * dp
    pp_group = dp_group = None
    for d in range(dp):  # every rank creates every group (new_group is collective)
        g = dist.new_group(list(range(d * pp, (d + 1) * pp)))
        pp_group = g if rank // pp == d else pp_group
    for s in range(pp):
        g = dist.new_group(list(range(s, world, pp)))
        dp_group = g if rank % pp == s else dp_group
    return pp_group, dp_group, None, rank // pp, rank % pp


def stage_params(stages, tp_group):
    """This rank's parameters by original name, unsharded (an all-gather over tp when tp > 1)."""
    if tp_group is None:
        return {n: p.data for st in stages for n, p in st.submodule.named_parameters()}
    from neural_arch.distributed.tensor.parallel.state_dict import full_state_dict

    out = {}
    for st in stages:
        out.update(full_state_dict(st.submodule))  # collective over the stage's tp group
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    pp, dp, tp = sizes(args, world)
    v = {"interleaved": args.virtual, "izb": args.virtual, "zbv": 2}.get(args.schedule, 1)
    pp_group, dp_group, tp_group, d, s = make_groups(pp, dp, tp)

    model = build_model(args)
    if tp > 1:
        from neural_arch.distributed.tensor.parallel.gpt import parallelize_gpt

        parallelize_gpt(model, tp_group, loss_parallel=False)  # logits gathered: the plain loss works
    pipe = pl.pipeline(model, num_stages=pp * v, balance="layers")
    stages = [pipe.build_stage(i, group=pp_group, dp_group=dp_group if dp > 1 else None)
              for i in pl.stage_indices(s, pp, v, style=MULTI_STAGE.get(args.schedule, "loop"))]
    schedule_cls = SCHEDULES[args.schedule]
    schedule = schedule_cls(stages if args.schedule in MULTI_STAGE else stages[0], args.microbatches,
                            loss_fn=lm_loss)
    opt = optim.AdamW([p for st in stages for p in st.submodule.parameters()], lr=args.lr, weight_decay=0.01)
    has_first, has_last = any(st.is_first for st in stages), any(st.is_last for st in stages)
    reporter = has_last and d == 0 and (tp_group is None or tp_group.rank() == 0)

    ref = ref_opt = None
    if args.verify:
        ref = build_model(args)
        ref_opt = optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01)

    per_replica = args.microbatches * args.microbatch_size
    X, Y = make_token_sequences(per_replica * dp * args.steps, args.seq_len, args.vocab, seed=args.seed, task="sum")
    if rank == 0:
        print(f"GPT {sum(p.data.size for p in model.parameters())} local parameters on rank 0; pp={pp} dp={dp} "
              f"tp={tp}, {args.schedule} with {args.microbatches} micro-batches"
              + (f", {v} stages per rank" if v > 1 else "") + f"; stages per rank: {len(stages)}", flush=True)
        print(schedule.format(), flush=True)
    t0 = time.perf_counter()
    for step in range(args.steps):
        g = slice(step * per_replica * dp, (step + 1) * per_replica * dp)  # the global batch of this step
        x, y = X[g], Y[g]
        mine = slice(d * per_replica, (d + 1) * per_replica)
        losses = schedule.step(*((x[mine],) if has_first else ()), target=y[mine] if has_last else None)
        opt.step()
        opt.zero_grad()
        if ref is not None:
            lm_loss(ref(Tensor(x)), y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        if reporter and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {np.mean([float(l.item()) for l in losses]):.4f}", flush=True)
    elapsed = time.perf_counter() - t0
    if ref is not None:
        ref_named = dict(ref.named_parameters())
        mine = stage_params(stages, tp_group)
        diff = max(float(np.abs(np.asarray(a) - ref_named[n].data).max()) for n, a in mine.items() if n in ref_named)
        worst = np.array([diff])
        dist.all_reduce(worst, dist.ReduceOp.MAX)
        if rank == 0:
            print(f"verify: max |pipeline - single process| over all parameters = {float(worst[0]):.3e}", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps in {elapsed:.1f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
