"""The tensor-parallel plan for the project's GPT (:class:`neural_arch.nn.GPT`), Megatron style.

Per block: ``q_proj``/``k_proj``/``v_proj`` column-parallel (each rank gets ``n_head / p`` whole
heads; attention infers its local head count from the projection width), ``out_proj``
row-parallel (one all-reduce), ``mlp.fc1`` column-parallel, ``mlp.fc2`` row-parallel (one
all-reduce). The token embedding is vocabulary-parallel; the LM head is column-parallel over
the vocabulary: with ``loss_parallel=True`` its logits stay sharded ``(B, T, V/p)`` for
:func:`~neural_arch.distributed.tensor.parallel.cross_entropy.vocab_parallel_cross_entropy`, otherwise
they are all-gathered to ``(B, T, V)``.
LayerNorms, the position embedding and the row-parallel biases are replicated; their gradients
come out identical on every rank (everything after an all-reduce is replicated computation, and
"f" all-reduces the gradient entering each parallel region), so they need no extra sync.

``sequence_parallel=True`` adds Megatron's sequence parallelism: the embeddings' dropout enters a
region sharded along the sequence (``PrepareModuleInput``), the LayerNorms run on ``T/p`` positions
(``SequenceParallel``: their gradients are all-reduced), attention and the MLP's and head's
column-parallel layers all-gather the sequence and every row-parallel layer reduce-scatters it. The sequence length must divide by
the group size. Results equal the plain plan's (and single-process training).

``context_parallel=True`` shards the *sequence* instead (:func:`parallelize_gpt_context_parallel`):
global positions for the position embedding, ring (or Ulysses) attention, gradients averaged over
the context-parallel group; a second call with the tp mesh dimension adds TP on top.

Generation: ``model.generate(...)`` works on the returned model (every rank, same prompt): each
rank's KV cache holds its own heads and the next token is chosen vocabulary-parallel
(:mod:`neural_arch.distributed.tensor.parallel.generation`, installed as ``model.token_selector``).

Example (every rank of the tp group)::

    model = nn.GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)   # same seed everywhere
    parallelize_gpt(model, mesh["tp"], loss_parallel=True)
    loss = vocab_parallel_cross_entropy(model(idx), targets, process_group=mesh["tp"])
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.distributed.device_mesh import DeviceMesh, resolve_group_or_mesh
from neural_arch.distributed.tensor.parallel.generation import VocabParallelTokenSelector
from neural_arch.distributed.tensor.parallel.sequence_parallel import (
    PrepareModuleInput,
    SequenceParallel,
)
from neural_arch.distributed.tensor.parallel.style import (
    ColwiseParallel,
    Replicate,
    RowwiseParallel,
    Shard,
    parallelize_module,
)

__all__ = ["gpt_tp_plan", "parallelize_gpt", "parallelize_gpt_context_parallel"]


def gpt_tp_plan(loss_parallel: bool = True, sequence_parallel: bool = False) -> dict:
    """The ``{pattern: style}`` plan for :class:`neural_arch.nn.GPT` (see the module docstring).

    Example::

        >>> plan = gpt_tp_plan()
        >>> plan["blocks.*.attn.q_proj"]
        ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=-1))
    """
    if sequence_parallel:
        seq = Shard(1)
        return {
            "tok_emb": RowwiseParallel(input_layouts=Replicate()),
            "drop": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=seq),
            "blocks.*.ln1": SequenceParallel(),
            "blocks.*.ln2": SequenceParallel(),
            # attention reads the sequence length from its input: gather the whole sequence once
            # at its entry; q/k/v then take a replicated input as in the plain plan
            "blocks.*.attn": PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate()),
            "blocks.*.attn.q_proj": ColwiseParallel(),
            "blocks.*.attn.k_proj": ColwiseParallel(),
            "blocks.*.attn.v_proj": ColwiseParallel(),
            "blocks.*.attn.out_proj": RowwiseParallel(output_layouts=seq),
            "blocks.*.mlp.fc1": ColwiseParallel(input_layouts=seq),
            "blocks.*.mlp.fc2": RowwiseParallel(output_layouts=seq),
            "ln_f": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1) if loss_parallel else Replicate()),
        }
    return {
        "tok_emb": RowwiseParallel(input_layouts=Replicate()),
        "blocks.*.attn.q_proj": ColwiseParallel(),
        "blocks.*.attn.k_proj": ColwiseParallel(),
        "blocks.*.attn.v_proj": ColwiseParallel(),
        "blocks.*.attn.out_proj": RowwiseParallel(),
        "blocks.*.mlp.fc1": ColwiseParallel(),
        "blocks.*.mlp.fc2": RowwiseParallel(),
        "head": ColwiseParallel(output_layouts=Shard(-1) if loss_parallel else Replicate()),
    }


def parallelize_gpt(model, device_mesh=None, loss_parallel: bool = True, sequence_parallel: bool = False,
                    context_parallel: bool = False, *, load_balance: bool = True, rotate: str = "p2p",
                    cp_algorithm: str = "ring"):
    """Shard ``model`` (an ``nn.GPT``) in place with :func:`gpt_tp_plan`; returns it.

    Checks first that heads, MLP width and vocabulary divide by the group size.

    ``context_parallel=True`` shards the *sequence* over ``device_mesh`` instead of the weights
    (see :func:`parallelize_gpt_context_parallel`); combine with TP by calling once per mesh
    dimension (``parallelize_gpt(m, mesh["tp"])`` then ``parallelize_gpt(m, mesh["cp"], context_parallel=True)``).

    Example::

        # the same model, built from the same seed, on every rank
        model = nn.GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)
        parallelize_gpt(model, init_device_mesh("cpu", (2,)), loss_parallel=True)
        loss = vocab_parallel_cross_entropy(model(idx), targets)
    """
    if context_parallel:
        return parallelize_gpt_context_parallel(model, device_mesh, load_balance=load_balance, rotate=rotate,
                                                algorithm=cp_algorithm)
    group = resolve_group_or_mesh(device_mesh, "parallelize_gpt")
    p = group.size()
    # the dense MLPs' width (an MoE model may have none: every block's MLP an nn.MoE, whose experts
    # are split by expert parallelism, not by this plan)
    dense = [b.mlp for b in model.blocks if hasattr(getattr(b, "mlp", None), "fc1")]
    hidden = dense[0].fc1.out_features if dense else 0
    for what, value in (("n_head", model.n_head), ("vocab_size", model.vocab_size), ("MLP width", hidden)):
        if value % p:
            raise ValueError(f"parallelize_gpt: {what} ({value}) must be divisible by the tensor-parallel "
                             f"size {p}")
    plan = gpt_tp_plan(loss_parallel, sequence_parallel)
    if not dense:
        plan = {pattern: style for pattern, style in plan.items() if ".mlp." not in pattern}
    # the mesh itself when there is one: the DTensor parameters then live on it
    parallelize_module(model, device_mesh if isinstance(device_mesh, DeviceMesh) else group, plan)
    model.tp_group = group
    # generate() chooses tokens from this rank's vocabulary shard (see tensor/parallel/generation.py)
    model.token_selector = VocabParallelTokenSelector(group, model.vocab_size, sequence_parallel=sequence_parallel)
    model.loss_parallel = bool(loss_parallel)
    model.sequence_parallel = bool(sequence_parallel)
    return model


def parallelize_gpt_context_parallel(model, device_mesh=None, *, load_balance: bool = True, rotate: str = "p2p",
                                     algorithm: str = "ring"):
    """Context parallelism for ``nn.GPT``: every rank of the group runs the model on its share of the
    sequence (``shard_sequence(idx, 1, group, load_balance)``, and the targets alike).

    * positions: the position embedding is looked up at this rank's *global* positions;
    * attention: every block's ``attn.attention_fn`` becomes ring (or Ulysses) attention over the group;
    * loss and gradients: each rank's mean loss over its tokens is the global mean's share, so every
      parameter gradient is averaged over the group as it is produced (equal to single-process
      training on the whole sequence, like DDP's averaging).

    >>> parallelize_gpt(model, mesh["cp"], context_parallel=True)  # doctest: +SKIP
    >>> logits = model(shard_sequence(idx, 1, mesh["cp"]))  # doctest: +SKIP
    >>> loss = F.cross_entropy(logits.reshape(-1, V), shard_sequence(tgt, 1, mesh["cp"]).reshape(-1))  # doctest: +SKIP
    """
    from neural_arch.distributed.nn.functional import _allreduce
    from neural_arch.distributed.tensor.experimental._attention import (
        ContextParallelAttention,
        sequence_positions,
    )

    group = resolve_group_or_mesh(device_mesh, "parallelize_gpt(context_parallel=True)")
    n, r = group.size(), group.rank()
    attend = ContextParallelAttention(group, rotate, load_balance, algorithm)
    for block in model.blocks:
        block.attn.attention_fn = attend

    def global_positions(_module, args):
        local = args[0]
        t = int(local.shape[0])
        pos = sequence_positions(t, r, n, load_balance)
        if t * n > model.block_size:
            raise ValueError(f"parallelize_gpt(context_parallel=True): the whole sequence ({t} x {n} ranks = "
                             f"{t * n}) exceeds block_size {model.block_size}")
        return (_backend.get_array_module(local).asarray(pos),) + tuple(args[1:])

    model.pos_emb.register_forward_pre_hook(global_positions)

    def average(grad):
        # this rank's tokens gave part of the gradient: average the parts (each rank's loss is a mean)
        if n == 1:
            return grad
        summed = _allreduce(group, grad.data)
        return type(grad)._wrap(summed * summed.dtype.type(1.0 / n))

    handles = [p.register_hook(average) for p in model.parameters() if p.requires_grad]
    object.__setattr__(model, "_context_parallel_handles", handles)  # not a submodule/parameter
    model.cp_group = group
    model.context_parallel = True
    return model
