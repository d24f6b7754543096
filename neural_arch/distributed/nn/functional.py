"""Differentiable collectives: the forward is a collective, the backward is its adjoint.

Two families (public as :mod:`neural_arch.distributed.nn.functional`, torch's path):

* torch's ``torch.distributed.nn.functional``: :func:`all_reduce` (backward: all-reduce),
  :func:`all_gather` (backward: reduce-scatter), :func:`reduce_scatter` (backward: all-gather),
  :func:`all_to_all_single` / :func:`all_to_all` (backward: the reverse all-to-all) and
  :func:`broadcast` (backward: reduce to ``src``). These assume every rank computes a *different*
  loss that is summed across ranks (the adjoint of "rank r's x goes everywhere" sums over ranks).
* Megatron's four tensor-parallel mappings, which assume the computation *after* them is
  replicated on every rank of the group (the same loss everywhere):

  ============================================  ========================  ========================
  mapping                                       forward                   backward
  ============================================  ========================  ========================
  ``copy_to_tensor_model_parallel_region``      identity ("f")            all-reduce
  ``reduce_from_tensor_model_parallel_region``  all-reduce ("g")          identity
  ``scatter_to_tensor_model_parallel_region``   keep my last-dim chunk    all-gather last dim
  ``gather_from_tensor_model_parallel_region``  all-gather last dim       keep my last-dim chunk
  ============================================  ========================  ========================

Every op takes ``group=`` (default: the world); on a group of one each is the identity.
Gradients are raw arrays handed to the autograd engine (:class:`neural_arch.core.autograd.Node`),
moved by the group's backend, so they work on every backend.

Example::

    from neural_arch.distributed.nn.functional import all_reduce, copy_to_tensor_model_parallel_region
    y = all_reduce(x)                  # y = sum_r x_r; dL/dx_r = sum_r' dL_r'/dy
    h = copy_to_tensor_model_parallel_region(x, group=tp_group)
"""

from __future__ import annotations

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.autograd import Node, is_grad_enabled
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.resolve import _resolve_group

__all__ = [
    "all_gather",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "copy_to_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region",
    "gather_from_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "reduce_scatter",
    "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
    "scatter_to_tensor_model_parallel_region",
]


