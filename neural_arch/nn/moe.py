"""A mixture-of-experts layer (Switch/GShard style): a router picks ``top_k`` experts per token.

``MoE(embed_dim, num_experts, top_k=2)`` maps ``(..., embed_dim)`` to the same shape:

1. **route**: ``router`` (a bias-free ``Linear`` to ``num_experts`` logits), softmax, the ``top_k``
   most probable experts per token (ties go to the lowest expert index), gates = those
   probabilities renormalised to sum to one (``normalize_gates=False`` keeps the raw
   probabilities, Switch's top-1 rule: then the router also learns from the main loss);
2. **capacity** (only with ``capacity_factor``): each expert takes at most
   ``ceil(capacity_factor * tokens * top_k / num_experts)`` assignments (exact arithmetic on the
   factor's decimal form, not float rounding), ``tokens`` counted over
   the *whole* batch (every data-parallel rank's tokens once expert parallelism is on). The
   assignments are served in one fixed order: all first choices before all second choices
   (GShard), and within one choice level by the token's **global index** in the batch: sequence
   by sequence (under data parallelism rank 0's sequences, then rank 1's, ...), and inside a
   sequence by global position. The rule does not depend on the sequence layout: under context
   parallelism (a rank holds chunks of each sequence, e.g. the head-tail layout) the placement
   knows each local token's global position (``placement.token_segments``) and the tokens are
   served as one process would serve the whole sequence. An assignment past its expert's
   capacity is **dropped**: its share of the output is the token itself, so a token whose every
   choice is dropped passes through unchanged (with renormalised gates);
3. **experts**: ``moe.experts`` is a ``ModuleList`` of MLPs (``fc1`` -> GELU -> ``fc2``); each
   runs once on all the tokens routed to it (also on none: every expert is in every graph);
4. **combine**: ``sum_j gate_j * expert_j(x)`` (or ``gate_j * x`` for a dropped assignment).

After each forward ``moe.aux_loss`` is a Tensor in the graph, already scaled by its coefficients:
``aux_loss_coef * E * sum_e f_e * P_e`` (the Switch/GShard load-balancing loss: ``f_e`` the
fraction of the ``tokens * top_k`` choices that picked expert ``e``, before capacity; ``P_e`` the
mean router probability of ``e``) plus ``z_loss_coef * mean(logsumexp(logits) ** 2)`` (the
router z-loss of ST-MoE). Add it to the training loss, or set ``aux_loss_backward_scale``
(Megatron-core's way, for pipelines whose stages only back-propagate activation gradients): the
layer's output then carries the aux loss through :class:`MoEAuxLossAutoScaler`, which
back-propagates it, times that scale, whenever the output's gradient flows; do not add it to the
loss then.

Expert parallelism (``neural_arch.distributed.expert_parallel.parallelize_moe``) replaces the
layer's placement object (``moe.placement``): the statistics above then cover the whole
data-parallel batch and the experts live on different ranks; the result is the same numbers.

Example::

    >>> import numpy as np
    >>> from neural_arch import Tensor, nn
    >>> moe = nn.MoE(embed_dim=8, num_experts=4, top_k=2)
    >>> y = moe(Tensor(np.ones((2, 3, 8), dtype=np.float32)))
    >>> y.shape, moe.aux_loss.shape
    ((2, 3, 8), ())
"""

from __future__ import annotations

import math
from collections import OrderedDict
from fractions import Fraction

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import Node, is_grad_enabled
from neural_arch.core.ops_activation import exp, log, softmax
from neural_arch.core.ops_shape import concatenate
from neural_arch.core.tensor import Tensor
from neural_arch.nn.activation import GELU
from neural_arch.nn.container import ModuleList, Sequential
from neural_arch.nn.linear import Linear
from neural_arch.nn.module import Module

__all__ = ["LocalPlacement", "MoE", "MoEAuxLossAutoScaler", "apply_experts", "route_counts", "route_segments"]


