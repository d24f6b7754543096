"""``nn.utils.clip_grad_norm_`` on sharded gradients (functions RankPool ranks run).

Each rank backpropagates its slice of the global batch through FSDP (and through a ZeRO-2
optimizer); the norm clipping returns, and the clipped gradient pieces, are compared with a
single-process model on the whole batch.
"""

from __future__ import annotations

import math

import numpy as np
from sharded_rank_fns import _loss, build, data


def _piece_diff(shards, ref_by_param) -> float:
    """Largest difference between each shard's gradient pieces and the reference gradients."""
    worst = 0.0
    for s in shards:
        for p, start, at, n in s._flat_shard.pieces:
            want = ref_by_param[id(p)].grad.data.reshape(-1)[start:start + n]
            worst = max(worst, float(np.abs(s.grad.data[at:at + n] - want).max()))
    return worst


def clip_run(max_norm: float) -> dict:
    import neural_arch.distributed as dist
    from neural_arch import nn, optim
    from neural_arch.distributed.fsdp import FSDP
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = data(world * 3, np.float64)
    mine = slice(rank * 3, (rank + 1) * 3)
    ref = build(0, np.float64)
    _loss(ref, X, y).backward()
    out = {"ref": nn.utils.clip_grad_norm_(ref.parameters(), max_norm),
           "ref_inf": nn.utils.clip_grad_norm_(ref.parameters(), 1e9, norm_type=math.inf)}

    model = build(0, np.float64)
    fsdp = FSDP(model, auto_wrap_policy={nn.Linear})
    _loss(fsdp, X[mine], y[mine]).backward()
    out["fsdp"] = nn.utils.clip_grad_norm_(fsdp.parameters(), max_norm)
    out["fsdp_inf"] = nn.utils.clip_grad_norm_(fsdp.parameters(), 1e9, norm_type=math.inf)
    refs = dict(zip(map(id, model.parameters()), ref.parameters()))
    out["fsdp_grads"] = _piece_diff(list(fsdp.parameters()), refs)
    try:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # the original parameters: no .grad
        out["fsdp_refused"] = None
    except RuntimeError as exc:
        out["fsdp_refused"] = str(exc)

    model2 = build(0, np.float64)
    opt = ZeroRedundancyOptimizer(model2.parameters(), optim.Adam, stage=2, lr=0.1, bucket_cap_mb=0.0005)
    _loss(model2, X[mine], y[mine]).backward()
    out["zero2"] = opt.clip_grad_norm_(max_norm)
    out["zero2_grads"] = _piece_diff(opt._shards, dict(zip(map(id, model2.parameters()), ref.parameters())))
    try:
        nn.utils.clip_grad_norm_(model2.parameters(), max_norm)
        out["zero2_refused"] = None
    except RuntimeError as exc:
        out["zero2_refused"] = str(exc)
    return out