# ---------------------------------------------------------------------------------- helpers
def _tensor(x, op: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return Tensor(x)
    raise TypeError(f"{op}: expected a Tensor (or an array), got {type(x).__name__}")


def _copy(array):
    """A fresh C-contiguous copy (backends write in place; the caller's array must not change)."""
    return _xp(array).array(array, copy=True, order="C")


def _wrap(name: str, x: Tensor, out, backward, fresh: bool = True) -> Tensor:
    """The output Tensor of a collective on ``x``: ``backward(grad) -> grad of x`` (raw arrays)."""
    t = Tensor._wrap(out)
    if x.requires_grad and is_grad_enabled():
        t.grad_fn = Node(lambda g: (backward(g),), (x,), name, fresh=fresh)
        t.requires_grad = True
    return t


def _allreduce(group, array, op=ReduceOp.SUM):
    buf = _copy(array)
    if group.size() > 1:
        group.backend.allreduce(buf, op)
    return buf


def _gather_dim(group, array, dim: int):
    """All ranks' ``array`` concatenated along ``dim`` (rank order)."""
    xp = _xp(array)
    n = group.size()
    if n == 1:
        return _copy(array)
    table = xp.empty((n,) + tuple(array.shape), dtype=array.dtype)
    group.backend.allgather(table, xp.ascontiguousarray(array))
    return xp.concatenate([table[r] for r in range(n)], axis=dim)


def _chunk(group, array, dim: int, op: str):
    """This rank's chunk of ``array`` along ``dim`` (a fresh copy); the dim must divide evenly."""
    n = group.size()
    length = array.shape[dim]
    if length % n:
        raise ValueError(f"{op}: dimension {dim} of size {length} is not divisible by the group size {n}; "
                         f"pad it to a multiple of {n}")
    step = length // n
    index = [slice(None)] * array.ndim
    index[dim] = slice(group.rank() * step, (group.rank() + 1) * step)
    return _copy(array[tuple(index)])


def _reduce_scatter_dim(group, array, dim: int, op: str):
    """Sum over ranks, then this rank's chunk along ``dim``."""
    n = group.size()
    if array.shape[dim] % n:
        raise ValueError(f"{op}: dimension {dim} of size {array.shape[dim]} is not divisible by the group "
                         f"size {n}; pad it to a multiple of {n}")
    if n == 1:
        return _copy(array)
    xp = _xp(array)
    moved = xp.ascontiguousarray(xp.moveaxis(array, dim, 0))
    out = xp.empty((moved.shape[0] // n,) + moved.shape[1:], dtype=array.dtype)
    group.backend.reduce_scatter(out, moved, ReduceOp.SUM)
    return xp.ascontiguousarray(xp.moveaxis(out, 0, dim))


def _dim(dim: int, ndim: int, op: str) -> int:
    if ndim == 0:
        raise ValueError(f"{op}: a 0-d tensor has no dimension to split or concatenate; reshape it to (1,)")
    if not -ndim <= dim < ndim:
        raise ValueError(f"{op}: dim={dim} is out of range for a tensor with {ndim} dimensions")
    return dim % ndim


def _check_op(op, name: str) -> ReduceOp:
    """``op`` as a ReduceOp that has a gradient here (SUM or AVG); anything else raises."""
    op = ReduceOp.coerce(op, name)
    if op is ReduceOp.SUM or op is ReduceOp.AVG:
        return op
    raise NotImplementedError(f"{name}: only ReduceOp.SUM and ReduceOp.AVG have a gradient here; got {op!r}. "
                              "Use neural_arch.distributed.all_reduce under no_grad for MAX/MIN/PRODUCT")


# ---------------------------------------------------------------------------------- torch's ops
def all_reduce(tensor, op=ReduceOp.SUM, group=None) -> Tensor:
    """Differentiable all-reduce (out of place). Backward: the same all-reduce of the gradients.

    >>> y = all_reduce(x)  # doctest: +SKIP
    """
    op = _check_op(op, "all_reduce")
    x = _tensor(tensor, "all_reduce")
    g = _resolve_group(group, "all_reduce")
    return _wrap("AllReduce", x, _allreduce(g, x.data, op), lambda grad: _allreduce(g, grad, op))


def broadcast(tensor, src: int = 0, group=None) -> Tensor:
    """Differentiable broadcast from global rank ``src``. Backward: gradients summed onto ``src``
    (zero elsewhere), as torch does.

    Example::

        w = broadcast(w_local, src=0)      # every rank uses rank 0's w; its gradient sums onto rank 0
    """
    x = _tensor(tensor, "broadcast")
    g = _resolve_group(group, "broadcast")
    root = g.group_rank(src, "src")
    out = _copy(x.data)
    if g.size() > 1:
        g.backend.broadcast(out, root)

    def backward(grad):
        buf = _copy(grad)
        if g.size() > 1:
            g.backend.reduce(buf, root, ReduceOp.SUM)
        if g.rank() != root:
            buf[...] = 0
        return buf

    return _wrap("Broadcast", x, out, backward)


def all_gather(tensor, group=None, dim: int | None = None):
    """Differentiable all-gather. ``dim=None`` (torch): a tuple of every rank's tensor; ``dim=k``:
    one tensor, the ranks' tensors concatenated along ``k``. Backward: reduce-scatter (the
    gradient of rank r's piece is summed over every rank's loss).

    >>> full = all_gather(x, dim=-1)  # doctest: +SKIP
    """
    x = _tensor(tensor, "all_gather")
    g = _resolve_group(group, "all_gather")
    if dim is None:
        stacked = all_gather(x.reshape(1, *x.shape), group=g, dim=0)
        return tuple(stacked[r] for r in range(g.size()))
    d = _dim(dim, x.ndim, "all_gather")
    return _wrap("AllGather", x, _gather_dim(g, x.data, d),
                 lambda grad: _reduce_scatter_dim(g, grad, d, "all_gather backward"))


def reduce_scatter(output_or_input, input_list=None, op=ReduceOp.SUM, group=None, dim: int = 0):
    """Differentiable reduce-scatter: sum over ranks, rank r keeps chunk r along ``dim``.

    Forms: ``reduce_scatter(input, dim=0)`` (one tensor whose ``dim`` is split in ``size`` chunks), or
    torch's ``reduce_scatter(output, input_list)`` (``output`` only gives the shape; a new tensor is
    returned). Backward: all-gather of the gradients along ``dim``.

    Example::

        y = reduce_scatter(x, dim=0)       # x: (world_size * n, d) on every rank -> y: (n, d)
    """
    op = _check_op(op, "reduce_scatter")
    g = _resolve_group(group, "reduce_scatter")
    if input_list is not None:
        from neural_arch.core.ops_shape import cat

        pieces = [_tensor(t, "reduce_scatter") for t in input_list]
        if len(pieces) != g.size():
            raise ValueError(f"reduce_scatter: input_list has {len(pieces)} tensors for a group of {g.size()}")
        out = reduce_scatter(cat(pieces, 0), op=op, group=g, dim=0)
        if tuple(out.shape) != tuple(output_or_input.shape):
            raise ValueError(f"reduce_scatter: output has shape {tuple(output_or_input.shape)}, expected "
                             f"{tuple(out.shape)}")
        return out
    x = _tensor(output_or_input, "reduce_scatter")
    d = _dim(dim, x.ndim, "reduce_scatter")
    scale = 1.0 / g.size() if op is ReduceOp.AVG else None
    out = _reduce_scatter_dim(g, x.data, d, "reduce_scatter")
    if scale is not None:
        out = out * out.dtype.type(scale)

    def backward(grad):
        full = _gather_dim(g, grad, d)
        return full * full.dtype.type(scale) if scale is not None else full

    return _wrap("ReduceScatter", x, out, backward)


def all_to_all_single(tensor, group=None, *, output_split_sizes=None, input_split_sizes=None) -> Tensor:
    """Differentiable all-to-all on dim 0: chunk d goes to rank d. Backward: the reverse exchange
    (all-to-all is its own adjoint up to the chunk permutation it undoes).

    Uneven splits (torch's arguments): ``input_split_sizes[d]`` rows go to rank d and
    ``output_split_sizes[s]`` rows arrive from rank s (the output has ``sum(output_split_sizes)``
    rows; zero-length splits are fine). Rank s's ``input_split_sizes[d]`` must equal rank d's
    ``output_split_sizes[s]`` (checked: every rank raises together). The backward sends the
    gradient rows back with the two lists swapped.

    >>> out = all_to_all_single(x, output_split_sizes=[1, 3], input_split_sizes=[1, 2])  # doctest: +SKIP
    """
    x = _tensor(tensor, "all_to_all_single")
    g = _resolve_group(group, "all_to_all_single")
    if output_split_sizes is not None or input_split_sizes is not None:
        return _all_to_all_uneven(x, g, output_split_sizes, input_split_sizes)

    def exchange(array):
        if array.ndim == 0 or array.shape[0] % g.size():
            raise ValueError(f"all_to_all_single: dim 0 ({array.shape[0] if array.ndim else 'a 0-d tensor'}) "
                             f"must be divisible by the group size {g.size()}")
        src = _copy(array)
        if g.size() == 1:
            return src
        out = _xp(array).empty_like(src)
        g.backend.alltoall(out, src)
        return out

    return _wrap("AllToAll", x, exchange(x.data), exchange)


def _all_to_all_uneven(x: Tensor, g, output_split_sizes, input_split_sizes) -> Tensor:
    from neural_arch.distributed.collectives import all_to_all_single as exchange_rows

    if x.ndim == 0:
        raise ValueError("all_to_all_single: a 0-d tensor has no rows to split; reshape it to (1,)")
    n = g.size()
    if output_split_sizes is None:
        raise ValueError("all_to_all_single: input_split_sizes needs output_split_sizes too (the rows "
                         "this rank receives from each rank): the output's length is not known otherwise")
    out_splits = [int(v) for v in output_split_sizes]
    in_splits = ([x.shape[0] // n] * n if input_split_sizes is None and x.shape[0] % n == 0
                 else input_split_sizes)

    def exchange(array, sends, receives):
        out = _xp(array).empty((sum(int(v) for v in receives),) + tuple(array.shape[1:]), dtype=array.dtype)
        exchange_rows(out, _xp(array).ascontiguousarray(array), output_split_sizes=receives,
                      input_split_sizes=sends, group=g)
        return out

    return _wrap("AllToAllUneven", x, exchange(x.data, in_splits, out_splits),
                 lambda grad: exchange(grad, out_splits, in_splits))


def all_to_all(output_tensor_list, input_tensor_list, group=None) -> tuple:
    """torch's list form: rank r sends ``input_tensor_list[d]`` to rank d and returns what it got
    (a tuple; ``output_tensor_list`` gives the count and shapes). All tensors must share a shape.

    Example::

        outs = all_to_all([Tensor(np.zeros(2))] * world_size, [x[d] for d in range(world_size)])
        # outs[s] is what rank s sent to this rank; gradients flow back the reverse way
    """
    from neural_arch.core.ops_shape import stack

    g = _resolve_group(group, "all_to_all")
    inputs = [_tensor(t, "all_to_all") for t in input_tensor_list]
    if len(inputs) != g.size() or len(output_tensor_list) != g.size():
        raise ValueError(f"all_to_all: need {g.size()} input and output tensors, got {len(inputs)} and "
                         f"{len(output_tensor_list)}")
    shapes = {tuple(t.shape) for t in inputs}
    if len(shapes) != 1:
        raise NotImplementedError(f"all_to_all: tensors of different shapes {sorted(shapes)} are not supported; "
                                  "pad them to one shape")
    out = all_to_all_single(stack(inputs, 0), group=g)
    return tuple(out[r] for r in range(g.size()))


# ---------------------------------------------------------------------------------- Megatron's mappings
def copy_to_tensor_model_parallel_region(tensor, group=None) -> Tensor:
    """"f": identity forward, all-reduce backward (enter a column-parallel layer).

    Example::

        h = copy_to_tensor_model_parallel_region(x, group=tp_group)
        y = h @ w_column_shard                   # each rank computes its columns
    """
    x = _tensor(tensor, "copy_to_tensor_model_parallel_region")
    g = _resolve_group(group, "copy_to_tensor_model_parallel_region")
    return _wrap("CopyToTPRegion", x, x.data, lambda grad: _allreduce(g, grad), fresh=True)


def reduce_from_tensor_model_parallel_region(tensor, group=None) -> Tensor:
    """"g": all-reduce forward, identity backward (leave a row-parallel layer).

    Example::

        partial = h_row_shard @ w_row_shard      # each rank's partial sum
        y = reduce_from_tensor_model_parallel_region(partial, group=tp_group)
    """
    x = _tensor(tensor, "reduce_from_tensor_model_parallel_region")
    g = _resolve_group(group, "reduce_from_tensor_model_parallel_region")
    return _wrap("ReduceFromTPRegion", x, _allreduce(g, x.data), lambda grad: grad, fresh=False)


def scatter_to_tensor_model_parallel_region(tensor, group=None) -> Tensor:
    """Keep this rank's chunk of the last dimension; backward all-gathers it.

    Example::

        mine = scatter_to_tensor_model_parallel_region(x, group=tp_group)   # (..., C) -> (..., C / tp)
    """
    x = _tensor(tensor, "scatter_to_tensor_model_parallel_region")
    g = _resolve_group(group, "scatter_to_tensor_model_parallel_region")
    d = _dim(-1, x.ndim, "scatter_to_tensor_model_parallel_region")
    return _wrap("ScatterToTPRegion", x, _chunk(g, x.data, d, "scatter_to_tensor_model_parallel_region"),
                 lambda grad: _gather_dim(g, grad, d))


def gather_from_tensor_model_parallel_region(tensor, group=None) -> Tensor:
    """All-gather along the last dimension; backward keeps this rank's chunk of the gradient.

    Example::

        full = gather_from_tensor_model_parallel_region(y_shard, group=tp_group)  # (..., C / tp) -> (..., C)
    """
    x = _tensor(tensor, "gather_from_tensor_model_parallel_region")
    g = _resolve_group(group, "gather_from_tensor_model_parallel_region")
    d = _dim(-1, x.ndim, "gather_from_tensor_model_parallel_region")
    return _wrap("GatherFromTPRegion", x, _gather_dim(g, x.data, d),
                 lambda grad: _chunk(g, grad, d, "gather_from_tensor_model_parallel_region backward"))



# ------------------------------------------------------------------ sequence parallelism (Megatron's mappings)
# Activations are (batch, seq, hidden): the sequence dimension is 1 (Megatron's (seq, batch, hidden)
# uses 0). Inside LayerNorm/dropout regions each rank holds seq/p positions; a column-parallel layer
# needs the whole sequence (all-gather in, reduce-scatter back), a row-parallel one hands out only
# this rank's positions (reduce-scatter instead of all-reduce).
SEQUENCE_DIM = 1


def scatter_to_sequence_parallel_region(tensor, group=None) -> Tensor:
    """Keep this rank's positions of a replicated ``(B, T, C)`` activation; backward all-gathers.

    The entry into a sequence-parallel region (e.g. after the embeddings).

    Example::

        h = scatter_to_sequence_parallel_region(embeddings, group=tp_group)   # (B, T, C) -> (B, T / tp, C)
    """
    x = _tensor(tensor, "scatter_to_sequence_parallel_region")
    g = _resolve_group(group, "scatter_to_sequence_parallel_region")
    return _wrap("ScatterToSPRegion", x, _chunk(g, x.data, SEQUENCE_DIM, "scatter_to_sequence_parallel_region"),
                 lambda grad: _gather_dim(g, grad, SEQUENCE_DIM))


def gather_from_sequence_parallel_region(tensor, group=None, tensor_parallel_output_grad: bool = True) -> Tensor:
    """All-gather the sequence: ``(B, T/p, C)`` -> ``(B, T, C)``.

    Backward: with ``tensor_parallel_output_grad`` (the consumer is a column-parallel layer, whose
    ranks each contribute part of the gradient) the gradient is reduce-scattered; without it (the
    consumer is replicated computation) each rank keeps its own positions.

    Example::

        full = gather_from_sequence_parallel_region(h, group=tp_group)    # (B, T / tp, C) -> (B, T, C)
        y = full @ w_column_shard
    """
    x = _tensor(tensor, "gather_from_sequence_parallel_region")
    g = _resolve_group(group, "gather_from_sequence_parallel_region")
    op = "gather_from_sequence_parallel_region backward"
    back = ((lambda grad: _reduce_scatter_dim(g, grad, SEQUENCE_DIM, op)) if tensor_parallel_output_grad
            else (lambda grad: _chunk(g, grad, SEQUENCE_DIM, op)))
    return _wrap("GatherFromSPRegion", x, _gather_dim(g, x.data, SEQUENCE_DIM), back)


def reduce_scatter_to_sequence_parallel_region(tensor, group=None) -> Tensor:
    """Sum the partial outputs of a row-parallel layer and keep this rank's positions; backward all-gathers.

    Example::

        # partial: a row-parallel layer's (B, T, C) output; h: this rank's (B, T / tp, C) of the sum
        h = reduce_scatter_to_sequence_parallel_region(partial, group=tp_group)
    """
    x = _tensor(tensor, "reduce_scatter_to_sequence_parallel_region")
    g = _resolve_group(group, "reduce_scatter_to_sequence_parallel_region")
    return _wrap("ReduceScatterToSPRegion", x,
                 _reduce_scatter_dim(g, x.data, SEQUENCE_DIM, "reduce_scatter_to_sequence_parallel_region"),
                 lambda grad: _gather_dim(g, grad, SEQUENCE_DIM), fresh=False)
