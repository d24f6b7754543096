"""``vocab_parallel_cross_entropy``: softmax cross-entropy over a vocabulary split across ranks.

Rank r holds logits ``(..., V/p)`` for vocabulary ids ``[r*V/p, (r+1)*V/p)`` (a column-parallel
LM head without ``gather_output``). The full ``(..., V)`` logits are never gathered; instead
(Megatron's algorithm) two all-reduces over the group carry ``O(tokens)`` numbers:

1. the row maximum (MAX), for a stable ``exp``;
2. ``sum_v exp(logit_v - max)`` and the target's shifted logit (SUM; only the rank that owns
   the target id contributes it), in one buffer.

Then ``loss = log(sum_exp) - (target_logit - max)``, identical on every rank, and the gradient
with respect to the local logits is ``softmax_local - onehot_local`` (times the upstream
gradient), computed without further communication.

Example::

    logits = head(x)                                     # ColumnParallelLinear, (B, T, V/p)
    loss = vocab_parallel_cross_entropy(logits, targets) # == F.cross_entropy on gathered logits
"""

from __future__ import annotations

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.autograd import Node, is_grad_enabled
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.device_mesh import resolve_group_or_mesh

__all__ = ["vocab_parallel_cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def vocab_parallel_cross_entropy(vocab_parallel_logits, target, ignore_index: int = -100,
                                 reduction: str = "mean", label_smoothing: float = 0.0,
                                 process_group=None) -> Tensor:
    """Cross-entropy of logits whose last (class) dimension is split across ``process_group``.

    Args:
        vocab_parallel_logits: ``(..., V/p)`` Tensor, this rank's vocabulary slice.
        target: integer class ids ``(...)`` over the *whole* vocabulary (same on every rank).
        ignore_index: targets equal to it add nothing (and are not counted by ``"mean"``).
        reduction: ``"mean"`` (default, as ``F.cross_entropy``), ``"sum"`` or ``"none"``
            (Megatron's per-token losses, shape of ``target``).
        process_group: the tensor-parallel group (ProcessGroup, 1-d DeviceMesh, None = world).

    Example::

        logits = model(idx)                                    # (B, T, V / tp): this rank's vocabulary slice
        loss = vocab_parallel_cross_entropy(logits, targets, process_group=tp_group)
        loss.backward()
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"vocab_parallel_cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if label_smoothing:
        raise NotImplementedError("vocab_parallel_cross_entropy: label_smoothing is not implemented; "
                                  "use label_smoothing=0.0")
    group = resolve_group_or_mesh(process_group, "vocab_parallel_cross_entropy")
    logits = vocab_parallel_logits if isinstance(vocab_parallel_logits, Tensor) else Tensor(vocab_parallel_logits)
    ld = logits.data
    xp = _xp(ld)
    td = target.data if isinstance(target, Tensor) else target
    td = xp.asarray(td)
    if td.dtype.kind not in "iu":
        raise TypeError(f"vocab_parallel_cross_entropy: target must hold integer class ids, got dtype {td.dtype}")
    if tuple(td.shape) != tuple(ld.shape[:-1]):
        raise ValueError(f"vocab_parallel_cross_entropy: target shape {tuple(td.shape)} must equal the logits' "
                         f"shape without the class dim, {tuple(ld.shape[:-1])}")
    per = ld.shape[-1]
    vocab = per * group.size()
    start = group.rank() * per
    lm = ld.reshape(-1, per)
    t = td.reshape(-1)
    valid = t != ignore_index
    if bool(((t < 0) | (t >= vocab))[valid].any()):
        raise IndexError(f"vocab_parallel_cross_entropy: targets must be in [0, {vocab}) or ignore_index")
    n = lm.shape[0]

    row_max = lm.max(axis=-1) if per else xp.full(n, -xp.inf, dtype=ld.dtype)
    row_max = xp.ascontiguousarray(row_max)
    if group.size() > 1:
        group.backend.allreduce(row_max, ReduceOp.MAX)
    shifted = lm - row_max[:, None]
    exp = xp.exp(shifted)
    mine = valid & (t >= start) & (t < start + per)
    rows = xp.arange(n)
    local_t = xp.where(mine, t - start, 0)
    both = xp.empty((2, n), dtype=ld.dtype)
    both[0] = exp.sum(axis=-1)
    both[1] = xp.where(mine, shifted[rows, local_t], 0)
    if group.size() > 1:
        group.backend.allreduce(both, ReduceOp.SUM)
    sum_exp, target_logit = both[0], both[1]
    losses = xp.where(valid, xp.log(sum_exp) - target_logit, 0).astype(ld.dtype)
    count = int(valid.sum())
    if reduction == "mean":
        out = xp.asarray(losses.sum() / count if count else xp.nan, dtype=ld.dtype)
    elif reduction == "sum":
        out = xp.asarray(losses.sum(), dtype=ld.dtype)
    else:
        out = losses.reshape(td.shape)

    result = Tensor._wrap(out)
    if logits.requires_grad and is_grad_enabled():
        def backward(grad):
            g = xp.asarray(grad)
            probs = exp / sum_exp[:, None]
            probs[rows[mine], local_t[mine]] -= 1
            probs[~valid] = 0
            if reduction == "none":
                scale = g.reshape(-1)[:, None]
            elif reduction == "mean":
                scale = g / count
            else:
                scale = g
            return ((probs * scale).astype(ld.dtype).reshape(ld.shape),)

        result.grad_fn = Node(backward, (logits,), "VocabParallelCrossEntropy")
        result.requires_grad = True
    return result
