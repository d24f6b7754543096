#!/usr/bin/env python3
"""Peak memory per rank of a GPT under DDP, ZeRO-1, ZeRO-2, FSDP and FSDP + activation checkpointing.

For N = 1, 2, 4 ranks (gloo, real processes on one host, started by ``RankPool``) every strategy
trains the same ``nn.GPT`` (sized so that parameters, not activations, dominate) with Adam, and
every rank reports, from :mod:`neural_arch.memory` (``tracemalloc`` on NumPy):

* ``params`` / ``grads`` / ``optim``: bytes of the parameter, gradient and optimizer-state arrays
  this rank holds after backward (counted from the arrays themselves; zero-strided placeholders
  of freed FSDP parameters count as nothing);
* ``held after fwd``: bytes the forward pass leaves alive for backward (activations; FSDP gives
  the memory of its gather buffers back after forward, see below);
* ``peak``: ``max_memory_allocated()`` over one whole step (forward, backward, optimizer step),
  from ``reset_peak_memory_stats()`` before the forward, minus what was allocated before the
  model was built: everything the rank held at its worst moment, communication buffers included;
* ``step ms``: median step time with tracing **off** (a separate pass: tracing slows allocation),
  and its ratio to DDP at the same N.

Strategies: ``DDP`` (default buckets, a separate bucket copy of the gradients), ``ZeRO-1``
(DDP + ``ZeroRedundancyOptimizer``), ``ZeRO-2`` (``ZeroRedundancyOptimizer(stage=2)``, no DDP),
``FSDP`` (FULL_SHARD, one unit per ``TransformerBlock`` + the root, torch's defaults:
``backward_prefetch=BACKWARD_PRE``), ``FSDP-post`` (the same with ``BACKWARD_POST``: the next
unit is gathered once the current one's gradients are final, so the two never coexist),
``FSDP+AC`` (``FSDP`` with every block checkpointed), ``DDP+AC`` (a clean activation-checkpointing comparison: DDP
keeps no gathered parameters in its graph), and ``TP`` (Megatron over all N ranks: ``parallelize_gpt`` with
``loss_parallel``, one batch per group; only where N divides the heads), ``FSDP2`` and ``FSDP2-keep``
(``fully_shard`` on every block then the root, ``reshard_after_forward`` True / False) and ``PP`` (``N`` stages,
``balance="layers"``, 1F1B over ``N`` micro-batches of ``batch`` sequences; forward and backward
interleave, so its "backward" phase is the whole schedule).

**Estimate vs measured** (issue 32): for every (N, strategy) the run also asks
:func:`neural_arch.memory.estimate` for the same step and prints both per category (parameters,
gradients, optimizer state, activations), per phase (the worst moment of forward, backward,
optimizer step) and for the peak, as the ratio estimate / measured; the JSON keeps both in
bytes (``"estimate"``). Goal: within 10% everywhere. Measured phases are ``max_memory_allocated``
over each phase minus what was allocated before the model was built.

The issue's goals, checked at the end of the run and written to the JSON:

1. FSDP's peak per rank <= DDP's model-state bytes (params + grads + Adam) / N + the largest unit
   (within 10%). FULL_SHARD re-gathers a unit before its backward into the buffer its forward
   used (the saved views read it; see ``fsdp/unit.py``) and gives that buffer's
   memory back in between (``fsdp/storage.py``: torch's ``storage.resize_(0)``), and
   during a unit's backward the pages under each parameter as soon as its gradient is final;
   gradients go parameter by parameter to the ranks owning their elements (no unit-sized flat
   gradient; ``distributed/fsdp/owner_reducer.py``). What the bound leaves out and a rank still
   holds at the peak: in forward the root unit *and* a block (the root's forward encloses the
   blocks'), in backward one parameter's gradient (plus gloo's copy of it on non-owner ranks),
   the activations, and with ``BACKWARD_PRE`` (torch's default, ``limit_all_gathers=True``) the
   prefetched unit: a second unit by design, which is why ``FSDP-post`` is measured too. The goal
   lines also print the bound plus DDP's memory held after forward (the activations every
   strategy holds).
2. ZeRO-1's optimizer state per rank = DDP's / N within 5% (greedy whole-parameter partition:
   the worst rank is reported).
3. Activation checkpointing cuts the memory held after forward >= 2x for <= 1.4x step time.

Run::

    python benchmarks/bench_memory.py                # N = 1, 2, 4; ~2-3 minutes on 2 cores
    python benchmarks/bench_memory.py --quick        # smaller GPT, N = 1, 2
    python benchmarks/bench_memory.py --ranks 2 --n-embd 256 --steps 5

Writes ``benchmarks/results/bench_memory.{json,txt,png}``. Step times oversubscribe the cores at
N = 4 on a 2-core machine: read them as ratios within one N, not as scaling.
"""

