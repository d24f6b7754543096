"""``neural_arch.memory.estimate``: every strategy's categories against numbers worked out by hand on a
tiny GPT, bad arguments, and the estimate within 10% of ``tracemalloc``'s measurement on one rank and
on two gloo ranks (DDP, ZeRO-1, ZeRO-2, FSDP; one RankPool for the module)."""

from __future__ import annotations

import doctest
import importlib

import memory_rank_fns as fns
import numpy as np
import pytest

from neural_arch import memory, nn
from neural_arch.distributed.testing import RankPool

# ---------------------------------------------------------------------------------- by hand
# The tiny GPT: V = 8, T = 4, L = 2, H = 2, C = 4 (MLP width h = 16), float32 (s = 4 bytes).
# Parameters (elements): tok_emb 8*4 = 32, pos_emb 4*4 = 16, per block: ln1 4+4, q/k/v/out 4*(16+4),
# ln2 4+4, fc1 16*4+16, fc2 4*16+4 = 244; ln_f 4+4; head 8*4 = 32. Psi = 32+16+2*244+8+32 = 576.
S = 4
PSI = 576
P = PSI * S                                    # 2304 bytes
BLOCK = 244 * S                                # 976: one FSDP block unit
ROOT = (32 + 16 + 8 + 32) * S                  # 352: the root unit (embeddings, ln_f, head)
G_MAX = 64 * S                                 # fc1.weight / fc2.weight, the largest gradient
# Adam's scratch: two neighbours in parameter order at most: fc1.weight (64) + fc1.bias (16) elements
PAIR = (64 + 16) * S
# Activations of batch 2 x seq 4 (8 tokens): per token, per block 25C + H + 2, then 4C + 2V + 1
# (embeddings, ln_f, logits and the loss's softmax), 16 bytes of int64 ids and targets; once the
# (T, C) position embedding output and the graph's Python objects (24 KiB per block, 8 KiB else).
A = 8 * ((2 * (25 * 4 + 2 + 2) + 4 * 4 + 2 * 8 + 1) * S + 16) + 4 * 4 * S + 2 * 24 * 1024 + 8 * 1024


@pytest.fixture(scope="module")
def tiny():
    return nn.GPT(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=4)


def _est(model, strategy, n, **kw):
    return memory.estimate(model, strategy=strategy, world_size=n, optimizer="adam", batch=2, seq=4, **kw)


def test_ddp_and_zero_by_hand(tiny):
    assert sum(p.data.nbytes for p in tiny.parameters()) == P
    e = _est(tiny, "ddp", 2)
    assert (e.parameters, e.gradients, e.optimizer_state, e.gathered, e.activations) == (P, P, 2 * P, P, A)
    base = P + 2 * P + P                                      # params, Adam, buckets
    assert e.phases == {"forward": base + A, "backward": base + max(A, P), "optimizer": base + P + PAIR}
    assert e.total == base + A and e.peak_phase == "forward"
    assert _est(tiny, "ddp", 2, gradient_as_bucket_view=True).gathered == 0

    z1 = _est(tiny, "zero1", 2)
    # greedy largest-first partition: both ranks end with 288 elements; the broadcast's two flats = P
    assert (z1.parameters, z1.gradients, z1.optimizer_state, z1.gathered) == (P, P, 2 * 288 * S, P + P)
    assert z1.phases["optimizer"] == P + P + 2 * 288 * S + P + max(PAIR, P)

    z2 = _est(tiny, "zero2", 2)
    shard = P // 2                                            # one bucket (under 25 MiB), 576 elements split in 2
    assert (z2.parameters, z2.gradients, z2.optimizer_state, z2.gathered) == (P + shard, shard, 2 * shard, P)
    base = P + shard + 2 * shard
    assert z2.phases == {"forward": base + A, "backward": base + max(A, P + shard),
                         "optimizer": base + shard + max(shard, P)}


