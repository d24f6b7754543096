"""One FSDP unit: the parameters of a wrapped submodule as one flat, sharded parameter.

A unit owns a flat shard (a leaf Parameter of shape ``(shard_size,)``, what the optimizer
sees) in the parameters' original (master) dtype. ``gather()`` all-gathers the shards in the
compute dtype and points the module's original Parameters at views of the full flat array;
``free()`` points them at a zero-strided placeholder of the same shape (no memory), so a
rank holds full parameters only while a unit is in use.

Note on backward: the ops of this core save the arrays they read, so a unit's gathered
parameters stay alive through the graph until that unit's backward has run (torch frees them
and re-gathers before backward instead). Wrapping the unit in activation checkpointing gives
torch's behaviour exactly: the forward graph is not kept, and the recomputation in backward
re-gathers the unit (its forward pre-hook runs again).
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.parallel.sharded.flat import FlatLayout
from neural_arch.nn.parameter import Parameter

__all__ = ["FlatParamUnit"]


class FlatParamUnit:
    """The flat shard of ``params`` (list of Parameters owned by one wrapped module)."""

    def __init__(self, name: str, module, params: list, layout: FlatLayout, shard_rank: int, group,
                 param_dtype=None, offload: bool = False, reshard_after_forward: bool = True):
        self.name = name
        self.module = module
        self.params = params
        self.layout = layout
        self.group = group  # the shard group (None for NO_SHARD)
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise TypeError(f"FSDP unit {name or '<root>'}: parameters have mixed dtypes {sorted(map(str, dtypes))}; "
                            "convert the model to one dtype first (e.g. model.float())")
        self.master_dtype = params[0].dtype if params else np.dtype(np.float32)
        self.compute_dtype = np.dtype(param_dtype) if param_dtype is not None else self.master_dtype
        self.device = _backend.device_of(params[0].data) if params else "cpu"
        xp = _backend.get_array_module(params[0].data) if params else np
        flat = layout.flatten([p.data for p in params], xp, dtype=self.master_dtype)
        lo, hi = layout.shard_range(shard_rank)
        shard = flat[lo:hi].copy()
        self.offload = bool(offload)
        if self.offload:
            shard = _backend.to_device(shard, "cpu")  # identity for NumPy arrays
        self.flat_param = Parameter(shard)
        self.reshard_after_forward = reshard_after_forward
        self._placeholders = [np.broadcast_to(np.zeros((), self.compute_dtype), p.shape) if self.device == "cpu"
                              else xp.broadcast_to(xp.zeros((), self.compute_dtype), p.shape) for p in params]
        self.gathered = False
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

    def add_grad(self, flat_grad) -> None:
        """Accumulate this rank's averaged gradient shard into ``flat_param.grad`` (master dtype)."""
        g = flat_grad.astype(self.master_dtype, copy=False)
        if self.offload:
            g = _backend.to_device(g, "cpu")
        if self.group is None and g.shape[0] != self.layout.shard_size:
            g = g[:self.layout.shard_size]
        fp = self.flat_param
        if fp.grad is None:
            fp.grad = Tensor._wrap(g.copy())
        else:
            fp.grad.data += g
