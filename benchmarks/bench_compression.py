#!/usr/bin/env python3
"""Gradient compression hooks vs plain all-reduce: bytes per step, step time, accuracy.

Two workloads, on 2 ranks (gloo by default; ``--backend mpi`` runs under ``mpiexec``):

1. **digits MLP** (64-128-128-10, the DDP example's model, Adam, batch 32 per rank): trained
   ``--epochs`` epochs under DDP with each comm hook; reported: bytes handed to collectives per
   step and per rank, median step time, and held-out accuracy (``distributed_evaluate``) next to
   plain all-reduce's (goal: within 1 point), averaged over ``--seeds`` runs (the per-seed spread is ~1 point).
2. **GPT weight matrices** (``nn.GPT``, n_embd 256, 2 layers): one backward's real gradients of
   every 2-D weight, each reduced by each hook (one bucket per matrix); bytes per rank vs plain
   all-reduce (goal: PowerSGD rank 4 sends <= 1/20), and DDP step time on the whole model.

Bytes are counted by a thin proxy in front of the backend that every hook talks to: the payload
each rank hands to all-reduce / all-gather (``payload``), and what a ring moves per rank for it
(``wire``: all-reduce 2 (n - 1) / n x payload, all-gather (n - 1) x payload). Top-K sends an int32
index next to each value (one packed all-gather), so its bytes are 2 x k x 4 (+ padding to 8).
Warm-up steps count at their real size: the table gives the steady state and the mean over training.

Run (a few minutes on 2 cores: every hook trains --seeds times; times are medians, ratios from one run)::

    python benchmarks/bench_compression.py                 # table + benchmarks/results/bench_compression.json
    python benchmarks/bench_compression.py --epochs 10 --backend mpi
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

HOOKS = ("allreduce", "fp16", "bf16", "powersgd-r1", "powersgd-r4", "topk-10%", "topk-1%:spread=0",
         "topk-1%:spread=1")


# ------------------------------------------------------------------------------------------------
# byte counting
# ------------------------------------------------------------------------------------------------

class CountingBackend:
    """Forwards to ``backend`` and adds up the payload of every all-reduce / all-gather."""

    def __init__(self, backend):
        self._b = backend
        self.payload = 0
        self.wire = 0.0

    def __getattr__(self, name):
        return getattr(self._b, name)

    @property
    def size(self):
        return self._b.size

    @property
    def rank(self):
        return self._b.rank

    def allreduce(self, array, *args, **kwargs):
        n = self._b.size
        self.payload += array.nbytes
        self.wire += 2 * (n - 1) / n * array.nbytes
        return self._b.allreduce(array, *args, **kwargs)

    def allgather(self, output, input, *args, **kwargs):
        self.payload += input.nbytes
        self.wire += (self._b.size - 1) * input.nbytes
        return self._b.allgather(output, input, *args, **kwargs)

    def reset(self):
        self.payload, self.wire = 0, 0.0


def make_hook(name: str, counter):
    """(state, hook) for ``name``, every hook talking to ``counter``."""
    from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook, topk_hook

    if name == "allreduce":
        return counter, default_hooks.allreduce_hook
    if name == "fp16":
        return counter, default_hooks.fp16_compress_hook
    if name == "bf16":
        return counter, default_hooks.bf16_compress_hook
    if name.startswith("powersgd-r"):
        rank = int(name[len("powersgd-r"):])
        return powerSGD_hook.PowerSGDState(counter, matrix_approximation_rank=rank, start_powerSGD_iter=10), \
            powerSGD_hook.powerSGD_hook
    if name.startswith("topk-"):
        # "topk-1%" (TopKState's defaults) or with overrides: "topk-1%:warmup_iters=0:momentum=0.9",
        # "topk-1%:spread=1" (spread delivery, no warm-up)
        pct, *opts = name[len("topk-"):].split(":")
        kwargs = {}
        for opt in opts:
            key, value = opt.split("=")
            kwargs[key] = float(value) if "." in value else int(value)
        return topk_hook.TopKState(ratio=float(pct.rstrip("%")) / 100, process_group=counter, **kwargs), \
            topk_hook.topk_hook
    raise ValueError(name)


def steady_state(state) -> None:
    """Skip a hook's warm-up (PowerSGD's dense start, Top-K's density schedule): the GPT workload
    measures one step of the steady state."""
    if hasattr(state, "start_powerSGD_iter"):
        state.start_powerSGD_iter = 0
    if hasattr(state, "schedule"):
        state.iter = state.schedule[-1].start


def bf16_supported(backend) -> str:
    """"ok", or why the backend cannot all-reduce bfloat16 (probed on a fresh group: a failure after
    the operation started poisons the group it ran on)."""
    import ml_dtypes
    import numpy as np

    import neural_arch.distributed as dist

    probe = dist.new_group(list(range(backend.size)))
    x = np.ones(2, dtype=ml_dtypes.bfloat16)
    try:
        probe.backend.allreduce(x)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return "ok" if x.astype(np.float32).tolist() == [float(backend.size)] * 2 else "wrong result"


# ------------------------------------------------------------------------------------------------
# workloads (run on every rank)
# ------------------------------------------------------------------------------------------------

def digits_run(hook_name: str, epochs: int, seed: int = 0) -> dict:
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.data import DataLoader, TensorDataset, load_digits

    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(seed)
    X_train, y_train, X_test, y_test = load_digits()
    train_set = TensorDataset(X_train, y_train)
    sampler = dist.DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler, drop_last=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = dist.DistributedDataParallel(model)
    counter = CountingBackend(dist.get_default_group().backend)
    state, hook = make_hook(hook_name, counter)
    ddp.register_comm_hook(state, hook)
    opt = optim.Adam(ddp.parameters(), lr=2e-3)
    times, steps = [], 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            F.cross_entropy(ddp(Tensor(x)), y).backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
            steps += 1
    payload = counter.payload
    counter.reset()
    # bytes of one step of the steady state (after PowerSGD's dense start, Top-K's warm-up)
    steady_state(state)
    F.cross_entropy(ddp(Tensor(X_train[:32])), y_train[:32]).backward()
    opt.zero_grad()
    acc = dist.distributed_evaluate(ddp, (X_test, y_test), metric=["accuracy"], batch_size=256)["accuracy"]
    return {"hook": hook_name, "steps": steps, "step_ms": 1e3 * statistics.median(times),
            "bytes_per_step": counter.payload, "wire_bytes_per_step": counter.wire,
            "mean_bytes_per_step": payload / max(steps, 1), "accuracy": float(acc)}


def gpt_matrices_run(hook_name: str, steps: int) -> dict:
    import numpy as np

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor, manual_seed
    from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import GradBucket

    rank = dist.get_rank()
    manual_seed(0)
    vocab, seq, batch = 64, 32, 8
    model = nn.GPT(vocab_size=vocab, block_size=seq, n_layer=2, n_head=4, n_embd=256)
    rng = np.random.default_rng(rank)
    x = rng.integers(0, vocab, size=(batch, seq))
    y = rng.integers(0, vocab, size=(batch, seq))

    def loss_of(m):
        logits = m(Tensor(x))
        b, t, v = logits.shape
        return F.cross_entropy(logits.reshape(b * t, v), y.reshape(b * t))

    # 1) every weight matrix's real gradient through the hook, one bucket per matrix
    loss_of(model).backward()
    counter = CountingBackend(dist.get_default_group().backend)
    state, hook = make_hook(hook_name, counter)
    steady_state(state)
    mats = [(n, p) for n, p in model.named_parameters() if p.grad is not None and p.data.ndim >= 2]
    plain = 0
    for i, (_, p) in enumerate(mats):
        g = p.grad.data.reshape(-1).copy()
        plain += g.nbytes
        bucket = GradBucket(i, g, [(0, g.size, p.data.shape)], [p], last=i == len(mats) - 1)
        hook(state, bucket).result()
    matrices = {"matrices": len(mats), "matrix_numel": int(sum(p.data.size for _, p in mats)),
                "plain_bytes": plain, "bytes": counter.payload, "wire_bytes": counter.wire}

    # 2) DDP step time on the whole model with the hook
    model2 = nn.GPT(vocab_size=vocab, block_size=seq, n_layer=2, n_head=4, n_embd=256)
    ddp = dist.DistributedDataParallel(model2)
    counter2 = CountingBackend(dist.get_default_group().backend)
    state2, hook2 = make_hook(hook_name, counter2)
    steady_state(state2)
    ddp.register_comm_hook(state2, hook2)
    opt = optim.AdamW(ddp.parameters(), lr=1e-3)
    times = []
    for s in range(steps + 2):
        t0 = time.perf_counter()
        loss_of(ddp).backward()
        opt.step()
        opt.zero_grad()
        if s >= 2:
            times.append(time.perf_counter() - t0)
    return {"hook": hook_name, **matrices, "ddp_step_ms": 1e3 * statistics.median(times),
            "ddp_bytes_per_step": counter2.payload / (steps + 2)}


def worker(args) -> dict:
    import neural_arch.distributed as dist

    dist.init_process_group(backend=args.backend)
    backend = dist.get_default_group().backend
    why_not_bf16 = bf16_supported(backend)
    out = {"backend": args.backend, "world_size": dist.get_world_size(), "bf16": why_not_bf16,
           "digits": [], "gpt": []}
    digits_run("allreduce", 1)  # warm-up (imports, first touches): not recorded
    for name in args.hooks.split(","):
        if name == "bf16" and why_not_bf16 != "ok":
            continue
        runs = []
        for seed in range(args.seeds):
            dist.barrier()
            runs.append(digits_run(name, args.epochs, seed))
        out["digits"].append({**runs[0], "accuracy": statistics.fmean(r["accuracy"] for r in runs),
                              "accuracy_per_seed": [r["accuracy"] for r in runs],
                              "step_ms": statistics.median(r["step_ms"] for r in runs),
                              "mean_bytes_per_step": statistics.fmean(r["mean_bytes_per_step"] for r in runs)})
        dist.barrier()
        if args.gpt_steps:
            out["gpt"].append(gpt_matrices_run(name, args.gpt_steps))
    dist.destroy_process_group()
    return out


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------

def launch(args) -> dict:
    from benchmarks.common import json_lines, run_processes, thread_env
    from neural_arch.distributed.testing import free_port

    me = os.path.abspath(__file__)
    common = ["--worker", "--backend", args.backend, "--epochs", str(args.epochs), "--seeds", str(args.seeds), "--hooks", args.hooks,
              "--gpt-steps", str(args.gpt_steps)]
    env = thread_env(1)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if args.backend == "mpi":
        from neural_arch.distributed.testing import mpiexec_path

        cmds = [([mpiexec_path(), "-n", str(args.ranks), sys.executable, me, *common], env)]
    else:
        port = str(free_port())
        cmds = [([sys.executable, me, *common], dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.ranks),
                                                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
                for r in range(args.ranks)]
    rank0 = run_processes(cmds, args.timeout, "compression worker", cwd=REPO)[0][0]
    results = json_lines(rank0)
    if results:
        return results[-1]
    raise RuntimeError(f"no result from rank 0:\n{rank0[-2000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="gradient compression benchmark (see the module docstring)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "mpi"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3, help="digits runs per hook (seeds 0..N-1); accuracy is their mean")
    ap.add_argument("--gpt-steps", type=int, default=8, help="0: skip the GPT workload (accuracy runs only)")
    ap.add_argument("--hooks", default=",".join(HOOKS))
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bench_compression.json"))
    args = ap.parse_args(argv)
    if args.worker:
        result = worker(args)
        rank = int(os.environ.get("RANK") or os.environ.get("PMI_RANK") or 0)  # mpiexec: PMI_RANK
        if rank == 0:
            print(json.dumps(result), flush=True)
        return 0

    from benchmarks.common import format_table, write_json

    print(f"{args.ranks} ranks, backend {args.backend}, digits {args.epochs} epochs; load average {os.getloadavg()}",
          flush=True)
    res = launch(args)
    base = next(d for d in res["digits"] if d["hook"] == "allreduce")
    rows = []
    for d in res["digits"]:
        diffs = [100 * (a - b) for a, b in zip(d["accuracy_per_seed"], base["accuracy_per_seed"])]
        rows.append([d["hook"], d["bytes_per_step"], round(d["bytes_per_step"] / base["bytes_per_step"], 4),
                     round(d["mean_bytes_per_step"]), round(d["mean_bytes_per_step"] / base["mean_bytes_per_step"], 4),
                     round(d["step_ms"], 2), round(d["step_ms"] / base["step_ms"], 2), round(100 * d["accuracy"], 2),
                     round(100 * (d["accuracy"] - base["accuracy"]), 2), " ".join(f"{x:+.2f}" for x in diffs)])
    t1 = format_table(rows, ["hook", "bytes/step/rank (steady)", "vs all-reduce", "bytes/step/rank (mean over training)",
                             "vs all-reduce", "step ms", "step vs all-reduce", f"held-out acc % (mean of {args.seeds})",
                             "acc - all-reduce (points)", "per seed (points)"])
    gbase = next((g for g in res["gpt"] if g["hook"] == "allreduce"), None)
    rows2 = []
    for g in res["gpt"] if gbase else []:
        rows2.append([g["hook"], g["matrices"], g["bytes"], round(g["bytes"] / gbase["bytes"], 4),
                      f"1/{gbase['bytes'] / g['bytes']:.1f}" if g["bytes"] else "-", round(g["ddp_step_ms"], 1),
                      round(g["ddp_step_ms"] / gbase["ddp_step_ms"], 2)])
    t2 = format_table(rows2, ["hook", "weight matrices", "bytes/rank", "vs all-reduce", "fraction",
                              "DDP step ms (whole GPT)", "step vs all-reduce"])
    note = "" if res["bf16"] == "ok" else f"\n(bf16 row left out: the backend does not all-reduce bfloat16: {res['bf16']})"
    print(f"\ndigits MLP 64-128-128-10, {args.epochs} epochs, {args.ranks} ranks ({args.backend}), seeds 0-{args.seeds - 1}"
          f"{note}\n\n{t1}")
    if rows2:
        print(f"\nGPT (n_embd 256, 2 layers) weight matrices, one backward's gradients (steady state)\n\n{t2}")
    path = write_json(args.out, {"benchmark": "bench_compression", "command": " ".join(sys.argv),
                                 "load_average_end": list(os.getloadavg()), **res, "tables": [t1, t2]})
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