from __future__ import annotations

import argparse
import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, ROOT)

from benchmarks.common import format_table, write_json

STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "FSDP", "FSDP-post", "FSDP+AC", "DDP+AC", "FSDP2", "FSDP2-keep", "TP", "PP")
RESULTS = os.path.join(ROOT, "benchmarks", "results")


# ---------------------------------------------------------------------------------- rank side
def _real_nbytes(a) -> int:
    """Bytes an array really occupies: a zero-strided placeholder (a freed FSDP parameter) is ~0."""
    if a is None:
        return 0
    if a.size and any(s == 0 for s in a.strides):
        return a.dtype.itemsize
    return int(a.nbytes)


def _build(strategy: str, cfg: dict):
    """(module to call, optimizer, model, trainable tensors) for one strategy, from seed 0."""
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, ModuleWrapPolicy
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.utils.checkpoint import apply_activation_checkpointing

    manual_seed(0)
    model = nn.GPT(vocab_size=cfg["vocab"], block_size=cfg["seq"], n_layer=cfg["n_layer"], n_head=cfg["n_head"],
                   n_embd=cfg["n_embd"])
    if strategy.endswith("+AC"):
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.TransformerBlock))
    if strategy.startswith("FSDP2"):
        from neural_arch.distributed.fsdp import fully_shard

        for block in model.blocks:      # bottom-up: each block, then the root (the rest)
            fully_shard(block, reshard_after_forward=strategy == "FSDP2")
        fully_shard(model, reshard_after_forward=strategy == "FSDP2")
        opt = optim.Adam(model.parameters(), lr=1e-4)
        return model, opt, opt, model, list(model.parameters())
    if strategy == "PP":
        from neural_arch.distributed import pipelining as pl

        stage = pl.pipeline(model, num_stages=dist.get_world_size(), balance="layers").build_stage(dist.get_rank())
        schedule = pl.Schedule1F1B(stage, dist.get_world_size(), loss_fn=_lm_loss)
        opt = optim.Adam(stage.submodule.parameters(), lr=1e-4)
        # the stage's own module only: the rest of the model is another rank's (and is dropped here)
        return _PipelineStep(schedule, stage), opt, opt, stage.submodule, list(stage.submodule.parameters())
    if strategy == "TP":
        from neural_arch.distributed.tensor.parallel import parallelize_gpt

        wrapped = parallelize_gpt(model, None, loss_parallel=True)   # Megatron over the whole world
        opt = optim.Adam(wrapped.parameters(), lr=1e-4)
    elif strategy in ("DDP", "DDP+AC"):
        wrapped = dist.DistributedDataParallel(model)
        opt = optim.Adam(wrapped.parameters(), lr=1e-4)
    elif strategy == "ZeRO-1":
        wrapped = dist.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(wrapped.parameters(), optim.Adam, lr=1e-4)
    elif strategy == "ZeRO-2":
        wrapped = model
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=2, lr=1e-4)
    else:
        # FSDP and FSDP+AC: torch's defaults (BACKWARD_PRE); FSDP-post: BACKWARD_POST
        prefetch = BackwardPrefetch.BACKWARD_POST if strategy == "FSDP-post" else BackwardPrefetch.BACKWARD_PRE
        wrapped = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerBlock}),
                                           backward_prefetch=prefetch)
        opt = optim.Adam(wrapped.parameters(), lr=1e-4)
    inner = getattr(opt, "optim", None) or opt      # ZeRO steps an inner optimizer on its shard
    tensors = {id(p): p for p in list(model.parameters()) + list(wrapped.parameters())
               + [p for g in (inner.param_groups if inner is not None else []) for p in g["params"]]}
    return wrapped, opt, inner, model, list(tensors.values())


