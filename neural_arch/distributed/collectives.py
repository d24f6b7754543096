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

from collections.abc import Callable
from typing import Any

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.backend import _xp
from neural_arch.distributed.comm.work import ReduceOp, Work
from neural_arch.distributed.groups import ProcessGroup, _resolve_group

__all__ = [
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
]


# ---------------------------------------------------------------------------------- helpers
def _buf(x, arg: str = "tensor"):
    """A Tensor's data (made C-contiguous in place if needed); arrays pass through unchanged.

    Arrays are not copied: the backend checks them strictly, because a copy would silently
    leave the caller's buffer unchanged.
    """
    if isinstance(x, Tensor):
        data = x.data
        flags = getattr(data, "flags", None)
        if flags is not None and not flags.c_contiguous:
            data = _xp(data).ascontiguousarray(data)
            x.data = data
        return data
    if isinstance(x, (list, tuple)):
        raise TypeError(f"{arg} must be a Tensor or an array, got a {type(x).__name__}; the list forms "
                        "are all_gather(tensor_list, tensor), reduce_scatter(output, input_list) and "
                        "all_to_all(output_list, input_list)")
    return x


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


def _group(group, op: str) -> ProcessGroup:
    return _resolve_group(group, op)


def _stack(items, xp):
    return xp.stack([_buf(t, "tensor") for t in items]) if items else None


# ---------------------------------------------------------------------------------- collectives
def barrier(group=None, async_op: bool = False):
    """Block until every rank of ``group`` reached the barrier."""
    pg = _group(group, "barrier")
    work = pg.backend.barrier(async_op=async_op)
    return _finish(work, lambda: None, async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``tensor`` over the group, in place on every rank; returns ``tensor``."""
    pg = _group(group, "all_reduce")
    work = pg.backend.allreduce(_buf(tensor), op, async_op=async_op)
    return _finish(work, lambda: tensor, async_op)


def broadcast(tensor, src: int = 0, group=None, async_op: bool = False):
    """Copy global rank ``src``'s tensor into every rank's ``tensor``; returns ``tensor``."""
    pg = _group(group, "broadcast")
    root = pg.group_rank(src, "src")
    work = pg.backend.broadcast(_buf(tensor), root, async_op=async_op)
    return _finish(work, lambda: tensor, async_op)


def reduce(tensor, dst: int = 0, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce into global rank ``dst``'s ``tensor`` (others unchanged); returns ``tensor``."""
    pg = _group(group, "reduce")
    root = pg.group_rank(dst, "dst")
    work = pg.backend.reduce(_buf(tensor), root, op, async_op=async_op)
    return _finish(work, lambda: tensor, async_op)


def all_gather(tensor_list_or_tensor, tensor=None, group=None, async_op: bool = False):
    """Every rank's tensor, in group-rank order.

    ``all_gather(t)`` returns a new list (seed style); ``all_gather(tensor_list, t)`` fills
    ``tensor_list`` (torch style) and returns it.
    """
    pg = _group(group, "all_gather")
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
    """
    pg = _group(group, "gather")
    root = pg.group_rank(dst, "dst")
    data = _buf(tensor)
    is_root = pg.rank() == root
    table = None
    if is_root:
        if gather_list is not None:
            _check_list(gather_list, pg.size(), data.shape, data.dtype, "gather_list")
        table = _xp(data).empty((pg.size(),) + _at_least_1d(data).shape, dtype=data.dtype)
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
    """Global rank ``src`` sends ``scatter_list[r]`` to group rank r, into its ``tensor``; returns ``tensor``."""
    pg = _group(group, "scatter")
    root = pg.group_rank(src, "src")
    data = _buf(tensor)
    stacked = None
    if pg.rank() == root:
        if scatter_list is None:
            raise ValueError(f"scatter: global rank {src} is the source and needs scatter_list, a list "
                             f"of {pg.size()} tensors shaped like tensor {tuple(data.shape)}")
        _check_list(scatter_list, pg.size(), data.shape, data.dtype, "scatter_list")
        stacked = _stack(scatter_list, _xp(data)).reshape((pg.size(),) + _at_least_1d(data).shape)
    work = pg.backend.scatter(_at_least_1d(data), stacked, root, async_op=async_op)
    return _finish(work, lambda: tensor, async_op)


def reduce_scatter(output_or_input, input_list_or_op=None, op=ReduceOp.SUM, group=None,
                   async_op: bool = False):
    """Reduce over the group, then give each rank one chunk.

    Seed style: ``reduce_scatter(t, ReduceOp.AVERAGE)`` reduces ``t`` (dim 0 divisible by the
    group size) and returns this rank's chunk of dim 0 as a new tensor.
    Torch style: ``reduce_scatter(output, input_list, op)`` reduces ``input_list[r]`` across
    ranks into group rank r's ``output`` and returns ``output``.
    """
    pg = _group(group, "reduce_scatter")
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
    """torch's flat form: ``input.shape[0] == size * output.shape[0]``; fills and returns ``output``."""
    pg = _group(group, "reduce_scatter_tensor")
    work = pg.backend.reduce_scatter(_buf(output, "output"), _buf(input, "input"), op, async_op=async_op)
    return _finish(work, lambda: output, async_op)


def all_to_all(output, input=None, group=None, async_op: bool = False):
    """Rank r sends its chunk d to rank d and receives rank s's chunk r into slot s.

    Forms: ``all_to_all(output_list, input_list)`` (torch; equal shapes), ``all_to_all(output,
    input)`` with single tensors split along dim 0 (torch's ``all_to_all_single``), and
    ``all_to_all(input)``, which returns a new tensor.
    """
    pg = _group(group, "all_to_all")
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


def all_to_all_single(output, input, group=None, async_op: bool = False):
    """torch's name for the single-tensor form of :func:`all_to_all` (equal splits only)."""
    return all_to_all(output, input, group=group, async_op=async_op)


# ---------------------------------------------------------------------------------- point to point
def _p2p_args(group, tag):
    # Accept send(t, dst, tag) as well as torch's send(t, dst, group, tag).
    if isinstance(group, int) and not isinstance(group, bool):
        group, tag = None, group
    if not isinstance(tag, int) or tag < 0:
        raise ValueError(f"tag={tag!r} must be a non-negative int")
    return group, tag


def send(tensor, dst: int, group=None, tag: int = 0) -> None:
    """Send ``tensor`` to global rank ``dst`` (blocks until handed to the transport)."""
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "send")
    pg.backend.send(_buf(tensor), pg.group_rank(dst, "dst"), tag).wait()


