"""Tensor (intra-layer) parallelism, Megatron style, with torch's ``parallelize_module`` API.

=====================  ==================================================================
module                 what
=====================  ==================================================================
``layers``             ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
``cross_entropy``      vocab_parallel_cross_entropy (no gathered logits)
``style``              parallelize_module, ColwiseParallel, RowwiseParallel, Shard, Replicate
``sequence_parallel``  SequenceParallel, PrepareModuleInput (Megatron's sequence parallelism)
``gpt``                gpt_tp_plan / parallelize_gpt for ``nn.GPT``
``generation``         VocabParallelTokenSelector, vocab_parallel_argmax (``GPT.generate`` under TP)
``sketched``           TensorParallelSKLinear, TensorParallelModel (seed 004)
``state_dict``         sharded_state_dict, full_state_dict, load_full_state_dict
``wrapper``            TensorParallel (seed 001's placeholder name)
=====================  ==================================================================

The mappings these layers use ("f", "g", scatter, gather) are in
:mod:`neural_arch.distributed.nn.functional`. Example::

    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy
    parallelize_gpt(model, tp_group)
    loss = vocab_parallel_cross_entropy(model(idx), targets, process_group=tp_group)
"""

from neural_arch.distributed.tensor.parallel.cross_entropy import vocab_parallel_cross_entropy
from neural_arch.distributed.tensor.parallel.generation import (
    VocabParallelTokenSelector,
    vocab_parallel_argmax,
)
from neural_arch.distributed.tensor.parallel.gpt import gpt_tp_plan, parallelize_gpt
from neural_arch.distributed.tensor.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from neural_arch.distributed.tensor.parallel.sequence_parallel import PrepareModuleInput, SequenceParallel
from neural_arch.distributed.tensor.parallel.sketched import (
    TensorParallelModel,
    TensorParallelSKLinear,
)
from neural_arch.distributed.tensor.parallel.state_dict import (
    ShardedArray,
    full_state_dict,
    load_full_state_dict,
    sharded_state_dict,
)
from neural_arch.distributed.tensor.parallel.style import (
    ColwiseParallel,
    ParallelStyle,
    Replicate,
    RowwiseParallel,
    Shard,
    parallelize_module,
)
from neural_arch.distributed.tensor.parallel.wrapper import TensorParallel

__all__ = [
    "ColumnParallelLinear", "ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "Replicate",
    "RowParallelLinear", "RowwiseParallel", "SequenceParallel", "Shard", "ShardedArray", "TensorParallel", "TensorParallelModel", "TensorParallelSKLinear",
    "VocabParallelEmbedding", "VocabParallelTokenSelector", "full_state_dict", "gpt_tp_plan", "load_full_state_dict", "parallelize_gpt",
    "parallelize_module", "sharded_state_dict", "vocab_parallel_argmax", "vocab_parallel_cross_entropy",
]