def _state_bytes(inner) -> int:
    if inner is None:
        return 0
    return sum(_real_nbytes(v) for p in inner.state for v in inner.state[p].values() if hasattr(v, "strides"))


def _lm_loss(logits, target):
    import neural_arch.nn.functional as F

    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), target.reshape(b * t))


class _PipelineStep:
    """PP's step as ``_loss(...).backward()``: forward and backward interleave in the 1F1B schedule, so the
    whole schedule runs in ``backward()`` (PP's measured forward phase is empty)."""

    def __init__(self, schedule, stage):
        self.schedule, self.stage = schedule, stage

    def loss(self, x, y):
        step = self

        class _Run:
            def backward(self):
                args = (x,) if step.stage.is_first else ()
                step.schedule.step(*args, target=y.reshape(x.shape) if step.stage.is_last else None)

        return _Run()


def _batch(cfg: dict, rank: int, strategy: str = ""):
    import numpy as np

    import neural_arch.distributed as dist

    # a TP group and a pipeline share one batch; a pipeline's is N micro-batches of `batch` sequences
    rng = np.random.default_rng(1000 + (0 if strategy in ("TP", "PP") else rank))
    B, T = cfg["batch"] * (dist.get_world_size() if strategy == "PP" else 1), cfg["seq"]
    return rng.integers(0, cfg["vocab"], size=(B, T)), rng.integers(0, cfg["vocab"], size=(B * T,))


def _loss(wrapped, x, y, vocab: int, strategy: str = ""):
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor

    if strategy == "PP":
        return wrapped.loss(x, y)
    logits = wrapped(Tensor(x))
    b, t, v = logits.shape
    if strategy == "TP":    # the logits stay sharded over the vocabulary (loss_parallel)
        from neural_arch.distributed.tensor.parallel import vocab_parallel_cross_entropy

        return vocab_parallel_cross_entropy(logits, y.reshape(b, t))
    return F.cross_entropy(logits.reshape(b * t, v), y)


def _time_all(strategies: list[str], cfg: dict) -> dict:
    """Median step time (s) per strategy, tracing off; the strategies take turns step by step, so
    load from other processes on a shared machine hits them all alike."""
    import time

    import numpy as np

    import neural_arch.distributed as dist

    built = {s: _build(s, cfg)[:2] for s in strategies}
    batches = {s: _batch(cfg, dist.get_rank(), s) for s in strategies}
    times: dict = {s: [] for s in strategies}
    for step in range(cfg["steps"] + 1):
        for s, (wrapped, opt) in built.items():
            x, y = batches[s]
            dist.barrier()
            t0 = time.perf_counter()
            _loss(wrapped, x, y, cfg["vocab"], s).backward()
            opt.step()
            opt.zero_grad()
            if step:                            # step 0 warms up (and allocates Adam's state)
                times[s].append(time.perf_counter() - t0)
    return {s: float(np.median(t)) for s, t in times.items()}


