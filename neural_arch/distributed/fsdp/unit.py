"""One FSDP unit: the parameters of a wrapped submodule as one flat, sharded parameter.

A unit owns a flat shard (a leaf Parameter of shape ``(shard_size,)``, what the optimizer
sees) in the parameters' original (master) dtype. Gathering all-gathers the shards in the
compute dtype into a flat array and points the module's original Parameters at views of it;
freeing points them at zero-strided placeholders of the same shape (no memory).

Why gathered arrays come from a :class:`GatherPool`: the ops of this core save the arrays they
read, so the autograd graph keeps *views* of a unit's gathered parameters until that unit's
backward. A fresh array per gather would therefore stay alive from the unit's forward to its
backward for every unit at once (the whole model, gathered). torch frees the storage under
those views and re-allocates it before backward; NumPy cannot free memory that views point at,
so instead units *share* a few flat arrays (:class:`GatherBuffer`): after a unit's forward the
buffer is handed to the next unit, and before the unit's backward its parameters are
all-gathered **into the same buffer again**, so the views the graph saved read the right values
exactly when they are read. The engine runs nodes in reverse creation order, so in backward a
unit's nodes all run before any node of a unit that ran earlier in forward: the buffer is never
needed by two units at once as long as units that are live together in forward get different
buffers (the pool's rule). See :mod:`.fsdp` for the hooks and the checks that enforce it.
Host buffers live in :mod:`neural_arch.distributed.fsdp.storage` mappings, so that between a unit's forward and its
re-gather their memory can be given back under the views (torch's ``storage.resize_(0)``).
"""

from __future__ import annotations

import sys

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.flat_param import FlatLayout, FlatShard
from neural_arch.distributed.fsdp import storage as _storage
from neural_arch.nn.parameter import Parameter

__all__ = ["FlatParamUnit", "GatherBuffer", "GatherPool"]


def _new_array(numel: int, dtype, xp):
    # host buffers come from mmap so that their memory can be given back under live views
    return _storage.empty(numel, dtype) if xp is np else xp.empty(numel, dtype=dtype)


class GatherBuffer:
    """A flat array that holds one unit's gathered parameters at a time.

    ``holder``: the unit whose values it holds *and* still needs (None when free to reuse);
    ``call``: the holder's ``_UnitCall`` (when it ran in forward: decides safe eviction);
    ``work``: an in-flight (prefetch) all-gather into it, waited before the values are read.

    Example:
        >>> import numpy as np
        >>> buf = GatherBuffer(np.zeros(4, np.float32))
        >>> buf
        GatherBuffer(4 x float32, holder=None)
    """

    __slots__ = ("_inputs", "array", "call", "holder", "work")

    def __init__(self, array):
        self.array = array
        self.holder = None
        self.call = None
        self.work = None
        self._inputs = None  # the cast shard of an async all-gather, alive until it completes

    def drop_if_unviewed(self) -> bool:
        """Free the array when nothing else views it (no graph saved a view: activation
        checkpointing, no_grad, or the backward that read it is over); the next gather
        allocates a new one. NumPy only: a view holds a reference to its base array, so the
        reference count says whether views exist (CuPy views do not, so CuPy arrays stay)."""
        arr = self.array
        if arr is None or self.holder is not None or self.work is not None or type(arr) is not np.ndarray:
            return False
        del arr
        if sys.getrefcount(self.array) > 2:  # ours + getrefcount's argument
            return False
        self.array = None
        return True

    def release_storage(self) -> bool:
        """Give the array's memory back while the graph's views of it live on (torch's
        ``storage.resize_(0)``): only when nobody holds it, i.e. whoever reads it next gathers
        into it first (see :mod:`neural_arch.distributed.fsdp.storage`). False if it cannot (CuPy, a small array)."""
        if self.array is None or self.holder is not None or self.work is not None:
            return False
        return _storage.release(self.array)

    def release_range(self, start: int, stop: int) -> int:
        """Give back the memory under elements ``[start, stop)`` (whole pages) while the holder
        keeps the rest: their values are dead (see ``FullyShardedDataParallel._on_param_final``)."""
        return 0 if self.array is None else _storage.release_range(self.array, start, stop)

    def wait(self) -> None:
        if self.work is not None:
            work, self.work = self.work, None
            work.wait()
            self._inputs = None

    def __repr__(self) -> str:
        who = (self.holder.name or "<root>") if self.holder is not None else None
        return f"GatherBuffer({self.array.size} x {self.array.dtype}, holder={who})"


