"""``estimate(model, strategy=..., world_size=...)``: bytes per rank of one training step, by category.

The memory model of this project's strategies, written from what their code allocates and checked
against ``tracemalloc`` (``benchmarks/bench_memory.py`` prints estimate against measurement per
category at N = 1, 2, 4; ``tests/memory/test_estimate.py`` holds the 10% line at N = 2).

Symbols (bytes; ``s`` the parameter dtype's size, so ``Ψ`` parameters take ``P = sΨ``):

* ``P`` the parameters, ``G = P`` their gradients, ``K`` the optimizer's state arrays per parameter
  (Adam/AdamW 2, SGD with momentum 1, SGD 0), so ``O = K·P``; ``N`` the world size.
* ``A`` the activations the forward keeps (:mod:`neural_arch.memory.gpt_activations` for ``nn.GPT``).
* ``pair(xs)``: Adam's scratch. Its step allocates one parameter-sized temporary per parameter,
  and the previous parameter's is still bound to a local variable while the next one is made, so
  two consecutive ones coexist: the largest sum of two neighbours in the optimizer's order.
* ``u_root``, ``u_blk``: FSDP's units (the GPT's blocks, and the root holding the rest), padded
  to a multiple of ``N``; ``g_max``: the largest single gradient.

Each strategy's three phases (a phase is what coexists at its worst moment; the peak is the
largest phase; the sharded terms are the worst rank's):

================  =============================================================================
strategy          formula
================  =============================================================================
``ddp``           buckets ``B = P`` (a copy of the gradients; 0 with ``gradient_as_bucket_view``).
                  forward ``P + O + B + A``; backward ``P + O + B + max(A, G)``;
                  optimizer ``P + O + B + G + pair(params)``. ZeRO's "2Ψ + 2Ψ + KΨ" (fp16
                  parameters and gradients, K = 12 for fp32 master weights and Adam) is the
                  ``P + G + O`` part; here the parameters are the master copy, so it is
                  ``sΨ + sΨ + 2sΨ`` with Adam, and DDP's buckets add one more ``sΨ``. ZeRO-1/2/3
                  divide the ``KΨ``, then the gradients, then the parameters by ``N``.
``zero1``         as DDP with ``O/N`` (the greedy largest-first partition's worst rank, ``O_r``);
                  after the step each owner broadcasts its partition as one flat array, and the
                  previous owner's is still alive when the next is made: ``2·P/N`` (``P`` at N = 1).
                  optimizer ``P + G + O_r + B + max(pair(own params), broadcast)``.
``zero2``         no DDP; buckets of 25 MiB reduce-scattered in backward, a flat master shard per
                  bucket (``S = P/N``, so parameters ``P + S``), gradients ``S``, state ``K·S``.
                  forward ``P + S + O + A``; backward ``P + S + O + max(A, P_buckets + S)``;
                  optimizer ``P + S + O + S + max(pair(shards), two buckets all-gathered)``.
``fsdp``          FSDP1 FULL_SHARD, flat units: parameters, gradients, state ``P/N, G/N, O/N``;
                  at N > 1 the forward holds the root unit and one block gathered (the root's
                  forward encloses the blocks'): forward ``3P/N + A + u_root + u_blk``. Backward
                  starts with the root gathered, the next block prefetched (``BACKWARD_PRE``;
                  none with ``"post"``), the activations and one full gradient plus the
                  transport's copy of it (``2·g_max``), and ends with ``G/N``, two blocks (one
                  with ``"post"``) and one block gradient: the larger of the two. Optimizer
                  ``3P/N + G/N + pair(unit shards)``. At N = 1 nothing is gathered (views of
                  the shard): backward ``P + O + G + g_max``.
``fully_shard``   FSDP2: each parameter sharded on dim 0 (``torch.chunk``: the worst rank holds
                  ``ceil(d0/N)`` rows; shards ``S = P/N``), gathered per module it wraps (the GPT's
                  blocks and the root) into a buffer through the all-gather's output table (both
                  exist while a unit is gathered: ``2·u``); the root stays gathered from its forward
                  to the end of the backward, as in torch; gradients are whole per module until one
                  reduce-scatter of a packed copy (``2·u``). Forward ``3S + A + u_root + u_blk +
                  u_blk`` (``reshard_after_forward=False``: every block stays gathered,
                  ``+ Σ u_blk`` instead of one); backward ``3S + A + 2·u_root + 2·u_blk`` (the
                  current block and the next one's table; kept: ``Σ u_blk``) ``+ 2·u_blk`` (the
                  current block's gradients and the reduce-scatter's input) ``+ 2·u_blk/N`` (its
                  output and the sharded gradients copied from it); optimizer
                  ``3S + S + pair(shards)``. One rank gathers too (no views of the shard).
``tp``            Megatron's plan for the GPT (``parallelize_gpt``): q/k/v, ``fc1``, ``out_proj``,
                  ``fc2`` weights, the token embedding and the head sharded ``1/t``, LayerNorms,
                  the position embedding and the row-parallel biases replicated: ``P_t`` per rank
                  (Megatron's ``(2 + 2 + 12)Ψ/t`` bytes per parameter in mixed precision is the
                  same sum with fp16 parameters and gradients and fp32 master weights + Adam).
                  forward ``P_t + O_t + A_t``; backward ``P_t + O_t + max(A_t, G_t)``; optimizer
                  ``P_t + O_t + G_t + pair``. ``A_t`` shards the column-parallel activations (and adds
                  the styles' whole copies: :mod:`~neural_arch.memory.gpt_activations`).
``pp``            ``N`` stages, blocks split evenly (``pipeline(balance="layers")``: the first stage also
                  holds the embeddings, the last the final LayerNorm and head); a stage keeps the
                  activations ``A_mb`` of the micro-batches in flight, ``k``: all ``M`` under GPipe,
                  ``min(M, N - stage)`` under 1F1B. Forward ``P_s + O_s + k·A_mb``; backward
                  ``P_s + O_s + max(k·A_mb, G_s, G_s + (k' - 1)·A_mb + A_mb + g_max)``: from the second
                  micro-batch's backward on the gradients exist, a new one is made whole before it
                  is added in (``g_max``, the stage's largest), and ``k' = min(k, M - 1)`` (GPipe
                  ``M - 1``) micro-batches are still alive; optimizer ``P_s + O_s + G_s + pair``.
                  The worst stage.
================  =============================================================================

What it leaves out, knowingly: the backend's own staging buffers (gloo's ring for large
messages on 3+ ranks copies through a receive buffer: ZeRO-1 at N = 4 measures one more
partition than modelled), the allocator's pools and fragmentation (NumPy returns memory to the
OS; CuPy's pool keeps it), and on GPU the CUDA context and cuBLAS workspaces.

Example::

    >>> from neural_arch import memory, nn
    >>> model = nn.GPT(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32)
    >>> ddp = memory.estimate(model, strategy="ddp", world_size=4, batch=2, seq=16)
    >>> fsdp = memory.estimate(model, strategy="fsdp", world_size=4, batch=2, seq=16)
    >>> fsdp.total < ddp.total, ddp.optimizer_state == 2 * ddp.parameters
    (True, True)
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from neural_arch.memory.gpt_activations import gpt_activation_bytes, gpt_shape, is_gpt
from neural_arch.memory.result import MemoryEstimate

__all__ = ["STRATEGIES", "estimate"]

#: the strategies :func:`estimate` knows
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "fully_shard", "tp", "pp")

#: optimizer -> (state arrays per parameter, whether its step allocates Adam's per-parameter scratch)
_OPTIMIZERS = {"adam": (2, True), "adamw": (2, True), "sgd": (0, False), "sgd_momentum": (1, False)}

_BUCKET_CAP = 25 * 2**20          # DDP's and ZeRO-2's default bucket_cap_mb
_HALF_FLOATS = {"bfloat16": 2, "float16": 2, "half": 2}


def _itemsize(param_dtype, model_params) -> int:
    if param_dtype is None:
        return int(model_params[0][1].data.dtype.itemsize) if model_params else 4
    name = getattr(param_dtype, "name", None) or str(param_dtype)
    if name in _HALF_FLOATS:
        return _HALF_FLOATS[name]
    try:
        return int(np.dtype(param_dtype).itemsize)
    except TypeError:
        raise ValueError(f"estimate: param_dtype={param_dtype!r} is not a dtype (float64, float32, bfloat16, "
                         "float16)") from None


def _optimizer(optimizer) -> tuple[int, bool]:
    key = optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", type(optimizer).__name__)
    key = key.lower().replace("-", "_")
    if key not in _OPTIMIZERS:
        raise ValueError(f"estimate: optimizer={optimizer!r} is not one of {sorted(_OPTIMIZERS)} "
                         "(or optim.Adam / optim.AdamW / optim.SGD)")
    return _OPTIMIZERS[key]


def _pair(sizes) -> int:
    """Adam's scratch: the largest sum of two neighbours (one array alone if there is only one)."""
    sizes = [int(x) for x in sizes if x]
    if not sizes:
        return 0
    return max([sizes[0]] + [a + b for a, b in pairwise(sizes)])


