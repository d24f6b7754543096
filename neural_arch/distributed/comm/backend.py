"""The abstract communication backend: a handful of primitives, everything else derived.

A backend moves **arrays** (NumPy, or CuPy on GPU backends) between the ranks of one
group. It never sees a ``Tensor``. Subclasses implement six synchronous primitives::

    _allreduce(array, op, info)         in place
    _broadcast(array, root, info)       in place
    _allgather(output, input, info)     output.shape == (size, *input.shape)
    _send(array, dst, tag, info)        header/payload framing is the backend's business
    _recv(array, src, tag, info)        fills ``array``; shape/dtype must match the sender's
    _new_group(ranks) -> Backend        sub-communicator over ``ranks`` (ranks of this group)

and may override the derived ones (``_reduce``, ``_gather``, ``_scatter``,
``_reduce_scatter``, ``_alltoall``, ``_alltoallv``, ``_sendrecv``, ``_barrier``) with faster algorithms.

The public methods (``allreduce``, ``broadcast``, ...) are written once, here:

* they validate their arguments **in the caller**, before any I/O (bad input is a clear
  ``ValueError``/``TypeError`` naming the argument: type, device, dtype, contiguity, shape, a
  read-only output, the tag range). A rejected call takes no sequence number (as in torch), so
  when only one rank's call is rejected, that rank's next call takes the number: a retry with a
  valid buffer pairs with the peers' call, and any other call fails on every rank, because every
  frame carries the op's kind, dtype, reduce op, number and byte count (``transport.framing``);
* an error raised once the operation has started (a peer's bytes did not match, a reduction
  failed, a timeout) **poisons** the group: the peers may be mid-message, so every later operation
  on this rank fails at once naming that first failure
  (:class:`~neural_arch.distributed.errors.GroupPoisonedError`), and the
  backend tells the other ranks (:meth:`_poison_peers`), whose next operation fails the same way.
  A group never returns data from streams that fell out of step;
* they number every collective per group (``info.seq``), which errors and debug checks use;
* they run collectives **in order** on one progress thread per group when ``async_op=True``
  (so backward can overlap with communication), and inline when the queue is idle and the
  call is synchronous (no thread hop on the latency-critical path);
* with ``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL`` they first compare (op, shape, dtype, root)
  across ranks and raise :class:`~neural_arch.distributed.errors.CollectiveMismatchError` on
  **every** rank when they differ;
* every operation that runs is reported once to :mod:`neural_arch.profiler.events` as a
  ``"collective"`` span (op, seq, group, bytes, dtype, backend, transport) when someone listens;
  with no subscriber that costs one test of the observer lists.

How each operation runs (numbering, lanes, the inline synchronous path, debug checks, spans,
poisoning) lives in :mod:`neural_arch.distributed.comm.runner`
(:class:`~neural_arch.distributed.comm.runner.OpRunner`, this class's base); the dtypes and
in-place reductions every backend shares in :mod:`neural_arch.distributed.comm.dtypes`. ``Backend``
inherits the runner rather
than holding one because a backend *is* the thing that runs its ops: ``_run`` is the template method
that calls back the backend's own ``_allgather`` (debug checks) and ``_poison_peers``, and a held
runner would add an attribute hop and a two-way reference to every call on the latency path.

The synchronous path (``async_op=False``, idle lane) is the latency-critical one for small
messages: it validates, numbers, runs the primitive on the caller's thread and returns a Work
that is already done, with no lock, Event or thread hop (``benchmarks/bench_small_messages.py``
measures what is left).

Example (any concrete backend)::

    work = backend.allreduce(grads, ReduceOp.SUM, async_op=True)
    work.wait()
"""

from __future__ import annotations

import abc
import pickle
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from neural_arch.distributed.comm import spans as _spans
from neural_arch.distributed.comm.debug import _SEQ_MASK, wire_word
from neural_arch.distributed.comm.dtypes import (
    _AVG,
    _MAX,
    _MIN,
    _PRODUCT,
    _SUM,
    BFLOAT16,
    FLOAT_DTYPE_KINDS,
    SUPPORTED_DTYPES,
    _dtype_name,
    _is_array,
    is_bfloat16,
)
from neural_arch.distributed.comm.runner import OpRunner
from neural_arch.distributed.comm.work import UNSHARED_REFS as _UNSHARED_REFS
from neural_arch.distributed.comm.work import OpInfo, ReduceOp, Work
from neural_arch.distributed.flight_recorder.buffer import COMPLETED as _COMPLETED
from neural_arch.distributed.flight_recorder.buffer import STARTED as _STARTED
from neural_arch.distributed.flight_recorder.buffer import STATE as _STATE
from neural_arch.distributed.flight_recorder.buffer import T_END as _T_END
from neural_arch.distributed.flight_recorder.buffer import mark_failed as _fr_failed
from neural_arch.profiler import events as _events