def _topk_lowest_index(xp, probs, k: int):
    """Indices of the ``k`` largest entries of each row, ties broken towards the lowest index."""
    # A stable sort of -p keeps equal probabilities in index order: the documented tie rule.
    try:
        order = xp.argsort(-probs, axis=-1, kind="stable")
    except TypeError:  # an array module whose argsort has no ``kind``: its sort is stable
        order = xp.argsort(-probs, axis=-1)
    return order[:, :k]


def route_counts(table: np.ndarray, rank: int, capacity: int | None):
    """Capacity bookkeeping for one batch, from the choice counts of every rank.

    ``table[r, j, e]`` is how many of rank ``r``'s tokens chose expert ``e`` as their ``j``-th choice.
    Returns ``(offset, kept)``: ``offset[j, e]`` is the number of assignments served before this
    rank's level-``j`` choices of ``e`` (all earlier levels of every rank, then level ``j`` of the
    lower ranks) and ``kept[r, e]`` how many of rank ``r``'s assignments expert ``e`` serves.

    >>> t = np.array([[[2, 0]], [[1, 1]]])       # 2 ranks, top-1, 2 experts
    >>> off, kept = route_counts(t, rank=1, capacity=2)
    >>> off.tolist(), kept.tolist()
    ([[2, 0]], [[2, 0], [0, 1]])
    """
    level_total = table.sum(axis=0)                                  # (k, E)
    before_level = np.cumsum(level_total, axis=0) - level_total      # earlier choice levels
    before_rank = np.cumsum(table, axis=0) - table                   # lower ranks, same level
    offsets = before_level[None] + before_rank                       # (R, k, E)
    if capacity is None:
        kept = table.sum(axis=1)
    else:
        kept = np.clip(capacity - offsets, 0, table).sum(axis=1)
    return offsets[rank], kept


def route_segments(counts: np.ndarray, keys: np.ndarray, owners: np.ndarray, num_ranks: int,
                   capacity: int | None):
    """Capacity bookkeeping when each rank's tokens are several runs of the batch's global order.

    A *segment* is a run of one rank's tokens (in its flat order) that is also consecutive in the
    batch's global order (under context parallelism: one sequence's chunk). ``counts[s, j, e]``
    is how many of segment ``s``'s tokens chose expert ``e`` as their ``j``-th choice,
    ``keys[s]`` a row that sorts the segments into global order (``np.lexsort`` on its columns,
    the first column most significant) and ``owners[s]`` the rank holding it. The assignments are
    served level by level, inside a level in global order. Returns ``(offsets, kept)``:
    ``offsets[s, j, e]`` assignments are served before segment ``s``'s level-``j`` choices of
    ``e``, and ``kept[r, e]`` is how many of rank ``r``'s assignments expert ``e`` serves.

    >>> counts = np.array([[[1, 0]], [[1, 0]], [[1, 1]]])   # 3 segments, top-1, 2 experts
    >>> keys = np.array([[1, 0], [0, 0], [0, 4]])           # global order: segments 1, 2, 0
    >>> off, kept = route_segments(counts, keys, np.array([0, 1, 1]), num_ranks=2, capacity=1)
    >>> off[:, 0].tolist(), kept.tolist()
    ([[2, 1], [0, 0], [1, 0]], [[0, 0], [1, 1]])
    """
    order = np.lexsort(keys.T[::-1])                                 # segments in global order
    level_total = counts.sum(axis=0)                                 # (k, E)
    before_level = np.cumsum(level_total, axis=0) - level_total      # earlier choice levels
    sorted_counts = counts[order]
    before = np.empty_like(counts)
    before[order] = np.cumsum(sorted_counts, axis=0) - sorted_counts  # earlier segments, same level
    offsets = before_level[None] + before                            # (S, k, E)
    served = counts if capacity is None else np.clip(capacity - offsets, 0, counts)
    kept = np.zeros((num_ranks, counts.shape[-1]), dtype=np.int64)
    np.add.at(kept, np.asarray(owners, dtype=np.int64), served.sum(axis=1))
    return offsets, kept


