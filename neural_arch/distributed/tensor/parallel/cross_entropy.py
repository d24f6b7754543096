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

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.device_mesh import resolve_group_or_mesh
from neural_arch.distributed.tensor._loss_ops import _vocab_parallel_loss

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
    per = logits.shape[-1]
    return _vocab_parallel_loss(logits, target, group, group.rank() * per, per * group.size(), ignore_index,
                                reduction)
