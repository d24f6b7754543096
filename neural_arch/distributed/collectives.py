"""Tensor-level collectives: the functions training code calls (torch names and semantics).

Every collective takes ``group=`` (default: the world) and ``async_op=``. Tensors are updated
**in place** *and* returned, so both the seeds' style and torch's work::

    reduced = all_reduce(t, ReduceOp.SUM)      # reduced is t, now summed over the ranks
    all_reduce(t)                              # torch style: use t afterwards
    work = all_reduce(t, async_op=True)        # a Work; work.result() is t once done

Conventions:

* ``src``/``dst`` are **global** ranks, also for sub-groups (torch); they are translated to
  the group's numbering here, and a rank outside the group is an error at the call.
* A ``Tensor`` whose ``.data`` is not C-contiguous is made contiguous (its ``.data`` is
  replaced); raw NumPy/CuPy arrays are accepted too but must already be contiguous, because
  the caller's own buffer is what gets written.
* Bad input (shape, dtype, rank, divisibility) raises ``ValueError``/``TypeError`` in the
  caller before any communication.
* ``all_gather``, ``reduce_scatter`` and ``all_to_all`` accept both the seeds' single-tensor
  forms (returning new tensors) and torch's list forms (filling the caller's tensors).
* ``*_object`` functions pickle: use them between trusted peers only.

Example::

    from neural_arch.distributed import init_process_group, all_gather, reduce_scatter, ReduceOp
    init_process_group()
    parts = all_gather(Tensor(np.ones(3)))          # list of world_size Tensors
    mine = reduce_scatter(Tensor(np.ones((4 * world, 2))), ReduceOp.AVERAGE)   # shape (4, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from neural_arch.backend import get_array_module as _xp
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp, Work
from neural_arch.distributed.process_group import FLAT_ALWAYS as _NEVER
from neural_arch.distributed.process_group import GroupMember
from neural_arch.distributed.resolve import _buf, _group, _resolve_group
from neural_arch.distributed.state import STATE as _STATE

__all__ = [
    "P2POp",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "get_process_group_ranks",
    "group",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "sendrecv",
]


#: torch's ``dist.group.WORLD``: ``group.WORLD`` is the default group once initialised.
group = GroupMember
#: torch's deprecated lower-case alias of :class:`~neural_arch.distributed.comm.work.ReduceOp` (old scripts still write it).
reduce_op = ReduceOp


# ---------------------------------------------------------------------------------- helpers
def _at_least_1d(data):
    """A 0-d buffer as a (1,)-shaped view of the same memory: rows of a (size, ...) table are then
    arrays, never NumPy scalars, on every backend."""
    return data.reshape(1) if data.ndim == 0 else data


def _like(template, array):
    """Wrap ``array`` the way the caller passed its input: a Tensor for a Tensor, else the array."""
    return Tensor(array) if isinstance(template, Tensor) else array


def _assign(dst, src) -> None:
    (dst.data if isinstance(dst, Tensor) else dst)[...] = src


def _shape_dtype(x):
    data = x.data if isinstance(x, Tensor) else x
    if not hasattr(data, "shape") or not hasattr(data, "dtype"):
        raise TypeError(f"expected a Tensor or an array, got {type(x).__name__}")
    return tuple(data.shape), data.dtype


def _check_list(items, n: int, shape, dtype, what: str) -> None:
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{what} must be a list of {n} tensors, got {type(items).__name__}")
    if len(items) != n:
        raise ValueError(f"{what} has {len(items)} entries; it needs exactly {n} (the group size)")
    for i, item in enumerate(items):
        s, d = _shape_dtype(item)
        if d != dtype:
            raise TypeError(f"{what}[{i}] has dtype {d}, but the input tensor has dtype {dtype}")
        if s != tuple(shape):
            raise ValueError(f"{what}[{i}] has shape {s}; every entry must have shape {tuple(shape)}")


def _agree_on_root_args(pg, xp, error: Exception | None, what: str) -> None:
    """Raise on every rank when the root rejected an argument only the root has (``scatter_list``,
    ``gather_list``). Without this one-int all-reduce the other ranks would wait for a collective
    the root never joined (scatter) or return as if it had run, leaving the group's streams out of
    step for the next collective (gather). ``xp`` is the data's array module (a NCCL group moves
    device arrays only)."""
    flag = xp.array([0 if error is None else 1], dtype=np.int64)
    pg.backend.allreduce(flag, ReduceOp.MAX).wait()
    if error is not None:
        raise error
    if int(flag[0]):
        raise ValueError(f"{what}; nothing was sent (see that rank's error)")


def _finish(work: Work, make_result: Callable[[], Any], async_op: bool):
    """Synchronous: the result. Asynchronous: a Work whose ``result()`` is ``make_result()``."""
    if not async_op:
        work.wait()
        return make_result()
    out = Work(work.info)

    def done(w: Work) -> None:
        exc = w.exception()
        if exc is not None:
            out._set_exception(exc)
            return
        try:
            out._set_result(make_result())
        except BaseException as err:  # noqa: BLE001 - surfaced by out.wait()
            out._set_exception(err)

    work.add_done_callback(done)
    return out


def _stack(items, xp):
    return xp.stack([_buf(t, "tensor") for t in items]) if items else None


def get_process_group_ranks(group) -> list[int]:
    """torch's query: the global ranks of ``group`` (None: the world), in group-rank order.

    Example::

        pg = dist.new_group([0, 2])
        dist.get_process_group_ranks(pg)       # [0, 2]
    """
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("get_process_group_ranks: this rank is not in the group (NON_GROUP_MEMBER); "
                         "ask a member, or keep the ranks list you passed to new_group()")
    return list(_resolve_group(group, "get_process_group_ranks").ranks)


# ---------------------------------------------------------------------------------- collectives
def barrier(group=None, async_op: bool = False):
    """Block until every rank of ``group`` reached the barrier.

    Example::

        dist.barrier()                         # every rank waits here until all arrived
    """
    pg = _group(group, "barrier")
    if pg is None:
        return None
    work = pg.backend.barrier(async_op=async_op)
    return _finish(work, lambda: None, async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``tensor`` over the group, in place on every rank; returns ``tensor``.

    On a gloo group spanning several hosts, a large synchronous call runs hierarchically (shared
    memory inside hosts, the network between them; ``NEURAL_ARCH_HIERARCHICAL``, and
    ``algorithms.hierarchical_auto.all_reduce_algorithm`` says which form a call takes).

    Example::

        t = Tensor(np.full(3, float(dist.get_rank())))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)   # t.data == sum of the ranks, on every rank
    """
    # The common case of _group and _buf, inline (two calls less on every small all-reduce): the default
    # group, a Tensor whose data is a C-contiguous NumPy array. Anything else goes through them.
    pg = _STATE.world if group is None else None
    if pg is None:
        pg = _group(group, "all_reduce")
        if pg is None:
            return None
    if op.__class__ is not ReduceOp:
        op = ReduceOp.coerce(op, "all_reduce")
    data = tensor.data if tensor.__class__ is Tensor else None
    if data.__class__ is not np.ndarray or not data.flags.c_contiguous:
        data = _buf(tensor)
    # One attribute read per call: single-host groups hold the _NEVER object after their first call.
    limit = pg._hierarchical_min_bytes
    if limit is not _NEVER and not async_op and _hierarchical(pg, data, op, limit):
        return tensor
    if not async_op:
        # _work=False: no Work handle for a synchronous call (it would be dropped here); the backend
        # waited, and raised if the op failed
        pg.backend.allreduce(data, op, False, False)
        return tensor
    return _finish(pg.backend.allreduce(data, op, True), lambda: tensor, True)


