"""State dicts of tensor-parallel models: this rank's shards, the full dict, and loading a full dict.

Every parallel layer names, in ``_tp_shard_dims``, which of its parameters are split and along
which dimension (``ColumnParallelLinear``: weight and bias on 0; ``RowParallelLinear``: weight
on 1; ``VocabParallelEmbedding``: weight on 0). The parameter names are the single-process
model's, so a full state dict from an unsharded model loads into the sharded one and back.

Example::

    full = model_single.state_dict()
    load_full_state_dict(tp_model, full)              # each rank keeps its slices
    assert full_state_dict(tp_model).keys() == full.keys()   # collective over the tp group
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from neural_arch import backend as _backend

__all__ = ["ShardedArray", "full_state_dict", "load_full_state_dict", "sharded_state_dict"]


@dataclass
class ShardedArray:
    """One rank's slice of a parameter: ``local`` is ``full[offset:offset+len]`` along ``dim``.

    Example::

        entry = sharded_state_dict(model)["fc1.weight"]
        entry.local.shape, entry.global_shape, entry.dim, entry.offset   # this rank's rows of the whole
    """

    local: np.ndarray
    global_shape: tuple
    dim: int
    offset: int
    group: object = None


def _shard_specs(module) -> dict:
    """``{state-dict key: (dim, group)}`` for every sharded parameter of ``module``."""
    specs = {}
    for prefix, sub in module.named_modules():
        dims = getattr(sub, "_tp_shard_dims", None)
        if not dims:
            continue
        group = getattr(sub, "process_group", None) or getattr(sub, "tp_group", None)
        for rel, dim in dims.items():
            specs[f"{prefix}.{rel}" if prefix else rel] = (dim, group)
    return specs


def sharded_state_dict(module) -> OrderedDict[str, object]:
    """``module.state_dict()`` with each sharded entry wrapped in a :class:`ShardedArray` (local, no I/O).

    Example::

        sd = sharded_state_dict(model)                 # no communication: each rank's slices
        np.savez(f"tp_rank{rank}.npz", **{k: getattr(v, "local", v) for k, v in sd.items()})
    """
    specs = _shard_specs(module)
    out = OrderedDict()
    for key, value in module.state_dict().items():
        if key in specs:
            dim, group = specs[key]
            n, r = group.size(), group.rank()
            shape = list(value.shape)
            offset = r * shape[dim]
            shape[dim] *= n
            out[key] = ShardedArray(value, tuple(shape), dim, offset, group)
        else:
            out[key] = value
    return out


def full_state_dict(module) -> OrderedDict[str, np.ndarray]:
    """The unsharded state dict (same keys and values as the single-process model).

    Collective: every rank of each tensor-parallel group must call it (one all-gather per
    sharded parameter).

    Example::

        sd = full_state_dict(model)                    # on every rank of the group
        if dist.get_rank() == 0:
            np.savez("model.npz", **sd)
    """
    out = OrderedDict()
    for key, value in sharded_state_dict(module).items():
        if isinstance(value, ShardedArray):
            n = value.group.size()
            local = np.ascontiguousarray(value.local)
            table = np.empty((n,) + local.shape, dtype=local.dtype)
            if n > 1:
                value.group.backend.allgather(table, local)
            else:
                table[0] = local
            out[key] = np.concatenate(list(table), axis=value.dim)
        else:
            out[key] = value
    return out


def load_full_state_dict(module, state_dict, strict: bool = True):
    """Load an unsharded ``state_dict`` into a tensor-parallel ``module``: each rank keeps its slices.

    Returns ``module.load_state_dict``'s ``IncompatibleKeys``. A full entry whose shape does not
    match the sharded parameter times the group size raises ``ValueError`` naming the key.

    Example::

        load_full_state_dict(model, dict(np.load("model.npz")))   # each rank keeps its slices
    """
    specs = _shard_specs(module)
    local = OrderedDict()
    for key, value in state_dict.items():
        value = _backend.to_host(value)  # Tensors and device arrays too: shards are cut on the host
        if key in specs:
            dim, group = specs[key]
            n, r = group.size(), group.rank()
            if value.ndim <= dim or value.shape[dim] % n:
                raise ValueError(f"load_full_state_dict: {key} has shape {value.shape}, which cannot be split "
                                 f"in {n} along dim {dim}; is it the full (unsharded) tensor?")
            step = value.shape[dim] // n
            index = [slice(None)] * value.ndim
            index[dim] = slice(r * step, (r + 1) * step)
            value = value[tuple(index)]
        local[key] = value
    return module.load_state_dict(local, strict=strict)