def measure_step(strategy: str, cfg: dict) -> dict:
    """One step of ``strategy`` on this rank, measured (see the module docstring): bytes of ``params``,
    ``grads``, ``optim``, ``held_after_fwd``, ``peak`` and ``peak_phase`` per phase, from before the model
    was built. Every rank of the group calls it (``tests/memory`` does too).

    Example (on every rank)::

        measure_step("DDP", {"vocab": 1024, "seq": 16, "n_layer": 2, "n_head": 4, "n_embd": 192, "batch": 2})
    """
    import gc

    import neural_arch.distributed as dist
    from neural_arch import memory, nn

    gc.collect()
    memory.stop()
    memory.start()                              # trace from here: the model is built under tracing
    base = memory.memory_allocated()
    wrapped, opt, inner, model, tensors = _build(strategy, cfg)
    x, y = _batch(cfg, dist.get_rank(), strategy)
    _loss(wrapped, x, y, cfg["vocab"], strategy).backward()   # warm-up step: Adam allocates its state here
    opt.step()
    opt.zero_grad()
    gc.collect()
    dist.barrier()
    # One step in three phases; resetting the peak between them keeps the overall peak (the max
    # of the three) and tells which phase sets it.
    memory.reset_peak_memory_stats()
    before = memory.memory_allocated()
    loss = _loss(wrapped, x, y, cfg["vocab"], strategy)
    after_fwd = memory.memory_allocated()
    peak_fwd = memory.max_memory_allocated()
    memory.reset_peak_memory_stats()
    loss.backward()
    del loss
    peak_bwd = memory.max_memory_allocated()
    after_bwd = memory.memory_allocated()
    grads = sum(_real_nbytes(p.grad.data) for p in tensors if p.grad is not None)
    memory.reset_peak_memory_stats()
    opt.step()
    peak_step = memory.max_memory_allocated()
    peak = max(peak_fwd, peak_bwd, peak_step)
    params = sum(_real_nbytes(p.data) for p in tensors)
    optim_bytes = _state_bytes(inner)
    opt.zero_grad()
    stats = memory.stats()
    memory.stop()
    block = max(sum(p.data.nbytes for p in m.parameters()) for m in model.modules()
                if isinstance(m, nn.TransformerBlock))
    in_blocks = {id(p) for m in model.modules() if isinstance(m, nn.TransformerBlock) for p in m.parameters()}
    root = sum(p.data.nbytes for p in model.parameters() if id(p) not in in_blocks) if strategy.startswith("FSDP") \
        else 0
    return {"params": params, "grads": grads, "optim": optim_bytes, "held_after_fwd": after_fwd - before,
            "peak": peak - base, "resident_before_step": before - base, "resident_after_backward": after_bwd - base,
            "peak_phase": {"forward": peak_fwd - base, "backward": peak_bwd - base, "optimizer": peak_step - base}, "largest_unit": max(block, root),
            "tracer": stats["backend"]}


def warm_up(strategies: list[str], cfg: dict) -> None:
    """One untraced step of every strategy on a tiny GPT: the imports and one-time caches the first
    step of a process makes (modules, the backend's buffers) would otherwise be counted against
    whichever strategy is measured first (about 1-2 MiB)."""
    tiny = dict(cfg, vocab=64, n_head=2, n_embd=16)
    for s in strategies:
        wrapped, opt = _build(s, tiny)[:2]
        x, y = _batch(tiny, 0, s)
        _loss(wrapped, x, y, tiny["vocab"], s).backward()
        opt.step()
        opt.zero_grad()


def _rank_fn(strategies: list[str], cfg: dict) -> dict:
    import neural_arch.distributed as dist

    warm_up(strategies, cfg)
    out = {s: measure_step(s, cfg) for s in strategies}
    for s, t in _time_all(strategies, cfg).items():
        out[s].update(step_s=t, rank=dist.get_rank())
    return out


# ---------------------------------------------------------------------------------- estimate
#: bench strategy -> memory.estimate's arguments
ESTIMATE_ARGS = {
    "DDP": {"strategy": "ddp"}, "ZeRO-1": {"strategy": "zero1"}, "ZeRO-2": {"strategy": "zero2"},
    "FSDP": {"strategy": "fsdp"}, "FSDP-post": {"strategy": "fsdp", "backward_prefetch": "post"},
    "FSDP+AC": {"strategy": "fsdp", "activation_checkpointing": True},
    "DDP+AC": {"strategy": "ddp", "activation_checkpointing": True}, "TP": {"strategy": "tp"},
    "PP": {"strategy": "pp", "schedule": "1f1b"}, "FSDP2": {"strategy": "fully_shard"},
    "FSDP2-keep": {"strategy": "fully_shard", "reshard_after_forward": False},
}
#: (label, estimate's key, measured key): a category or a phase
COMPARED = (("params", "parameters", "params"), ("grads", "gradients", "grads"), ("optim", "optimizer_state", "optim"),
            ("acts", "activations", "held_after_fwd"), ("fwd", "forward", "forward"),
            ("bwd", "backward", "backward"), ("opt step", "optimizer", "optimizer"), ("peak", "total", "peak"))