def _plan_buckets(sizes, cap: int) -> list[int]:
    """Bucket sizes (bytes) by DDP's rule: reverse order, a bucket closes once it holds ``cap``."""
    buckets, cur = [], 0
    for size in reversed(sizes):
        cur += size
        if cur >= cap:
            buckets.append(cur)
            cur = 0
    if cur:
        buckets.append(cur)
    return buckets


def _padded(nbytes: int, s: int, n: int) -> int:
    """``nbytes`` of elements of ``s`` bytes padded to a multiple of ``n`` elements."""
    return math.ceil(nbytes / s / n) * n * s


class _Model:
    """The parameters (name, bytes, rows) and, for a GPT, its units and activations."""

    def __init__(self, model, s: int):
        named = list(model.named_parameters())
        self.s = s
        self.names = [name for name, _ in named]
        self.sizes = [int(p.data.size) * s for _, p in named]
        self.rows = [int(p.data.shape[0]) if p.data.ndim else 1 for _, p in named]
        self.total = sum(self.sizes)
        self.gpt = is_gpt(model)
        self.model = model
        self.shape = gpt_shape(model) if self.gpt else None
        if self.gpt:
            # FSDP's units as bench_memory and the examples wrap them: one per block, the root the rest
            self.block_of = [int(n.split(".")[1]) if n.startswith("blocks.") else None for n in self.names]
        else:
            self.block_of = [None] * len(named)

    def blocks(self) -> list[list[int]]:
        """Parameter indices per block (empty for a model that is not a GPT)."""
        out: dict = {}
        for i, b in enumerate(self.block_of):
            if b is not None:
                out.setdefault(b, []).append(i)
        return [out[k] for k in sorted(out)]

    def root(self) -> list[int]:
        return [i for i, b in enumerate(self.block_of) if b is None]

    def activations(self, batch: int, seq: int, checkpointed: bool = False, **kw) -> tuple[int, int]:
        """(held at the end of the forward, held at the start of the backward): under checkpointing
        the backward reruns one block, whose activations come back on top."""
        if not self.gpt:
            return 0, 0
        a = gpt_activation_bytes(self.model, batch, seq, self.s, checkpointed=checkpointed, **kw)
        if not checkpointed:
            return a, a
        tp = kw.get("tp")
        one_block = gpt_activation_bytes(self.model, batch, seq, self.s, tp=tp, blocks=1, first_stage=False,
                                         last_stage=False)
        return a, a + one_block


