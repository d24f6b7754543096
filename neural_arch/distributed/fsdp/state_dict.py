"""FSDP's state dicts: full (original names, gathered values) and sharded (each rank's flat shards).

:class:`FSDPStateDicts` is a component that every
:class:`~neural_arch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel` holds
(``fsdp._state_dicts``); it reads the wrapper's ``module`` and ``_units`` and owns the current
:class:`~neural_arch.distributed.fsdp.api.StateDictType`. FSDP's public ``state_dict``, ``load_state_dict`` and
``summon_full_params`` delegate to it; torch's static ``FSDP.state_dict_type`` context and the
optimizer's ``FSDP.optim_state_dict`` / ``FSDP.optim_state_dict_to_load`` are the functions of
this module (they defer to :mod:`neural_arch.distributed.checkpoint.state_dict`: the optimizer's
state under the model's parameter names, each rank's part of it as a ``ShardedArray``).
Checkpointing is a concept of its own, hence a file of its own.

Example::

    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        shards = fsdp.state_dict()          # {"flat_param_0": this rank's shard, ...}
    full = fsdp.state_dict()                # a collective: every rank gets the full values

Under expert parallelism the experts are named by their global index (``moe.experts.3.fc1.weight``
on the ranks holding expert 3, see :mod:`neural_arch.distributed.checkpoint.expert_names`), in the
full state dict and in a sharded one (an expert unit's shard: ``moe.experts.3.flat_param``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import no_grad
from neural_arch.distributed.fsdp.api import StateDictType


def _named_modules(module):
    """``module.named_modules()`` with expert-parallel experts under their global index."""
    from neural_arch.distributed.checkpoint.expert_names import named_modules

    return named_modules(module)

__all__ = ["FSDPStateDicts", "optim_state_dict", "optim_state_dict_to_load", "state_dict_type"]


@contextlib.contextmanager
def state_dict_type(module, state_dict_type, state_dict_config=None, optim_state_dict_config=None):
    """Set the state-dict type of ``module`` and every FSDP module inside it, for a ``with`` block.

    Example::

        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            sd = model.state_dict()
    """
    if not isinstance(state_dict_type, StateDictType):
        raise TypeError(f"state_dict_type must be a StateDictType, got {state_dict_type!r}")
    fsdps = [m for m in ([module] + list(module.modules())) if isinstance(getattr(m, "_state_dicts", None), FSDPStateDicts)]
    prev = [m._state_dicts.type for m in fsdps]
    for m in fsdps:
        m._state_dicts.type = state_dict_type
    try:
        yield
    finally:
        for m, p in zip(fsdps, prev):
            m._state_dicts.type = p


def optim_state_dict(model, optim, optim_state_dict=None, group=None) -> dict:
    """torch's ``FSDP.optim_state_dict``: ``optim``'s state under the model's parameter names.

    Under ``FULL_STATE_DICT`` (the default) every array is whole, on every rank (a collective);
    under ``SHARDED_STATE_DICT`` each rank's part is a flat ``ShardedArray`` (for ``dcp.save``).
    The same as :func:`neural_arch.distributed.checkpoint.state_dict.get_optimizer_state_dict`.

    Example::

        with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
            dcp.save({"model": fsdp.state_dict(), "optim": FSDP.optim_state_dict(fsdp, opt)}, path)
    """
    from neural_arch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    del optim_state_dict, group  # accepted for torch compatibility: the state is read from ``optim``
    own = getattr(model, "_state_dicts", None)
    full = own is None or own.type is StateDictType.FULL_STATE_DICT
    return get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=full))


def optim_state_dict_to_load(model, optim, optim_state_dict, is_named_optimizer: bool = False,
                             load_directly: bool = False, group=None) -> dict:
    """torch's ``FSDP.optim_state_dict_to_load``: ``optim_state_dict`` (from
    :func:`optim_state_dict` on any world size, whole or sharded) as this rank's
    ``optim.load_state_dict`` input. It is loaded into ``optim`` on the way (``load_directly``
    is always true here); loading the result again changes nothing.

    Example::

        osd = FSDP.optim_state_dict_to_load(fsdp, opt, full_osd)
        opt.load_state_dict(osd)
    """
    from neural_arch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    del is_named_optimizer, load_directly, group
    set_optimizer_state_dict(model, optim, optim_state_dict)
    return optim.state_dict()


class FSDPStateDicts:
    """The state dicts of one FSDP wrapper ``fsdp`` (its ``module`` and flat ``_units``).

    ``type`` is the :class:`~neural_arch.distributed.fsdp.api.StateDictType` that :func:`state_dict_type` sets for a block.

    Example::

        fsdp._state_dicts.type                          # StateDictType.FULL_STATE_DICT
        full = fsdp._state_dicts.state_dict()           # what fsdp.state_dict() returns
    """

    def __init__(self, fsdp) -> None:
        self.fsdp = fsdp
        self.type = StateDictType.FULL_STATE_DICT

    def _names(self):
        """{id(parameter): state-dict name}: experts under their global index (expert_names)."""
        names = {}
        for mod_prefix, sub in _named_modules(self.fsdp.module):
            for n, p in sub._parameters.items():
                if p is not None and id(p) not in names:
                    names[id(p)] = f"{mod_prefix}.{n}" if mod_prefix else n
        return names

    def _all_units(self) -> list:
        # the replicated units first, then the experts' (over their edp groups): the same
        # collective order on every rank
        return list(self.fsdp._units) + list(getattr(self.fsdp, "_expert_units", ()))

    def _buffers(self):
        """``(name, buffer)`` of the persistent buffers, under the same names as the parameters."""
        for mod_prefix, sub in _named_modules(self.fsdp.module):
            for n, b in sub._buffers.items():
                if b is not None and n not in sub._non_persistent:
                    yield (f"{mod_prefix}.{n}" if mod_prefix else n), b

    @no_grad()
    def state_dict(self, prefix: str = "") -> OrderedDict[str, np.ndarray]:
        """FULL: original names, full values in the master dtype, on every rank (a collective).
        SHARDED/LOCAL: this rank's flat shards, ``{prefix + "flat_param_<i>": array}``, and its
        experts' shards, ``{prefix + "moe.experts.<e>.flat_param": array}``. Experts go by their
        global index ``e`` (expert parallelism: :mod:`neural_arch.distributed.checkpoint.expert_names`)."""
        out: OrderedDict = OrderedDict()
        names = self._names()
        experts = {names[id(p)]: _backend.to_device(p.data, "cpu").copy() for p in self.fsdp._experts}
        if self.type is not StateDictType.FULL_STATE_DICT:
            for i, u in enumerate(self.fsdp._units):
                out[f"{prefix}flat_param_{i}"] = _backend.to_device(u.flat_param.data, "cpu").copy()
            for u in self._all_units()[len(self.fsdp._units):]:   # an expert's shard: its global name
                out[f"{prefix}{u.name}.flat_param"] = _backend.to_device(u.flat_param.data, "cpu").copy()
            out.update((prefix + k, v) for k, v in experts.items())   # this rank's experts, whole
            return out
        values = dict(experts)
        for u in self._all_units():
            flat = _backend.to_device(u.full_flat(u.master_dtype), "cpu")
            for p, v in zip(u.params, u.layout.views(flat)):
                values[names[id(p)]] = v.copy()
        for key in names.values():      # the module's parameter order
            if key in values:
                out[prefix + key] = values[key]
        for key, b in self._buffers():
            out[prefix + key] = _backend.to_device(b.data, "cpu").copy()
        return out

    @no_grad()
    def load_state_dict(self, state_dict, strict: bool = True):
        """Load what :meth:`state_dict` gave under the same state-dict type."""
        if self.type is not StateDictType.FULL_STATE_DICT:
            for i, u in enumerate(self.fsdp._units):
                key = f"flat_param_{i}"
                if key not in state_dict:
                    raise RuntimeError(f"FSDP.load_state_dict: missing {key!r} in a sharded state dict")
                arr = np.asarray(state_dict[key])
                if arr.shape != u.flat_param.shape:
                    raise RuntimeError(f"FSDP.load_state_dict: {key} has shape {arr.shape}, this rank's shard "
                                       f"is {u.flat_param.shape} (was it saved with another world size?)")
                u.flat_param.data[...] = _backend.to_device(arr, _backend.device_of(u.flat_param.data))
            for u in self._all_units()[len(self.fsdp._units):]:
                key = f"{u.name}.flat_param"
                if key in state_dict:
                    u.flat_param.data[...] = _backend.to_device(np.asarray(state_dict[key]),
                                                                _backend.device_of(u.flat_param.data))
                elif strict:
                    raise RuntimeError(f"FSDP.load_state_dict(strict=True): missing {key!r} in a sharded state dict")
            self._load_experts(state_dict, strict)
            return
        self._load_experts(state_dict, strict=False)   # the FULL check below covers their names
        names = self._names()
        expected = set(names.values())
        missing = [k for k in expected if k not in state_dict]
        if strict and missing:
            raise RuntimeError(f"FSDP.load_state_dict(strict=True): missing keys {sorted(missing)}")
        for u in self._all_units():
            arrays = [np.asarray(state_dict[names[id(p)]]) if names[id(p)] in state_dict else None
                      for p in u.params]
            if any(a is None for a in arrays):
                old = _backend.to_device(u.full_flat(u.master_dtype), "cpu")
                arrays = [a if a is not None else v for a, v in zip(arrays, u.layout.views(old))]
            flat = u.layout.flatten(arrays, np, dtype=u.master_dtype)
            lo, hi = u.layout.shard_range(u.group.rank() if u.group is not None else 0)
            u.flat_param.data[...] = _backend.to_device(flat[lo:hi], _backend.device_of(u.flat_param.data))
        for key, b in self._buffers():
            if key in state_dict:
                b.data[...] = _backend.to_device(np.asarray(state_dict[key]), _backend.device_of(b.data))
        return

    def _load_experts(self, state_dict, strict: bool) -> None:
        """This rank's expert parameters (whole, under their names): not in any flat unit."""
        names = self._names()
        for p in self.fsdp._experts:
            key = names[id(p)]
            if key in state_dict:
                p.data[...] = _backend.to_device(np.asarray(state_dict[key]), _backend.device_of(p.data))
            elif strict:
                raise RuntimeError(f"FSDP.load_state_dict(strict=True): missing expert parameter {key!r}")

    @contextlib.contextmanager
    def summon_full_params(self, writeback: bool = True):
        """Gather every unit's full parameters (master dtype) into the module; write edits back on exit."""
        with no_grad():
            for u in self._all_units():
                full = u.full_flat(u.master_dtype).copy()
                for p, v in zip(u.params, u.layout.views(full)):
                    p.data = v
        try:
            yield self.fsdp.module
        finally:
            with no_grad():
                for u in self._all_units():
                    if writeback and u.params:
                        xp = _backend.get_array_module(u.params[0].data)
                        flat = u.layout.flatten([p.data for p in u.params], xp, dtype=u.master_dtype)
                        lo, hi = u.layout.shard_range(u.group.rank() if u.group is not None else 0)
                        u.flat_param.data[...] = _backend.to_device(flat[lo:hi], _backend.device_of(u.flat_param.data))
                    u.free()
