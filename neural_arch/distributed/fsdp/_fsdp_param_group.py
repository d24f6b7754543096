"""``FSDPParamGroup``: the parameters of one ``fully_shard``-ed module, moved together: one
all-gather unshards them all, one reduce-scatter (plus, for HSDP, one all-reduce) reduces all their
gradients (torch's ``FSDPParamGroup``).

Layout of the collectives (torch's): each parameter is split on dim 0 into ``n`` chunks of
``ceil(rows / n)`` rows (``torch.chunk``; the last ranks may hold fewer rows or none). Every rank
packs its chunks, each zero-padded to the full chunk size, one after another into a flat array of
``per_rank`` elements; the all-gather's ``(n, per_rank)`` output is copied out into the *unsharded
buffer*, where each parameter is contiguous, and each unsharded parameter is a view of it. The
gradients travel the other way: each unsharded gradient is padded to ``n`` chunks and written into
an ``(n, per_rank)`` array in the reduce dtype; the reduce-scatter leaves this rank its
``per_rank`` elements (the sum over the shard group), HSDP then all-reduces them over the replicate
group, and the sum is divided by the data-parallel degree (the mean, as DDP) and stored, in the
sharded parameter's dtype, as (or added to) the sharded parameter's gradient. The reduction carries
one more element per parameter after each rank's ``per_rank``: how many ranks had a gradient for it
(none: its gradient is left alone, as one process leaves an unused parameter's). A ``replicate_group``
from outside the mesh (a fault-tolerant replica's lane, whose size is the current quorum's) averages
instead, and the shard group's sum is divided by the shard group's size.

Resharding gives the unsharded buffer's memory back (host arrays from
:mod:`neural_arch.distributed.fsdp.storage`: the autograd graph's saved views stay valid) and puts
the sharded parameters back in the module; unsharding restores it and re-gathers into the same
buffer, so the views the graph saved read the right values again in backward.

Example::

    group = FSDPParamGroup(fsdp_params, module, mesh, MixedPrecisionPolicy(), OffloadPolicy())
    group.unshard(); y = module(x); group.reshard()
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import queue_callback
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.fsdp import storage
from neural_arch.distributed.fsdp._fsdp_api import CPUOffloadPolicy
from neural_arch.distributed.fsdp._fsdp_param import ShardedGrad

__all__ = ["FSDPParamGroup"]


def _tensors(out) -> list:
    """Every Tensor in ``out`` (a Tensor, or tuples/lists/dicts of them) that carries a gradient."""
    if isinstance(out, Tensor):
        return [out] if out.requires_grad and out.grad_fn is not None else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


class FSDPParamGroup:
    """The :class:`~neural_arch.distributed.fsdp._fsdp_param.FSDPParam` s of one
    module: unshard / reshard / reduce as one collective each, and the hooks' state per backward.

    ``mesh`` is 1-d (shard over it) or 2-d ``(replicate, shard)`` (HSDP). ``replicate_group``
    (with a 1-d mesh) is a replicate group that is no dimension of the mesh: after the
    reduce-scatter each shard is averaged over it (``ReduceOp.AVG``), so its size may change from
    one step to the next (a fault-tolerant lane,
    :class:`~neural_arch.distributed.ft.managed_group.ManagedProcessGroup`).

    Example::

        group.unshard()          # one all-gather; the module's slots hold the full parameters
        group.reshard()          # the sharded parameters are back; the buffer's memory is returned
    """

    def __init__(self, fsdp_params, mesh, mp_policy, offload_policy, reshard_after_forward: bool,
                 shard_dim: int, replicate_dim: int | None, replicate_group=None):
        if replicate_group is not None and replicate_dim is not None:
            raise ValueError("FSDPParamGroup: replicate over the mesh's replicate dimension or over "
                             "replicate_group, not both")
        self.fsdp_params = list(fsdp_params)
        self.mesh = mesh
        self.shard_group = mesh.get_group(shard_dim)
        self.replicate_group = mesh.get_group(replicate_dim) if replicate_dim is not None else replicate_group
        self.shard_size = mesh.size(shard_dim)
        self.dp_size = mesh.size(shard_dim) * (mesh.size(replicate_dim) if replicate_dim is not None else 1)
        # a mesh dimension has a fixed size: sum over it and divide by the whole degree once; a group
        # from outside the mesh averages itself (its size is the quorum's, known only when it reduces)
        self._replicate_averages = replicate_group is not None
        self.mp_policy = mp_policy
        self.host_offload = isinstance(offload_policy, CPUOffloadPolicy)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.reshard_after_backward = True
        self.requires_gradient_sync = True
        self.requires_all_reduce = True
        # HSDP with requires_all_reduce False: the reduce-scattered sums (and counts) not yet
        # all-reduced over the replicate group, added to the next reduction that is
        self._partial = None
        dtypes = {np.dtype(fp.orig_dtype) for fp in self.fsdp_params}
        if mp_policy.param_dtype is None and len(dtypes) > 1:
            raise ValueError(f"fully_shard: the parameters of one module have several dtypes {sorted(map(str, dtypes))}; "
                             "give them one dtype, or set MixedPrecisionPolicy(param_dtype=...)")
        self.param_dtype = np.dtype(mp_policy.param_dtype) if mp_policy.param_dtype is not None else (
            dtypes.pop() if dtypes else np.dtype(np.float32))
        self.reduce_dtype = np.dtype(mp_policy.reduce_dtype) if mp_policy.reduce_dtype is not None else self.param_dtype
        offset = unsharded = 0
        for fp in self.fsdp_params:
            fp.offset, fp.unsharded_offset = offset, unsharded
            offset += fp.padded_numel
            unsharded += fp.numel
        self.per_rank, self.unsharded_numel = offset, unsharded
        self.device = self.fsdp_params[0].device if self.fsdp_params else "cpu"
        self.buffer = None
        self.is_unsharded = False
        self._trainable = [fp for fp in self.fsdp_params if fp.requires_grad]
        self._ready: set[int] = set()   # the parameters whose gradient is final in this round
        self._callback_queued = False
        self._pending = None          # a prefetched all-gather: (work, table)
        #: the group whose module ran just before this one in the last forward (its backward comes
        #: next): prefetched when this module's backward starts (torch's backward prefetch)
        self.backward_prefetch: FSDPParamGroup | None = None

    # ------------------------------------------------------------------ arrays
    def _xp(self):
        return _backend.get_array_module(self.fsdp_params[0].sharded_param.data)

    def _on_device(self, array):
        if self.host_offload and self.device != "cpu":
            return _backend.to_device(array, self.device)
        return array

    def _alloc_buffer(self):
        if self.device == "cpu":
            buf = storage.empty(self.unsharded_numel, self.param_dtype)
        else:
            buf = _backend.to_device(np.empty(0, self.param_dtype), self.device)
            buf = _backend.get_array_module(buf).empty(self.unsharded_numel, dtype=self.param_dtype)
        self.buffer = buf
        for fp in self.fsdp_params:
            view = buf[fp.unsharded_offset:fp.unsharded_offset + fp.numel].reshape(fp.shape)
            # every leaf gets the hook; whether it takes a gradient follows the sharded parameter at
            # each forward (see _follow_requires_grad), so freezing one later works
            fp.unsharded = Tensor(view, requires_grad=True)
            fp.unsharded.register_post_accumulate_grad_hook(lambda t, fp=fp: self._on_grad_final(fp))
            fp.unsharded.requires_grad = fp.requires_grad

    def _follow_requires_grad(self) -> None:
        """Take ``requires_grad`` from the sharded parameters (what the user sets, e.g. freezing a layer
        for fine-tuning after ``fully_shard``): the unsharded leaves the forward uses, and the set of
        parameters whose gradients a backward waits for."""
        self._trainable = [fp for fp in self.fsdp_params if fp.requires_grad]
        if self.buffer is not None:
            for fp in self.fsdp_params:
                fp.unsharded.requires_grad = fp.requires_grad

    # ------------------------------------------------------------------ unshard / reshard
    def _start_gather(self, async_op: bool):
        """Pack this rank's shards (in ``param_dtype``) and all-gather them: ``(work, table)``."""
        xp = self._xp()
        send = xp.zeros(self.per_rank, dtype=self.param_dtype)
        for fp in self.fsdp_params:
            size = fp.local_rows * fp.row_numel
            send[fp.offset:fp.offset + size] = fp.sharded_param.data.reshape(-1)
        send = self._on_device(send)
        table = _backend.get_array_module(send).empty((self.shard_size, self.per_rank), dtype=self.param_dtype)
        return self.shard_group.backend.allgather(table, send, async_op=async_op), table

    def prefetch(self) -> None:
        """Start this group's all-gather in the background (the next :meth:`unshard` waits for it):
        issued when the module that follows this one in forward starts its backward."""
        if self.is_unsharded or self._pending is not None or not self.fsdp_params:
            return
        self._arm()
        self._pending = self._start_gather(async_op=True)

    def _drop_prefetch(self) -> None:
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def unshard(self) -> None:
        """All-gather every parameter of the group (one collective) and install the full ones."""
        if self.is_unsharded or not self.fsdp_params:
            return
        work, table = self._pending if self._pending is not None else self._start_gather(async_op=False)
        self._pending = None
        work.wait()
        if self.buffer is None:
            self._alloc_buffer()
        else:
            storage.restore(self.buffer)
        n = self.shard_size
        for fp in self.fsdp_params:
            full = table[:, fp.offset:fp.offset + fp.padded_numel].reshape((n * fp.chunk,) + fp.shape[1:])
            fp.unsharded.data[...] = full[:fp.rows]
            fp.install(fp.unsharded)
        self.is_unsharded = True

    def reshard(self) -> None:
        """Put the sharded parameters back in the module and give the gathered memory back."""
        if not self.is_unsharded:
            return
        for fp in self.fsdp_params:
            fp.install(fp.sharded_param)
        storage.release(self.buffer)
        self.is_unsharded = False

    # ------------------------------------------------------------------ forward / backward hooks
    def pre_forward(self, args):
        self._follow_requires_grad()
        self.unshard()
        return self.cast_inputs(args)

    def cast_inputs(self, inputs):
        """``inputs`` (the positional tuple, or the keyword dict) with every floating Tensor in them,
        nested ones too, cast to ``param_dtype`` (``cast_forward_inputs``, torch's); None: no cast."""
        dt = self.mp_policy.param_dtype
        if dt is None or not self.mp_policy.cast_forward_inputs:
            return None
        return _cast_floating(inputs, dt)

    def post_forward(self, out, reshard: bool):
        if reshard:
            self.reshard()
        for t in _tensors(out):
            t.register_hook(self._pre_backward)
        dt = self.mp_policy.output_dtype
        if dt is not None:
            out = _cast_floating(out, dt)
        return out

    def _arm(self) -> None:
        if not self._callback_queued:
            queue_callback(self._finish_backward)
            self._callback_queued = True

    def _pre_backward(self, grad):
        self._arm()
        self.unshard()   # resharded after forward: the graph's saved views need the values again
        if self.backward_prefetch is not None:
            self.backward_prefetch.prefetch()

    def _on_grad_final(self, fp) -> None:
        self._arm()
        self._ready.add(id(fp))
        if len(self._ready) == len(self._trainable):
            self._post_backward()

    def _post_backward(self) -> None:
        # a new round may follow in the same backward: an activation-checkpointed module applied twice
        # (or in two forwards) is recomputed once per use, and each recomputation's backward ends with
        # the gradients "final"; the next round's contributions are reduced and added in turn
        self._ready.clear()
        if self.requires_gradient_sync:
            self.reduce_grads()
        if self._reshards_after_backward():
            self.reshard()

    def _reshards_after_backward(self) -> bool:
        # a synced backward is followed by the optimizer step, which changes the shards: parameters
        # kept gathered would be stale in the next forward (reshard_after_backward=False is for the
        # unsynced backwards of gradient accumulation, torch's use)
        return self.reshard_after_backward or self.requires_gradient_sync

    def _finish_backward(self) -> None:
        self._drop_prefetch()   # prefetched but never needed: the shards change before the next forward
        # the parameters that got no gradient in this backward never reported final: reduce now
        if self._ready:
            self._post_backward()
        elif self._reshards_after_backward():
            self.reshard()
        self._callback_queued = False

    # ------------------------------------------------------------------ gradients
    def reduce_grads(self) -> None:
        """Reduce-scatter the unsharded gradients (one collective; HSDP: then one all-reduce over the
        replicate group), average over the data-parallel ranks, add to the sharded gradients.

        A parameter without a gradient on this rank contributes zeros (the mean over the ranks that
        used it counts this one as zero). One more element per parameter, after each rank's
        ``per_rank`` elements, counts the ranks that had a gradient for it: a parameter no rank used
        in this backward keeps its sharded gradient as it was (``None`` after ``zero_grad``), as in
        one process, where the optimizer then skips it (a zero gradient would still move it by
        momentum and weight decay)."""
        # every parameter, frozen ones too (frozen after gradients accumulated: one process would
        # still step them with those): the same list on every rank, whatever each one's gradients
        grads = [(fp, fp.unsharded.grad if fp.unsharded is not None else None) for fp in self.fsdp_params]
        if all(g is None for _, g in grads):
            return
        xp = _backend.get_array_module(next(g for _, g in grads if g is not None).data)
        n, width = self.shard_size, self.per_rank + len(grads)
        send = xp.zeros((n, width), dtype=self.reduce_dtype)
        for i, (fp, g) in enumerate(grads):
            if g is None:
                continue
            padded = xp.zeros(n * fp.padded_numel, dtype=self.reduce_dtype)
            padded[:fp.numel] = g.data.reshape(-1)
            send[:, fp.offset:fp.offset + fp.padded_numel] = padded.reshape(n, fp.padded_numel)
            send[:, self.per_rank + i] = 1      # in every rank's part: the count reaches them all
            fp.unsharded.grad = None
        out = xp.empty(width, dtype=self.reduce_dtype)
        self.shard_group.backend.reduce_scatter(out, send.reshape(-1), ReduceOp.SUM)
        if self.replicate_group is not None:
            if self._partial is not None:
                out += self._partial
                self._partial = None
            if not self.requires_all_reduce:
                self._partial = out      # the sharded gradients wait for the all-reduce
                return
        if self._replicate_averages:
            # a fault-tolerant lane carries the gradient shard only (its quorum changes from step to
            # step): the counts are the shard group's, so every parameter takes its (zero-filled)
            # gradient, the same on every replica
            self.replicate_group.backend.allreduce(out[:self.per_rank], ReduceOp.AVG)
            out /= self.shard_size
            out[self.per_rank:] = 1
        else:
            if self.replicate_group is not None:
                self.replicate_group.backend.allreduce(out, ReduceOp.SUM)
            out /= self.dp_size
        if self.host_offload and self.device != "cpu":
            out = _backend.to_device(out, "cpu")
        used = _backend.to_host(out[self.per_rank:] > 0)
        for i, (fp, g) in enumerate(grads):
            if not used[i]:
                continue
            sp = fp.sharded_param
            piece = out[fp.offset:fp.offset + fp.local_rows * fp.row_numel]
            piece = piece.reshape((fp.local_rows,) + fp.shape[1:]).astype(fp.orig_dtype, copy=True)
            if sp._grad is None:
                sp._grad = ShardedGrad(piece, sp.device_mesh, sp.placements, sp.dtensor_shape)
            else:
                sp._grad.data += piece


def _cast_floating(out, dtype):
    if isinstance(out, Tensor):
        return out.to(dtype) if out.is_floating_point() and out.dtype != dtype else out
    if isinstance(out, tuple):
        items = [_cast_floating(o, dtype) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)   # namedtuples stay
    if isinstance(out, list):
        return [_cast_floating(o, dtype) for o in out]
    if isinstance(out, dict):
        return {k: _cast_floating(v, dtype) for k, v in out.items()}
    return out
