"""What the project's ``nn.GPT`` keeps alive for the backward: activation bytes, counted from our autograd.

Counted by reading what each op's backward closure holds (``neural_arch/core``), not taken from a
paper, and checked against ``tracemalloc`` (``tests/memory/test_estimate.py``). Per token (one
position of one sequence), with width ``C``, MLP width ``h`` (``4C``), ``H`` heads, vocabulary
``V``, in elements of the compute dtype:

============================  ==========  =====================================================
what                          elements    why it is alive
============================  ==========  =====================================================
``ln1`` (LayerNorm)           2C + 1      the normalised input and the output; 1/std per token
``q_proj, k_proj, v_proj``    3C          their outputs (q, k, v), read by attention's backward
attention (blockwise SDPA)    C + H       its output and one log-sum-exp per head (no T x T kept)
heads -> (B, T, C) reshape    C           a copy (the permuted output is not contiguous)
``out_proj``                  C           its output (the residual add's input)
residual add                  C           the new residual stream
``ln2``                       2C + 1      as ``ln1``
``fc1``                       h           its output
GELU (erf)                    2h          its output and its saved derivative
``fc2``, residual add         2C          as above
**per block**                 13C + 3h    + H + 2 = 25C + H + 2 for ``h = 4C``
embeddings (first stage)      2C          token embedding output and the sum with positions
``ln_f``                      2C + 1
logits, cross entropy         2V          the logits and the softmax the loss keeps
============================  ==========  =====================================================

plus, once, the position embedding's ``(T, C)`` output, the ``int64`` token ids and targets
(16 bytes per token), and the Python objects of the graph (nodes, closures, Tensor wrappers):
:data:`GRAPH_BYTES_PER_BLOCK` per block and :data:`GRAPH_BYTES_OTHER` for the rest, measured
(host memory; they exist on a GPU run too, but not in the device's pool).

Under Megatron tensor parallelism of degree ``t`` (``parallelize_gpt``) the column-parallel outputs
are sharded (q, k, v, attention, the reshape, ``fc1``, GELU: ``(5C + 3h)/t`` and ``H/t``) while the
LayerNorms, the row-parallel outputs and the residual stream stay whole (``8C + 2``); with
``loss_parallel`` the logits and the loss's softmax are sharded too (``2V/t``). The parallel styles
keep whole copies of their own on top: :data:`TP_STYLE_COPIES_PER_BLOCK` ``= 5C`` per token per block
(the column-parallel layers' inputs and the row-parallel layers' all-reduced outputs), a figure
fitted to measurement (``tracemalloc`` at t = 1 and 2, widths 128 and 256, 2 and 3 blocks), not
counted op by op. Under activation
checkpointing of every block a block keeps only its input (``C``); the backward reruns one block
at a time, so its activations (one block's) come back on top. Dropout with
``p > 0`` would add a mask per dropout (not counted: the GPT's default is ``p = 0``).

Example::

    >>> from neural_arch import nn
    >>> from neural_arch.memory.gpt_activations import GRAPH_BYTES_OTHER, GRAPH_BYTES_PER_BLOCK, gpt_activation_bytes
    >>> model = nn.GPT(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
    >>> per_token = 2 * (25 * 16 + 2 + 2) + 4 * 16 + 2 * 64 + 1       # elements, float32
    >>> gpt_activation_bytes(model, batch=3, seq=8, itemsize=4) == (3 * 8 * (4 * per_token + 16) + 8 * 16 * 4
    ...                                                             + 2 * GRAPH_BYTES_PER_BLOCK + GRAPH_BYTES_OTHER)
    True
"""

from __future__ import annotations

__all__ = ["GRAPH_BYTES_CHECKPOINTED_BLOCK", "GRAPH_BYTES_OTHER", "GRAPH_BYTES_PER_BLOCK", "TP_STYLE_COPIES_PER_BLOCK",
           "gpt_activation_bytes", "gpt_shape", "is_gpt"]