class LocalPlacement:
    """Every expert in this process and statistics over this process's batch (the default).

    The three methods are what expert parallelism replaces (composition, not a subclass of
    ``MoE``): ``count_table`` (every rank's choice counts), ``sum_stats`` (a sum over the
    batch's ranks, differentiable) and ``run_experts`` (experts applied to grouped rows).

    Example::

        >>> from neural_arch import nn
        >>> moe = nn.MoE(embed_dim=8, num_experts=4, top_k=2)
        >>> type(moe.placement).__name__
        'LocalPlacement'
    """

    expert_ids: tuple | None = None  # None: all experts, in order

    def count_table(self, local_counts: np.ndarray):
        """``(table, rank)``: the choice counts of every rank of the batch, and this rank's row."""
        return local_counts[None], 0

    def sum_stats(self, t: Tensor, local: bool) -> Tensor:
        """``t`` summed over the ranks that share the batch (here: one)."""
        return t

    def run_experts(self, moe: MoE, rows: Tensor, kept: np.ndarray, rank: int) -> Tensor:
        """Rows grouped by expert (``kept[rank, e]`` rows for expert ``e``) -> the experts' outputs."""
        return apply_experts(moe.experts, rows, [int(c) for c in kept[rank]])

    def token_segments(self, lead_shape: tuple):
        """None: this rank's tokens, in flat order, are one run of the batch's global order (no
        context parallelism). A placement whose ranks hold chunks of sequences returns
        ``(starts, keys)`` instead (see :func:`route_segments`) and implements ``gather_segments``."""


def apply_experts(experts, rows: Tensor, counts) -> Tensor:
    """Run ``experts[i]`` on the next ``counts[i]`` rows of ``rows``; concatenate the outputs.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.nn.moe import apply_experts
        >>> experts = [nn.Linear(4, 4), nn.Linear(4, 4)]
        >>> apply_experts(experts, na.ones(5, 4), [3, 2]).shape      # 3 rows to expert 0, 2 to expert 1
        (5, 4)
    """
    outs, start = [], 0
    for expert, c in zip(experts, counts):
        outs.append(expert(rows[start:start + c]))     # also on zero rows: every expert in the graph
        start += c
    return concatenate(outs, axis=0) if len(outs) > 1 else outs[0]


class MoEAuxLossAutoScaler:
    """Megatron-core's ``MoEAuxLossAutoScaler``: the identity on an MoE layer's output in forward;
    in backward it also back-propagates the layer's aux loss, with gradient ``scale``.

    The aux loss then reaches the router whenever the output's gradient flows, so a pipeline
    stage that only receives its output's gradient (not a loss) still trains its routers. Set the
    scale as the main loss is scaled: with ``m`` micro-batches whose losses are each multiplied
    by ``1 / m`` before backward, ``scale = 1 / m`` makes the accumulated gradient that of
    ``mean_i(loss_i + aux_i)``. ``scale=None`` uses the class-wide ``main_loss_backward_scale``
    (1.0 until :meth:`set_loss_scale`, Megatron's API).

    Example::

        >>> import numpy as np
        >>> from neural_arch import Tensor
        >>> x = Tensor(np.ones(2), requires_grad=True)
        >>> aux = (x * x).sum()                     # stands for a router's aux loss
        >>> y = MoEAuxLossAutoScaler.apply(x * 3.0, aux, scale=0.5)
        >>> y.sum().backward()                      # d/dx (3x) + 0.5 * d/dx (x . x)
        >>> x.grad.tolist()
        [4.0, 4.0]
    """

    main_loss_backward_scale: float = 1.0

    @staticmethod
    def apply(output: Tensor, aux_loss: Tensor, scale: float | None = None) -> Tensor:
        """``output`` unchanged, with ``aux_loss`` (a scalar Tensor) attached for backward."""
        s = MoEAuxLossAutoScaler.main_loss_backward_scale if scale is None else float(scale)
        out = Tensor._wrap(output.data)
        if not is_grad_enabled() or not (output.requires_grad or aux_loss.requires_grad):
            return out
        xp = _backend.get_array_module(aux_loss.data)

        def backward(g):
            # the aux loss's seed: ``scale`` (a fresh array every time: the engine may keep it)
            return g, xp.full(aux_loss.data.shape, s, dtype=aux_loss.data.dtype)

        out.grad_fn = Node(backward, (output if output.requires_grad else None,
                                      aux_loss if aux_loss.requires_grad else None),
                           "MoEAuxLossAutoScaler", fresh=False)
        out.requires_grad = True
        return out

    @classmethod
    def set_loss_scale(cls, scale: float) -> None:
        """The scale :meth:`apply` uses when given none (Megatron sets ``loss_scale / num_microbatches``).

        >>> MoEAuxLossAutoScaler.set_loss_scale(1.0)
        """
        cls.main_loss_backward_scale = float(scale)