def _phases(forward, backward, optimizer) -> dict:
    return {"forward": int(forward), "backward": int(backward), "optimizer": int(optimizer)}


def _parts(parameters, gradients, optimizer_state, gathered, activations, temporary, phases) -> dict:
    """The fields of a :class:`MemoryEstimate` but its strategy, world size and notes."""
    return {"parameters": int(parameters), "gradients": int(gradients), "optimizer_state": int(optimizer_state),
            "gathered": int(gathered), "activations": int(activations), "temporary": int(temporary),
            "phases": phases}


# ------------------------------------------------------------------------------ strategies
def _ddp(m: _Model, n, k, adam, a, a_b, opts):
    p = g = m.total
    o = k * p
    bucket = 0 if opts["gradient_as_bucket_view"] else p
    tmp = _pair(m.sizes) if adam else 0
    base = p + o + bucket
    return _parts(parameters=p, gradients=g, optimizer_state=o, gathered=bucket, activations=a, temporary=tmp,
                phases=_phases(base + a, base + max(a_b, g), base + g + tmp))


def _greedy_partition(sizes, n):
    """torch's ZeroRedundancyOptimizer rule: largest first, each to the rank with the fewest bytes."""
    load, owner = [0] * n, {}
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = int(np.argmin(load))
        owner[i] = r
        load[r] += sizes[i]
    return load, owner


def _zero1(m: _Model, n, k, adam, a, a_b, opts):
    p = g = m.total
    load, owner = _greedy_partition(m.sizes, n)
    worst = int(np.argmax(load))
    o = k * load[worst]
    bucket = p
    own = [m.sizes[i] for i in range(len(m.sizes)) if owner[i] == worst]
    tmp = _pair(own) if adam else 0
    # the flat array of each owner's partition; the previous owner's is still bound when the next is made
    broadcast = load[0] if n == 1 else max(x + y for x, y in pairwise(load))
    base = p + o + bucket
    return _parts(parameters=p, gradients=g, optimizer_state=o, gathered=bucket + broadcast, activations=a,
                temporary=tmp, phases=_phases(base + a, base + max(a_b, g), base + g + max(tmp, broadcast)))