def estimate_for(strategy: str, n: int, cfg: dict) -> dict:
    """``memory.estimate(...).as_dict()`` for one bench strategy at ``n`` ranks (the bench's GPT, Adam)."""
    from neural_arch import memory, nn
    from neural_arch.core.tensor import manual_seed

    manual_seed(0)
    model = nn.GPT(vocab_size=cfg["vocab"], block_size=cfg["seq"], n_layer=cfg["n_layer"], n_head=cfg["n_head"],
                   n_embd=cfg["n_embd"])
    batch = cfg["batch"] * (n if strategy == "PP" else 1)     # PP: N micro-batches of `batch` sequences
    out = memory.estimate(model, world_size=n, optimizer="adam", batch=batch, seq=cfg["seq"],
                          **ESTIMATE_ARGS[strategy]).as_dict()
    if strategy.startswith("FSDP2"):
        # what fully_shard leaves gathered after forward: the root (torch's rule), with
        # reshard_after_forward=False every block too; measured together with the activations
        blocks = sum(p.data.nbytes for b in model.blocks for p in b.parameters())
        root = sum(p.data.nbytes for p in model.parameters()) - blocks
        out["held_after_forward"] = out["activations"] + root + (blocks if strategy == "FSDP2-keep" else 0)
    return out


def compare(measured: dict, est: dict, strategy: str = "") -> dict:
    """``{label: (estimate bytes, measured bytes)}`` for every category and phase in :data:`COMPARED`.

    PP's forward and backward interleave (1F1B): its activations and forward phase are not measured,
    and its measured backward phase (the whole schedule) is compared with the larger estimated phase.
    ``fully_shard`` keeps the root (and with ``reshard_after_forward=False`` every block) gathered after
    forward: the memory held after forward is the activations plus those."""
    out = {}
    for label, e_key, m_key in COMPARED:
        if strategy == "PP" and label in ("acts", "fwd"):
            continue
        e = est["phases"][e_key] if e_key in est["phases"] else est[e_key]
        if strategy.startswith("FSDP2") and label == "acts":
            e = est["held_after_forward"]
        if strategy == "PP" and label == "bwd":
            e = max(est["phases"]["forward"], est["phases"]["backward"])
        m = measured["peak_phase"][m_key] if m_key in measured["peak_phase"] else measured[m_key]
        out[label] = (int(e), int(m))
    return out


# ---------------------------------------------------------------------------------- report
def _mib(b) -> float:
    return b / 2**20


def _goals(results: dict) -> list[dict]:
    goals = []
    for n, per in results.items():
        ddp = per.get("DDP")
        if ddp is None:
            continue
        model_state = ddp["params"] + ddp["grads"] + ddp["optim"]
        for s in ("FSDP", "FSDP-post", "FSDP+AC"):
            if s in per:
                bound = model_state / n + per[s]["largest_unit"]
                # the bound leaves out activations, which every strategy holds (DDP too):
                # the same bound plus DDP's (or DDP+AC's) memory held after forward, for comparison
                acts = per.get("DDP+AC" if s.endswith("+AC") else "DDP", ddp)["held_after_fwd"]
                goals.append({"goal": f"{s} peak <= DDP model state / N + largest unit (10%)", "N": n,
                              "measured_mib": _mib(per[s]["peak"]), "bound_mib": _mib(bound),
                              "ratio": per[s]["peak"] / bound, "met": per[s]["peak"] <= 1.10 * bound,
                              "bound_plus_activations_mib": _mib(bound + acts),
                              "ratio_with_activations": per[s]["peak"] / (bound + acts)})
        if "ZeRO-1" in per:
            want = ddp["optim"] / n
            goals.append({"goal": "ZeRO-1 optimizer state per rank = DDP's / N (5%)", "N": n,
                          "measured_mib": _mib(per["ZeRO-1"]["optim"]), "bound_mib": _mib(want),
                          "ratio": per["ZeRO-1"]["optim"] / want,
                          "met": abs(per["ZeRO-1"]["optim"] / want - 1) <= 0.05})
        for plain, ac in (("DDP", "DDP+AC"), ("FSDP", "FSDP+AC")):
            if plain in per and ac in per:
                cut = per[plain]["held_after_fwd"] / max(1, per[ac]["held_after_fwd"])
                slow = per[ac]["step_s"] / per[plain]["step_s"]
                goals.append({"goal": f"{ac}: memory held after forward cut >= 2x vs {plain}, step <= 1.4x", "N": n,
                              "cut": cut, "time_ratio": slow, "met": cut >= 2.0 and slow <= 1.4})
    return goals