class MoE(Module):
    """Mixture of experts on ``(..., embed_dim)`` inputs; see the module docstring for the rules.

    Args:
        embed_dim: width of the tokens.
        num_experts: number of expert MLPs (``moe.experts``).
        top_k: experts per token (1 <= top_k <= num_experts).
        hidden_dim: width of each expert's hidden layer (default ``4 * embed_dim``).
        capacity_factor: ``None`` (default) drops nothing; otherwise each expert serves at most
            ``ceil(capacity_factor * tokens * top_k / num_experts)`` assignments.
        aux_loss_coef: weight of the load-balancing loss in ``moe.aux_loss``.
        z_loss_coef: weight of the router z-loss in ``moe.aux_loss``.
        normalize_gates: renormalise the top-k probabilities to sum to one (default, as asked by
            GShard/Mixtral); ``False`` keeps the raw probabilities (Switch).
        aux_loss_backward_scale: ``None`` (default): add ``moe.aux_loss`` to the loss yourself. A
            number: the output carries the aux loss (:class:`MoEAuxLossAutoScaler`), back-propagated
            with that gradient whenever the output's gradient flows (pipeline stages); then do not
            add it to the loss. The attribute of that name may be changed at any time.

    Attributes after a forward: ``aux_loss`` (Tensor, scalar), ``tokens_per_expert`` (NumPy
    array: choices per expert over the batch, before capacity) and ``dropped`` (assignments
    dropped by capacity, over the batch).

    Example::

        >>> import numpy as np
        >>> from neural_arch import Tensor
        >>> moe = MoE(4, num_experts=2, top_k=1, capacity_factor=1.0)
        >>> moe(Tensor(np.ones((5, 4)))).shape
        (5, 4)
    """

    def __init__(self, embed_dim: int, num_experts: int, top_k: int = 2, hidden_dim: int | None = None,
                 capacity_factor: float | None = None, aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0,
                 normalize_gates: bool = True, aux_loss_backward_scale: float | None = None):
        super().__init__()
        if int(embed_dim) <= 0 or int(num_experts) <= 0:
            raise ValueError(f"MoE: embed_dim ({embed_dim}) and num_experts ({num_experts}) must be positive")
        if not 1 <= int(top_k) <= int(num_experts):
            raise ValueError(f"MoE: top_k={top_k} must be between 1 and num_experts={num_experts}")
        if capacity_factor is not None and not 0 < capacity_factor < math.inf:
            raise ValueError(f"MoE: capacity_factor={capacity_factor} must be finite and > 0 (or None: drop nothing)")
        self.embed_dim, self.num_experts, self.top_k = int(embed_dim), int(num_experts), int(top_k)
        self.hidden_dim = int(hidden_dim) if hidden_dim is not None else 4 * self.embed_dim
        self.capacity_factor = None if capacity_factor is None else float(capacity_factor)
        self.aux_loss_coef, self.z_loss_coef = float(aux_loss_coef), float(z_loss_coef)
        self.normalize_gates = bool(normalize_gates)
        #: None, or the gradient with which the output's backward also back-propagates ``aux_loss``
        self.aux_loss_backward_scale = None if aux_loss_backward_scale is None else float(aux_loss_backward_scale)
        self.router = Linear(self.embed_dim, self.num_experts, bias=False)
        self.experts = ModuleList([
            Sequential(OrderedDict(fc1=Linear(self.embed_dim, self.hidden_dim), act=GELU(),
                                   fc2=Linear(self.hidden_dim, self.embed_dim)))
            for _ in range(self.num_experts)])
        #: where the experts live and over which ranks statistics are taken (see LocalPlacement)
        self.placement = LocalPlacement()
        #: whether the aux statistics are each rank's own (Megatron's) rather than the whole
        #: data-parallel batch's (the default, False)
        self.local_aux_loss = False
        self.aux_loss: Tensor | None = None
        self.tokens_per_expert: np.ndarray | None = None
        self.dropped = 0

    def capacity(self, tokens: int) -> int | None:
        """Assignments one expert may serve in a batch of ``tokens`` tokens (None: unlimited).

        Exact arithmetic on the factor as written (its shortest decimal form): in floats
        ``1.1 * 100 / 2`` is ``55.00000000000001`` and its ceiling 56, one more than the rule says.

        >>> MoE(4, num_experts=2, top_k=1, capacity_factor=1.1).capacity(100)
        55
        """
        if self.capacity_factor is None:
            return None
        factor = Fraction(repr(float(self.capacity_factor)))
        return math.ceil(factor * tokens * self.top_k / self.num_experts)

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = Tensor(x)
        shape = tuple(x.shape)
        if not shape or shape[-1] != self.embed_dim:
            raise ValueError(f"MoE: expected inputs of shape (..., {self.embed_dim}), got {shape}")
        E, k = self.num_experts, self.top_k
        flat = x.reshape(-1, self.embed_dim)
        n = flat.shape[0]
        xp = _backend.get_array_module(flat.data)
        logits = self.router(flat)
        probs = softmax(logits, axis=-1)
        idx = _topk_lowest_index(xp, probs.data, k)                          # (n, k)
        idx_np = np.asarray(_backend.to_host(idx), dtype=np.int64)
        rows = np.arange(n)[:, None]
        top = probs[rows, idx_np]                                            # (n, k), in the graph
        gates = top / top.sum(axis=-1, keepdims=True) if self.normalize_gates else top

        # -- capacity: positions of this rank's assignments in the batch-wide serving order
        local = np.stack([np.bincount(idx_np[:, j], minlength=E) for j in range(k)]).astype(np.int64)
        table, rank = self.placement.count_table(local)                      # (R, k, E)
        total_tokens = int(table[:, 0, :].sum())
        cap = self.capacity(total_tokens)
        segments = None if cap is None else self.placement.token_segments(shape[:-1])
        if segments is not None:          # this rank's tokens are several runs of the global order
            keep, kept = self._keep_by_segments(idx_np, segments, cap)
        else:
            offsets, kept = route_counts(table, rank, cap)
            keep = np.ones((n, k), dtype=bool)
            if cap is not None:
                for j in range(k):
                    onehot = idx_np[:, j, None] == np.arange(E)
                    before = np.cumsum(onehot, axis=0) - onehot              # earlier tokens, same expert
                    pos = offsets[j, idx_np[:, j]] + before[np.arange(n), idx_np[:, j]]
                    keep[:, j] = pos < cap
        self.tokens_per_expert = table.sum(axis=(0, 1))
        self.dropped = int(table.sum() - kept.sum())

        self.aux_loss = self._aux_loss(logits, probs, table, local, n, total_tokens)

        # -- dispatch: kept assignments grouped by expert (token order inside each expert)
        a_tok = np.repeat(np.arange(n), k)
        a_exp = idx_np.reshape(-1)
        chosen = np.flatnonzero(keep.reshape(-1))
        order = chosen[np.argsort(a_exp[chosen], kind="stable")]
        expert_in = flat[a_tok[order]]
        expert_out = self.placement.run_experts(self, expert_in, kept, rank)

        # -- combine: each assignment's row (a zero row for a dropped one), weighted by its gate
        slot = np.full(n * k, len(order), dtype=np.int64)
        slot[order] = np.arange(len(order))
        zero = Tensor._wrap(xp.zeros((1, self.embed_dim), dtype=expert_out.data.dtype))
        per_choice = concatenate([expert_out, zero], axis=0)[slot].reshape(n, k, self.embed_dim)
        out = (per_choice * gates.reshape(n, k, 1)).sum(axis=1)
        if not keep.all():
            dropped = xp.asarray((~keep).astype(flat.data.dtype))
            out = out + flat * (gates * dropped).sum(axis=-1, keepdims=True)
        out = out.reshape(*shape)
        if self.aux_loss_backward_scale is not None:
            out = MoEAuxLossAutoScaler.apply(out, self.aux_loss, self.aux_loss_backward_scale)
        return out

    def _keep_by_segments(self, idx_np: np.ndarray, segments, cap: int):
        """``(keep, kept)`` when this rank's tokens are runs of the global order (context parallelism).

        ``segments = (starts, keys)``: run ``i`` is flat tokens ``starts[i] .. starts[i+1]`` with
        sort key ``keys[i]``. One all-gather of every rank's per-run choice counts, then
        :func:`route_segments` serves them in global order."""
        n, k = idx_np.shape
        E = self.num_experts
        starts, keys = segments
        run = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))     # token -> its run
        onehot = (idx_np[:, :, None] == np.arange(E)).astype(np.int64)            # (n, k, E)
        counts = np.add.reduceat(onehot, starts, axis=0) if n else np.zeros((0, k, E), dtype=np.int64)
        all_counts, all_keys, owners, first, ranks = self.placement.gather_segments(counts, keys)
        offsets, kept = route_segments(all_counts, all_keys, owners, ranks, cap)
        # earlier tokens of the same run with the same choice, at the same level
        before = np.cumsum(onehot, axis=0) - onehot
        if n:
            before -= before[starts][run]                                         # ... inside its run
        pos = offsets[first + run] + before                                       # (n, k, E)
        keep = np.take_along_axis(pos, idx_np[:, :, None], axis=2)[:, :, 0] < cap
        return keep, kept

    def _aux_loss(self, logits, probs, table, local, n: int, total_tokens: int) -> Tensor:
        """Load-balancing loss + router z-loss, from batch-wide statistics (or this rank's)."""
        xp = _backend.get_array_module(probs.data)
        dtype = probs.data.dtype
        if self.aux_loss_coef == 0 and self.z_loss_coef == 0:
            return Tensor._wrap(xp.zeros((), dtype=dtype))
        E, k = self.num_experts, self.top_k
        # Sums first, one (differentiable) all-reduce for both, divisions after.
        stats = [probs.sum(axis=0)]
        if self.z_loss_coef:
            m = xp.max(logits.data, axis=-1, keepdims=True)                 # a constant shift
            lse = log(exp(logits - m).sum(axis=-1)) + m.reshape(-1)
            stats.append((lse * lse).sum().reshape(1))
        summed = self.placement.sum_stats(concatenate(stats, axis=0) if len(stats) > 1 else stats[0],
                                          local=self.local_aux_loss)
        counts, tokens = (local[None], n) if self.local_aux_loss else (table, total_tokens)
        if tokens == 0:
            return (summed * 0.0).sum()     # keeps the graph; nothing to balance in an empty batch
        frac = xp.asarray((counts.sum(axis=(0, 1)) / (tokens * k)).astype(dtype))
        loss = (summed[:E] * frac).sum() * (self.aux_loss_coef * E / tokens)
        if self.z_loss_coef:
            loss = loss + summed[E] * (self.z_loss_coef / tokens)
        return loss

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"hidden_dim={self.hidden_dim}, capacity_factor={self.capacity_factor}")