_monotonic = time.monotonic
_refcount = sys.getrefcount

# The fused all_reduce path's table: reduce op -> {dtype: its name} for the host dtypes that op
# reduces as they are. Left out (they take the general path, which checks or converts them): bool
# for SUM/PRODUCT (an error), AVG of anything but float32/float64 (float16 is pre-multiplied,
# integers are an error), bfloat16 (recognised by name there).
# Each entry is (dtype name, the op's check word without its sequence number): the path builds the
# OpInfo with its wire word (``base | seq & _SEQ_MASK``, what ``comm.debug.wire_word`` returns) instead of
# leaving it to be computed on first read (a function call and a dict lookup on a tuple key).
_FAST = {op: {d: (_dtype_name(d), wire_word("all_reduce", 0, _dtype_name(d), op._value_)) for d in SUPPORTED_DTYPES
              if (op in (_MAX, _MIN) or d.kind != "b") and (op is not _AVG or (d.kind == "f" and d.itemsize > 2))}
         for op in ReduceOp}


class Backend(OpRunner):
    """One group's communicator. See the module docstring for the contract; how each operation
    runs (numbering, lanes, debug checks, spans, poisoning) is
    :class:`~neural_arch.distributed.comm.runner.OpRunner`'s.

    Example::

        >>> import numpy as np
        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> backend = LocalBackend()                 # a world of one; every backend has these methods
        >>> grads = np.ones(3)
        >>> backend.allreduce(grads, ReduceOp.SUM, async_op=True).wait()
        True
        >>> backend.rank, backend.size
        (0, 1)
    """

    #: device kinds whose arrays this backend can move
    devices: tuple = ("cpu",)
    #: the OpInfo the fused alltoallv path reuses while nobody else holds it (see :meth:`alltoallv`)
    _a2av_info: OpInfo | None = None

    # -- primitives (synchronous; run on the caller's thread or the progress thread) -------
    @abc.abstractmethod
    def _allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        """In place. AVG must come out averaged (``reduce_into`` then ``finish_average``)."""

    @abc.abstractmethod
    def _broadcast(self, array, root: int, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def _allgather(self, output, input, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def _send(self, array, dst: int, tag: int, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def _recv(self, array, src: int, tag: int, info: OpInfo) -> None: ...

    @abc.abstractmethod
    def _new_group(self, ranks: list[int]) -> Backend: ...

    def _shutdown(self) -> None:
        """Release sockets, shared memory, communicators. Called once by :meth:`shutdown`."""

    def interrupt_waits(self) -> None:
        """Make the operations other threads of this rank are waiting in stop with an error that
        says the group is being destroyed. ``destroy_process_group`` calls it first, before it
        waits for its peers to leave: an op that can no longer complete should not wait as long.
        Default: nothing (a backend whose waits cannot be interrupted, such as MPI's)."""

    # -- derived operations (override for speed) --------------------------------------------
    def _sendrecv(self, send_array, dst: int, recv_array, src: int, tag: int, info: OpInfo) -> None:
        """Send to ``dst`` while receiving from ``src`` (no deadlock when all ranks do it in a ring)."""
        errors: list = []

        def _do_send():
            try:
                self._send(send_array, dst, tag, info)
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller
                errors.append(exc)

        sender = threading.Thread(target=_do_send, daemon=True)
        sender.start()
        self._recv(recv_array, src, tag, info)
        sender.join(max(info.remaining(), 0.1))
        if errors:
            raise errors[0]

    def _reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        tmp = array.copy()
        self._allreduce(tmp, op, info)
        if self._rank == root:
            array[...] = tmp

    def _gather(self, output, input, root: int, info: OpInfo) -> None:
        if self._rank == root:
            for src in range(self._size):
                # output[src, ...] stays an array view even when input is 0-d
                if src == root:
                    output[src, ...] = input
                else:
                    self._recv(output[src, ...], src, _COLLECTIVE_TAG, info)
        else:
            self._send(input, root, _COLLECTIVE_TAG, info)

    def _scatter(self, output, input, root: int, info: OpInfo) -> None:
        if self._rank == root:
            for dst in range(self._size):
                if dst == root:
                    output[...] = input[dst, ...]
                else:
                    self._send(input[dst, ...].copy(), dst, _COLLECTIVE_TAG, info)
        else:
            self._recv(output, root, _COLLECTIVE_TAG, info)

    def _reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        tmp = input.copy()
        self._allreduce(tmp, op, info)
        n = output.shape[0]
        output[...] = tmp[self._rank * n:(self._rank + 1) * n]

    def _alltoall(self, output, input, info: OpInfo) -> None:
        size, rank = self._size, self._rank
        n = input.shape[0] // size
        output[rank * n:(rank + 1) * n] = input[rank * n:(rank + 1) * n]
        for step in range(1, size):
            dst, src = (rank + step) % size, (rank - step) % size
            send = input[dst * n:(dst + 1) * n]
            self._sendrecv(send, dst, output[src * n:(src + 1) * n], src, _COLLECTIVE_TAG, info)

    def _alltoallv(self, output, input, output_splits: list, input_splits: list, info: OpInfo) -> None:
        """Uneven all-to-all: rows ``input_splits[d]`` of ``input`` (in rank order) go to rank d, and
        ``output_splits[s]`` rows from rank s land in ``output`` (in rank order). The splits were
        checked in the caller (lengths, sums); whether the ranks' splits match is the hook's business.

        The default pads every block to the longest one in the group (agreed by a MAX all-reduce of one
        integer) and runs the equal-split :meth:`_alltoall` on the padded copies: correct on any
        backend, at the cost of the padding bytes and two copies. Backends with a native uneven exchange
        override it (gloo: pairwise blocks of their own length; MPI: ``Ialltoallv`` on these buffers).
        """
        xp = _xp(input)
        size, rest = self._size, tuple(input.shape[1:])
        longest = xp.asarray([max(input_splits + output_splits + [0])], dtype=np.int64)
        self._allreduce(longest, _MAX, info)
        chunk = int(longest[0])
        if chunk == 0:
            return                                   # no rank sends a row (the same decision everywhere)
        send = xp.zeros((size, chunk) + rest, dtype=input.dtype)
        start = 0
        for d, rows in enumerate(input_splits):
            send[d, :rows] = input[start:start + rows]
            start += rows
        recv = xp.empty_like(send)
        self._alltoall(recv.reshape((size * chunk,) + rest), send.reshape((size * chunk,) + rest), info)
        start = 0
        for s, rows in enumerate(output_splits):
            output[start:start + rows] = recv[s, :rows]
            start += rows

    def _barrier(self, info: OpInfo) -> None:
        self._allreduce(np.zeros(1, dtype=np.int32), _SUM, info)

    def _validate_tag(self, tag: int) -> None:
        """Raise ValueError in the caller for a tag this backend cannot carry (override)."""
        if not isinstance(tag, (int, np.integer)):
            raise TypeError(f"tag={tag!r} must be an int")

    # -- validation helpers ---------------------------------------------------------------------
    def _check_array(self, x, arg: str, writable: bool = False) -> None:
        if x.__class__ is np.ndarray and "cpu" in self.devices and x.dtype in SUPPORTED_DTYPES:
            flags = x.flags      # the common case: a plain NumPy array of a supported dtype
            if flags.c_contiguous and (flags.writeable or not writable):
                return
        if not _is_array(x):
            raise TypeError(f"{arg} must be a NumPy or CuPy array, got {type(x).__name__}; "
                            "pass tensor.data for a Tensor")
        device = "cpu" if isinstance(x, np.ndarray) else "cuda"
        if device not in self.devices:
            raise TypeError(f"{arg} lives on {device} but the {self.name!r} backend moves "
                            f"{'/'.join(self.devices)} arrays; use a backend for {device} or move the data")
        if x.dtype not in SUPPORTED_DTYPES and not is_bfloat16(x.dtype):
            raise TypeError(f"{arg} has dtype {x.dtype}, which cannot be communicated; "
                            f"use one of {sorted(str(d) for d in SUPPORTED_DTYPES) + [BFLOAT16]}")
        flags = x.flags
        if not flags.c_contiguous:
            raise ValueError(f"{arg} is not C-contiguous; pass np.ascontiguousarray({arg}) "
                             "(collectives write into the buffer in place)")
        if writable and isinstance(x, np.ndarray) and not flags.writeable:  # CuPy has no read-only arrays
            # checked here, before any I/O: found during the reduction, the peers would already be
            # mid-exchange and the group's streams out of step
            raise ValueError(f"{arg} is read-only but this collective writes its result into it; pass a "
                             f"writable array (np.array({arg}) copies one)")

    def _check_rank(self, r: int, arg: str) -> None:
        if r.__class__ is int and 0 <= r < self._size:
            return               # the common case in two tests (cheaper than the isinstance below)
        if not isinstance(r, (int, np.integer)) or not 0 <= int(r) < self._size:
            raise ValueError(f"{arg}={r!r} is out of range for a group of size {self._size} "
                             f"(valid: 0..{self._size - 1})")

    @staticmethod
    def _check_same(a, b, what: str, expected_shape=None) -> None:
        if np.dtype(a.dtype) != np.dtype(b.dtype):
            raise TypeError(f"{what}: dtype {b.dtype} does not match {a.dtype}")
        if expected_shape is not None and tuple(b.shape) != tuple(expected_shape):
            raise ValueError(f"{what}: shape {tuple(b.shape)} should be {tuple(expected_shape)}")

    def _check_op(self, op, array) -> ReduceOp:
        if op.__class__ is not ReduceOp:
            op = ReduceOp.coerce(op)
        kind = array.dtype.kind
        if kind == "f" and op is not _PRODUCT:   # the common case, decided in one test
            return op
        if op is _AVG and kind not in FLOAT_DTYPE_KINDS and not is_bfloat16(array.dtype):
            raise TypeError(f"ReduceOp.AVG needs a floating dtype, got {array.dtype}; "
                            "use ReduceOp.SUM and divide by the group size")
        if kind == "b" and op not in (_MAX, _MIN):
            raise TypeError(f"bool arrays support ReduceOp.MAX / MIN only, got {op}")
        return op

    # -- public collectives ---------------------------------------------------------------------
    def _check_allreduce(self, array, op) -> tuple:
        """all_reduce's argument checks, in the caller before any I/O: the one validation both paths
        of :meth:`allreduce` use. Returns ``(op, fast)``: ``op`` as a :class:`ReduceOp`, and ``fast``,
        the ``_FAST`` entry of a call whose array and op are the fused path's common case (else None).
        A bad argument raises what ``_check_array``/``_check_op`` raise, whichever path would run.

        >>> from neural_arch.distributed.comm.local import LocalBackend
        >>> LocalBackend()._check_allreduce(np.ones(2, np.float32), "sum")[0]
        <ReduceOp.SUM: 'sum'>
        """
        if array.__class__ is np.ndarray and op.__class__ is ReduceOp and self._cpu:
            fast = _FAST[op].get(array.dtype)
            # flags.carray: C-contiguous, aligned and writeable in one read. A _FAST dtype with it passes
            # every check below by construction (the table holds only what _check_op accepts as is);
            # an unaligned array takes the checks (and the general path, which moves it as well).
            if fast is not None and array.flags.carray:
                return op, fast
        self._check_array(array, "array", writable=True)
        return self._check_op(op, array), None

    def allreduce(self, array, op: ReduceOp = ReduceOp.SUM, async_op: bool = False, _work: bool = True) -> Work:
        """Reduce ``array`` across the group, in place on every rank.

        ``_work=False`` (internal: the Tensor API, which discards the handle) returns None instead of a
        finished Work from a synchronous call that took the fused path below.
        """
        op, fast = self._check_allreduce(array, op)
        # The fused synchronous path of the common case (``fast``: see _check_allreduce), on an idle,
        # healthy group of two or more on host memory without debug mode (``_fast``:
        # OpRunner._refresh_fast), in one frame: it numbers, times, spans, slots and poisons as
        # _new_info and _run do, without their call layers and the closure (what that buys:
        # docs/benchmarks.md, "small messages"; benchmarks/bench_small_messages.py --overhead).
        if fast is not None and not async_op and self._fast and not self._lane.pending:
            seq = self._seq = self._seq + 1
            now = _monotonic()
            info = self._fast_info
            if _refcount(info) == _UNSHARED_REFS:
                # Nobody but this slot holds the previous call's OpInfo (no Work, span, error, stall
                # inspector or waiting thread kept it), so it becomes this call's, field by field
                # (tests/comm/test_small_path.py pins that a held one is never reused).
                info.seq = seq
                info.shape = array.shape
                info.dtype = fast[0]
                info.reduce_op = op._value_
                info.deadline = now + self.timeout
                info._wire = fast[1] | (seq & _SEQ_MASK)
                info.nbytes = array.nbytes
            else:
                info = self._fast_info = OpInfo(
                    "all_reduce", seq, self._fr_group, self._global_rank, array.shape, fast[0], None,
                    op._value_, now + self.timeout, None, fast[1] | (seq & _SEQ_MASK), array.nbytes)
            rec = None
            ring = self._fr
            if ring is not None:
                # the flight recorder's record (the fields of flight_recorder.buffer, by index), as _run builds it
                code, offset = self._fr_caller()
                index = ring.next_index()
                rec = ring.slots[index % ring.size]   # a slot reused in place (flight_recorder.buffer.Ring)
                rec[:] = (self._fr_group, seq, "all_reduce", info.shape, fast[0], op._value_, None,
                          _STARTED, now, 0.0, code, offset, None, False, index)
            span = None
            if _events.OBSERVERS or _events.BEGIN_OBSERVERS or _events.END_OBSERVERS:
                span = _spans.begin(self, info, "default")   # a profiler, metrics
                info.extra["blocking"] = True          # the caller waits through it (metrics: not hidden)
            self._op_now = info                    # where the stall inspector looks (spans.in_flight)
            try:
                self._allreduce(array, op, info)
            except BaseException as exc:
                self._op_now = None
                if rec is not None:
                    _fr_failed(rec, exc)
                self._failed(info, exc, span)      # poison the group (and dump the recorder), as _run does
                raise
            self._op_now = None
            if rec is not None:
                rec[_STATE] = _COMPLETED
                rec[_T_END] = _monotonic()
            if span is not None:
                _spans.end(span, info)
            return Work.completed(array, info) if _work else None
        info = self._new_info("all_reduce", array, op=op)
        if self._size == 1:
            return self._run(info, lambda: array, async_op)
        if op is _AVG and info.dtype == "float16":
            def run():
                # Pre-multiplied sum: a float16 sum can overflow where the mean would not.
                array[...] *= array.dtype.type(1.0 / self._size)
                self._allreduce(array, _SUM, info)
                return array
        else:
            def run():
                self._allreduce(array, op, info)
                return array
        return self._run(info, run, async_op)

    def broadcast(self, array, root: int = 0, async_op: bool = False) -> Work:
        """Copy ``root``'s array into every rank's ``array``."""
        self._check_rank(root, "root")
        self._check_array(array, "array", writable=int(root) != self._rank)
        info = self._new_info("broadcast", array, root=root)

        def run():
            if self._size > 1:
                self._broadcast(array, root, info)
            return array
        return self._run(info, run, async_op)

    def reduce(self, array, root: int = 0, op: ReduceOp = ReduceOp.SUM, async_op: bool = False) -> Work:
        """Reduce into ``root``'s array; the other ranks' arrays are left unchanged."""
        self._check_array(array, "array", writable=True)
        self._check_rank(root, "root")
        op = self._check_op(op, array)
        info = self._new_info("reduce", array, root=root, op=op)

        def run():
            if self._size > 1:
                self._reduce(array, root, op, info)
            return array
        return self._run(info, run, async_op)

    def allgather(self, output, input, async_op: bool = False) -> Work:
        """``output[r] = input of rank r``; ``output.shape == (size, *input.shape)``."""
        self._check_array(input, "input")
        self._check_array(output, "output", writable=True)
        self._check_same(input, output, "all_gather output", (self._size,) + tuple(input.shape))
        info = self._new_info("all_gather", input)

        def run():
            if self._size == 1:
                output[0] = input
            else:
                self._allgather(output, input, info)
            return output
        return self._run(info, run, async_op)

    def gather(self, output, input, root: int = 0, async_op: bool = False) -> Work:
        """Like allgather, but only ``root`` receives (``output`` may be None elsewhere)."""
        self._check_array(input, "input")
        self._check_rank(root, "root")
        if self._rank == root:
            if output is None:
                raise ValueError(f"gather: rank {root} is the root and needs an output array "
                                 f"of shape {(self._size,) + tuple(input.shape)}")
            self._check_array(output, "output", writable=True)
            self._check_same(input, output, "gather output", (self._size,) + tuple(input.shape))
        info = self._new_info("gather", input, root=root)

        def run():
            if self._size == 1:
                output[0] = input
            else:
                self._gather(output, input, root, info)
            return output
        return self._run(info, run, async_op)

    def scatter(self, output, input, root: int = 0, async_op: bool = False) -> Work:
        """``output = root's input[rank]``; ``input.shape == (size, *output.shape)`` on root."""
        self._check_array(output, "output", writable=True)
        self._check_rank(root, "root")
        if self._rank == root:
            if input is None:
                raise ValueError(f"scatter: rank {root} is the root and needs an input array "
                                 f"of shape {(self._size,) + tuple(output.shape)}")
            self._check_array(input, "input")
            self._check_same(output, input, "scatter input", (self._size,) + tuple(output.shape))
        info = self._new_info("scatter", output, root=root)

        def run():
            if self._size == 1:
                output[...] = input[0]
            else:
                self._scatter(output, input, root, info)
            return output
        return self._run(info, run, async_op)

    def reduce_scatter(self, output, input, op: ReduceOp = ReduceOp.SUM, async_op: bool = False) -> Work:
        """Reduce ``input`` and give rank r the r-th chunk of dim 0 (``input.shape[0] == size * output.shape[0]``)."""
        self._check_array(input, "input")
        self._check_array(output, "output", writable=True)
        op = self._check_op(op, input)
        if input.ndim == 0 or input.shape[0] % self._size:
            dim0 = input.shape[0] if input.ndim else "a 0-d array"
            raise ValueError(f"reduce_scatter: input dim 0 ({dim0}) is not divisible by the group "
                             f"size {self._size}; pad the input to a multiple of {self._size}")
        expected = (input.shape[0] // self._size,) + tuple(input.shape[1:])
        self._check_same(input, output, "reduce_scatter output", expected)
        info = self._new_info("reduce_scatter", input, op=op)

        def run():
            if self._size == 1:
                output[...] = input
            elif op is _AVG and input.dtype == np.float16:
                # Pre-multiplied sum (see allreduce), on a copy: the input is the caller's.
                self._reduce_scatter(output, input * input.dtype.type(1.0 / self._size), _SUM, info)
            else:
                self._reduce_scatter(output, input, op, info)
            return output
        return self._run(info, run, async_op)

    def alltoall(self, output, input, async_op: bool = False) -> Work:
        """Rank r sends chunk d of ``input``'s dim 0 to rank d, and receives chunk s from rank s."""
        self._check_array(input, "input")
        self._check_array(output, "output", writable=True)
        if input.ndim == 0 or input.shape[0] % self._size:
            raise ValueError(f"all_to_all: input dim 0 must be divisible by the group size {self._size}")
        self._check_same(input, output, "all_to_all output", input.shape)
        info = self._new_info("all_to_all", input)

        def run():
            if self._size == 1:
                output[...] = input
            else:
                self._alltoall(output, input, info)
            return output
        return self._run(info, run, async_op)

    def alltoallv(self, output, input, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                  async_op: bool = False, _work: bool = True) -> Work:
        """Uneven all-to-all along dim 0 (MPI's ``Alltoallv``, torch's ``all_to_all_single`` with splits).

        Rank r sends rows ``input[off_d : off_d + input_split_sizes[d]]`` to rank d (``off_d``: the sum
        of the earlier splits) and receives ``output_split_sizes[s]`` rows from rank s into ``output``,
        in rank order. Splits may be zero. ``output`` and ``input`` share dtype and every dim but the
        first; ``sum(input_split_sizes) == input.shape[0]`` and ``sum(output_split_sizes) ==
        output.shape[0]`` (checked here, before any I/O). The peers' splits must match (rank s's
        ``input_split_sizes[d]`` == rank d's ``output_split_sizes[s]``): the MPI backend checks that
        inside its call check (a :class:`~neural_arch.distributed.errors.CollectiveMismatchError` on
        every rank, nothing sent); on gloo, blocks of different lengths are a ``FrameMismatchError``
        on the receiver and a block one side skips (zero rows) a timeout. Callers that cannot trust
        the splits exchange them first (``dist.all_to_all_single`` does).

        Every frame and the call check carry the row's byte count as the op's size (the rows differ
        between ranks; the row shape does not), and debug mode compares every dim but the first.

        ``_work=False`` (internal: callers that discard the handle, as expert parallelism's exchange
        does) returns None instead of a finished Work from a synchronous call that took the fused path.

        Example (2 ranks)::

            # rank 0 keeps 1 row and sends 2 to rank 1; rank 1 sends 3 rows to rank 0 and keeps 1
            backend.alltoallv(out, inp, output_split_sizes=[1, 3], input_split_sizes=[1, 2])   # rank 0
        """
        if (not async_op and self._fast and not self._lane.pending and input.__class__ is np.ndarray
                and output.__class__ is np.ndarray):
            # The fused synchronous path (what allreduce's does, for the token exchange of a MoE layer,
            # whose small steps are mostly per-op Python): the same checks as below in their cheap form,
            # then the op numbered, recorded, spanned and run in this frame, without _new_info, _run
            # and the closure. Anything the cheap checks do not pass takes the general path, which
            # raises the general path's errors.
            dtype, shape = input.dtype, input.shape
            fast = _A2AV_FAST.get(dtype)       # (dtype name, check word without the sequence number)
            if (fast is not None and dtype is output.dtype and shape and output.ndim and input.flags.c_contiguous
                    and output.flags.carray and shape[1:] == output.shape[1:]
                    and input_split_sizes.__class__ in _SPLIT_CLASSES and output_split_sizes.__class__ in _SPLIT_CLASSES):
                in_splits = list(map(int, input_split_sizes))
                out_splits = list(map(int, output_split_sizes))
                if (len(in_splits) == self._size == len(out_splits) and sum(in_splits) == shape[0]
                        and sum(out_splits) == output.shape[0] and min(in_splits) >= 0 <= min(out_splits)):
                    seq = self._seq = self._seq + 1
                    now = _monotonic()
                    # the op's size on the wire and in the call check: one row's bytes, the same on every rank
                    row_bytes = input.nbytes // shape[0] if shape[0] else _row_bytes(input)
                    info = self._a2av_info
                    if info is not None and _refcount(info) == _UNSHARED_REFS:
                        # nobody but this slot holds the previous call's OpInfo: it becomes this call's
                        # (as allreduce's fused path does; its op, group and rank fields stay the same)
                        info.seq = seq
                        info.shape = shape
                        info.dtype = fast[0]
                        info.deadline = now + self.timeout
                        info._wire = fast[1] | (seq & _SEQ_MASK)
                        info.nbytes = row_bytes
                        info._extra = None
                    else:
                        info = self._a2av_info = OpInfo(
                            "all_to_allv", seq, self._fr_group, self._global_rank, shape, fast[0], None, None,
                            now + self.timeout, None, fast[1] | (seq & _SEQ_MASK), row_bytes)
                    rec = None
                    ring = self._fr
                    if ring is not None:   # the flight recorder's record, as _run builds it
                        code, offset = self._fr_caller()
                        index = ring.next_index()
                        rec = ring.slots[index % ring.size]
                        rec[:] = (self._fr_group, seq, "all_to_allv", shape, fast[0], None, None,
                                  _STARTED, now, 0.0, code, offset, None, False, index)
                    span = None
                    if _events.OBSERVERS or _events.BEGIN_OBSERVERS or _events.END_OBSERVERS:
                        span = _spans.begin(self, info, "default")
                        info.extra["blocking"] = True
                    self._op_now = info
                    try:
                        self._alltoallv(output, input, out_splits, in_splits, info)
                    except BaseException as exc:
                        self._op_now = None
                        if rec is not None:
                            _fr_failed(rec, exc)
                        self._failed(info, exc, span)     # poison the group, as _run does
                        raise
                    self._op_now = None
                    if rec is not None:
                        rec[_STATE] = _COMPLETED
                        rec[_T_END] = _monotonic()
                    if span is not None:
                        _spans.end(span, info)
                    return Work.completed(output, info) if _work else None
        self._check_array(input, "input")
        self._check_array(output, "output", writable=True)
        if input.ndim == 0 or output.ndim == 0:
            raise ValueError("all_to_allv: input and output need at least one dim (rows are split along dim 0)")
        if input.dtype != output.dtype or input.shape[1:] != output.shape[1:]:
            raise ValueError(f"all_to_allv: output {tuple(output.shape)} {output.dtype} and input "
                             f"{tuple(input.shape)} {input.dtype} must share dtype and every dim but the first")
        in_splits = self._split_list(input_split_sizes, input, "input_split_sizes")
        out_splits = self._split_list(output_split_sizes, output, "output_split_sizes")
        info = self._new_info("all_to_allv", input)
        # the op's size on the wire and in the call check: one row's bytes, the same on every rank
        info.nbytes = _row_bytes(input)

        def run():
            if self._size == 1:
                output[...] = input
            else:
                self._alltoallv(output, input, out_splits, in_splits, info)
            return output
        return self._run(info, run, async_op)

    def _split_list(self, sizes, array, arg: str) -> list:
        if sizes is None or isinstance(sizes, (str, bytes)) or len(sizes) != self._size:
            raise ValueError(f"all_to_allv: {arg} must hold {self._size} row counts (one per rank), got {sizes!r}")
        out = list(map(int, sizes))
        if min(out) < 0 or sum(out) != array.shape[0]:
            raise ValueError(f"all_to_allv: {arg}={out} must be non-negative and sum to dim 0 of its array "
                             f"({array.shape[0]})")
        return out

    def barrier(self, async_op: bool = False) -> Work:
        info = self._new_info("barrier")

        def run():
            if self._size > 1:
                self._barrier(info)
        return self._run(info, run, async_op)

    # -- point to point -----------------------------------------------------------------------------
    def send(self, array, dst: int, tag: int = 0, async_op: bool = False) -> Work:
        """Send ``array`` to group rank ``dst`` (matched by ``tag`` with the peer's recv)."""
        self._check_array(array, "array")
        self._check_rank(dst, "dst")
        self._validate_tag(tag)
        if dst == self._rank:
            raise ValueError(f"send: dst={dst} is this rank; a rank cannot send to itself")
        info = self._new_info("send", array, root=dst, p2p=True)
        return self._run_p2p(info, lambda: self._send(array, dst, tag, info), async_op, ("send", dst, tag))

    def recv(self, array, src: int, tag: int = 0, async_op: bool = False) -> Work:
        """Receive into ``array`` from group rank ``src``; shape and dtype must match the send."""
        self._check_array(array, "array", writable=True)
        self._check_rank(src, "src")
        self._validate_tag(tag)
        if src == self._rank:
            raise ValueError(f"recv: src={src} is this rank; a rank cannot receive from itself")
        info = self._new_info("recv", array, root=src, p2p=True)

        def run():
            self._recv(array, src, tag, info)
            return array
        return self._run_p2p(info, run, async_op, ("recv", src, tag))

    # -- object collectives (trusted peers only: they unpickle what peers send) --------------------
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Pickle ``obj`` on ``root`` and return it on every rank. Trusted peers only."""
        self._check_rank(root, "root")
        if self._size == 1:
            return obj
        payload = _pickle(obj) if self._rank == root else np.zeros(0, np.uint8)
        length = np.array([payload.size], dtype=np.int64)
        self.broadcast(length, root)
        if self._rank != root:
            payload = np.empty(int(length[0]), dtype=np.uint8)
        self.broadcast(payload, root)
        return obj if self._rank == root else pickle.loads(payload.tobytes())

    def allgather_object(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order. Trusted peers only."""
        if self._size == 1:
            return [obj]
        payload = _pickle(obj)
        lengths = np.zeros((self._size, 1), dtype=np.int64)
        self.allgather(lengths, np.array([payload.size], dtype=np.int64))
        longest = int(lengths.max())
        padded = np.zeros(longest, dtype=np.uint8)
        padded[:payload.size] = payload
        table = np.zeros((self._size, longest), dtype=np.uint8)
        self.allgather(table, padded)
        return [pickle.loads(table[r, :int(lengths[r, 0])].tobytes()) for r in range(self._size)]

    # -- groups and teardown ---------------------------------------------------------------------------
    def new_group(self, ranks: Sequence[int]) -> Backend | None:
        """Sub-communicator over ``ranks`` (ranks of this group). Every rank of this group must
        call it with the same list; ranks outside it get ``None``."""
        ranks = [int(r) for r in ranks]
        if not ranks:
            raise ValueError("new_group: ranks must not be empty")
        for r in ranks:
            self._check_rank(r, "ranks[...]")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"new_group: ranks {ranks} contain duplicates")
        # every rank of this group calls it, in the same order: the count names the sub-group alike
        # on its members (the flight recorder tells same-member groups apart by it)
        self._fr_subgroups += 1
        sub = self._new_group(sorted(ranks))
        if sub is not None and self.group_id is not None:
            sub.group_id = f"{self.group_id}.{self._fr_subgroups}"
        return sub

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fast = False
        self._close_lanes("the process group was destroyed")
        self._shutdown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self._rank}, size={self._size}, ranks={self.group_ranks})"


_COLLECTIVE_TAG = -1  # tag used by derived collectives built on send/recv


_SPLIT_CLASSES = (list, tuple)   # split sizes the fused alltoallv path takes as they are (others: the general path)
# The fused alltoallv path's table, as _FAST for all_reduce: dtype -> (its name, the op's check word
# without its sequence number); bfloat16 is left to the general path (recognised by name there).
_A2AV_FAST = {d: (_dtype_name(d), wire_word("all_to_allv", 0, _dtype_name(d), None)) for d in SUPPORTED_DTYPES}


def _row_bytes(array) -> int:
    """The bytes of one row along dim 0 (``array`` may have none)."""
    if array.shape[0]:
        return array.nbytes // array.shape[0]
    n = array.dtype.itemsize
    for d in array.shape[1:]:
        n *= int(d)
    return n


def _xp(array):
    """NumPy, or CuPy for a CuPy array (the padding path allocates where the data lives)."""
    if isinstance(array, np.ndarray):
        return np
    import cupy

    return cupy


def _pickle(obj) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8).copy()
