"""The tensor-parallel plan for the project's GPT (:class:`neural_arch.nn.GPT`), Megatron style.

Per block: ``q_proj``/``k_proj``/``v_proj`` column-parallel (each rank gets ``n_head / p`` whole
heads; attention infers its local head count from the projection width), ``out_proj``
row-parallel (one all-reduce), ``mlp.fc1`` column-parallel, ``mlp.fc2`` row-parallel (one
all-reduce). The token embedding is vocabulary-parallel; the LM head is column-parallel over
the vocabulary: with ``loss_parallel=True`` its logits stay sharded ``(B, T, V/p)`` for
:func:`vocab_parallel_cross_entropy`, otherwise they are all-gathered to ``(B, T, V)``.
LayerNorms, the position embedding and the row-parallel biases are replicated; their gradients
come out identical on every rank (everything after an all-reduce is replicated computation, and
"f" all-reduces the gradient entering each parallel region), so they need no extra sync.

``sequence_parallel=True`` adds Megatron's sequence parallelism: the embeddings' dropout enters a
region sharded along the sequence (``PrepareModuleInput``), the LayerNorms run on ``T/p`` positions
(``SequenceParallel``: their gradients are all-reduced), attention and the MLP's and head's
column-parallel layers all-gather the sequence and every row-parallel layer reduce-scatters it. The sequence length must divide by
the group size. Results equal the plain plan's (and single-process training).

Example (every rank of the tp group)::

    model = nn.GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)   # same seed everywhere
    parallelize_gpt(model, mesh["tp"], loss_parallel=True)
    loss = vocab_parallel_cross_entropy(model(idx), targets, process_group=mesh["tp"])
"""

from __future__ import annotations

from neural_arch.distributed.parallel.tensor_parallel.layers import resolve_tp_group
from neural_arch.distributed.parallel.tensor_parallel.sequence_parallel import PrepareModuleInput, SequenceParallel
from neural_arch.distributed.parallel.tensor_parallel.style import (
    ColwiseParallel,
    Replicate,
    RowwiseParallel,
    Shard,
    parallelize_module,
)

__all__ = ["gpt_tp_plan", "parallelize_gpt"]


def gpt_tp_plan(loss_parallel: bool = True, sequence_parallel: bool = False) -> dict:
    """The ``{pattern: style}`` plan for :class:`neural_arch.nn.GPT` (see the module docstring)."""
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


def parallelize_gpt(model, device_mesh=None, loss_parallel: bool = True, sequence_parallel: bool = False):
    """Shard ``model`` (an ``nn.GPT``) in place with :func:`gpt_tp_plan`; returns it.

    Checks first that heads, MLP width and vocabulary divide by the group size.
    """
    group = resolve_tp_group(device_mesh, "parallelize_gpt")
    p = group.size()
    hidden = model.blocks[0].mlp.fc1.out_features if len(model.blocks) else 0
    for what, value in (("n_head", model.n_head), ("vocab_size", model.vocab_size), ("MLP width", hidden)):
        if value % p:
            raise ValueError(f"parallelize_gpt: {what} ({value}) must be divisible by the tensor-parallel "
                             f"size {p}")
    parallelize_module(model, group, gpt_tp_plan(loss_parallel, sequence_parallel))
    model.tp_group = group
    model.loss_parallel = bool(loss_parallel)
    model.sequence_parallel = bool(sequence_parallel)
    return model