class GatherPool:
    """Per-dtype list of :class:`GatherBuffer`; cleared at the end of each backward.

    ``acquire`` returns a buffer nobody holds (growing one that is too small: the old array
    stays alive only while a graph still has views of it). ``exclude`` lets the caller keep
    consecutive units on different buffers (needed for backward prefetch).

    Example:
        >>> import numpy as np
        >>> pool = GatherPool()
        >>> first = pool.acquire(10, np.float32, np)
        >>> first.holder = "unit 0"                        # held: the next acquire gets another
        >>> pool.acquire(10, np.float32, np) is first
        False
    """

    def __init__(self):
        self._free_lists: dict = {}

    def acquire(self, numel: int, dtype, xp, exclude=()) -> GatherBuffer:
        bufs = self._free_lists.setdefault((np.dtype(dtype), xp.__name__), [])
        for i, b in enumerate(bufs):
            if b.holder is None and b.work is None and not any(b is e for e in exclude):
                if b.array is None:
                    b.array = _new_array(numel, dtype, xp)
                elif b.array.size < numel:
                    b = bufs[i] = GatherBuffer(_new_array(numel, dtype, xp))
                return b
        b = GatherBuffer(_new_array(numel, dtype, xp))
        bufs.append(b)
        return b

    def buffers(self) -> list:
        return [b for bufs in self._free_lists.values() for b in bufs]

    def clear(self) -> None:
        self._free_lists = {}


