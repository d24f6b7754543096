#!/usr/bin/env python3
"""Inference: tokens/s with and without the KV cache vs batch size (tp = 1, 2), and the server's
time to first token and per-token latency under concurrent requests.

Part 1 (``GPT.generate`` on gloo ranks, one BLAS thread each): for every tp and batch size, the median
time of one ``generate`` call of ``--new-tokens`` tokens after a ``--prompt``-token prompt, with the KV
cache (one position per decode step) and without it (``use_cache=False``: the whole prefix again at
every step). tokens/s counts generated tokens of the whole batch.

Part 2 (``PipelineGenerator`` on ``--pp`` gloo ranks, one stage each): tokens/s with 1, 2, 4 requests
(batch 1 each) in flight; one request keeps one stage busy at a time, ``m >= pp`` requests keep them all
busy (``neural_arch.distributed.pipelining.generation``).

Part 3 (``python -m neural_arch.serve --tp N``, and ``--pp --serve-pp`` with tp 1, under real HTTP
clients): ``C`` clients post at once, each a streaming request of ``--new-tokens`` tokens, ``--repeat``
rounds after one warm-up round; measured at the client: time to first token (post -> first
server-sent event) and per-token latency (the mean gap between its later events; a client that reads
several events at once sees gaps near 0). Continuous batching decodes the concurrent requests
together, so the per-token latency grows far less than ``C`` times.

Part 4 (only when ``torch`` is importable): PyTorch CPU eager greedy generation with a KV cache on
the same weights, one thread as our ranks, batch 1 and the largest batch, as the side-by-side
reference: its greedy tokens are checked against ours, and the prompt's logits compared.

Every timed figure is the median over ``--repeat`` timed runs after a warm-up, with the range
(slowest-fastest) next to it in the tables and in the JSON (``*_range``): the machine is shared.

Run::

    python benchmarks/bench_inference.py                               # defaults below
    # the documented run (about a minute on an idle 2-core machine); torch from a separate folder:
    PYTHONPATH=/tmp/torchlib python benchmarks/bench_inference.py --batches 1 4 16 --new-tokens 16 \
        --concurrency 1 4 8 --repeat 3

Prints Markdown tables; raw numbers go to ``benchmarks/results/bench_inference.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np

from benchmarks.common import print_table, stop_session, write_json


def _tok_s_range(tokens: int, times: list) -> list:
    """``[lowest, highest]`` tokens/s over the timed repeats (the machine is shared: the spread says how much)."""
    return [tokens / max(times), tokens / min(times)]


def _model_args(cfg: dict) -> dict:
    return {k: cfg[k] for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")}


def _generate_rank_fn(cfg: dict):
    """Every rank of a RankPool: tokens/s of generate with and without the cache, per batch size."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed

    manual_seed(0)
    model = nn.GPT(**_model_args(cfg))
    group = dist.get_default_group()
    if group.size() > 1:
        from neural_arch.distributed.tensor.parallel import parallelize_gpt

        parallelize_gpt(model, group, loss_parallel=True)
    rng = np.random.default_rng(0)
    rows = []
    for batch in cfg["batches"]:
        idx = rng.integers(0, cfg["vocab_size"], size=(batch, cfg["prompt"]))
        row = {"tp": group.size(), "batch": batch}
        for use_cache in (True, False):
            times = []
            for rep in range(cfg["repeat"] + 1):
                dist.barrier()
                t0 = time.perf_counter()
                model.generate(idx, cfg["new_tokens"], use_cache=use_cache)
                if rep:                      # the first call warms up
                    times.append(time.perf_counter() - t0)
            key = "cache" if use_cache else "no_cache"
            row[f"{key}_s"] = float(np.median(times))
            row[f"{key}_tok_s"] = batch * cfg["new_tokens"] / row[f"{key}_s"]
            row[f"{key}_tok_s_range"] = _tok_s_range(batch * cfg["new_tokens"], times)
        rows.append(row)
    return rows


