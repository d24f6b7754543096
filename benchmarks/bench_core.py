"""One training step of an MLP (784-1024-1024-10, batch 128, float32): neural_arch vs NumPy vs torch.

A step is forward + softmax cross-entropy + backward + SGD update (lr 0.01). Three versions:

* ``numpy``       -- the same step written by hand in NumPy (the floor neural_arch is measured against);
* ``neural_arch`` -- ``nn.Sequential`` + ``nn.CrossEntropyLoss`` + ``loss.backward()`` + ``optim.SGD``;
* ``torch``       -- the same model in PyTorch on the CPU (skipped when torch is not importable).

Every (implementation, thread count) pair runs in its own subprocess with the BLAS/OpenMP thread
variables set *before* NumPy is imported (``threads=1``, and ``default`` = whatever the machine
gives when nothing is set); the worker records what threadpoolctl / torch actually report, so the
table shows the thread count that was really used. All versions start from the same weights and
data, and the first-step losses are printed so you can see they compute the same thing.

Usage::

    python benchmarks/bench_core.py                       # threads 1 and default, 2 rounds
    python benchmarks/bench_core.py --threads 1 --repeat 30 --json /tmp/core.json
    python benchmarks/bench_core.py --profile             # cProfile of the neural_arch step
    python benchmarks/bench_core.py --gpt                 # the GPT step vs torch, 1 and 2 threads,
                                                          # per-op profile, JSON + .txt + .png
    PYTHONPATH=/path/to/torch python benchmarks/bench_core.py --gpt --malloc-tuned
    python benchmarks/bench_core.py --gpt-elementwise     # the GPT's elementwise kernels: NumPy vs numexpr
    git worktree add /tmp/base HEAD && python benchmarks/bench_core.py --gpt --baseline-tree /tmp/base
                                                          # before/after (+ torch), interleaved

The GPT benchmark (``--gpt``, issue 37): vocab 256, block 64, 4 layers, 4 heads, width 128
(``gpt128``) and 512 (``gpt512``), batch 16, AdamW, float32; forward + cross entropy + backward +
AdamW step, median of 15 steps after 3 warm-up steps per worker, neural_arch and the same
architecture in PyTorch interleaved (one subprocess per contender, thread count, round), with a
per-op cProfile table of the neural_arch step (exclusive share per op, forward and backward).

Goal (a target, measured honestly): neural_arch <= 1.15x the hand-written NumPy step and faster
than torch CPU at the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
if _ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, _ROOT)

from benchmarks.common import (  # noqa: E402
    blas_threads,
    format_table,
    median_time,
    run_worker,
    write_json,
)

SIZES = (784, 1024, 1024, 10)
BATCH = 128
LR = 0.01
IMPLS = ("numpy", "neural_arch", "torch")


def _initial_state(seed: int = 0):
    """Weights (torch layout, out x in) drawn like torch's Linear default, plus one batch."""
    import numpy as np

    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        params.append(rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32))
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=BATCH).astype(np.int64)
    return params, x, y


# ---------------------------------------------------------------------------- the three steps
def make_numpy_step(params, x, y):
    """Hand-written forward/backward/SGD for the same MLP; returns step() -> loss."""
    import numpy as np

    w1, b1, w2, b2, w3, b3 = [p.copy() for p in params]
    n = x.shape[0]
    rows = np.arange(n)

    def step():
        h1 = x @ w1.T
        h1 += b1
        np.maximum(h1, 0, out=h1)
        h2 = h1 @ w2.T
        h2 += b2
        np.maximum(h2, 0, out=h2)
        logits = h2 @ w3.T
        logits += b3
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)  # now softmax probabilities
        loss = -np.log(logits[rows, y]).mean()
        d3 = logits
        d3[rows, y] -= 1
        d3 /= n
        g_w3, g_b3 = d3.T @ h2, d3.sum(0)
        d2 = d3 @ w3
        d2 *= h2 > 0
        g_w2, g_b2 = d2.T @ h1, d2.sum(0)
        d1 = d2 @ w2
        d1 *= h1 > 0
        g_w1, g_b1 = d1.T @ x, d1.sum(0)
        for p, g in ((w1, g_w1), (b1, g_b1), (w2, g_w2), (b2, g_b2), (w3, g_w3), (b3, g_b3)):
            p -= LR * g
        return float(loss)

    return step