class FlatParamUnit:
    """The flat shard of ``params`` (list of Parameters owned by one wrapped module).

    Example::

        layout = FlatLayout([p.shape for p in params], world_size=group.size())
        unit = FlatParamUnit("blocks.0", block, params, layout, group.rank(), group)
        unit.gather()       # the parameters hold their full values (an all-gather)
        unit.free()         # back to this rank's shard only
    """

    def __init__(self, name: str, module, params: list, layout: FlatLayout, shard_rank: int, group,
                 param_dtype=None, offload: bool = False, reshard_after_forward: bool = True, like=None):
        self.name = name
        self.module = module
        self.params = params
        self.layout = layout
        self.group = group  # the shard group (None for NO_SHARD)
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise TypeError(f"FSDP unit {name or '<root>'}: parameters have mixed dtypes {sorted(map(str, dtypes))}; "
                            "convert the model to one dtype first (e.g. model.float())")
        # a unit without parameters of its own (a root whose layers are all units) still lives on the
        # model's device and dtype (``like``: any parameter of the model), not on the host
        ref = params[0] if params else like
        self.master_dtype = ref.dtype if ref is not None else np.dtype(np.float32)
        self.compute_dtype = np.dtype(param_dtype) if param_dtype is not None else self.master_dtype
        self.device = _backend.device_of(ref.data) if ref is not None else "cpu"
        xp = _backend.get_array_module(ref.data) if ref is not None else np
        flat = layout.flatten([p.data for p in params], xp, dtype=self.master_dtype)
        lo, hi = layout.shard_range(shard_rank)
        shard = flat[lo:hi].copy()
        self.offload = bool(offload)
        if self.offload:
            shard = _backend.to_device(shard, "cpu")  # identity for NumPy arrays
        self.flat_param = Parameter(shard)
        # which parts of which parameters the shard holds: for optimizer state dicts under the
        # parameters' names, and for clip_grad_norm_'s sum over the ranks
        self.flat_param._flat_shard = FlatShard(params, layout, shard_rank, group)
        for p in params:
            p._grad_elsewhere = ("FullyShardedDataParallel keeps its gradient in a flat shard (its .grad stays "
                                 "None); clip with fsdp.clip_grad_norm_(max_norm) or "
                                 "clip_grad_norm_(fsdp.parameters(), max_norm)")
        self.reshard_after_forward = reshard_after_forward
        self._placeholders = [np.broadcast_to(np.zeros((), self.compute_dtype), p.shape) if self.device == "cpu"
                              else xp.broadcast_to(xp.zeros((), self.compute_dtype), p.shape) for p in params]
        self.gathered = False
        self.bound = None   # the GatherBuffer the parameters point into (pooled units)
        self._held: list = []  # GatherBuffers holding this unit's values still needed
        self.free()

    def _shard_on_device(self):
        shard = self.flat_param.data
        if self.offload and self.device != "cpu":
            shard = _backend.to_device(shard, self.device)
        return shard

    def full_flat(self, dtype=None):
        """All-gather the full padded flat parameter in ``dtype`` (default: compute dtype)."""
        dtype = np.dtype(dtype) if dtype is not None else self.compute_dtype
        shard = self._shard_on_device()
        if shard.dtype != dtype:
            shard = shard.astype(dtype)
        if self.group is None:  # NO_SHARD: the shard is the whole flat parameter
            return shard
        xp = _backend.get_array_module(shard)
        out = xp.empty((self.group.size(), self.layout.shard_size), dtype=dtype)
        self.group.backend.allgather(out, shard)
        return out.reshape(-1)

    def gather(self) -> None:
        """Point the original parameters at the gathered full values (compute dtype)."""
        if not self.params:
            return
        for p, view in zip(self.params, self.layout.views(self.full_flat())):
            p.data = view
        self.gathered = True

    def free(self) -> None:
        for p, ph in zip(self.params, self._placeholders):
            p.data = ph
        self.gathered = False

    # -- pooled gathering (FULL_SHARD / HYBRID_SHARD with resharding after forward) ------------
    def gather_into(self, buf: GatherBuffer, async_op: bool = False) -> None:
        """All-gather this unit's full flat parameter into ``buf`` (asynchronously if asked)."""
        buf.wait()
        dtype = self.compute_dtype
        shard = self._shard_on_device()
        if shard.dtype != dtype:
            shard = shard.astype(dtype)
        if (buf.array is not None and buf.array.size < self.layout.padded_numel
                and not buf.drop_if_unviewed()):
            raise RuntimeError(f"FSDP unit {self.name or '<root>'}: its gather buffer was re-allocated "
                               "smaller by another unit whose saved views still use it")
        if buf.array is None:  # dropped while nothing viewed it: no saved view can need this one
            buf.array = _new_array(self.layout.padded_numel, dtype, _backend.get_array_module(shard))
        _storage.restore(buf.array)  # its memory may have been given back after forward
        out = buf.array[:self.layout.padded_numel].reshape(self.group.size(), self.layout.shard_size)
        work = self.group.backend.allgather(out, shard, async_op=async_op)
        if async_op:
            buf.work, buf._inputs = work, shard
        buf.holder = self
        self._held.append(buf)

    def take_staged(self, stage: GatherBuffer, buf: GatherBuffer) -> None:
        """Move a prefetch gathered into ``stage`` into ``buf`` (the buffer the graph's views read)."""
        stage.wait()
        n = self.layout.padded_numel
        if buf.array is None or buf.array.size < n:
            if buf.array is not None and not buf.drop_if_unviewed():
                raise RuntimeError(f"FSDP unit {self.name or '<root>'}: its gather buffer was re-allocated "
                                   "smaller by another unit whose saved views still use it")
            buf.array = stage.array if stage.array.size == n else stage.array[:n].copy()
        else:
            _storage.restore(buf.array)
            buf.array[:n] = stage.array[:n]
        stage.array = None
        buf.holder = self
        self._held.append(buf)

    def bind(self, buf: GatherBuffer) -> None:
        """Point the original parameters at views of ``buf`` (waiting for a prefetch first)."""
        buf.wait()
        for p, view in zip(self.params, self.layout.views(buf.array[:self.layout.padded_numel])):
            p.data = view
        self.bound = buf
        self.gathered = True

    def unbind(self) -> None:
        """Placeholders for the parameters; the buffer itself is released separately."""
        for p, ph in zip(self.params, self._placeholders):
            p.data = ph
        self.bound = None
        self.gathered = False

    def release(self, buf: GatherBuffer) -> None:
        """This unit no longer needs what ``buf`` holds."""
        buf.wait()
        if buf.holder is self:
            buf.holder = None
            buf.call = None
        self._held = [b for b in self._held if b is not buf]

    def release_all(self) -> None:
        held = list(self._held)
        for b in held:
            self.release(b)
        self.unbind()
        for b in held:
            b.drop_if_unviewed()

    def holds(self, buf: GatherBuffer) -> bool:
        return buf.holder is self

    def add_grad(self, flat_grad, owned: bool = False) -> None:
        """Accumulate this rank's averaged gradient shard into ``flat_param.grad`` (master dtype);
        ``owned``: the caller hands ``flat_grad`` over (it becomes the gradient without a copy)."""
        g = flat_grad.astype(self.master_dtype, copy=False)
        owned = owned or g is not flat_grad
        if self.offload:
            g = _backend.to_device(g, "cpu")
        if self.group is None and g.shape[0] != self.layout.shard_size:
            g = g[:self.layout.shard_size]
        fp = self.flat_param
        if fp.grad is None:
            fp.grad = Tensor._wrap(g if owned else g.copy())
        else:
            fp.grad.data += g