def bench_generate(cfg: dict) -> list[dict]:
    from neural_arch.distributed.testing import RankPool

    rows = []
    for tp in cfg["tp"]:
        with RankPool(tp, backend="gloo", timeout=600.0) as pool:
            rows += pool.run(_generate_rank_fn, cfg)[0]
    return rows


def _pipeline_rank_fn(cfg: dict):
    """Every rank of a pp-rank RankPool: tokens/s of PipelineGenerator with m requests in flight."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.pipelining.generation import PipelineGenerator

    manual_seed(0)
    gen = PipelineGenerator(nn.GPT(**_model_args(cfg)))
    rng = np.random.default_rng(0)
    rows = []
    for m in cfg["pipeline_requests"]:
        prompts = [rng.integers(0, cfg["vocab_size"], size=(1, cfg["prompt"])) for _ in range(m)]
        times = []
        for rep in range(cfg["repeat"] + 1):
            dist.barrier()
            t0 = time.perf_counter()
            gen.generate(prompts, cfg["new_tokens"])
            if rep:
                times.append(time.perf_counter() - t0)
        rows.append({"pp": dist.get_world_size(), "requests": m, "s": float(np.median(times)),
                     "tok_s": m * cfg["new_tokens"] / float(np.median(times)),
                     "tok_s_range": _tok_s_range(m * cfg["new_tokens"], times)})
    return rows


def bench_pipeline(cfg: dict) -> list[dict]:
    from neural_arch.distributed.testing import RankPool

    with RankPool(cfg["pp"], backend="gloo", timeout=600.0) as pool:
        return pool.run(_pipeline_rank_fn, cfg)[0]


# ----------------------------------------------------------------------------------------- serving
def _start_server(folder: str, tp: int, pp: int, workdir: str):
    from neural_arch.distributed.testing import script_env

    proc = subprocess.Popen([sys.executable, "-m", "neural_arch.serve", "--checkpoint", folder, "--tp", str(tp),
                             "--pp", str(pp), "--port", "0", "--max-batch", "64"],
                            env=script_env({"TMPDIR": workdir}), cwd=workdir, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "listening on http://" in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep draining
            return proc, line.split("listening on ")[1].split()[0]
        if time.monotonic() > deadline:
            break
    stop_session(proc)
    raise RuntimeError("the server did not start")


def _client(url: str, prompt: list, new_tokens: int, out: list, start: threading.Event) -> None:
    body = json.dumps({"prompt": prompt, "max_new_tokens": new_tokens, "stream": True}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    start.wait()
    t0 = time.perf_counter()
    stamps = []
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if line.startswith(b"data: ") and b'"token"' in line:
                stamps.append(time.perf_counter())
    out.append({"ttft_s": stamps[0] - t0,
                "per_token_s": (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1), "tokens": len(stamps)})


def bench_serving(cfg: dict) -> list[dict]:
    from neural_arch.core.tensor import manual_seed
    from neural_arch.nn.transformer import GPT
    from neural_arch.serve.checkpoint import save_checkpoint

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_inference_") as tmp:
        folder = os.path.join(tmp, "ckpt")
        manual_seed(0)
        save_checkpoint(GPT(**_model_args(cfg)), folder)
        rng = np.random.default_rng(1)
        layouts = [(tp, 1) for tp in cfg["tp"]] + ([(1, cfg["serve_pp"])] if cfg["serve_pp"] > 1 else [])
        for tp, pp in layouts:
            proc, url = _start_server(folder, tp, pp, tmp)
            try:
                for c in cfg["concurrency"]:
                    rounds = []
                    for rep in range(cfg["repeat"] + 1):          # the first round warms up
                        results: list = []
                        go = threading.Event()
                        threads = [threading.Thread(target=_client, args=(
                            url, rng.integers(0, cfg["vocab_size"], cfg["prompt"]).tolist(), cfg["new_tokens"],
                            results, go)) for _ in range(c)]
                        for t in threads:
                            t.start()
                        go.set()
                        for t in threads:
                            t.join(timeout=600)
                        if rep:
                            rounds.append(results)
                    ttft = [1e3 * r["ttft_s"] for res in rounds for r in res]
                    per_token = [1e3 * r["per_token_s"] for res in rounds for r in res]
                    # all requests' tokens over the slowest request's time, one figure per round
                    tok_s = [c * cfg["new_tokens"] / max(r["ttft_s"] + r["per_token_s"] * (r["tokens"] - 1)
                                                         for r in res) for res in rounds]
                    rows.append({"tp": tp, "pp": pp, "concurrent": c, "rounds": len(rounds),
                                 "ttft_ms_median": float(np.median(ttft)), "ttft_ms_range": [min(ttft), max(ttft)],
                                 "ttft_ms_max": max(ttft),
                                 "per_token_ms_median": float(np.median(per_token)),
                                 "per_token_ms_range": [min(per_token), max(per_token)],
                                 "tok_s_total": float(np.median(tok_s)), "tok_s_total_range": [min(tok_s), max(tok_s)]})
            finally:
                stop_session(proc)
    return rows


# ----------------------------------------------------------------------------------------- PyTorch
def bench_torch(cfg: dict) -> list[dict] | str:
    """PyTorch CPU eager greedy decoding (KV cache) with our weights; its tokens must equal ours."""
    try:
        import torch
        import torch.nn.functional as TF
    except ImportError:
        return "skipped: torch is not installed"
    from neural_arch.core.autograd import no_grad
    from neural_arch.core.tensor import manual_seed
    from neural_arch.nn.transformer import GPT

    torch.set_num_threads(1)    # as our ranks: one BLAS thread
    manual_seed(0)
    ours = GPT(**_model_args(cfg))
    w = {k: torch.from_numpy(np.asarray(v.data if hasattr(v, "data") else v).copy())
         for k, v in ours.state_dict().items()}
    h = cfg["n_head"]

    def lin(x, name, bias=True):
        return TF.linear(x, w[name + ".weight"], w.get(name + ".bias") if bias else None)

    def forward(idx, pos, cache):
        x = w["tok_emb.weight"][idx] + w["pos_emb.weight"][pos]
        b, t, c = x.shape
        for i in range(cfg["n_layer"]):
            p = f"blocks.{i}."
            y = TF.layer_norm(x, (c,), w[p + "ln1.weight"], w[p + "ln1.bias"], 1e-5)
            q, k, v = (lin(y, p + f"attn.{n}_proj").view(b, t, h, c // h).transpose(1, 2) for n in "qkv")
            if i in cache:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            att = TF.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
            x = x + lin(att.transpose(1, 2).reshape(b, t, c), p + "attn.out_proj")
            y = TF.layer_norm(x, (c,), w[p + "ln2.weight"], w[p + "ln2.bias"], 1e-5)
            x = x + lin(TF.gelu(lin(y, p + "mlp.fc1")), p + "mlp.fc2")
        x = TF.layer_norm(x, (c,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
        return lin(x, "head", bias=False)

    def generate(idx):
        with torch.no_grad():
            cache, out = {}, idx
            logits = forward(idx, torch.arange(idx.shape[1]), cache)
            for s in range(cfg["new_tokens"]):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                out = torch.cat([out, nxt], 1)
                if s + 1 < cfg["new_tokens"]:
                    logits = forward(nxt, torch.tensor([out.shape[1] - 1]), cache)
            return out

    rows = []
    rng = np.random.default_rng(0)
    for batch in sorted({min(cfg["batches"]), max(cfg["batches"])}):
        idx = rng.integers(0, cfg["vocab_size"], size=(batch, cfg["prompt"]))
        same = generate(torch.from_numpy(idx)).numpy().tolist() == ours.generate(idx, cfg["new_tokens"]).tolist()
        with torch.no_grad(), no_grad():  # the prompt's logits, ours vs theirs (float32: only rounding differs)
            diff = float(np.abs(forward(torch.from_numpy(idx), torch.arange(idx.shape[1]), {}).numpy()
                                - ours.eval()(idx).data).max())
        times = []
        for rep in range(cfg["repeat"] + 1):
            t0 = time.perf_counter()
            generate(torch.from_numpy(idx))
            if rep:
                times.append(time.perf_counter() - t0)
        rows.append({"batch": batch, "torch_s": float(np.median(times)),
                     "torch_tok_s": batch * cfg["new_tokens"] / float(np.median(times)),
                     "torch_tok_s_range": _tok_s_range(batch * cfg["new_tokens"], times), "same_tokens": same,
                     "max_abs_logit_diff": diff, "torch": torch.__version__,
                     "torch_threads": torch.get_num_threads()})
    return rows


def _span(lo_hi, digits: int = 0) -> str:
    return f"{lo_hi[0]:.{digits}f}-{lo_hi[1]:.{digits}f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, nargs="*", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 4, 16])
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 8])
    p.add_argument("--pp", type=int, default=2, help="pipeline stages for the pipeline-generation table (0: skip)")
    p.add_argument("--pipeline-requests", type=int, nargs="*", default=[1, 2, 4],
                   help="requests (batch 1 each) in flight through the pipeline")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--serve-pp", type=int, default=2,
                   help="also serve with this many pipeline stages (tp 1; 0 or 1: not)")
    p.add_argument("--skip-serving", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_inference.json"))
    args = p.parse_args(argv)
    cfg = {k.replace("-", "_"): v for k, v in vars(args).items()}
    print(f"GPT vocab={args.vocab_size} n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd}, "
          f"float32, prompt {args.prompt} + {args.new_tokens} new tokens, gloo, {os.cpu_count()} cpu(s)\n")
    gen = bench_generate(cfg)
    print_table([[r["tp"], r["batch"], f"{r['cache_tok_s']:.0f} ({_span(r['cache_tok_s_range'])})",
                  f"{r['no_cache_tok_s']:.0f} ({_span(r['no_cache_tok_s_range'])})",
                  f"{r['cache_tok_s'] / r['no_cache_tok_s']:.1f}x"] for r in gen],
                ["tp", "batch", "tokens/s, KV cache (range)", "tokens/s, no cache (range)", "cache speed-up"])
    pipe = bench_pipeline(cfg) if args.pp > 1 else []
    if pipe:
        print()
        print_table([[r["pp"], r["requests"], f"{r['tok_s']:.0f} ({_span(r['tok_s_range'])})",
                      f"{r['tok_s'] / pipe[0]['tok_s']:.2f}x"]
                     for r in pipe], ["pp stages", "requests in flight", "tokens/s (range)", "vs one request"])
    serving = [] if args.skip_serving else bench_serving(cfg)
    if serving:
        print()
        print_table([[r["tp"], r["pp"], r["concurrent"], f"{r['ttft_ms_median']:.1f} ({_span(r['ttft_ms_range'], 1)})",
                      f"{r['per_token_ms_median']:.2f} ({_span(r['per_token_ms_range'], 2)})",
                      f"{r['tok_s_total']:.0f} ({_span(r['tok_s_total_range'])})"] for r in serving],
                    ["tp", "pp", "concurrent requests", "TTFT ms, median (range)", "per-token ms, median (range)",
                     "tokens/s, all requests (range)"])
    ref = bench_torch(cfg)
    print()
    if isinstance(ref, str):
        print(f"PyTorch reference: {ref}")
    else:
        ours = {r["batch"]: r for r in gen if r["tp"] == 1}
        print_table([[r["batch"], f"{r['torch_tok_s']:.0f} ({_span(r['torch_tok_s_range'])})",
                      f"{ours[r['batch']]['cache_tok_s']:.0f}" if r["batch"] in ours else "-",
                      r["same_tokens"], f"{r['max_abs_logit_diff']:.1e}"] for r in ref],
                    ["batch", "PyTorch eager tokens/s, KV cache (range)", "ours, tp=1, KV cache",
                     "same greedy tokens", "max |logit diff|, prompt"])
    path = write_json(args.out, {"config": cfg, "generate": gen, "pipeline": pipe, "serving": serving, "torch": ref})
    print(f"\nraw results: {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
