"""``cross_entropy`` on DTensor logits (torch's ``_ops/_math_ops.py`` NLL rules and
``torch.distributed.tensor.parallel.loss_parallel``).

Logits ``(N, C, ...)`` (or ``(C,)``) with class dim 1; per mesh dimension:

* a batch dim sharded (``Shard(d)``, ``d != 1``): each rank takes the loss of its rows; ``"none"``
  keeps the shard (``d`` renumbered), ``"sum"`` gives ``Partial()``, and ``"mean"`` gives
  ``Partial()`` of local sums over the *global* count of non-ignored targets (one all-reduce of a
  count, on the device);
* the class dim sharded (``Shard(1)``): the vocabulary-parallel loss (Megatron, torch's
  ``loss_parallel``): the row max and the sums of exponentials are all-reduced, the full logits are
  never gathered; the loss is ``Replicate`` there; class-index targets only, no label smoothing;
* ``Replicate``: the plain loss. ``Partial`` logits raise (the loss is not linear).

``target`` is a DTensor laid out like the logits' batch dims (the class dim's mesh dims
``Replicate``), or a plain array / Tensor holding the whole target on every rank (each rank takes
its rows, no communication).

Example::

    loss = cross_entropy(logits, target)     # logits Shard(0) -> loss Partial(); or Shard(1) -> Replicate()
    loss.full_tensor()                        # == F.cross_entropy on the full logits
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.autograd import Node, is_grad_enabled
from neural_arch.core.ops_loss import _CheckedLoss, _eager_checks
from neural_arch.core.ops_loss import cross_entropy as _cross_entropy
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.nn.functional import _allreduce
from neural_arch.distributed.tensor._api import DTensor, compute_local_shape_and_global_offset
from neural_arch.distributed.tensor._sharding_rules import no_rule
from neural_arch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

__all__ = ["cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def _target_piece(target, mesh, pl, shape, logits_local):
    """This rank's target rows: a DTensor's local piece (checked against ``pl``), or a cut of a
    full array."""
    xp = _xp(logits_local.data)
    if isinstance(target, DTensor):
        if target.device_mesh != mesh or tuple(target.placements) != tuple(pl) or tuple(target.shape) != shape:
            no_rule("cross_entropy", target, why=f"the target must be laid out {list(pl)} over shape {shape}, "
                                                 "like the logits' batch dims")
        return target.to_local().data
    full = xp.asarray(target.data if isinstance(target, Tensor) else target)
    if tuple(full.shape) != shape:
        return full  # a probability target (logits' shape) or a wrong one: cut below / core raises
    local, offset = compute_local_shape_and_global_offset(shape, mesh, pl)
    return full[tuple(slice(o, o + n) for o, n in zip(offset, local))]


def cross_entropy(logits: DTensor, target, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> DTensor:
    """``F.cross_entropy`` of DTensor ``logits`` (rules above); returns a DTensor.

    Example::

        cross_entropy(logits, target).full_tensor()   # == F.cross_entropy(full logits, target)
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"DTensor cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    mesh, shape = logits.device_mesh, tuple(logits.shape)
    cdim = 0 if logits.ndim == 1 else 1
    if any(isinstance(p, (Partial, _StridedShard)) for p in logits.placements):
        no_rule("cross_entropy", logits, why="the loss is not linear in Partial logits")
    tshape = shape[:cdim] + shape[cdim + 1:]
    class_k = [k for k, p in enumerate(logits.placements) if isinstance(p, Shard) and p.dim == cdim]
    batch_k = [k for k, p in enumerate(logits.placements) if isinstance(p, Shard) and p.dim != cdim]
    t_pl = [Shard(p.dim - (p.dim > cdim)) if k in batch_k else Replicate() for k, p in enumerate(logits.placements)]
    local_logits = logits.to_local()
    probs_target = not isinstance(target, DTensor) and tuple(getattr(target, "shape", ())) == shape
    if probs_target:  # soft labels of the logits' shape: cut like the logits
        xp = _xp(local_logits.data)
        full = xp.asarray(target.data if isinstance(target, Tensor) else target)
        lshape, offset = compute_local_shape_and_global_offset(shape, mesh, logits.placements)
        t_local = full[tuple(slice(o, o + n) for o, n in zip(offset, lshape))]
    else:
        t_local = _target_piece(target, mesh, t_pl, tshape, local_logits)
    xp = _xp(local_logits.data)
    if class_k:
        if len(class_k) > 1 or probs_target or label_smoothing or logits.ndim == 1:
            no_rule("cross_entropy", logits, why="a sharded class dim takes (N, C, ...) logits with class-index "
                                                 "targets and no label smoothing")
        k = class_k[0]
        _, offset = compute_local_shape_and_global_offset(shape, mesh, logits.placements)
        moved = local_logits if logits.ndim == 2 else local_logits.permute(
            0, *range(2, logits.ndim), 1)  # the class dim last
        losses = _vocab_parallel_loss(moved, t_local, mesh.get_group(k), offset[cdim], shape[cdim],
                                      ignore_index, "none")
    else:
        losses = _cross_entropy(local_logits, t_local, ignore_index=ignore_index, reduction="none",
                                label_smoothing=label_smoothing)
    if reduction == "none":
        out_pl = [Shard(p.dim - (p.dim > cdim)) if k in batch_k else Replicate()
                  for k, p in enumerate(logits.placements)]
        return DTensor(losses, mesh, out_pl, shape=tshape)
    out_pl = [Partial() if k in batch_k else Replicate() for k in range(mesh.ndim)]
    total = losses.sum()
    if reduction == "sum":
        return DTensor(total, mesh, out_pl, shape=())
    wide = xp.result_type(losses.dtype, np.float32)  # a float16 count would overflow
    if probs_target:
        count = xp.asarray(float(math.prod(tshape)), dtype=wide)
    else:
        count = (xp.asarray(t_local) != ignore_index).sum().astype(wide)
        for k in batch_k:  # the global count (an array all-reduce: no host sync)
            count = _allreduce(mesh.get_group(k), xp.reshape(count, (1,)))[0]
    # 0 / 0 = nan when every target is ignored (torch)
    with np.errstate(divide="ignore", invalid="ignore"):  # NumPy's warning; CuPy has none
        mean = total * Tensor._wrap((xp.asarray(1.0, dtype=wide) / count).astype(losses.dtype))
    return DTensor(mean, mesh, out_pl, shape=())


