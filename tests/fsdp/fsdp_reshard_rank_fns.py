"""Rank functions for test_fsdp_reshard.py: FULL_SHARD on a small float64 GPT, resharding after
forward and re-gathering before backward (with every prefetch setting, activation checkpointing
and two forwards before one backward), compared with single-process training on the global batch."""

from __future__ import annotations

import mmap

import numpy as np

VOCAB, T, B = 40, 8, 2


def _gpt(ckpt: bool):
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed
    from neural_arch.utils.checkpoint import apply_activation_checkpointing

    manual_seed(0)
    m = nn.GPT(vocab_size=VOCAB, block_size=T, n_layer=3, n_head=2, n_embd=16)
    for p in m.parameters():
        p.data = p.data.astype(np.float64)
    if ckpt:
        apply_activation_checkpointing(m, check_fn=lambda mm: isinstance(mm, nn.TransformerBlock))
    return m


def _loss(model, x, y, twice: bool):
    import neural_arch.nn.functional as F
    from neural_arch.core.tensor import Tensor

    def one(xx):
        logits = model(Tensor(xx))
        b, t, v = logits.shape
        return F.cross_entropy(logits.reshape(b * t, v), y)
    return one(x) + one(x[:, ::-1].copy()) if twice else one(x)


def _batches(world: int, steps: int):
    rng = np.random.default_rng(7)
    return [(rng.integers(0, VOCAB, size=(world * B, T)), rng.integers(0, VOCAB, size=(world * B, T)))
            for _ in range(steps)]


def reshard_run(cfg):
    """Largest parameter difference to single-process training, and what the pool held."""
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.distributed.fsdp import FSDP, BackwardPrefetch, ModuleWrapPolicy, storage

    storage.MIN_BYTES = 0  # this GPT's buffers are small: map them all, so that freeing is exercised
    if hasattr(mmap, "MADV_DONTNEED"):
        # released pages then read as zeros (MADV_FREE keeps the old values while memory is
        # plentiful): a read of memory given back too early shows up as a wrong result
        storage._ADVICE = mmap.MADV_DONTNEED
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, twice, ckpt = 3, cfg.get("twice", False), cfg.get("ckpt", False)
    batches = _batches(world, steps)
    prefetch = cfg.get("backward_prefetch", "BACKWARD_PRE")
    model = _gpt(ckpt)
    limit = cfg.get("limit_all_gathers", True)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerBlock}),
                backward_prefetch=None if prefetch is None else BackwardPrefetch[prefetch],
                forward_prefetch=cfg.get("forward_prefetch", False), limit_all_gathers=limit)
    opt = optim.Adam(fsdp.parameters(), lr=1e-2)
    held = []
    gathered = []  # units holding gathered parameters, seen as each gradient is final
    shrunk = []    # whether a held buffer had given part of its memory back by then
    root = fsdp._units[-1]
    root_in_blocks = []  # whether the root held a buffer while a block's gradient was final
    blocks = {id(p) for m in model.modules() if isinstance(m, nn.TransformerBlock) for p in m.parameters()}

    def seen(p):
        bufs = [b for b in fsdp._pool.buffers() if b.array is not None and b.holder is not None]
        gathered.append(fsdp._gathered_units())
        shrunk.append(any(storage.resident_nbytes(b.array) < b.array.nbytes for b in bufs))
        if id(p) in blocks:
            root_in_blocks.append(any(b.holder is root for b in bufs))
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(seen)
    for x, y in batches:
        mine = slice(rank * B, (rank + 1) * B)
        # local loss = mean over my tokens; FSDP averages over ranks -> the global mean
        loss = _loss(fsdp, x[mine], y[mine].reshape(-1), twice)
        # what the gather buffers still occupy after forward (memory given back counts as nothing)
        held.append(sum(storage.resident_nbytes(b.array) // b.array.itemsize
                        for b in fsdp._pool.buffers() if b.array is not None))
        loss.backward()
        assert not fsdp._pool.buffers() and all(not u.gathered for u in fsdp._units)
        opt.step()
        opt.zero_grad()
    got = fsdp.state_dict()
    ref = _gpt(False)
    ref_opt = optim.Adam(ref.parameters(), lr=1e-2)
    for x, y in batches:
        _loss(ref, x, y.reshape(-1), twice).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = max(float(np.abs(got[k] - v).max()) for k, v in ref.state_dict().items())
    sizes = sorted((u.layout.padded_numel for u in fsdp._units), reverse=True)
    return diff, {"held": max(held), "root": fsdp._units[-1].layout.padded_numel, "block": sizes[0],
                  "all_units": sum(sizes), "max_gathered": max(gathered), "shrunk": any(shrunk),
                  "root_in_blocks": any(root_in_blocks)}