def _zero2(m: _Model, n, k, adam, a, a_b, opts):
    p = m.total
    buckets = [_padded(b, m.s, n) for b in _plan_buckets(m.sizes, _BUCKET_CAP)]
    shards = [b // n for b in buckets]
    s_total = sum(shards)
    o = k * s_total
    gather = max([buckets[0]] + [x + y for x, y in pairwise(buckets)])
    tmp = _pair(shards) if adam else 0
    base = p + s_total + o
    return _parts(parameters=p + s_total, gradients=s_total, optimizer_state=o, gathered=max(sum(buckets), gather),
                activations=a, temporary=tmp,
                phases=_phases(base + a, base + max(a_b, sum(buckets) + s_total), base + s_total + max(tmp, gather)))


def _units(m: _Model, n, per_parameter: bool):
    """(root bytes, [block bytes], [shard bytes per optimizer parameter]) gathered/padded as FSDP does."""
    s = m.s
    if per_parameter:   # fully_shard: each parameter's dim 0 in torch.chunk pieces, padded to N pieces
        full = [math.ceil(r / n) * n * (size // max(r, 1)) for size, r in zip(m.sizes, m.rows)]
        shards = [f // n for f in full]

        def unit(idx):
            return sum(full[i] for i in idx)
    else:               # FSDP1: one flat parameter per unit, padded to a multiple of N
        shards = None

        def unit(idx):
            return _padded(sum(m.sizes[i] for i in idx), s, n)
    root = unit(m.root())
    blocks = [unit(idx) for idx in m.blocks()]
    if shards is None:
        shards = [b // n for b in blocks] + ([root // n] if root else [])
    return root, blocks, shards


def _fsdp(m: _Model, n, k, adam, a, a_b, opts):
    root, blocks, shards = _units(m, n, per_parameter=False)
    shard_total = sum(shards)
    p = g = shard_total
    o = k * shard_total
    # the optimizer's order of flat parameters: the two largest units are the worst neighbours
    tmp = sum(sorted(shards)[-2:]) if adam else 0
    base = p + o
    g_max = max(m.sizes) if m.sizes else 0
    blk = max(blocks, default=0)
    g_blk = max([m.sizes[i] for idx in m.blocks() for i in idx], default=g_max)
    pre = opts["backward_prefetch"] == "pre"
    if n == 1:          # a one-rank group keeps views of its shard: nothing is gathered
        gathered = 0
        phases = _phases(base + a, base + max(a_b, g + g_max), base + g + tmp)
    else:
        fwd = root + blk
        start = a_b + root + (blk if pre else 0) + 2 * g_max
        end = g + blk * (2 if pre else 1) + g_blk
        gathered = max(fwd, root + (blk if pre else 0), blk * (2 if pre else 1))
        phases = _phases(base + a + fwd, base + max(start, end), base + g + tmp)
    return _parts(parameters=p, gradients=g, optimizer_state=o, gathered=gathered, activations=a,
                temporary=max(tmp, 2 * g_max if n > 1 else g_max), phases=phases)


def _fully_shard(m: _Model, n, k, adam, a, a_b, opts):
    root, blocks, shards = _units(m, n, per_parameter=True)
    p = g = sum(shards)
    o = k * p
    tmp = _pair(shards) if adam else 0
    blk = max(blocks, default=0)
    keep = not opts["reshard_after_forward"]
    # the root stays gathered from its forward to the end of the backward (torch's rule); a unit being
    # gathered has its buffer and the all-gather's output table at once
    held_blocks = sum(blocks) if keep else blk
    gathered = root + held_blocks + blk
    # backward: the root gathered with its unsharded gradients, the current block (or all, kept) and the
    # next one's all-gather table, the current block's unsharded gradients and the reduce-scatter's input,
    # its output and the sharded gradients made from it (a shard each)
    backward = a_b + 2 * root + (sum(blocks) if keep else 2 * blk) + 2 * blk + 2 * (blk // n)
    base = p + o
    return _parts(parameters=p, gradients=g, optimizer_state=o, gathered=gathered, activations=a,
                  temporary=max(tmp, 2 * blk), phases=_phases(base + a + gathered, base + backward, base + g + tmp))


_TP_SHARDED = ("q_proj.", "k_proj.", "v_proj.", "fc1.", "out_proj.weight", "fc2.weight", "tok_emb.weight",
               "head.weight")


def _tp(m: _Model, t, k, adam, a, a_b, opts):
    sizes = [math.ceil(r / t) * (size // max(r, 1)) if any(key in name for key in _TP_SHARDED) else size
             for name, size, r in zip(m.names, m.sizes, m.rows)]
    p = g = sum(sizes)
    o = k * p
    tmp = _pair(sizes) if adam else 0
    base = p + o
    return _parts(parameters=p, gradients=g, optimizer_state=o, gathered=0, activations=a, temporary=tmp,
                phases=_phases(base + a, base + max(a_b, g), base + g + tmp))


def _pp_stage(m: _Model, stages, stage, k, adam, batch, seq, opts):
    blocks = m.blocks()
    per = [len(blocks) // stages + (1 if i < len(blocks) % stages else 0) for i in range(stages)]
    first, last = stage == 0, stage == stages - 1
    lo = sum(per[:stage])
    idx = [i for b in blocks[lo:lo + per[stage]] for i in b]
    names = ("tok_emb", "pos_emb") if first else ()
    names += ("ln_f", "head") if last else ()
    idx += [i for i in m.root() if m.names[i].split(".")[0] in names]
    idx.sort()
    sizes = [m.sizes[i] for i in idx]
    p = g = sum(sizes)
    o = k * p
    tmp = _pair(sizes) if adam else 0
    micro = opts["microbatches"]
    in_flight = micro if opts["schedule"] == "gpipe" else min(micro, stages - stage)
    one, one_b = m.activations(batch // micro, seq, opts["activation_checkpointing"], blocks=per[stage],
                               first_stage=first, last_stage=last, stage_input=True)
    a, a_b = in_flight * one, (in_flight - 1) * one + one_b
    backward = max(a_b, g)
    accumulate = 0
    if micro > 1:
        # from the second micro-batch's backward on, the gradients exist and each new one is made
        # whole before it is added in (one parameter's worth), while the micro-batches still in flight
        # keep their activations: min(in flight, M - 1) of them at the second backward
        accumulate = max(sizes, default=0)
        alive = micro - 1 if opts["schedule"] == "gpipe" else min(in_flight, micro - 1)
        backward = max(backward, g + (alive - 1) * one + one_b + accumulate)
    base = p + o
    return _parts(parameters=p, gradients=g, optimizer_state=o, gathered=0, activations=a,
                  temporary=max(tmp, accumulate), phases=_phases(base + a, base + backward, base + g + tmp))


def _pp(m: _Model, n, k, adam, batch, seq, opts):
    stages = [_pp_stage(m, n, i, k, adam, batch, seq, opts) for i in range(n)]
    return max(stages, key=lambda st: max(st["phases"].values()))


# ------------------------------------------------------------------------------ the entry point
def estimate(model, strategy: str = "ddp", world_size: int = 1, optimizer="adam", param_dtype=None,
             batch: int = 1, seq: int | None = None, *, reshard_after_forward: bool = True,
             backward_prefetch: str = "pre", gradient_as_bucket_view: bool = False, microbatches: int | None = None,
             schedule: str = "1f1b", activation_checkpointing: bool = False) -> MemoryEstimate:
    """Bytes per rank (the worst rank) of one training step of ``model`` under ``strategy``.

    Formulas: the module docstring (:mod:`neural_arch.memory.estimator`).

    Args:
        model: the model before wrapping (its parameters give ``Ψ``; an ``nn.GPT`` also gives its
            activations and FSDP's units; any other model gets activations 0 and one unit).
        strategy: ``"ddp"``, ``"zero1"``, ``"zero2"``, ``"fsdp"`` (FSDP1, FULL_SHARD, one unit per
            block), ``"fully_shard"`` (FSDP2), ``"tp"`` (Megatron, degree ``world_size``) or
            ``"pp"`` (``world_size`` stages).
        world_size: ranks (``N``; TP's degree; PP's stages).
        optimizer: ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd_momentum"`` (or the class: ``optim.Adam``).
        param_dtype: the parameters' (and the compute's) dtype; default the model's.
        batch: sequences per rank per step (per data-parallel rank; a TP group's and a pipeline's
            whole batch), ``seq`` tokens each (default the GPT's ``block_size``).
        reshard_after_forward: ``fully_shard``'s (False keeps the gathered parameters to the backward).
        backward_prefetch: ``"pre"`` (torch's default: the next unit is gathered during the current
            unit's backward) or ``"post"``; FSDP and ``fully_shard``.
        gradient_as_bucket_view: DDP's (no bucket copy of the gradients).
        microbatches: PP's micro-batches per step (default ``world_size``); ``schedule``:
            ``"1f1b"`` or ``"gpipe"``.
        activation_checkpointing: every GPT block checkpointed: the forward keeps each block's
            input only, and the backward adds one block's activations while it reruns it.

    Returns:
        :class:`~neural_arch.memory.result.MemoryEstimate`.

    Raises:
        ValueError: an unknown ``strategy``/``optimizer``/``schedule``, ``world_size < 1``,
            ``batch < 1``, a TP degree that does not divide the heads, more stages than blocks.

    Example::

        >>> from neural_arch import memory, nn
        >>> model = nn.GPT(vocab_size=128, block_size=16, n_layer=2, n_head=2, n_embd=32)
        >>> e = memory.estimate(model, strategy="zero1", world_size=2, optimizer="adam", batch=4, seq=16)
        >>> e.gradients == e.parameters == sum(p.data.nbytes for p in model.parameters())
        True
        >>> print(e)  # doctest: +ELLIPSIS
        memory.estimate: zero1, world_size 2, bytes per rank (worst rank)
        ...
    """
    if not isinstance(strategy, str) or strategy.lower() not in STRATEGIES:
        raise ValueError(f"estimate: strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    strategy = strategy.lower()
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"estimate: world_size must be an integer >= 1, got {world_size!r}")
    n = int(world_size)
    if int(batch) < 1:
        raise ValueError(f"estimate: batch must be >= 1 (sequences per rank), got {batch!r}")
    if backward_prefetch not in ("pre", "post"):
        raise ValueError(f"estimate: backward_prefetch must be 'pre' or 'post', got {backward_prefetch!r}")
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"estimate: schedule must be '1f1b' or 'gpipe', got {schedule!r}")
    k, adam = _optimizer(optimizer)
    named = list(model.named_parameters())
    s = _itemsize(param_dtype, named)
    m = _Model(model, s)
    if seq is None:
        seq = m.shape["T_max"] if m.gpt else 1
    if int(seq) < 1:
        raise ValueError(f"estimate: seq must be >= 1, got {seq!r}")
    notes = []
    if not m.gpt:
        notes.append("activations not modelled (not an nn.GPT): 0")
    elif any(getattr(getattr(b, "mlp", None), "experts", None) is not None for b in model.blocks):
        notes.append("MoE blocks: activations counted as dense MLPs")
    opts = {"reshard_after_forward": bool(reshard_after_forward), "backward_prefetch": backward_prefetch,
            "gradient_as_bucket_view": bool(gradient_as_bucket_view),
            "microbatches": int(microbatches or n), "schedule": schedule,
            "activation_checkpointing": bool(activation_checkpointing)}
    ac = opts["activation_checkpointing"]
    if strategy == "tp":
        if m.gpt and (m.shape["H"] % n or m.shape["h"] % n):
            raise ValueError(f"estimate: world_size={n} (the TP degree) must divide the heads ({m.shape['H']}) "
                             f"and the MLP width ({m.shape['h']})")
        parts = _tp(m, n, k, adam, *m.activations(batch, seq, ac, tp=n), opts)
        notes.append("TP: parallelize_gpt with loss_parallel (the logits stay sharded)")
    elif strategy == "pp":
        if m.gpt and n > m.shape["L"]:
            raise ValueError(f"estimate: world_size={n} pipeline stages is more than the {m.shape['L']} blocks")
        if opts["microbatches"] < 1 or int(batch) % opts["microbatches"]:
            raise ValueError(f"estimate: microbatches={opts['microbatches']} must be >= 1 and divide batch={batch}")
        parts = _pp(m, n, k, adam, batch, seq, opts)
    else:
        acts = m.activations(batch, seq, ac)
        if strategy == "ddp":
            parts = _ddp(m, n, k, adam, *acts, opts)
        elif strategy == "zero1":
            parts = _zero1(m, n, k, adam, *acts, opts)
        elif strategy == "zero2":
            parts = _zero2(m, n, k, adam, *acts, opts)
        else:
            parts = (_fully_shard if strategy == "fully_shard" else _fsdp)(m, n, k, adam, *acts, opts)
    return MemoryEstimate(strategy=strategy, world_size=n, notes=tuple(notes), **parts)