def make_neural_arch_step(params, x, y):
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    model.load_state_dict(dict(zip(model.state_dict().keys(), params)))
    opt = optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = Tensor(x), Tensor(y)

    def step():
        loss = loss_fn(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


def make_torch_step(params, x, y):
    import torch

    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.copy_(torch.from_numpy(value))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        loss = loss_fn(model(xt), yt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


FACTORIES = {"numpy": make_numpy_step, "neural_arch": make_neural_arch_step, "torch": make_torch_step}


# ---------------------------------------------------------------------------- worker (subprocess)

def _time_steps(step, repeat: int, warmup: int) -> tuple[list, list]:
    """Wall and CPU seconds of each timed ``step()`` after ``warmup`` untimed ones (median_time runs them)."""
    times, cpu_times = [], []

    def timed():
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)

    median_time(timed, repeat=repeat, warmup=warmup)
    return times[warmup:], cpu_times[warmup:]

def worker(impl: str, threads: int | None, repeat: int, warmup: int) -> dict:
    params, x, y = _initial_state()
    torch_threads = None
    if impl == "torch":
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        torch_threads = torch.get_num_threads()
    step = FACTORIES[impl](params, x, y)
    first_loss = step()
    times, cpu_times = _time_steps(step, repeat, warmup)
    return {"impl": impl, "threads_requested": threads, "blas_threads": blas_threads(),
            "torch_threads": torch_threads, "first_loss": first_loss, "times_s": times,
            "cpu_times_s": cpu_times}


def profile_neural_arch(repeat: int) -> None:
    import cProfile
    import pstats

    params, x, y = _initial_state()
    step = make_neural_arch_step(params, x, y)
    for _ in range(3):
        step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeat):
        step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


# ============================================================================ GPT step (issue 37)
# The model users actually train here: GPT, AdamW, float32, one step = forward + cross entropy +
# backward + AdamW update. Same architecture in PyTorch (separate q/k/v/out projections with bias,
# pre-LN blocks, exact GELU, causal SDPA, untied head without bias), same weights and batch.
GPT_CONFIGS = {
    "gpt128": {"vocab": 256, "block": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "batch": 16},
    "gpt512": {"vocab": 256, "block": 64, "n_layer": 4, "n_head": 4, "n_embd": 512, "batch": 16},
}
GPT_IMPLS = ("neural_arch", "torch")
BASELINE = "neural_arch (baseline tree)"
GPT_LR = 3e-4