def recv(tensor, src: int, group=None, tag: int = 0):
    """Receive from global rank ``src`` into ``tensor`` (same shape and dtype as sent); returns ``tensor``."""
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "recv")
    pg.backend.recv(_buf(tensor), pg.group_rank(src, "src"), tag).wait()
    return tensor


def isend(tensor, dst: int, group=None, tag: int = 0) -> Work:
    """Non-blocking :func:`send`; returns a Work (do not modify ``tensor`` until it is done)."""
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "isend")
    work = pg.backend.send(_buf(tensor), pg.group_rank(dst, "dst"), tag, async_op=True)
    return _finish(work, lambda: None, True)


def irecv(tensor, src: int, group=None, tag: int = 0) -> Work:
    """Non-blocking :func:`recv`; the Work's ``result()`` is ``tensor`` once received."""
    group, tag = _p2p_args(group, tag)
    pg = _group(group, "irecv")
    work = pg.backend.recv(_buf(tensor), pg.group_rank(src, "src"), tag, async_op=True)
    return _finish(work, lambda: tensor, True)


# ---------------------------------------------------------------------------------- objects (pickle)
def broadcast_object_list(object_list: list[Any], src: int = 0, group=None) -> list[Any]:
    """Replace ``object_list``'s contents with global rank ``src``'s. Trusted peers only (pickle)."""
    pg = _group(group, "broadcast_object_list")
    root = pg.group_rank(src, "src")
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list (it is filled in place), got {type(object_list).__name__}")
    received = pg.backend.broadcast_object(list(object_list) if pg.rank() == root else None, root)
    if pg.rank() != root:
        object_list[:] = received
    return object_list


def all_gather_object(object_list: list[Any], obj: Any, group=None) -> list[Any]:
    """Fill ``object_list`` (length = group size) with every rank's ``obj``. Trusted peers only."""
    pg = _group(group, "all_gather_object")
    if not isinstance(object_list, list) or len(object_list) != pg.size():
        got = len(object_list) if isinstance(object_list, list) else type(object_list).__name__
        raise ValueError(f"all_gather_object: object_list must be a list of length {pg.size()} (the group "
                         f"size), got {got}; use [None] * get_world_size(group)")
    object_list[:] = pg.backend.allgather_object(obj)
    return object_list


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0, group=None):
    """Every rank's ``obj`` on global rank ``dst`` (filling ``object_gather_list`` there); None elsewhere."""
    pg = _group(group, "gather_object")
    root = pg.group_rank(dst, "dst")
    if pg.rank() == root and object_gather_list is not None and (
            not isinstance(object_gather_list, list) or len(object_gather_list) != pg.size()):
        raise ValueError(f"gather_object: object_gather_list must be a list of length {pg.size()} on dst")
    # Built on all_gather_object: simple and correct; objects are small by nature.
    everything = pg.backend.allgather_object(obj)
    if pg.rank() != root:
        return None
    if object_gather_list is None:
        return everything
    object_gather_list[:] = everything
    return object_gather_list


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list=None,
                        src: int = 0, group=None) -> list[Any]:
    """Group rank r receives ``scatter_object_input_list[r]`` from ``src`` in ``output_list[0]``."""
    pg = _group(group, "scatter_object_list")
    root = pg.group_rank(src, "src")
    if not isinstance(scatter_object_output_list, list):
        raise TypeError("scatter_object_output_list must be a list (its first entry receives the object)")
    if pg.rank() == root and (not isinstance(scatter_object_input_list, (list, tuple))
                              or len(scatter_object_input_list) != pg.size()):
        raise ValueError(f"scatter_object_list: on src the input list needs {pg.size()} objects")
    items = pg.backend.broadcast_object(list(scatter_object_input_list) if pg.rank() == root else None, root)
    if scatter_object_output_list:
        scatter_object_output_list[0] = items[pg.rank()]
    else:
        scatter_object_output_list.append(items[pg.rank()])
    return scatter_object_output_list