#: the Python objects of one block's autograd graph (nodes, closures, Tensor wrappers), measured
#: with tracemalloc: independent of batch, sequence and width
GRAPH_BYTES_PER_BLOCK = 24 * 1024
#: the same for the embeddings, the final LayerNorm, the head and the loss
GRAPH_BYTES_OTHER = 8 * 1024
#: whole (C-wide) activations per token per block that the tensor-parallel styles add, in units of C
TP_STYLE_COPIES_PER_BLOCK = 5
#: a checkpointed block's one node (its input and the closure that reruns it)
GRAPH_BYTES_CHECKPOINTED_BLOCK = 2 * 1024


def is_gpt(model) -> bool:
    """Whether ``model`` looks like :class:`neural_arch.nn.GPT` (duck-typed: this layer imports no ``nn``).

    Example::

        >>> from neural_arch import nn
        >>> from neural_arch.memory.gpt_activations import is_gpt
        >>> is_gpt(nn.GPT(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4)), is_gpt(nn.Linear(2, 2))
        (True, False)
    """
    return all(hasattr(model, a) for a in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "blocks"))


def gpt_shape(model) -> dict:
    """``{"V", "T_max", "L", "H", "C", "h"}`` of a GPT (``h``: the MLP's hidden width).

    Example::

        >>> from neural_arch import nn
        >>> from neural_arch.memory.gpt_activations import gpt_shape
        >>> gpt_shape(nn.GPT(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4))["h"]
        16
    """
    c = int(model.n_embd)
    fc1 = getattr(getattr(model.blocks[0], "mlp", None), "fc1", None) if len(model.blocks) else None
    h = int(fc1.weight.data.size // c) if fc1 is not None else 4 * c
    return {"V": int(model.vocab_size), "T_max": int(model.block_size), "L": int(model.n_layer),
            "H": int(model.n_head), "C": c, "h": h}


def gpt_activation_bytes(model, batch: int, seq: int, itemsize: int, *, tp: int | None = None,
                         blocks: int | None = None,
                         first_stage: bool = True, last_stage: bool = True, stage_input: bool = False,
                         checkpointed: bool = False) -> int:
    """Bytes the forward of ``batch`` sequences of ``seq`` tokens leaves alive for the backward.

    Args:
        itemsize: bytes per element of the compute dtype.
        tp: tensor-parallel degree under ``parallelize_gpt`` (Megatron's sharding, ``loss_parallel``,
            the styles' copies; see the module docstring); None: no tensor parallelism.
        blocks: how many blocks this rank runs (a pipeline stage); default all.
        first_stage, last_stage: whether this rank runs the embeddings / the head and the loss.
        stage_input: a pipeline stage after the first keeps the activation it received (``C`` per token).
        checkpointed: every block under activation checkpointing
            (``utils.checkpoint.apply_activation_checkpointing``): a block keeps only its input
            (``C`` per token) and one node; its activations come back, one block at a time, in backward.

    Example::

        >>> from neural_arch import nn
        >>> from neural_arch.memory.gpt_activations import gpt_activation_bytes
        >>> model = nn.GPT(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
        >>> gpt_activation_bytes(model, 2, 8, 4) < gpt_activation_bytes(model, 4, 8, 4)
        True
    """
    g = gpt_shape(model)
    c, h, heads, v = g["C"], g["h"], g["H"], g["V"]
    n_blocks = g["L"] if blocks is None else int(blocks)
    tokens = int(batch) * int(seq)
    t = tp or 1
    per_block = c if checkpointed else 8 * c + 2 + (5 * c + 3 * h + heads) / t
    if tp is not None and not checkpointed:
        per_block += TP_STYLE_COPIES_PER_BLOCK * c
    per_token = n_blocks * per_block
    once = n_blocks * (GRAPH_BYTES_CHECKPOINTED_BLOCK if checkpointed else GRAPH_BYTES_PER_BLOCK)
    ids = 0
    if first_stage:
        per_token += 2 * c
        once += int(seq) * c * itemsize               # the position embedding's (T, C) output
        ids += 8
    if stage_input and not first_stage:
        per_token += c
    if last_stage:
        per_token += 2 * c + 1 + 2 * v / t
        ids += 8
    if first_stage or last_stage:
        once += GRAPH_BYTES_OTHER
    return round(tokens * (per_token * itemsize + ids)) + once