def _gpt_initial_state(cfg: dict, seed: int = 0):
    """neural_arch's GPT-2 initialisation (seeded) as a state dict of arrays, plus one batch."""
    import numpy as np

    import neural_arch as na
    from neural_arch import nn

    na.manual_seed(seed)
    model = nn.GPT(cfg["vocab"], cfg["block"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"])
    state = {k: np.array(getattr(v, "data", v), dtype=np.float32) for k, v in model.state_dict().items()}
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg["vocab"], size=(cfg["batch"], cfg["block"])).astype(np.int64)
    y = rng.integers(0, cfg["vocab"], size=(cfg["batch"], cfg["block"])).astype(np.int64)
    return state, x, y


def make_neural_arch_gpt_step(cfg, state, x, y):
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim

    model = nn.GPT(cfg["vocab"], cfg["block"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"])
    model.load_state_dict(state)
    opt = optim.AdamW(model.parameters(), lr=GPT_LR)
    yflat = y.reshape(-1)

    def step():
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), yflat)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


def make_torch_gpt_step(cfg, state, x, y):
    from collections import OrderedDict

    import torch
    import torch.nn.functional as TF
    from torch import nn as tnn

    class Attention(tnn.Module):
        def __init__(self, c, h):
            super().__init__()
            self.h = h
            self.q_proj, self.k_proj = tnn.Linear(c, c), tnn.Linear(c, c)
            self.v_proj, self.out_proj = tnn.Linear(c, c), tnn.Linear(c, c)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (p(x).view(b, t, self.h, c // self.h).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out_proj(y.transpose(1, 2).reshape(b, t, c))

    class Block(tnn.Module):
        def __init__(self, c, h):
            super().__init__()
            self.ln1, self.attn, self.ln2 = tnn.LayerNorm(c), Attention(c, h), tnn.LayerNorm(c)
            self.mlp = tnn.Sequential(OrderedDict(fc1=tnn.Linear(c, 4 * c), act=tnn.GELU(),
                                                  fc2=tnn.Linear(4 * c, c), drop=tnn.Dropout(0.0)))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            c = cfg["n_embd"]
            self.tok_emb, self.pos_emb = tnn.Embedding(cfg["vocab"], c), tnn.Embedding(cfg["block"], c)
            self.drop = tnn.Dropout(0.0)
            self.blocks = tnn.ModuleList([Block(c, cfg["n_head"]) for _ in range(cfg["n_layer"])])
            self.ln_f, self.head = tnn.LayerNorm(c), tnn.Linear(c, cfg["vocab"], bias=False)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1])
            h = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
            for block in self.blocks:
                h = block(h)
            return self.head(self.ln_f(h))

    model = GPT()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    opt = torch.optim.AdamW(model.parameters(), lr=GPT_LR)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.reshape(-1))

    def step():
        loss = TF.cross_entropy(model(xt).reshape(-1, cfg["vocab"]), yt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


GPT_FACTORIES = {"neural_arch": make_neural_arch_gpt_step, "torch": make_torch_gpt_step}


def gpt_worker(impl: str, config: str, threads: int | None, repeat: int, warmup: int) -> dict:
    cfg = GPT_CONFIGS[config]
    torch_threads = None
    if impl == "torch":
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
            torch.set_num_interop_threads(1)
        torch_threads = torch.get_num_threads()
    state, x, y = _gpt_initial_state(cfg)
    step = GPT_FACTORIES[impl](cfg, state, x, y)
    first_loss = step()
    times, cpu_times = _time_steps(step, repeat, warmup)
    return {"impl": impl, "config": config, "threads_requested": threads, "blas_threads": blas_threads(),
            "torch_threads": torch_threads, "intraop_threads": _intraop_threads(impl),
            "first_loss": first_loss, "times_s": times, "cpu_times_s": cpu_times}


def _intraop_threads(impl: str) -> int | None:
    """Threads of neural_arch's elementwise pool (neural_arch/core/thread_pool.py) in this worker;
    None for torch and for a tree without the pool (a --baseline-tree from before it)."""
    if impl == "torch":
        return None
    try:
        from neural_arch.core.thread_pool import intraop_threads
    except ImportError:
        return None
    return intraop_threads()


# Private helpers that hold a public op's whole forward and its backward closure (called by the
# autograd engine, not by the op, so their time would otherwise land in "other").
_PRIVATE_OP_HOMES = {"_layer_norm_rows": "layer_norm"}


def _op_label(filename: str, lineno: int, name: str, _cache: dict = {}) -> str | None:  # noqa: B006
    """The op a profiled function belongs to: ``"gelu fwd"`` for ``ops_*.gelu``, ``"gelu bwd"`` for the
    backward closure defined directly inside it, ``"AdamW step"`` for the optimizer's ``step``; None
    for glue, private helpers and closures nested deeper or run through the core's thread pool
    (their time stays in the cumulative time of the labelled function that called them)."""
    import ast

    norm = filename.replace(os.sep, "/")
    if "/neural_arch/optim/" in norm:
        return "AdamW step" if name == "step" else None
    base = os.path.basename(norm)
    if "/neural_arch/core/" not in norm or not base.startswith("ops_"):
        return None
    if filename not in _cache:
        with open(filename) as f:
            tree = ast.parse(f.read())
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
        _cache[filename] = [(n.lineno, n.name, {c.lineno: c.name for c in ast.walk(n)
                                                 if isinstance(c, funcs) and c is not n and _depth_one(n, c)})
                            for n in tree.body if isinstance(n, funcs)]
    for start, top, children in _cache[filename]:
        if lineno == start:
            child = None
        elif lineno in children:
            child = children[lineno]
        else:
            continue
        if top in _PRIVATE_OP_HOMES:  # a public op's fast path in a private helper
            home = _PRIVATE_OP_HOMES[top]
            return f"{home} fwd" if child is None else (f"{home} bwd" if child == "fn" else None)
        if top.startswith("_"):
            return None
        for suffix, phase in (("_forward", "fwd"), ("_backward", "bwd")):  # attention_forward/_backward
            if top.endswith(suffix):
                return f"{top[: -len(suffix)]} {phase}" if child is None else None
        return f"{top} fwd" if child is None else f"{top} bwd"
    return None


def _depth_one(outer, inner) -> bool:
    """Whether function ``inner`` is defined inside ``outer`` with no function between them."""
    import ast

    funcs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    todo = list(ast.iter_child_nodes(outer))
    while todo:
        node = todo.pop()
        if node is inner:
            return True
        if not isinstance(node, funcs):
            todo.extend(ast.iter_child_nodes(node))
    return False


def gpt_profile(config: str, steps: int) -> dict:
    """cProfile ``steps`` neural_arch GPT steps; each op's exclusive share of the step (forward and
    backward separately): its cumulative time minus the time of the other ops it called."""
    import cProfile
    import pstats

    cfg = GPT_CONFIGS[config]
    state, x, y = _gpt_initial_state(cfg)
    step = make_neural_arch_gpt_step(cfg, state, x, y)
    for _ in range(3):
        step()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    labels = {key: _op_label(*key) for key in stats}
    total = max(ct for (_, _, _, ct, _) in stats.values())  # the outermost call: the steps themselves
    shares: dict = {}
    for key, (_, _, _, ct, _) in stats.items():
        label = labels[key]
        if label is None:
            continue
        shares[label] = shares.get(label, 0.0) + ct
    # Subtract time spent in *other* labelled ops called from a labelled op (e.g. sdpa -> attention_forward).
    for callee, (_, _, _, _, callers) in stats.items():
        lc = labels[callee]
        if lc is None:
            continue
        for caller, (_, _, _, ct_from) in callers.items():
            lcaller = labels.get(caller)
            if lcaller is not None and lcaller != lc:
                shares[lcaller] -= ct_from
            elif lcaller is not None and lcaller == lc and caller != callee:
                shares[lcaller] -= ct_from  # same op nested (e.g. a closure calling its op): count once
    rows = sorted(((k, v) for k, v in shares.items() if v > 0), key=lambda kv: -kv[1])
    accounted = sum(v for _, v in rows)
    ops = [{"op": k, "ms_per_step": v / steps * 1e3, "share": v / total} for k, v in rows]
    ops.append({"op": "other (modules, autograd engine, Python glue)",
                "ms_per_step": (total - accounted) / steps * 1e3, "share": (total - accounted) / total})
    return {"config": config, "steps": steps, "blas_threads": blas_threads(),
            "profiled_ms_per_step": total / steps * 1e3, "wall_ms_per_step_under_profiler": wall / steps * 1e3,
            "ops": ops}


def _gpt_chart(path: str, records: list, profiles: dict) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no chart", file=sys.stderr)
        return None
    groups = sorted({(r["config"], str(r["threads"])) for r in records})
    impls = [i for i in (BASELINE, *GPT_IMPLS) if any(r["impl"] == i for r in records)]
    n_prof = len(profiles)
    fig, axes = plt.subplots(1, 1 + n_prof, figsize=(6 + 5 * n_prof, 4.5))
    axes = list(axes) if n_prof else [axes]
    ax = axes[0]
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        xs, meds, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            rec = next((r for r in records if (r["config"], str(r["threads"])) == g and r["impl"] == impl), None)
            if rec is None:
                continue
            xs.append(i + j * width)
            meds.append(rec["median_ms"])
            lo.append(rec["median_ms"] - rec["min_ms"])
            hi.append(rec["max_ms"] - rec["median_ms"])
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=impl)
    ax.set_xticks([i + width * (len(impls) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{c}\n{t} thr" for c, t in groups])
    ax.set_ylabel("ms per training step (median, min-max)")
    ax.set_yscale("log")
    ax.set_title("GPT step: fwd + bwd + AdamW, float32")
    ax.legend()
    for ax, (config, prof) in zip(axes[1:], profiles.items()):
        ops = prof["ops"][:12]
        ax.barh([o["op"] for o in ops][::-1], [100 * o["share"] for o in ops][::-1])
        ax.set_xlabel("% of the profiled step")
        ax.set_title(f"neural_arch per-op profile, {config}, {prof['blas_threads']} thread(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


# glibc returns freed blocks above the mmap/trim thresholds to the OS, so every fresh activation-sized
# temporary is page-faulted (and zeroed) again: ~0.7 ms per 2 MiB array. These keep them in the heap.
MALLOC_TUNED_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
                    "MALLOC_TOP_PAD_": str(1 << 28)}


def gpt_main(args) -> dict:
    import statistics

    if args.malloc_tuned:
        os.environ.update(MALLOC_TUNED_ENV)  # run_worker's children inherit it (both contenders)
    configs = [c for c in args.gpt_configs.split(",") if c]
    impls = list(GPT_IMPLS)
    torch_note = None
    if not _torch_available():
        torch_note = "torch is not importable here: no torch column (install torch into a separate dir and " \
                     "put it on PYTHONPATH)"
        print(torch_note, file=sys.stderr)
        impls.remove("torch")
    thread_counts = [None if t == "default" else int(t) for t in args.threads.split(",")]
    script = os.path.abspath(__file__)
    # label -> (this file, worker impl); --baseline-tree adds another checkout's neural_arch (e.g. the last
    # commit, `git worktree add`), so before and after run interleaved under the same machine load.
    scripts = {impl: (script, impl) for impl in impls}
    if args.baseline_tree:
        scripts = {BASELINE: (os.path.join(os.path.abspath(args.baseline_tree), "benchmarks", "bench_core.py"),
                              "neural_arch"), **scripts}
        impls = [BASELINE, *impls]
    results: dict = {}
    for _ in range(args.rounds):  # interleaved: every contender once per round
        for config in configs:
            for threads in thread_counts:
                for impl in impls:
                    cmd = [scripts[impl][0], "--gpt-worker", scripts[impl][1], "--gpt-configs", config,
                           "--repeat", str(args.repeat), "--warmup", str(args.warmup)]
                    if threads is not None:
                        cmd += ["--worker-threads", str(threads)]
                    out = run_worker(cmd, threads=threads, timeout=1800)
                    entry = results.setdefault((config, threads, impl), {**out, "times_s": [], "cpu_times_s": []})
                    entry["times_s"] += out["times_s"]
                    entry["cpu_times_s"] += out["cpu_times_s"]
                    print(f"  {config} threads={threads} {impl}: median "
                          f"{statistics.median(out['times_s']) * 1e3:.1f} ms", file=sys.stderr)
    records, rows = [], []
    for config in configs:
        for threads in thread_counts:
            torch_med = statistics.median(results[(config, threads, "torch")]["times_s"]) \
                if "torch" in impls else None
            for impl in impls:
                r = results[(config, threads, impl)]
                wall = statistics.median(r["times_s"])
                used = r["torch_threads"] if impl == "torch" else r["blas_threads"]
                rec = {"config": config, **GPT_CONFIGS[config], "impl": impl,
                       "threads": "default" if threads is None else threads, "threads_used": used,
                       "median_ms": wall * 1e3, "min_ms": min(r["times_s"]) * 1e3,
                       "max_ms": max(r["times_s"]) * 1e3,
                       "cpu_median_ms": statistics.median(r["cpu_times_s"]) * 1e3, "steps": len(r["times_s"]),
                       "vs_torch": wall / torch_med if torch_med else None, "first_loss": r["first_loss"]}
                records.append(rec)
                rows.append([config, impl, rec["threads"], used, f"{rec['median_ms']:.1f}",
                             f"{rec['min_ms']:.1f}-{rec['max_ms']:.1f}", f"{rec['cpu_median_ms']:.1f}",
                             "-" if rec["vs_torch"] is None else f"{rec['vs_torch']:.2f}x",
                             f"{r['first_loss']:.6f}"])
    lines = ["GPT (vocab 256, block 64, 4 layers, 4 heads, batch 16, AdamW, float32): fwd + bwd + step"
             + (" [glibc malloc tuned: " + " ".join(f"{k}={v}" for k, v in MALLOC_TUNED_ENV.items()) + "]"
                if args.malloc_tuned else ""),
             format_table(rows, ["config", "impl", "threads", "threads used", "median ms", "range ms", "cpu ms",
                                 "vs torch", "first loss"])]
    if torch_note:
        lines.append(f"torch: {torch_note}")
    profiles = {}
    if args.gpt_profile_steps:
        for config in configs:
            prof = run_worker([script, "--gpt-profile-worker", config, "--repeat", str(args.gpt_profile_steps)],
                              threads=1, timeout=1800)
            profiles[config] = prof
            lines.append(f"\nneural_arch per-op profile, {config}, {prof['blas_threads']} thread "
                         f"(cProfile, {prof['steps']} steps, {prof['profiled_ms_per_step']:.1f} ms/step under the "
                         "profiler; exclusive time per op, forward and backward separately)")
            lines.append(format_table([[o["op"], f"{o['ms_per_step']:.2f}", f"{100 * o['share']:.1f}%"]
                                       for o in prof["ops"]], ["op", "ms/step", "share"]))
    text = "\n".join(lines)
    print(text)
    payload = {"benchmark": "core_gpt_step", "configs": {c: GPT_CONFIGS[c] for c in configs}, "lr": GPT_LR,
               "optimizer": "AdamW (weight_decay 0.01)", "dtype": "float32", "repeat": args.repeat,
               "warmup": args.warmup, "rounds": args.rounds, "torch": torch_note or _torch_version(),
               "malloc_env": MALLOC_TUNED_ENV if args.malloc_tuned else None, "baseline_tree": args.baseline_tree,
               "results": records, "profiles": profiles}
    if args.json:
        stem = os.path.splitext(args.json)[0]
        print(f"wrote {write_json(args.json, payload)}")
        with open(stem + ".txt", "w") as f:
            f.write(text + "\n")
        chart = _gpt_chart(stem + ".png", records, profiles)
        if chart:
            print(f"wrote {chart}")
    return payload


# ---------------------------------------------------------------------------- GPT elementwise: NumPy vs numexpr
def _best_and_median_ms(fn, repeat: int) -> tuple[float, float]:
    """(min, median) wall ms of ``fn()`` over ``repeat`` calls after 3 warm-up calls. The minimum is the
    figure to compare on a shared machine: other jobs only ever add time."""
    import statistics

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3, statistics.median(times) * 1e3


def gpt_elementwise_worker(threads: int, repeat: int) -> dict:
    """Each elementwise kernel of the gpt128 step (float32, the step's shapes): the core's NumPy form
    against the same arithmetic as numexpr expressions (one pass over cache-sized blocks, numexpr's own
    threads set to ``threads``). Reductions stay NumPy on both sides; erf is the core's Abramowitz &
    Stegun 7.1.26 polynomial written into the expression (numexpr has no erf)."""
    import math

    import numexpr as ne
    import numpy as np

    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.nn.parameter import Parameter

    ne.set_num_threads(threads)
    f32 = np.float32
    cfg = GPT_CONFIGS["gpt128"]
    rows_, width, heads, block, vocab = cfg["batch"] * cfg["block"], cfg["n_embd"], cfg["n_head"], cfg["block"], \
        cfg["vocab"]
    rng = np.random.default_rng(0)
    x_mlp = (2 * rng.standard_normal((rows_, 4 * width))).astype(f32)         # GELU's input
    g_mlp = rng.standard_normal(x_mlp.shape).astype(f32)
    x_ln = rng.standard_normal((rows_, width)).astype(f32)                    # a layer norm's rows
    w_ln, b_ln = rng.standard_normal(width).astype(f32), rng.standard_normal(width).astype(f32)
    scores = rng.standard_normal((cfg["batch"], heads, block, block)).astype(f32)
    logits = rng.standard_normal((rows_, vocab)).astype(f32)
    target = rng.integers(0, vocab, rows_)
    n_params = cfg["n_layer"] * (12 * width * width + 13 * width) + (vocab + block) * width + 2 * width

    c = {"p": f32(0.3275911 / math.sqrt(2)), "h": f32(0.5), "mh": f32(-0.5), "one": f32(1.0),
         "k": f32(1 / math.sqrt(2 * math.pi))}
    c.update({f"a{i}": f32(0.5 * a) for i, a in enumerate((0.254829592, -0.284496736, 1.421413741, -1.453152027,
                                                             1.061405429))})
    out_mlp, d_mlp = np.empty_like(x_mlp), np.empty_like(x_mlp)
    poly = "tt * (a0 + tt * (a1 + tt * (a2 + tt * (a3 + tt * a4))))"

    def ne_gelu():   # numexpr does not share subexpressions: t and Phi are materialised once each
        ne.evaluate("one / (one + p * abs(x))", local_dict=dict(c, x=x_mlp), out=d_mlp)
        ne.evaluate(f"h + where(x < 0, -one, one) * (h - {poly} * exp(mh * x * x))",
                    local_dict=dict(c, x=x_mlp, tt=d_mlp), out=out_mlp)           # Phi(x)
        ne.evaluate("cdf + x * k * exp(mh * x * x)", local_dict=dict(c, x=x_mlp, cdf=out_mlp), out=d_mlp)
        ne.evaluate("x * cdf", local_dict={"x": x_mlp, "cdf": out_mlp}, out=out_mlp)

    def ne_layer_norm():
        mu = x_ln.mean(axis=1, keepdims=True)
        rstd = 1 / np.sqrt(x_ln.var(axis=1, keepdims=True) + f32(1e-5))
        return ne.evaluate("(x - mu) * rstd * w + b", local_dict={"x": x_ln, "mu": mu, "rstd": rstd, "w": w_ln,
                                                                   "b": b_ln})

    def ne_softmax():
        e = ne.evaluate("exp(s - m)", local_dict={"s": scores, "m": scores.max(axis=-1, keepdims=True)})
        return ne.evaluate("e / z", local_dict={"e": e, "z": e.sum(axis=-1, keepdims=True)})

    keep = np.tril(np.ones((block, block), dtype=bool))
    hidden, scale, ninf = ~keep, f32(1 / math.sqrt(width // heads)), f32(-np.inf)
    row_max = scores.max(axis=-1, keepdims=True)

    def np_attention_exp():   # the one-tile kernel's sequence, in place on a fresh score array
        s = scores * scale
        np.copyto(s, ninf, where=hidden)
        s -= row_max
        return np.exp(s, out=s)

    def ne_attention_exp():
        return ne.evaluate("where(keep, exp(s * c - m), 0)", local_dict={"keep": keep, "s": scores, "c": scale,
                                                                         "m": row_max})

    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    g_scale = f32(1 / rows_)
    logits_t = Tensor(logits, requires_grad=True)

    def np_cross_entropy():
        F.cross_entropy(logits_t, target).backward()
        logits_t.grad = None

    def ne_cross_entropy():
        shifted = logits - logits.max(axis=1, keepdims=True)
        lse = np.log(ne.evaluate("exp(s)", local_dict={"s": shifted}).sum(axis=1, keepdims=True))
        lp = ne.evaluate("s - l", local_dict={"s": shifted, "l": lse})
        grad = ne.evaluate("exp(lp) * g", local_dict={"lp": lp, "g": g_scale})
        grad[np.arange(rows_), target] -= g_scale
        return grad

    flat = Parameter(rng.standard_normal(n_params).astype(f32))
    flat.grad = Tensor(rng.standard_normal(n_params).astype(f32))
    adamw = optim.AdamW([flat], lr=1e-3)
    pd, pg, pm, pv = (rng.random(n_params).astype(f32) for _ in range(4))
    b1, b2, decay, step_size, sqrt_b2, eps = f32(0.9), f32(0.999), f32(1 - 1e-5), f32(1e-3), f32(0.5), f32(1e-8)

    def ne_adamw():
        ne.evaluate("m * b1 + (1 - b1) * g", local_dict={"m": pm, "g": pg, "b1": b1}, out=pm)
        ne.evaluate("v * b2 + (1 - b2) * g * g", local_dict={"v": pv, "g": pg, "b2": b2}, out=pv)
        ne.evaluate("d * decay - step_size * m / (sqrt(v) / sqrt_b2 + eps)",
                    local_dict={"d": pd, "decay": decay, "step_size": step_size, "m": pm, "v": pv,
                                "sqrt_b2": sqrt_b2, "eps": eps}, out=pd)

    kernels = [
        (f"GELU forward + derivative {x_mlp.shape}", lambda: F.gelu(Tensor(x_mlp, requires_grad=True)), ne_gelu),
        ("GELU backward g * gelu'", lambda: g_mlp * d_mlp,
         lambda: ne.evaluate("g * d", local_dict={"g": g_mlp, "d": d_mlp})),
        (f"layer norm forward {x_ln.shape}", lambda: F.layer_norm(Tensor(x_ln), (width,), w_ln, b_ln), ne_layer_norm),
        (f"softmax {scores.shape}", lambda: F.softmax(Tensor(scores), dim=-1), ne_softmax),
        ("attention scale, causal mask, exp", np_attention_exp, ne_attention_exp),
        (f"cross entropy forward + gradient {logits.shape}", np_cross_entropy, ne_cross_entropy),
        (f"AdamW update ({n_params} elements)", adamw.step, ne_adamw),
    ]
    results = []
    for name, numpy_fn, numexpr_fn in kernels:
        np_min, np_med = _best_and_median_ms(numpy_fn, repeat)
        ne_min, ne_med = _best_and_median_ms(numexpr_fn, repeat)
        results.append({"kernel": name, "numpy_min_ms": np_min, "numpy_median_ms": np_med,
                        "numexpr_min_ms": ne_min, "numexpr_median_ms": ne_med})
    return {"threads": threads, "blas_threads": blas_threads(), "intraop_threads": _intraop_threads("neural_arch"),
            "numexpr_threads": ne.get_num_threads(),
            "numexpr": ne.__version__, "numexpr_vml": bool(ne.use_vml), "kernels": results}


def gpt_elementwise_main(args) -> dict:
    """``--gpt-elementwise``: :func:`gpt_elementwise_worker` once per thread count, each in its own process."""
    try:
        import numexpr  # noqa: F401
    except ImportError:
        print("numexpr is not importable here: `pip install numexpr` to compare", file=sys.stderr)
        return {}
    script = os.path.abspath(__file__)
    workers = [run_worker([script, "--gpt-elementwise-worker", str(n), "--repeat", str(args.repeat)], threads=n)
               for n in (int(t) for t in args.threads.split(","))]
    rows = [[w["threads"], k["kernel"], f"{k['numpy_min_ms']:.3f} / {k['numpy_median_ms']:.3f}",
             f"{k['numexpr_min_ms']:.3f} / {k['numexpr_median_ms']:.3f}",
             f"{k['numexpr_min_ms'] / k['numpy_min_ms']:.2f}x"] for w in workers for k in w["kernels"]]
    print(f"gpt128's elementwise kernels, float32: the core's NumPy form against numexpr {workers[0]['numexpr']} "
          f"(VML: {workers[0]['numexpr_vml']}), ms per call")
    print(format_table(rows, ["threads", "kernel", "NumPy min / median", "numexpr min / median",
                              "numexpr / NumPy (min)"]))
    payload = {"benchmark": "core_gpt_elementwise_numexpr", "repeat": args.repeat, "results": workers}
    if args.json:
        print(f"wrote {write_json(args.json, payload)}")
    return payload


def _torch_version() -> str:
    try:
        import torch

        return f"torch {torch.__version__}"
    except ImportError:
        return "torch not importable"


# ---------------------------------------------------------------------------- driver
def _torch_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="neural_arch MLP training-step benchmark")
    parser.add_argument("--threads", default="1,default",
                        help="comma-separated BLAS thread counts; 'default' leaves the environment alone")
    parser.add_argument("--repeat", type=int, default=20, help="timed steps per worker")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2,
                        help="run every worker this many times, interleaved; times are pooled")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--json", default=os.path.join(_HERE, "results", "bench_core.json"))
    parser.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile the neural_arch step and exit")
    parser.add_argument("--gpt", action="store_true",
                        help="the GPT benchmark instead of the MLP (default JSON: results/bench_core_gpt.json)")
    parser.add_argument("--gpt-configs", default="gpt128,gpt512", help="comma-separated: gpt128, gpt512")
    parser.add_argument("--gpt-profile-steps", type=int, default=5,
                        help="steps of the per-op neural_arch profile per config (0: no profile)")
    parser.add_argument("--malloc-tuned", action="store_true",
                        help="GPT: run every contender with glibc's MALLOC_MMAP_THRESHOLD_/TRIM_THRESHOLD_/TOP_PAD_ "
                             "raised, so freed activations are reused instead of unmapped and page-faulted again")
    parser.add_argument("--baseline-tree", default=None,
                        help="GPT: also time the neural_arch of this checkout (its benchmarks/bench_core.py), "
                             "interleaved with the others: before/after under the same load")
    parser.add_argument("--gpt-elementwise", action="store_true",
                        help="each elementwise kernel of the gpt128 step, the core's NumPy form against numexpr "
                             "(default JSON: results/bench_core_gpt_elementwise.json)")
    parser.add_argument("--gpt-elementwise-worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gpt-worker", choices=GPT_IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--gpt-profile-worker", choices=tuple(GPT_CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.gpt_worker:
        print(json.dumps(gpt_worker(args.gpt_worker, args.gpt_configs, args.worker_threads, args.repeat,
                                    args.warmup)))
        return {}
    if args.gpt_elementwise_worker is not None:
        print(json.dumps(gpt_elementwise_worker(args.gpt_elementwise_worker, args.repeat)))
        return {}
    if args.gpt_elementwise:
        if args.json == os.path.join(_HERE, "results", "bench_core.json"):
            args.json = os.path.join(_HERE, "results", "bench_core_gpt_elementwise.json")
        if args.threads == "1,default":
            args.threads = "1,2"
        if args.repeat == 20:
            args.repeat = 60
        return gpt_elementwise_main(args)
    if args.gpt_profile_worker:
        print(json.dumps(gpt_profile(args.gpt_profile_worker, args.repeat)))
        return {}
    if args.gpt:
        if args.json == os.path.join(_HERE, "results", "bench_core.json"):
            args.json = os.path.join(_HERE, "results",
                                     "bench_core_gpt_malloc_tuned.json" if args.malloc_tuned else "bench_core_gpt.json")
        if args.threads == "1,default":
            args.threads = "1,2"
        if args.repeat == 20:
            args.repeat = 15
        return gpt_main(args)

    if args.worker:
        print(json.dumps(worker(args.worker, args.worker_threads, args.repeat, args.warmup)))
        return {}
    if args.profile:
        profile_neural_arch(args.repeat)
        return {}

    impls = [i for i in args.impls.split(",") if i]
    if "torch" in impls and not _torch_available():
        print("torch is not importable: skipping the torch column", file=sys.stderr)
        impls.remove("torch")
    thread_counts = [None if t == "default" else int(t) for t in args.threads.split(",")]
    script = os.path.abspath(__file__)
    results: dict = {}
    for _ in range(args.rounds):
        for threads in thread_counts:
            for impl in impls:
                cmd = [script, "--worker", impl, "--repeat", str(args.repeat), "--warmup", str(args.warmup)]
                if threads is not None:
                    cmd += ["--worker-threads", str(threads)]
                out = run_worker(cmd, threads=threads)
                entry = results.setdefault((threads, impl), {**out, "times_s": [], "cpu_times_s": []})
                entry["times_s"] += out["times_s"]
                entry["cpu_times_s"] += out["cpu_times_s"]

    import statistics

    def med(threads, impl, key="times_s"):
        return statistics.median(results[(threads, impl)][key]) if impl in impls else None

    rows, records = [], []
    for threads in thread_counts:
        base, base_cpu, torch_med = med(threads, "numpy"), med(threads, "numpy", "cpu_times_s"), \
            med(threads, "torch")
        for impl in impls:
            r = results[(threads, impl)]
            wall, cpu = med(threads, impl), med(threads, impl, "cpu_times_s")
            used = r["torch_threads"] if impl == "torch" else r["blas_threads"]
            rec = {"impl": impl, "threads": "default" if threads is None else threads, "threads_used": used,
                   "median_ms": wall * 1e3, "min_ms": min(r["times_s"]) * 1e3, "cpu_median_ms": cpu * 1e3,
                   "steps": len(r["times_s"]), "vs_numpy": wall / base if base else None,
                   "vs_numpy_cpu": cpu / base_cpu if base_cpu else None,
                   "vs_torch": wall / torch_med if torch_med else None, "first_loss": r["first_loss"]}
            records.append(rec)

            def ratio(v):
                return "-" if v is None else f"{v:.2f}x"

            rows.append([impl, rec["threads"], used, rec["median_ms"], rec["min_ms"], rec["cpu_median_ms"],
                         ratio(rec["vs_numpy"]), ratio(rec["vs_numpy_cpu"]), ratio(rec["vs_torch"]),
                         f"{r['first_loss']:.6f}"])
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32: one training step (fwd + bwd + SGD)")
    print(format_table(rows, ["impl", "threads", "threads used", "median ms", "min ms", "cpu ms",
                              "vs numpy", "vs numpy (cpu)", "vs torch", "first loss"]))
    print("median/min ms: wall clock per step; cpu ms: median process CPU time per step (all threads), "
          "less sensitive to other jobs on a shared machine")
    payload = {"benchmark": "core_mlp_step", "sizes": SIZES, "batch": BATCH, "dtype": "float32",
               "repeat": args.repeat, "rounds": args.rounds, "results": records}
    if args.json:
        print(f"wrote {write_json(args.json, payload)}")
    return payload


if __name__ == "__main__":
    main()