def _vocab_parallel_loss(logits: Tensor, target, group, start: int, vocab: int, ignore_index: int,
                         reduction: str) -> Tensor:
    """The loss of ``logits`` holding vocabulary ids ``[start, start + per)`` of ``vocab`` on this
    rank of ``group`` (Megatron's algorithm; :func:`vocab_parallel_cross_entropy` and a DTensor
    whose class dim is sharded both use it). No host sync: the target check is eager on NumPy (or
    with ``NEURAL_ARCH_EAGER_CHECKS=1``); on a device it rides on the loss like
    ``F.cross_entropy``'s and raises when the loss is read."""
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
    lm = ld.reshape(int(np.prod(ld.shape[:-1])), per)  # not -1: a rank may hold no classes (per == 0)
    t = td.reshape(-1)
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= vocab))
    eager = _eager_checks(xp)
    if eager and bool(bad.any()):
        raise IndexError(f"vocab_parallel_cross_entropy: targets must be in [0, {vocab}) or ignore_index")
    keep = valid & ~bad
    n = lm.shape[0]

    row_max = lm.max(axis=-1) if per else xp.full(n, -xp.inf, dtype=ld.dtype)
    row_max = xp.ascontiguousarray(row_max)
    if group.size() > 1:
        group.backend.allreduce(row_max, ReduceOp.MAX)
    shifted = lm - row_max[:, None]
    exp = xp.exp(shifted)
    # boolean masks select on the device (where / multiply): indexing with them would sync
    mine = keep & (t >= start) & (t < start + per)
    rows = xp.arange(n)
    local_t = xp.where(mine, t - start, 0)
    both = xp.empty((2, n), dtype=ld.dtype)
    both[0] = exp.sum(axis=-1)
    both[1] = xp.where(mine, shifted[rows, local_t], 0) if per else 0
    if group.size() > 1:
        group.backend.allreduce(both, ReduceOp.SUM)
    sum_exp, target_logit = both[0], both[1]
    losses = xp.where(keep, xp.log(sum_exp) - target_logit, 0).astype(ld.dtype)
    if not eager:
        losses = xp.where(bad, xp.nan, losses).astype(ld.dtype)  # visibly wrong until the check raises
    count = valid.sum()
    countf = xp.asarray(count).astype(xp.result_type(ld.dtype, np.float32))  # float16 would overflow
    if reduction == "mean" and eager:
        c = int(count)  # free on the host
        out = xp.asarray(losses.sum() / c if c else xp.nan, dtype=ld.dtype)
    elif reduction == "mean":
        out = xp.asarray(losses.sum() / countf, dtype=ld.dtype)  # 0/0 = nan when all are ignored, as torch
    elif reduction == "sum":
        out = xp.asarray(losses.sum(), dtype=ld.dtype)
    else:
        out = losses.reshape(td.shape)

    result = Tensor._wrap(out)
    if logits.requires_grad and is_grad_enabled():
        def backward(grad):
            g = xp.asarray(grad)
            probs = exp / sum_exp[:, None]
            if per:
                probs[rows, local_t] -= mine.astype(probs.dtype)  # local_t is 0 where not mine: minus 0
            if reduction == "none":
                scale = g.reshape(-1) * keep
            elif reduction == "mean":
                scale = (g / xp.maximum(countf, 1)) * keep
            else:
                scale = g * keep
            return ((probs * scale.reshape(-1, 1).astype(probs.dtype)).astype(ld.dtype).reshape(ld.shape),)

        result.grad_fn = Node(backward, (logits,), "VocabParallelCrossEntropy")
        result.requires_grad = True
    if not eager:
        result.__class__ = _CheckedLoss
        result.__dict__["_pending_check"] = (bad.any(), t, bad, vocab, ignore_index)
    return result