def test_fsdp_and_fully_shard_by_hand(tiny):
    shard = (2 * BLOCK + ROOT) // 2
    e = _est(tiny, "fsdp", 2)
    assert (e.parameters, e.gradients, e.optimizer_state) == (shard, shard, 2 * shard)
    base = 3 * shard
    start = A + ROOT + BLOCK + 2 * G_MAX                      # root gathered, next block prefetched
    end = shard + 2 * BLOCK + G_MAX                           # two blocks gathered, one block gradient
    assert e.phases == {"forward": base + A + ROOT + BLOCK, "backward": base + max(start, end),
                        "optimizer": base + shard + 2 * (BLOCK // 2)}
    post = _est(tiny, "fsdp", 2, backward_prefetch="post")
    assert post.phases["backward"] == base + max(A + ROOT + 2 * G_MAX, shard + BLOCK + G_MAX)
    one = _est(tiny, "fsdp", 1)                               # one rank: views of the shard, nothing gathered
    assert one.gathered == 0 and one.phases["backward"] == 3 * P + max(A, P + G_MAX)

    # fully_shard: every dim 0 here divides by 2, so the shards equal FSDP1's. The root stays gathered;
    # a block being gathered has its buffer and the all-gather's table; backward adds the root's and the
    # current block's whole gradients and the reduce-scatter's packed input, output and the sharded
    # gradients copied from it (a shard each)
    fs = _est(tiny, "fully_shard", 2)
    assert (fs.parameters, fs.gathered) == (shard, ROOT + 2 * BLOCK)
    assert fs.phases["forward"] == base + A + ROOT + 2 * BLOCK
    assert fs.phases["backward"] == base + A + 2 * ROOT + 2 * BLOCK + 2 * BLOCK + 2 * (BLOCK // 2)
    keep = _est(tiny, "fully_shard", 2, reshard_after_forward=False)   # every block stays gathered
    assert keep.gathered == ROOT + 2 * BLOCK + BLOCK and keep.phases["forward"] == base + A + ROOT + 3 * BLOCK
    assert keep.phases["backward"] == base + A + 2 * ROOT + 2 * BLOCK + 2 * BLOCK + 2 * (BLOCK // 2)
    # three ranks: torch.chunk rows, the worst rank holds ceil(rows / 3) of every parameter
    rows = {name: p.data.shape[0] for name, p in tiny.named_parameters()}
    per_row = {name: p.data.size // rows[name] for name, p in tiny.named_parameters()}
    worst = sum(-(-rows[k] // 3) * per_row[k] for k in rows) * S
    assert _est(tiny, "fully_shard", 3).parameters == worst


def test_tp_and_pp_by_hand(tiny):
    # TP 2: replicated pos_emb 16, per block ln1 8 + out_proj.bias 4 + ln2 8 + fc2.bias 4, ln_f 8 = 72
    # elements; the other 504 halved
    e = _est(tiny, "tp", 2)
    p_t = (72 + 504 // 2) * S
    # activations: per block 8C + 2 whole, (5C + 3h + H)/2 sharded, and the styles' 5C of whole copies
    a_t = 8 * ((2 * (8 * 4 + 2 + (5 * 4 + 3 * 16 + 2) / 2 + 5 * 4) + 4 * 4 + 1 + 2 * 8 / 2) * S + 16) + 4 * 4 * S \
        + 2 * 24 * 1024 + 8 * 1024
    assert (e.parameters, e.gradients, e.optimizer_state, e.gathered, e.activations) == (p_t, p_t, 2 * p_t, 0, a_t)
    # PP 2, 1F1B, 2 micro-batches of 1 sequence: stage 0 (tok_emb, pos_emb, block 0: 292 elements)
    # keeps both micro-batches; per micro-batch 4 tokens of (25C + H + 2) + 2C, ids, the position output
    pp = _est(tiny, "pp", 2)
    one = 4 * ((25 * 4 + 2 + 2 + 2 * 4) * S + 8) + 4 * 4 * S + 24 * 1024 + 8 * 1024
    assert (pp.parameters, pp.activations) == (292 * S, 2 * one)
    # GPipe keeps both micro-batches on the last stage too (block 1, ln_f, head: 284 elements), which is then
    # the worst: per token 25C + H + 2, the received input C, 2C + 1 + 2V; its targets; no position output
    gpipe = _est(tiny, "pp", 2, schedule="gpipe")
    last = 4 * ((25 * 4 + 2 + 2 + 4 + 2 * 4 + 1 + 2 * 8) * S + 8) + 24 * 1024 + 8 * 1024
    assert (gpipe.parameters, gpipe.activations) == (284 * S, 2 * last)


def test_dtype_optimizer_and_checkpointing(tiny):
    e = _est(tiny, "ddp", 1, param_dtype=np.float64)
    assert e.parameters == 2 * P and e.optimizer_state == 4 * P
    assert _est(tiny, "ddp", 1, param_dtype="bfloat16").parameters == P // 2
    sgd = memory.estimate(tiny, "ddp", 1, optimizer="sgd", batch=2, seq=4)
    assert sgd.optimizer_state == 0 and sgd.temporary == 0
    from neural_arch import optim

    assert memory.estimate(tiny, "ddp", 1, optimizer=optim.AdamW, batch=2, seq=4).optimizer_state == 2 * P
    ac = _est(tiny, "ddp", 1, activation_checkpointing=True)
    # each block keeps its input (C per token) and one small node instead of its activations
    assert ac.activations == 8 * ((2 * 4 + 4 * 4 + 2 * 8 + 1) * S + 16) + 4 * 4 * S + 2 * 2 * 1024 + 8 * 1024
    assert "total (peak, in forward)" in str(_est(tiny, "ddp", 1))


@pytest.mark.parametrize("kwargs, name", [
    ({"strategy": "zero3"}, "strategy"), ({"world_size": 0}, "world_size"), ({"world_size": 1.5}, "world_size"),
    ({"optimizer": "lion"}, "optimizer"), ({"batch": 0}, "batch"), ({"strategy": "tp", "world_size": 3}, "world_size"),
    ({"strategy": "pp", "world_size": 3}, "world_size"), ({"schedule": "zb"}, "schedule"),
    ({"param_dtype": "int7"}, "param_dtype"), ({"backward_prefetch": "never"}, "backward_prefetch"),
    ({"strategy": "pp", "world_size": 2, "batch": 3}, "microbatches"),
])
def test_bad_arguments_name_the_argument(tiny, kwargs, name):
    with pytest.raises(ValueError, match=name):
        memory.estimate(tiny, **kwargs)


@pytest.mark.parametrize("name", ["neural_arch.memory", "neural_arch.memory.estimator", "neural_arch.memory.result",
                                  "neural_arch.memory.gpt_activations"])
def test_docstring_examples(name):
    module = importlib.import_module(name)      # the module, even where the package's attribute is a function
    result = doctest.testmod(module, verbose=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


# ---------------------------------------------------------------------------------- measured
# The bench's --quick GPT: parameters and Adam dominate; big enough that Python's own objects are noise.
CFG = {"vocab": 1024, "seq": 16, "n_layer": 2, "n_head": 4, "n_embd": 192, "batch": 2}
STRATEGIES = {"DDP": {"strategy": "ddp"}, "ZeRO-1": {"strategy": "zero1"}, "ZeRO-2": {"strategy": "zero2"},
              "FSDP": {"strategy": "fsdp"}}


def _gpt():
    from neural_arch.core.tensor import manual_seed

    manual_seed(0)
    return nn.GPT(vocab_size=CFG["vocab"], block_size=CFG["seq"], n_layer=CFG["n_layer"], n_head=CFG["n_head"],
                  n_embd=CFG["n_embd"])


def _assert_close(est, measured: dict, where: str):
    pairs = {"parameters": (est.parameters, measured["params"]), "gradients": (est.gradients, measured["grads"]),
             "optimizer_state": (est.optimizer_state, measured["optim"]),
             "activations": (est.activations, measured["held_after_fwd"]), "total": (est.total, measured["peak"])}
    pairs.update({phase: (est.phases[phase], measured["peak_phase"][phase]) for phase in est.phases})
    bad = {k: (e, m, round(e / m, 3)) for k, (e, m) in pairs.items() if abs(e / m - 1) > 0.10}
    assert not bad, f"{where}: estimate / measured off by more than 10%: {bad}"


def test_within_ten_percent_of_measured_on_one_rank_in_process():
    """One process, no wrapper: a plain Adam step is DDP's model without buckets (gradient_as_bucket_view)."""
    import gc

    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor

    rng = np.random.default_rng(0)
    x = rng.integers(0, CFG["vocab"], size=(CFG["batch"], CFG["seq"]))
    y = rng.integers(0, CFG["vocab"], size=(CFG["batch"] * CFG["seq"],))

    def loss_of(model):
        logits = model(Tensor(x))
        return F.cross_entropy(logits.reshape(-1, CFG["vocab"]), y)

    warm = nn.GPT(vocab_size=CFG["vocab"], block_size=CFG["seq"], n_layer=1, n_head=2, n_embd=16)   # one-time imports
    warm_opt = optim.Adam(warm.parameters(), lr=1e-4)
    loss_of(warm).backward()
    warm_opt.step()
    del warm, warm_opt
    gc.collect()
    memory.stop()
    memory.start()
    try:
        base = memory.memory_allocated()
        model = _gpt()
        opt = optim.Adam(model.parameters(), lr=1e-4)
        loss_of(model).backward()
        opt.step()
        opt.zero_grad()
        gc.collect()
        memory.reset_peak_memory_stats()
        before = memory.memory_allocated()
        loss = loss_of(model)
        held, fwd = memory.memory_allocated() - before, memory.max_memory_allocated() - base
        memory.reset_peak_memory_stats()
        loss.backward()
        del loss
        bwd = memory.max_memory_allocated() - base
        grads = sum(p.grad.data.nbytes for p in model.parameters())
        memory.reset_peak_memory_stats()
        opt.step()
        step = memory.max_memory_allocated() - base
    finally:
        memory.stop()
    params = sum(p.data.nbytes for p in model.parameters())
    measured = {"params": params, "grads": grads, "optim": 2 * params, "held_after_fwd": held,
                "peak": max(fwd, bwd, step), "peak_phase": {"forward": fwd, "backward": bwd, "optimizer": step}}
    est = memory.estimate(_gpt(), "ddp", 1, batch=CFG["batch"], seq=CFG["seq"], gradient_as_bucket_view=True)
    _assert_close(est, measured, "one process")


@pytest.fixture(scope="module")
def measured_on_two_ranks():
    with RankPool(2, backend="gloo", timeout=180.0) as pool:
        return pool.run(fns.measure, list(STRATEGIES), CFG, timeout=180.0)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_within_ten_percent_of_measured_on_two_gloo_ranks(measured_on_two_ranks, strategy):
    est = memory.estimate(_gpt(), world_size=2, batch=CFG["batch"], seq=CFG["seq"], **STRATEGIES[strategy])
    per_rank = [out[strategy] for out in measured_on_two_ranks]
    # the estimate is the worst rank's (ZeRO-1's greedy partition gives the ranks different shares)
    worst = {k: max(r[k] for r in per_rank) for k in ("params", "grads", "optim", "held_after_fwd", "peak")}
    worst["peak_phase"] = {ph: max(r["peak_phase"][ph] for r in per_rank) for ph in per_rank[0]["peak_phase"]}
    _assert_close(est, worst, strategy)