def _hierarchical(pg, data, op, limit) -> bool:
    """all_reduce's slow path: decide once per group, then run the hierarchical form when the
    message is large enough (algorithms/hierarchical_auto.py; imported here, on first use only)."""
    from neural_arch.distributed.algorithms import hierarchical_auto

    if limit is None:
        limit = hierarchical_auto.min_bytes(pg)
    return limit is not _NEVER and getattr(data, "nbytes", -1) >= limit and hierarchical_auto.all_reduce(pg, data, op)


def broadcast(tensor, src: int = 0, group=None, async_op: bool = False):
    """Copy global rank ``src``'s tensor into every rank's ``tensor``; returns ``tensor``.

    Example::

        t = Tensor(np.arange(4.0)) if dist.get_rank() == 0 else Tensor(np.zeros(4))
        dist.broadcast(t, src=0)               # every rank now holds [0., 1., 2., 3.]
    """
    pg = _group(group, "broadcast")
    if pg is None:
        return None
    root = pg.group_rank(src, "src")
    work = pg.backend.broadcast(_buf(tensor), root, async_op=async_op)
    if not async_op:
        return tensor            # the backend already waited, and raised if the op failed
    return _finish(work, lambda: tensor, True)


def reduce(tensor, dst: int = 0, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce into global rank ``dst``'s ``tensor`` (others unchanged); returns ``tensor``.

    Example::

        t = Tensor(np.ones(3))
        dist.reduce(t, dst=0)                  # on rank 0: world_size * ones; elsewhere unchanged
    """
    pg = _group(group, "reduce")
    if pg is None:
        return None
    root = pg.group_rank(dst, "dst")
    work = pg.backend.reduce(_buf(tensor), root, op, async_op=async_op)
    return _finish(work, lambda: tensor, async_op)


def all_gather(tensor_list_or_tensor, tensor=None, group=None, async_op: bool = False):
    """Every rank's tensor, in group-rank order.

    ``all_gather(t)`` returns a new list (seed style); ``all_gather(tensor_list, t)`` fills
    ``tensor_list`` (torch style) and returns it.

    Example::

        parts = dist.all_gather(Tensor(np.full(2, float(rank))))          # seed style: a new list
        out = [Tensor(np.zeros(2)) for _ in range(world_size)]
        dist.all_gather(out, Tensor(np.full(2, float(rank))))             # torch style: fills out
    """
    pg = _group(group, "all_gather")
    if pg is None:
        return None
    if isinstance(tensor_list_or_tensor, (list, tuple)):
        outputs, source = tensor_list_or_tensor, tensor
        if source is None:
            raise TypeError("all_gather(tensor_list, tensor): the tensor to send is missing")
    else:
        outputs, source = None, tensor_list_or_tensor
        if tensor is not None:
            raise TypeError("all_gather(tensor) takes one tensor; for the torch form pass a list first: "
                            "all_gather(tensor_list, tensor)")
    data = _buf(source)
    if outputs is not None:
        _check_list(outputs, pg.size(), data.shape, data.dtype, "all_gather tensor_list")
    table = _xp(data).empty((pg.size(),) + tuple(data.shape), dtype=data.dtype)
    work = pg.backend.allgather(table, data, async_op=async_op)

    def result():
        if outputs is None:
            return [_like(source, table[r]) for r in range(pg.size())]
        for r, out in enumerate(outputs):
            _assign(out, table[r])
        return outputs
    return _finish(work, result, async_op)


def gather(tensor, gather_list=None, dst: int = 0, group=None, async_op: bool = False):
    """Collect every rank's ``tensor`` on global rank ``dst``.

    On ``dst`` returns ``gather_list`` filled in group-rank order (a new list when None);
    on the other ranks returns None (``gather_list`` is ignored there).

    Example::

        got = dist.gather(Tensor(np.full(2, float(rank))), dst=0)
        # rank 0: [Tensor([0., 0.]), Tensor([1., 1.]), ...]; other ranks: None
    """
    pg = _group(group, "gather")
    if pg is None:
        return None
    root = pg.group_rank(dst, "dst")
    data = _buf(tensor)
    is_root = pg.rank() == root
    table, error = None, None
    if is_root:
        if gather_list is not None:
            try:
                _check_list(gather_list, pg.size(), data.shape, data.dtype, "gather_list")
            except (TypeError, ValueError) as err:
                error = err
        table = _xp(data).empty((pg.size(),) + _at_least_1d(data).shape, dtype=data.dtype)
    _agree_on_root_args(pg, _xp(data), error, f"gather: global rank {dst} (the destination) rejected its gather_list")
    work = pg.backend.gather(table, _at_least_1d(data), root, async_op=async_op)

    def result():
        if not is_root:
            return None
        rows = [table[r].reshape(data.shape) for r in range(pg.size())]
        if gather_list is None:
            return [_like(tensor, row) for row in rows]
        for out, row in zip(gather_list, rows):
            _assign(out, row)
        return gather_list
    return _finish(work, result, async_op)


def scatter(tensor, scatter_list=None, src: int = 0, group=None, async_op: bool = False):
    """Global rank ``src`` sends ``scatter_list[r]`` to group rank r, into its ``tensor``; returns ``tensor``.

    Example::

        chunks = [Tensor(np.full(2, float(r))) for r in range(world_size)] if rank == 0 else None
        mine = dist.scatter(Tensor(np.zeros(2)), chunks, src=0)           # rank r holds [r, r]
    """
    pg = _group(group, "scatter")
    if pg is None:
        return None
    root = pg.group_rank(src, "src")
    data = _buf(tensor)
    stacked, error = None, None
    if pg.rank() == root:
        try:
            if scatter_list is None:
                raise ValueError(f"scatter: global rank {src} is the source and needs scatter_list, a list "
                                 f"of {pg.size()} tensors shaped like tensor {tuple(data.shape)}")
            _check_list(scatter_list, pg.size(), data.shape, data.dtype, "scatter_list")
            stacked = _stack(scatter_list, _xp(data)).reshape((pg.size(),) + _at_least_1d(data).shape)
        except (TypeError, ValueError) as err:
            error = err
    _agree_on_root_args(pg, _xp(data), error, f"scatter: global rank {src} (the source) rejected its scatter_list")
    work = pg.backend.scatter(_at_least_1d(data), stacked, root, async_op=async_op)
    return _finish(work, lambda: tensor, async_op)


def reduce_scatter(output_or_input, input_list_or_op=None, op=ReduceOp.SUM, group=None,
                   async_op: bool = False):
    """Reduce over the group, then give each rank one chunk.

    Seed style: ``reduce_scatter(t, ReduceOp.AVERAGE)`` reduces ``t`` (dim 0 divisible by the
    group size) and returns this rank's chunk of dim 0 as a new tensor.
    Torch style: ``reduce_scatter(output, input_list, op)`` reduces ``input_list[r]`` across
    ranks into group rank r's ``output`` and returns ``output``.

    Example::

        mine = dist.reduce_scatter(Tensor(np.ones((4 * world_size, 2))), dist.ReduceOp.SUM)
        # mine.shape == (4, 2), every element world_size
    """
    pg = _group(group, "reduce_scatter")
    if pg is None:
        return None
    if isinstance(input_list_or_op, (list, tuple)):
        output, inputs = output_or_input, input_list_or_op
        out = _buf(output, "output")
        if hasattr(out, "flags") and not out.flags.c_contiguous:
            # reshape below would silently copy, and the result would never reach the caller
            raise ValueError("reduce_scatter output is not C-contiguous; pass np.ascontiguousarray(output) "
                             "or a Tensor")
        _check_list(inputs, pg.size(), out.shape, out.dtype, "reduce_scatter input_list")
        stacked = _stack(inputs, _xp(out))
        # (size, *shape) in, (1, *shape) out: one row per rank, a view on the caller's output
        work = pg.backend.reduce_scatter(out.reshape((1,) + tuple(out.shape)), stacked, op, async_op=async_op)
        return _finish(work, lambda: output, async_op)
    if input_list_or_op is not None:
        op = input_list_or_op
    source = output_or_input
    data = _buf(source, "tensor")
    size = pg.size()
    if getattr(data, "ndim", 0) == 0 or data.shape[0] % size:
        dim0 = data.shape[0] if getattr(data, "ndim", 0) else "a 0-d tensor"
        raise ValueError(f"reduce_scatter: dim 0 of the input ({dim0}) is not divisible by the group size "
                         f"{size}; pad it to a multiple of {size}")
    chunk = _xp(data).empty((data.shape[0] // size,) + tuple(data.shape[1:]), dtype=data.dtype)
    work = pg.backend.reduce_scatter(chunk, data, op, async_op=async_op)
    return _finish(work, lambda: _like(source, chunk), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """torch's flat form: ``input`` is the concatenation of ``size`` outputs along dim 0
    (``input.shape[0] == size * output.shape[0]``) or their stack (``(size, *output.shape)``, which
    also serves a 0-d ``output``), as in torch; fills and returns ``output``.

    Example::

        out = Tensor(np.zeros((2, 3)))
        dist.reduce_scatter_tensor(out, Tensor(np.ones((2 * world_size, 3))))  # out == world_size
    """
    pg = _group(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    out, inp = _buf(output, "output"), _buf(input, "input")
    if getattr(inp, "ndim", 0) == getattr(out, "ndim", 0) + 1 and tuple(inp.shape) == (pg.size(),) + tuple(out.shape):
        # the stacked form: the backend reduces (size, *shape) into a (1, *shape) view of the output
        if hasattr(out, "flags") and not out.flags.c_contiguous:
            # reshape would silently copy, and the result would never reach the caller
            raise ValueError("reduce_scatter_tensor: output is not C-contiguous; pass np.ascontiguousarray(output) "
                             "or a Tensor")
        out = out.reshape((1,) + tuple(out.shape))
    work = pg.backend.reduce_scatter(out, inp, op, async_op=async_op)
    return _finish(work, lambda: output, async_op)


def all_to_all(output, input=None, group=None, async_op: bool = False):
    """Rank r sends its chunk d to rank d and receives rank s's chunk r into slot s.

    Forms: ``all_to_all(output_list, input_list)`` (torch; equal shapes), ``all_to_all(output,
    input)`` with single tensors split along dim 0 (torch's ``all_to_all_single``), and
    ``all_to_all(input)``, which returns a new tensor.

    Example::

        x = Tensor(np.full((world_size, 2), float(rank)))   # row d goes to rank d
        y = dist.all_to_all(x)                              # row s of y came from rank s
    """
    pg = _group(group, "all_to_all")
    if pg is None:
        return None
    if isinstance(output, (list, tuple)) or isinstance(input, (list, tuple)):
        if not isinstance(output, (list, tuple)) or not isinstance(input, (list, tuple)):
            raise TypeError("all_to_all(output_list, input_list): pass two lists, or two tensors")
        if not input:
            raise ValueError(f"all_to_all input_list is empty; it needs {pg.size()} tensors")
        shape, dtype = _shape_dtype(input[0])
        _check_list(input, pg.size(), shape, dtype, "all_to_all input_list")
        _check_list(output, pg.size(), shape, dtype, "all_to_all output_list")
        first = _buf(input[0], "input_list[0]")
        stacked = _stack(input, _xp(first))
        table = _xp(first).empty_like(stacked)
        work = pg.backend.alltoall(table, stacked, async_op=async_op)

        def result():
            for r, out in enumerate(output):
                _assign(out, table[r])
            return output
        return _finish(work, result, async_op)
    if input is None:
        source = output
        data = _buf(source, "input")
        out = _xp(data).empty_like(data)
        work = pg.backend.alltoall(out, data, async_op=async_op)
        return _finish(work, lambda: _like(source, out), async_op)
    work = pg.backend.alltoall(_buf(output, "output"), _buf(input, "input"), async_op=async_op)
    return _finish(work, lambda: output, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False):
    """torch's ``all_to_all_single``: ``input`` is split along dim 0, chunk d goes to group rank d.

    With no split sizes the splits are equal (dim 0 divisible by the group size). With
    ``input_split_sizes`` (rows sent to each rank) and ``output_split_sizes`` (rows received from
    each rank) the splits may be uneven; each rank's sizes must match its peers' (rank s's
    ``input_split_sizes[d]`` == rank d's ``output_split_sizes[s]``), else every rank raises
    ``ValueError`` naming the pair. Fills and returns ``output``. Example (2 ranks)::

        # rank 0 sends 1 row to itself and 2 rows to rank 1; rank 1 sends 3 rows to 0, 1 to itself
        all_to_all_single(out, inp, output_split_sizes=[1, 3], input_split_sizes=[1, 2])   # rank 0
    """
    if output_split_sizes is None and input_split_sizes is None:
        return all_to_all(output, input, group=group, async_op=async_op)
    pg = _group(group, "all_to_all_single")
    if pg is None:
        return None
    out, inp = _buf(output, "output"), _buf(input, "input")
    size = pg.size()
    out_splits = _splits(output_split_sizes, out, size, "output_split_sizes")
    in_splits = _splits(input_split_sizes, inp, size, "input_split_sizes")
    if out.dtype != inp.dtype or tuple(out.shape[1:]) != tuple(inp.shape[1:]):
        raise ValueError(f"all_to_all_single: output {tuple(out.shape)} {out.dtype} and input "
                         f"{tuple(inp.shape)} {inp.dtype} must share dtype and every dim but the first")
    xp = _xp(inp)
    # 1) every rank learns what each peer sends it and checks it against what it expects; the
    #    verdict is agreed by one all-reduce, so all ranks raise together, naming the pair.
    sent_to_me = np.empty(size, dtype=np.int64)
    pg.backend.alltoall(sent_to_me, np.asarray(in_splits, dtype=np.int64)).wait()
    bad = [s for s in range(size) if int(sent_to_me[s]) != out_splits[s]]
    verdict = np.array([1 if bad else 0], dtype=np.int64)
    pg.backend.allreduce(verdict, ReduceOp.MAX).wait()
    if verdict[0]:
        mine = "; ".join(f"group rank {s} sends {int(sent_to_me[s])} rows but output_split_sizes[{s}]="
                         f"{out_splits[s]}" for s in bad) or "this rank's sizes agree with its peers"
        raise ValueError(f"all_to_all_single: split sizes disagree between ranks (on group rank "
                         f"{pg.rank()}: {mine}); rank s's input_split_sizes[d] must equal rank d's "
                         "output_split_sizes[s]")
    # 2) the backend's native uneven all-to-all on the caller's buffers (Backend.alltoallv: no padding;
    #    backends without one inherit the interface's padding hook)
    src = xp.ascontiguousarray(inp)
    usable = out.flags.c_contiguous and getattr(out.flags, "writeable", True)    # (CuPy has no read-only arrays)
    dst = out if usable else xp.empty(out.shape, dtype=out.dtype)
    work = pg.backend.alltoallv(dst, src, out_splits, in_splits, async_op=async_op)

    def result():
        if dst is not out:
            out[...] = dst
        return output
    return _finish(work, result, async_op)


def _splits(sizes, data, size: int, arg: str) -> list[int]:
    rows = data.shape[0] if getattr(data, "ndim", 0) else None
    if rows is None:
        raise ValueError(f"all_to_all_single: {arg} needs a tensor with at least one dim")
    if sizes is None:  # torch: the other side uneven, this side equal
        if rows % size:
            raise ValueError(f"all_to_all_single: {arg} is None, so dim 0 ({rows}) must be divisible by "
                             f"the group size {size}; pass {arg} explicitly")
        return [rows // size] * size
    sizes = [int(v) for v in sizes]
    if len(sizes) != size or any(v < 0 for v in sizes) or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {arg}={sizes} must be {size} non-negative ints (one per "
                         f"rank) summing to dim 0 of the tensor ({rows})")
    return sizes


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """torch's flat all-gather: every rank's ``input_tensor`` into ``output_tensor``, in rank order.

    ``output_tensor`` is either the concatenation along dim 0 (``(size * n, ...)``) or the stack
    (``(size, n, ...)``), as in torch. Fills and returns ``output_tensor``. Example::

        out = Tensor(np.empty(2 * world)); all_gather_into_tensor(out, Tensor(np.ones(2)))
    """
    pg = _group(group, "all_gather_into_tensor")
    if pg is None:
        return None
    out, inp = _buf(output_tensor, "output_tensor"), _buf(input_tensor, "input_tensor")
    size, shape = pg.size(), tuple(_at_least_1d(inp).shape)
    stacked = (size,) + tuple(inp.shape)
    concatenated = (size * shape[0],) + shape[1:]
    if tuple(out.shape) not in (stacked, concatenated):
        raise ValueError(f"all_gather_into_tensor: output_tensor has shape {tuple(out.shape)}; with input "
                         f"{tuple(inp.shape)} and {size} ranks it must be {concatenated} or {stacked}")
    if out.dtype != inp.dtype:
        raise TypeError(f"all_gather_into_tensor: output_tensor dtype {out.dtype} != input dtype {inp.dtype}")
    # (size, *shape) view of the caller's contiguous buffer: the backend fills it in place.
    work = pg.backend.allgather(out.reshape((size,) + shape), _at_least_1d(inp), async_op=async_op)
    return _finish(work, lambda: output_tensor, async_op)


# ---------------------------------------------------------------------------------- point to point
def _p2p_args(group, tag):
    # Accept send(t, dst, tag) as well as torch's send(t, dst, group, tag).
    if isinstance(group, int) and not isinstance(group, bool):
        group, tag = None, group
    if not isinstance(tag, int) or tag < 0:
        raise ValueError(f"tag={tag!r} must be a non-negative int")
    return group, tag


def send(tensor, dst: int, group=None, tag: int = 0) -> None:
    """Send ``tensor`` to global rank ``dst`` (blocks until handed to the transport).

    Example::

        if rank == 0:
            dist.send(Tensor(np.arange(3.0)), dst=1)
        elif rank == 1:
            dist.recv(Tensor(np.zeros(3)), src=0)
    """
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "send")
    if pg is None:
        return
    pg.backend.send(_buf(tensor), pg.group_rank(dst, "dst"), tag).wait()


def recv(tensor, src: int, group=None, tag: int = 0):
    """Receive from global rank ``src`` into ``tensor`` (same shape and dtype as sent); returns ``tensor``.

    Example::

        buf = Tensor(np.zeros(3))
        if rank == 1:
            dist.recv(buf, src=0)              # buf.data is what rank 0 sent
    """
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "recv")
    if pg is None:
        return None
    pg.backend.recv(_buf(tensor), pg.group_rank(src, "src"), tag).wait()
    return tensor


def isend(tensor, dst: int, group=None, tag: int = 0) -> Work:
    """Non-blocking :func:`send`; returns a Work (do not modify ``tensor`` until it is done).

    Example::

        work = dist.isend(Tensor(np.arange(3.0)), dst=1)
        work.wait()                            # the buffer may be reused from here
    """
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "isend")
    if pg is None:
        return None
    work = pg.backend.send(_buf(tensor), pg.group_rank(dst, "dst"), tag, async_op=True)
    return _finish(work, lambda: None, True)


def irecv(tensor, src: int, group=None, tag: int = 0) -> Work:
    """Non-blocking :func:`recv`; the Work's ``result()`` is ``tensor`` once received.

    Example::

        work = dist.irecv(Tensor(np.zeros(3)), src=0)
        work.wait()
        received = work.result()           # the Tensor passed in, now filled
    """
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "irecv")
    if pg is None:
        return None
    work = pg.backend.recv(_buf(tensor), pg.group_rank(src, "src"), tag, async_op=True)
    return _finish(work, lambda: tensor, True)


def sendrecv(send_tensor, dst: int, recv_tensor, src: int, group=None, tag: int = 0):
    """Send ``send_tensor`` to global rank ``dst`` while receiving ``recv_tensor`` from ``src``
    (mpi4py's ``Sendrecv``); returns ``recv_tensor``.

    Both halves are posted before either is waited on, so a ring or pairwise exchange where every
    rank calls it at once cannot deadlock (two blocking ``send`` calls facing each other can).
    ``dst == src == this rank`` copies. ``tag`` matches both halves (mpi4py's ``sendtag``/``recvtag``).

    Example::

        right, left = (rank + 1) % world, (rank - 1) % world
        got = dist.sendrecv(Tensor(np.full(3, float(rank))), right, Tensor(np.zeros(3)), left)
        # got.data == [left, left, left]
    """
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "sendrecv")
    if pg is None:
        return None
    out, inp = _buf(recv_tensor, "recv_tensor"), _buf(send_tensor, "send_tensor")
    peer_out, peer_in = pg.group_rank(dst, "dst"), pg.group_rank(src, "src")
    me = pg.rank()
    if peer_out == me and peer_in == me:
        if _shape_dtype(inp) != _shape_dtype(out):
            raise ValueError(f"sendrecv to this rank: send_tensor {_shape_dtype(inp)} and recv_tensor "
                             f"{_shape_dtype(out)} must have the same (shape, dtype)")
        out[...] = inp
        return recv_tensor
    receiving = pg.backend.recv(out, peer_in, tag, async_op=True)
    sending = pg.backend.send(inp, peer_out, tag, async_op=True)
    sending.wait()
    receiving.wait()
    return recv_tensor


class P2POp:
    """One point-to-point op for :func:`batch_isend_irecv` (torch's ``dist.P2POp``).

    ``op`` is :func:`isend` or :func:`irecv`; ``peer`` a global rank. Example::

        ops = [P2POp(isend, send_buf, (rank + 1) % world), P2POp(irecv, recv_buf, (rank - 1) % world)]
        for work in batch_isend_irecv(ops):
            work.wait()
    """

    __slots__ = ("group", "op", "peer", "tag", "tensor")

    def __init__(self, op: Callable, tensor, peer: int, group=None, tag: int = 0) -> None:
        if op not in (isend, irecv):
            name = getattr(op, "__name__", repr(op))
            hint = " (pass the function itself, not send/recv)" if name in ("send", "recv") else ""
            raise ValueError(f"P2POp: op={name} must be neural_arch.distributed.isend or irecv{hint}")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every op of ``p2p_op_list``; return their Works (torch semantics: wait on each).

    Every op is posted before any is waited on, so a ring (each rank sends right and receives
    from the left) cannot deadlock.

    Example::

        ops = [dist.P2POp(dist.isend, send_buf, (rank + 1) % world_size),
               dist.P2POp(dist.irecv, recv_buf, (rank - 1) % world_size)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError("batch_isend_irecv: pass a non-empty list of P2POp")
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise TypeError(f"batch_isend_irecv: entry {i} is a {type(p).__name__}, not a P2POp")
    works = [p.op(p.tensor, p.peer, p.group, p.tag) for p in p2p_op_list]
    return [w for w in works if w is not None]  # None: this rank is outside that op's group


# Object collectives and monitored_barrier live in their own module; importable from here as ever.
from neural_arch.distributed.object_collectives import (  # noqa: E402 - after the helpers it imports from here
    all_gather_object,
    broadcast_object_list,
    gather_object,
    monitored_barrier,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