def _plot(results: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    ns = sorted(results)
    strategies = [s for s in STRATEGIES if all(s in results[n] for n in ns)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(ns))
    x = np.arange(len(strategies))
    for i, n in enumerate(ns):
        peaks = [_mib(results[n][s]["peak"]) for s in strategies]
        rel = [results[n][s]["step_s"] / results[n]["DDP"]["step_s"] for s in strategies]
        axes[0].bar(x + i * width, peaks, width, label=f"N = {n}")
        axes[1].bar(x + i * width, rel, width, label=f"N = {n}")
    for ax, title in ((axes[0], "peak memory per rank (MiB, worst rank)"), (axes[1], "step time / DDP (same N)")):
        ax.set_xticks(x + width * (len(ns) - 1) / 2)
        ax.set_xticklabels(strategies, rotation=20)
        ax.set_title(title)
        ax.legend()
    axes[1].axhline(1.0, color="gray", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    from neural_arch.distributed.testing import RankPool

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="*", default=None, help="world sizes (default 1 2 4; --quick: 1 2)")
    p.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=5, help="timed steps per strategy (after one warm-up)")
    p.add_argument("--quick", action="store_true", help="a smaller GPT on 1 and 2 ranks")
    p.add_argument("--out", default=os.path.join(RESULTS, "bench_memory"), help="path stem for .json/.txt/.png")
    args = p.parse_args(argv)
    if args.quick:
        args.n_embd, args.n_layer, args.vocab, args.steps = 192, 2, 1024, 2
    ranks = args.ranks or ([1, 2] if args.quick else [1, 2, 4])
    cfg = {k: getattr(args, k) for k in ("vocab", "seq", "n_layer", "n_head", "n_embd", "batch", "steps")}
    header = (f"GPT vocab={args.vocab} seq={args.seq} n_layer={args.n_layer} n_head={args.n_head} "
              f"n_embd={args.n_embd}, batch {args.batch}/rank, float32, Adam; gloo on {os.cpu_count()} cpu(s); "
              f"memory from tracemalloc (neural_arch.memory), worst rank")
    print(header, flush=True)

    results: dict[int, dict] = {}
    per_rank: dict[int, list] = {}
    # TP needs N to divide the heads, PP at least one block per stage
    runs = {n: [s for s in args.strategies if (s != "TP" or args.n_head % n == 0) and (s != "PP" or n <= args.n_layer)]
            for n in ranks}
    for n in ranks:
        with RankPool(n, backend="gloo", timeout=900.0) as pool:
            out = pool.run(_rank_fn, runs[n], cfg, timeout=900.0)
        per_rank[n] = out
        # the worst rank of each quantity (ranks differ: ZeRO-1's greedy partition, FSDP's root unit)
        results[n] = {}
        for s in runs[n]:
            worst = max(out, key=lambda o: o[s]["peak"])      # phases and labels from the worst rank
            results[n][s] = {k: (max(o[s][k] for o in out) if isinstance(v, (int, float)) else v)
                             for k, v in worst[s].items()}
        print(f"  N = {n} done", flush=True)

    headers = ["N", "strategy", "params MiB", "grads MiB", "optim MiB", "held after fwd MiB", "peak MiB",
               "peak in", "step ms", "step / DDP"]
    rows = []
    for n in ranks:
        ddp_t = results[n]["DDP"]["step_s"] if "DDP" in results[n] else None
        for s in runs[n]:
            r = results[n][s]
            rows.append([n, s, _mib(r["params"]), _mib(r["grads"]), _mib(r["optim"]), _mib(r["held_after_fwd"]),
                         _mib(r["peak"]), max(r["peak_phase"], key=r["peak_phase"].get), 1e3 * r["step_s"], r["step_s"] / ddp_t if ddp_t else "-"])
    table = format_table(rows, headers)
    print(table)
    comparison, est_rows, worst = {}, [], (0.0, None)
    for n in ranks:
        comparison[n] = {}
        for s in runs[n]:
            est = estimate_for(s, n, cfg)
            pairs = compare(results[n][s], est, s)
            comparison[n][s] = {"estimate": est, "pairs": pairs}
            cells = []
            for label, _, _ in COMPARED:
                if label not in pairs:
                    cells.append("-")
                    continue
                e, m = pairs[label]
                ratio = e / m if m else float("nan")
                cells.append(f"{ratio:.3f}")
                if m and abs(ratio - 1) > worst[0]:
                    worst = (abs(ratio - 1), (n, s, label, ratio))
            est_rows.append([n, s, _mib(pairs["peak"][0]), _mib(pairs["peak"][1])] + cells)
    est_table = format_table(est_rows, ["N", "strategy", "est peak MiB", "measured peak MiB"]
                             + [f"{label} est/meas" for label, _, _ in COMPARED])
    n_w, s_w, label_w, ratio_w = worst[1] if worst[1] else (0, "-", "-", 1.0)
    est_summary = (f"largest deviation: {100 * worst[0]:.1f}% ({s_w} at N = {n_w}, {label_w}: estimate / measured "
                   f"= {ratio_w:.3f}); goal: within 10% everywhere -> {'met' if worst[0] <= 0.10 else 'NOT met'}")
    print("\nEstimate (neural_arch.memory.estimate) vs measured, ratio estimate / measured:")
    print(est_table)
    print(est_summary)
    goals = _goals(results)
    lines = []
    for g in goals:
        verdict = "met" if g["met"] else "NOT met"
        if "cut" in g:
            lines.append(f"N={g['N']}: {g['goal']}: cut {g['cut']:.2f}x, time {g['time_ratio']:.2f}x -> {verdict}")
        else:
            line = (f"N={g['N']}: {g['goal']}: {g['measured_mib']:.1f} MiB vs {g['bound_mib']:.1f} MiB "
                    f"(ratio {g['ratio']:.3f}) -> {verdict}")
            if "ratio_with_activations" in g:
                line += (f"; with DDP's activations added to the bound: {g['bound_plus_activations_mib']:.1f} MiB "
                         f"(ratio {g['ratio_with_activations']:.3f})")
            lines.append(line)
    print("\n".join(["", "Goals (issue 14):"] + lines))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json(args.out + ".json", {"config": cfg, "ranks": ranks, "results": {str(n): v for n, v in results.items()},
                                    "estimate": {str(n): v for n, v in comparison.items()},
                                    "estimate_summary": est_summary,
                                    "per_rank": {str(n): v for n, v in per_rank.items()}, "goals": goals,
                                    "note": "shared 2-core machine; N=4 oversubscribes the cores (times are ratios "
                                            "within one N)"})
    with open(args.out + ".txt", "w") as fh:
        fh.write(header + "\n\n" + table + "\n\nGoals (issue 14):\n" + "\n".join(lines) + "\n"
                 + "\nEstimate (neural_arch.memory.estimate) vs measured, ratio estimate / measured:\n"
                 + est_table + "\n" + est_summary + "\n")
    png = _plot(results, args.out + ".png")
    print(f"\nwrote {args.out}.json, .txt" + (", .png" if png else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
