"""State dicts of parallel models and optimizers, by parameter name: torch's ``checkpoint.state_dict``.

``model.state_dict()`` / ``optimizer.state_dict()`` describe *this rank's* objects: under FSDP
or ZeRO-2 the optimizer's parameters are flat shards, so its state arrays are shards too, of the
same shape on every rank: saved as they are, a distributed checkpoint would take them for
replicated arrays (``dcp.save`` now refuses that). These functions give what a checkpoint needs
instead: every entry under the **unsharded model's parameter names**, a rank's part of a sharded
array as a flat :class:`~neural_arch.distributed.checkpoint.ShardedArray`, so a save on one
layout (FSDP on 2 ranks, ZeRO, DDP, one process) resumes exactly on any other::

    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(fsdp, opt)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id="ckpt/step_100")

    # resume, on any world size: the state dicts of the new layout are the load targets
    model_sd, optim_sd = get_state_dict(fsdp, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id="ckpt/step_100")
    set_state_dict(fsdp, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

The optimizer state dict is ``{"state": {name: {"step": 3, "exp_avg": ...}}, "param_groups":
[{"lr": ..., "params": [names]}]}``. A fresh optimizer has no state yet: its ``"state"`` is
empty, and ``dcp.load`` fills it with whole arrays, of which ``set_optimizer_state_dict`` keeps
this rank's part (unlike torch, no optimizer step is taken to create the state first).

A DTensor parameter (tensor parallel's styles, ``fully_shard``'s) is given as a DTensor: a host
copy of this rank's piece with the parameter's mesh and placements (no communication), and the
state of such a parameter (Adam's ``exp_avg``, ...) as a DTensor of the same placements;
``dcp.save`` writes each distinct piece once and ``dcp.load`` fills any other mesh's pieces
(see :mod:`~neural_arch.distributed.checkpoint.dtensor_box`)::

    msd = get_model_state_dict(tp_model)        # {"fc1.weight": DTensor(Shard(0)), "fc2.bias": DTensor(Replicate()), ...}

Expert parallelism (``parallelize_moe``): each expert's parameters and state are named by the
expert's **global** index (``moe.experts.3.fc1.weight`` on the ranks holding expert 3, whatever its
local position), so the keys are the plain model's, the ranks holding the same expert hold the same
key (``dcp.save`` writes it once, by one of them) and a checkpoint saved at one ep size loads at any
other, or into one process (see :mod:`~neural_arch.distributed.checkpoint.expert_names`).

How the shards are known (nothing here imports a parallel strategy): a flat shard parameter
carries ``_flat_shard`` (FSDP's ``flat_param``, ZeRO-2's bucket shards: which elements of which
original parameters it holds); a wrapper whose ``state_dict`` is its ``.module``'s (DDP, FSDP)
is looked through for names; an optimizer wrapper with an inner ``.optim`` (ZeRO) keeps its
state there (ZeRO-1: each rank saves the state of the parameters it owns).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.checkpoint.dtensor_box import as_sharded_array, global_shape_of, is_dtensor
from neural_arch.distributed.checkpoint.expert_names import (
    expand_group_names,
    held_elsewhere,
    named_modules,
    sliced_lists,
)
from neural_arch.distributed.checkpoint.sharded import Region, ShardedArray, copy_overlap
from neural_arch.distributed.flat_param import FlatShard
from neural_arch.distributed.tensor._api import DTensor, compute_local_shape_and_global_offset
from neural_arch.nn.module import Module
from neural_arch.optim.optimizer import Optimizer, ParamState

__all__ = [
    "StateDictOptions",
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "get_state_dict",
    "set_model_state_dict",
    "set_optimizer_state_dict",
    "set_state_dict",
]


@dataclass
class StateDictOptions:
    """torch's options. ``full_state_dict=True``: whole arrays on every rank (a collective)
    instead of this rank's shards (DTensors, flat ``ShardedArray`` s). ``cpu_offload``: state
    dicts hold host arrays anyway; with ``full_state_dict=True`` the pieces are gathered to rank 0
    only, which keeps the whole arrays; the other ranks get an empty dict (torch's). ``ignore_frozen_params``: leave
    parameters with ``requires_grad=False`` out of the model state dict. ``strict``: ``set_*`` raise on missing or unexpected names.

    Example:
        >>> StateDictOptions(full_state_dict=True).strict
        True
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False


def _options(options) -> StateDictOptions:
    options = StateDictOptions() if options is None else options
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"options must be a StateDictOptions, got {options!r}")
    if options.broadcast_from_rank0 or options.flatten_optimizer_state_dict:
        raise NotImplementedError("StateDictOptions(broadcast_from_rank0=True / flatten_optimizer_state_dict=True) "
                                  "is not implemented; load with dcp.load on every rank instead")
    return options


# ------------------------------------------------------------------------------------ names
def _unwrap(model) -> Module:
    """The module whose parameter names are the model's state-dict names: DDP and FSDP define
    ``state_dict`` as their ``.module``'s, without a prefix."""
    if not isinstance(model, Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    while isinstance(model.__dict__.get("module", getattr(model, "module", None)), Module) \
            and type(model).state_dict is not Module.state_dict:
        model = model.module
    return model


def _names(inner: Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for prefix, sub in named_modules(inner):
        for n, p in sub._parameters.items():
            if p is not None and id(p) not in names:
                names[id(p)] = f"{prefix}.{n}" if prefix else n
    return names


def _segments(p, names: dict) -> list[tuple]:
    """``[(name, shape, start, at, n, whole)]``: elements ``[start, start+n)`` of the parameter
    ``name`` (flattened) are elements ``[at, at+n)`` of ``p``'s (flattened) array."""
    fs = getattr(p, "_flat_shard", None)
    if fs is None:
        name = _name_of(p, names)
        shape = tuple(p.shape)
        return [(name, shape, 0, 0, math.prod(shape), True)]
    out = []
    for orig, start, at, n in fs.pieces:
        shape = tuple(orig.shape)
        out.append((_name_of(orig, names), shape, start, at, n, n == math.prod(shape)))
    return out


def _name_of(p, names: dict) -> str:
    try:
        return names[id(p)]
    except KeyError:
        raise ValueError(f"a parameter of shape {tuple(p.shape)} of the optimizer is not a parameter of the model "
                         "(pass the model the optimizer was built over)") from None


def _group_names(group: dict, names: dict, inner: Module) -> list[str]:
    out = []
    for p in group["params"]:
        fs = getattr(p, "_flat_shard", None)
        out.extend(_name_of(q, names) for q in (fs.params if fs is not None else [p]))
    # expert parallelism: every expert's names, so the list is the same on every rank (and at ep = 1)
    return expand_group_names(out, inner)


def _optimizers(optimizers) -> list:
    opts = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
    if not opts or not all(isinstance(o, Optimizer) for o in opts):
        raise TypeError(f"optimizers must be an Optimizer or a list of them, got {optimizers!r}")
    return opts


def _state_holder(opt):
    """The optimizer that keeps the state: ZeRO's inner ``.optim`` (None on a rank owning nothing)."""
    return opt.optim if "optim" in vars(opt) else opt


def _is_state_array(value, p) -> bool:
    return (isinstance(value, np.ndarray) or _backend.is_device_array(value)) and value.ndim > 0 \
        and tuple(value.shape) == tuple(p.shape)


# ------------------------------------------------------------------------------------ model
def get_model_state_dict(model, *, submodules=None, options: StateDictOptions | None = None) -> dict:
    """``{name: array}`` for parameters and persistent buffers; a parameter FSDP shards over the
    ranks is this rank's part of it, a flat ``ShardedArray``; a DTensor parameter (TP,
    ``fully_shard``) a DTensor of this rank's piece (``full_state_dict=True``: whole arrays).

    Example::

        sd = get_model_state_dict(fsdp)      # {"0.weight": ShardedArray(...), ...}
    """
    if submodules is not None:
        raise NotImplementedError("get_model_state_dict(submodules=...) is not implemented")
    options = _options(options)
    inner = _unwrap(model)
    out: dict = {}
    sharded = {}
    for fp in model.parameters():
        fs = getattr(fp, "_flat_shard", None)
        if fs is None:
            continue
        host = _backend.to_host(fp.data)
        for orig in fs.params:
            sharded[id(orig)] = None  # held by a flat shard: this rank may hold none of it
        for orig, start, at, n in fs.pieces:
            sharded[id(orig)] = (tuple(orig.shape), start, host[at:at + n])
    for prefix, sub in named_modules(inner):
        for n, p in sub._parameters.items():
            name = f"{prefix}.{n}" if prefix else n
            if p is None or name in out or (options.ignore_frozen_params and not p.requires_grad):
                continue
            if id(p) not in sharded:
                # a DTensor parameter (tensor parallel, fully_shard): this rank's piece and its
                # placements, no communication; anything else is whole on this rank
                out[name] = _host_dtensor(p, p) if is_dtensor(p) else _backend.to_host(p.data).copy()
            elif sharded[id(p)] is not None:
                shape, start, piece = sharded[id(p)]
                out[name] = piece.reshape(shape).copy() if piece.size == math.prod(shape) else \
                    ShardedArray(piece.copy(), shape, flat_offset=start)
        for n, b in sub._buffers.items():
            if b is not None and n not in sub._non_persistent:
                out[f"{prefix}.{n}" if prefix else n] = _backend.to_host(b.data).copy()
    return _full(out, options, _state_group(list(model.parameters()))) if options.full_state_dict else out


def _host_dtensor(dt, like) -> DTensor:
    """A DTensor whose local piece is a host copy of ``dt``'s, with ``like``'s mesh and placements."""
    local = Tensor(_backend.to_host(dt._local_tensor.data if isinstance(dt, DTensor) else dt).copy())
    return DTensor(local, like.device_mesh, like.placements, shape=global_shape_of(like))


def _full(tree: dict, options: StateDictOptions, group=None) -> dict:
    """The whole arrays of ``tree`` (a collective over ``group``, None: the world); ``cpu_offload``:
    gathered to the group's first rank only, the other ranks send their pieces and get an empty dict
    (torch's)."""
    first = 0 if group is None else group.ranks[0]
    return _gather_full(tree, dst=first if options.cpu_offload else None, group=group)


def _state_group(params) -> object | None:
    """The process group a full state dict of these parameters is gathered over: the one group every
    split flat shard among them (FSDP's, ZeRO-2's) is split over, when there is exactly one and nothing
    else is sharded, or the group of the 1-d mesh ``fully_shard`` sharded every DTensor parameter
    over. None (the world) otherwise: TP's DTensors (replicas may live on other ranks), meshes of
    several dimensions, experts' shards (experts differ across the expert-parallel group), shards over
    several groups. A model sharded over a sub-group is
    gathered there: its ranks alone call this, and a gather over the world would wait for the others
    until the timeout."""
    group = None
    mesh = None
    for p in params:
        if is_dtensor(p):
            # fully_shard's parameters, all on one 1-d mesh: the model lives on that mesh's ranks alone
            # (a sub-group: the other ranks never call this). A TP DTensor may have replicas elsewhere.
            # (meshes compared by their group: mesh["dp"] makes a new DeviceMesh object per call)
            m = p.device_mesh
            if not getattr(p, "fully_sharded", False) or m.ndim != 1 or (
                    mesh is not None and m.get_group() is not mesh.get_group()):
                return None
            mesh = m
            continue
        fs = getattr(p, "_flat_shard", None)
        if fs is None or fs.group is None:
            continue
        if type(fs) is not FlatShard or (group is not None and fs.group is not group):
            return None
        group = fs.group
    if mesh is not None:
        return mesh.get_group() if group is None else None
    return group


def set_model_state_dict(model, model_state_dict: dict, *, options: StateDictOptions | None = None):
    """Load ``model_state_dict`` (from :func:`get_model_state_dict` of any layout, whole arrays or
    this layout's ``ShardedArray`` parts, e.g. after ``dcp.load``) into ``model``, in place.

    Returns ``(missing_keys, unexpected_keys)``; ``strict`` (default) raises on either. Under expert
    parallelism the keys of the experts other ranks hold are neither (a whole state dict loads into
    every slice; see :mod:`~neural_arch.distributed.checkpoint.expert_names`).

    Example:
        >>> from neural_arch import nn
        >>> source, target = nn.Linear(2, 3), nn.Linear(2, 3)
        >>> set_model_state_dict(target, get_model_state_dict(source))
        ([], [])
        >>> bool((target.weight.data == source.weight.data).all())
        True
    """
    options = _options(options)
    inner = _unwrap(model)
    names = _names(inner)
    expected = set()
    filled = set()
    for fp in model.parameters():  # flat shards: fill this rank's part of every parameter in it
        fs = getattr(fp, "_flat_shard", None)
        if fs is None:
            continue
        flat = _backend.to_host(fp.data).copy()
        for orig, start, at, n in fs.pieces:  # a parameter this rank holds none of is not expected
            name = names[id(orig)]
            expected.add(name)
            if name in model_state_dict:
                _fill_piece(flat[at:at + n], model_state_dict[name], tuple(orig.shape), start, name)
        for orig in fs.params:
            filled.add(id(orig))
        fp.data[...] = _backend.to_device(flat, _backend.device_of(fp.data))
    targets = {}
    for prefix, sub in named_modules(inner):
        for n, t in list(sub._parameters.items()) + [(b, v) for b, v in sub._buffers.items()
                                                      if b not in sub._non_persistent]:
            name = f"{prefix}.{n}" if prefix else n
            if t is None or id(t) in filled:
                continue
            targets.setdefault(name, t)
    expected |= set(targets)
    missing = sorted(k for k in expected if k not in model_state_dict)
    lists = sliced_lists(inner)   # expert parallelism: the other ranks' experts are theirs, not unexpected
    unexpected = sorted(k for k in model_state_dict if k not in expected and not held_elsewhere(k, lists))
    if options.strict and (missing or unexpected):
        raise RuntimeError(f"set_model_state_dict(strict=True): missing keys {missing}, unexpected keys {unexpected}")
    for name, t in targets.items():
        if name in model_state_dict and is_dtensor(t):
            piece = _my_piece(model_state_dict[name], t, name, "set_model_state_dict")
            t._local_tensor.data[...] = _backend.to_device(piece, _backend.device_of(t._local_tensor.data))
        elif name in model_state_dict:
            value = model_state_dict[name]
            if isinstance(value, ShardedArray):
                whole = np.empty(value.global_shape, dtype=value.dtype)
                _fill_piece(whole.reshape(-1), value, value.global_shape, 0, name)
                value = whole
            if tuple(np.shape(value)) != tuple(t.shape):
                raise RuntimeError(f"set_model_state_dict: {name!r} has shape {tuple(np.shape(value))}, the model's "
                                   f"is {tuple(t.shape)}")
            t.data[...] = _backend.to_device(np.asarray(value), _backend.device_of(t.data))
    return missing, unexpected


def _my_piece(value, like, name: str, op: str) -> np.ndarray:
    """This rank's piece (a host array) of ``value`` for the DTensor ``like``: ``value`` is a DTensor
    (of the same layout: its local piece; of another layout on the same mesh: redistributed, a
    collective), a whole array, or a ``ShardedArray`` that covers this rank's box."""
    shape = global_shape_of(like)
    local_shape, offsets = compute_local_shape_and_global_offset(shape, like.device_mesh, like.placements)
    if is_dtensor(value):
        if global_shape_of(value) != shape:
            raise ValueError(f"{op}: {name!r} has global shape {global_shape_of(value)} in the state dict but "
                             f"{shape} here")
        if tuple(value.placements) != tuple(like.placements) or value.device_mesh != like.device_mesh:
            if value.device_mesh != like.device_mesh:
                value = as_sharded_array(value, repr(name))  # another mesh: only an overlapping box helps
            else:
                value = value.redistribute(like.device_mesh, like.placements)
        if is_dtensor(value):
            return _backend.to_host(value._local_tensor.data)
    dst = np.empty(local_shape, dtype=np.dtype(value.dtype))
    if isinstance(value, ShardedArray):
        if value.global_shape != shape:
            raise ValueError(f"{op}: {name!r} has global shape {value.global_shape} in the state dict but {shape} here")
        box = Region(shape, tuple(offsets), tuple(local_shape))
        got = copy_overlap(Region.of(value), _backend.to_host(value.local), box, dst)
        if got != dst.size:
            raise ValueError(f"{op}: {name!r}: the state dict holds {Region.of(value).to_json()} of it, this rank "
                             f"needs the box at {offsets} of shape {local_shape}; load into the state dict of "
                             "*this* layout (get_model_state_dict / get_optimizer_state_dict of it) with dcp.load first")
        return dst
    value = _backend.to_host(value)
    if tuple(value.shape) != shape:
        raise ValueError(f"{op}: {name!r} has shape {tuple(value.shape)} in the state dict but {shape} here")
    return value[tuple(slice(o, o + n) for o, n in zip(offsets, local_shape))]


def _fill_piece(dst: np.ndarray, value, shape: tuple, start: int, name: str) -> None:
    """Elements ``[start, start + dst.size)`` of the flattened array ``name`` into ``dst``."""
    if isinstance(value, ShardedArray):
        if value.global_shape != shape:
            raise ValueError(f"{name!r} has global shape {value.global_shape} in the state dict but {shape} here")
        got = copy_overlap(Region.of(value), _backend.to_host(value.local), Region(shape, flat_offset=start,
                                                                                  flat_size=dst.size), dst)
        if got != dst.size:
            region = Region.of(value).to_json()
            raise ValueError(f"{name!r}: the state dict holds {region} of it, this rank needs flat elements "
                             f"[{start}, {start + dst.size}); load into the state dict of *this* layout "
                             "(get_model_state_dict / get_optimizer_state_dict of it) with dcp.load first")
        return
    value = _backend.to_host(value)
    if tuple(value.shape) != shape:
        raise ValueError(f"{name!r} has shape {tuple(value.shape)} in the state dict but {shape} here")
    dst[...] = value.reshape(-1)[start:start + dst.size]


# ------------------------------------------------------------------------------------ optimizer
def get_optimizer_state_dict(model, optimizers, *, submodules=None, options: StateDictOptions | None = None) -> dict:
    """The optimizer state under the model's parameter names, each rank's shard of it as a flat
    ``ShardedArray`` (FSDP, ZeRO-2) or, for a DTensor parameter, a DTensor with the parameter's
    placements; ready for ``dcp.save`` on every rank.

    Example::

        osd = get_optimizer_state_dict(fsdp, opt)
        osd["state"]["0.weight"]["exp_avg"]          # ShardedArray(..., global_shape=(16, 6), flat_offset=...)
    """
    if submodules is not None:
        raise NotImplementedError("get_optimizer_state_dict(submodules=...) is not implemented")
    options = _options(options)
    inner = _unwrap(model)
    names = _names(inner)
    state: dict = {}
    groups: list = []
    for opt in _optimizers(optimizers):
        for g in opt.param_groups:
            groups.append(dict({k: copy.deepcopy(v) for k, v in g.items() if k != "params"},
                               params=_group_names(g, names, inner)))
        holder = _state_holder(opt)
        if holder is None:
            continue
        for g in holder.param_groups:
            for p in g["params"]:
                st = holder.state.get(p)
                if st:
                    _get_param_state(p, st, names, state)
    out = {"state": state, "param_groups": groups}
    if options.full_state_dict:
        shards = [p for opt in _optimizers(optimizers) for holder in [_state_holder(opt)] if holder is not None
                  for g in holder.param_groups for p in g["params"]]
        out["state"] = _full(state, options, _state_group(list(model.parameters()) + shards))
    return out


def _get_param_state(p, st: dict, names: dict, state: dict) -> None:
    if is_dtensor(p) and getattr(p, "_flat_shard", None) is None:
        # the state of a DTensor parameter is laid out like it: a DTensor of the same placements
        entry = state.setdefault(_name_of(p, names), {})
        for k, v in st.items():
            entry[k] = _host_dtensor(v, p) if _is_state_array(v, p) else _plain_copy(v)
        return
    for name, shape, start, at, n, whole in _segments(p, names):
        entry = state.setdefault(name, {})
        for k, v in st.items():
            if not _is_state_array(v, p):
                entry[k] = _plain_copy(v)
                continue
            flat = _backend.to_host(v).reshape(-1)
            piece = flat[at:at + n]
            entry[k] = piece.reshape(shape).copy() if whole else ShardedArray(piece.copy(), shape, flat_offset=start)


def _plain_copy(v):
    return _backend.to_host(v).copy() if _backend.is_device_array(v) or isinstance(v, np.ndarray) else copy.deepcopy(v)


def set_optimizer_state_dict(model, optimizers, optim_state_dict: dict, *,
                             options: StateDictOptions | None = None) -> None:
    """Load ``optim_state_dict`` (from :func:`get_optimizer_state_dict` of any layout, after
    ``dcp.load``) into the optimizer(s): each rank takes its own part of every array.

    Hyper-parameters come from ``param_groups`` (their number and parameter names must match);
    the state replaces the optimizer's. Raises ``ValueError`` naming the parameter when a part
    this rank needs is not in the state dict.

    Example:
        >>> from neural_arch import nn
        >>> from neural_arch.optim import Adam
        >>> model = nn.Linear(2, 3); opt = Adam(model.parameters(), lr=0.1)
        >>> saved = get_optimizer_state_dict(model, opt)
        >>> opt2 = Adam(model.parameters(), lr=0.5)
        >>> set_optimizer_state_dict(model, opt2, saved)
        >>> opt2.param_groups[0]["lr"]
        0.1
    """
    options = _options(options)
    inner = _unwrap(model)
    names = _names(inner)
    saved_state = optim_state_dict["state"]
    saved_groups = list(optim_state_dict["param_groups"])
    opts = _optimizers(optimizers)
    mine = [g for opt in opts for g in opt.param_groups]
    if len(saved_groups) != len(mine):
        raise ValueError(f"set_optimizer_state_dict: the state dict has {len(saved_groups)} parameter groups, the "
                         f"optimizer has {len(mine)}; build the optimizer the same way as when saving")
    for i, (saved, g) in enumerate(zip(saved_groups, mine)):
        want = set(_group_names(g, names, inner))
        if options.strict and set(saved.get("params", want)) != want:
            raise ValueError(f"set_optimizer_state_dict: parameter group {i} holds {sorted(saved['params'])} in the "
                             f"state dict but {sorted(want)} here")
    used = set()
    for opt in opts:
        holder = _state_holder(opt)
        if holder is None:
            continue
        fresh = ParamState()
        for g in holder.param_groups:
            for p in g["params"]:
                st = _set_param_state(p, names, saved_state, used)
                if st:
                    fresh[p] = st
        holder.state = fresh
    for saved, g in zip(saved_groups, mine):
        for k, v in saved.items():
            if k != "params":
                g[k] = copy.deepcopy(v)
    for opt in opts:
        local = getattr(opt, "_sync_hyperparameters", None)
        if local is not None:
            local()  # ZeRO: the inner optimizer's groups follow the outer ones


def _set_dtensor_state(p, names: dict, saved_state: dict, used: set) -> dict:
    """The state of the DTensor parameter ``p``: this rank's piece of every array of its global shape."""
    name = _name_of(p, names)
    if name not in saved_state:
        return {}
    used.add(name)
    shape, device, out = global_shape_of(p), _backend.device_of(p.data), {}
    for k, v in saved_state[name].items():
        vshape = global_shape_of(v) if is_dtensor(v) else v.global_shape if isinstance(v, ShardedArray) \
            else tuple(np.shape(v)) if isinstance(v, np.ndarray) or _backend.is_device_array(v) else None
        if vshape == shape and len(shape) > 0:
            piece = _my_piece(v, p, f"{name}.{k}", "set_optimizer_state_dict")
            out[k] = _backend.to_device(np.array(piece, copy=True), device)
        else:
            out[k] = copy.deepcopy(v) if not isinstance(v, np.ndarray) else v.copy()
    return out


def _set_param_state(p, names: dict, saved_state: dict, used: set) -> dict:
    if is_dtensor(p) and getattr(p, "_flat_shard", None) is None:
        return _set_dtensor_state(p, names, saved_state, used)
    segs = _segments(p, names)
    have = [s for s in segs if s[0] in saved_state]
    if not have:
        return {}
    if len(have) != len(segs):
        missing = sorted(s[0] for s in segs if s[0] not in saved_state)
        raise ValueError(f"set_optimizer_state_dict: the state dict has state for {sorted(s[0] for s in have)} but "
                         f"not for {missing}, which share one flat shard here")
    device = _backend.device_of(p.data)
    out: dict = {}
    for name, shape, start, at, n, _ in segs:
        used.add(name)
        for k, v in saved_state[name].items():
            gshape = v.global_shape if isinstance(v, ShardedArray) else tuple(np.shape(v))
            if gshape == shape and len(shape) > 0:
                arr = out.get(k)
                if arr is None:
                    arr = out[k] = np.zeros(tuple(p.shape), dtype=np.dtype(v.dtype))  # padding stays zero
                _fill_piece(arr.reshape(-1)[at:at + n], v, shape, start, f"{name}.{k}")
            elif k not in out:
                out[k] = copy.deepcopy(v) if not isinstance(v, np.ndarray) else v.copy()
    return {k: _backend.to_device(v, device) if isinstance(v, np.ndarray) and v.ndim > 0 else v
            for k, v in out.items()}


# ------------------------------------------------------------------------------------ both
def get_state_dict(model, optimizers, *, submodules=None, options: StateDictOptions | None = None):
    """``(get_model_state_dict(model), get_optimizer_state_dict(model, optimizers))``.

    Example:
        >>> from neural_arch import nn
        >>> from neural_arch.optim import Adam
        >>> model = nn.Linear(2, 3); opt = Adam(model.parameters(), lr=0.1)
        >>> model_sd, optim_sd = get_state_dict(model, opt)
        >>> sorted(model_sd), optim_sd["param_groups"][0]["params"]
        (['bias', 'weight'], ['weight', 'bias'])
    """
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules, options=options))


def set_state_dict(model, optimizers, *, model_state_dict: dict, optim_state_dict: dict,
                   options: StateDictOptions | None = None):
    """:func:`set_model_state_dict` then :func:`set_optimizer_state_dict`; returns the model's
    ``(missing_keys, unexpected_keys)``.

    Example:
        >>> from neural_arch import nn
        >>> from neural_arch.optim import Adam
        >>> model = nn.Linear(2, 3); opt = Adam(model.parameters(), lr=0.1)
        >>> model_sd, optim_sd = get_state_dict(model, opt)
        >>> set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
        ([], [])
    """
    result = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return result


def _gather_full(tree: dict, dst: int | None = None, group=None) -> dict:
    """``tree`` (nested dicts) as every rank's union of them, each ``ShardedArray`` replaced by the
    whole array assembled from every rank's pieces: one ``all_gather_object`` -- or, with ``dst``,
    one ``send_object_list`` from each rank to ``dst``, the others getting ``{}`` (pickles: trusted
    peers only, as every ``*_object`` helper)."""
    from neural_arch.distributed import groups

    tree = _boxes(tree)  # DTensors as their boxes: placements and offsets, no mesh to pickle
    every = [tree]
    if groups.is_initialized() and groups.get_world_size() > 1:
        members = list(range(groups.get_world_size())) if group is None else list(group.ranks)
        every = [None] * len(members)
        if dst is None:
            from neural_arch.distributed.collectives import all_gather_object

            all_gather_object(every, tree, group=group)
        else:
            # point to point, not gather_object: that one is an all-gather underneath, and every
            # rank would receive the whole state only to drop it
            from neural_arch.distributed.collectives import recv_object_list, send_object_list

            if groups.get_rank() != dst:
                send_object_list([tree], dst=dst, group=group)
                return {}
            for i, src in enumerate(members):
                if src != dst:
                    got = [None]
                    recv_object_list(got, src=src, group=group)
                    every[i] = got[0]
                else:
                    every[i] = tree
    return _merge(every)


def _boxes(tree):
    if isinstance(tree, dict):
        return {k: _boxes(v) for k, v in tree.items()}
    if is_dtensor(tree):
        box = as_sharded_array(tree)
        return ShardedArray(_backend.to_host(box.local), box.global_shape, offsets=box.offsets)
    return tree


def _merge(trees: list) -> dict:
    out: dict = {}
    for key in dict.fromkeys(k for t in trees for k in t):  # first-seen order
        values = [t[key] for t in trees if key in t]
        if isinstance(values[0], dict):
            out[key] = _merge(values)
        elif any(isinstance(v, ShardedArray) for v in values):
            pieces = [v for v in values if isinstance(v, ShardedArray)]
            whole = np.zeros(pieces[0].global_shape, dtype=pieces[0].dtype)
            for v in pieces:
                copy_overlap(Region.of(v), _backend.to_host(v.local), Region.of(whole), whole)
            out[key] = whole
        else:
            out[key] = values[0]  # a whole array or a plain value: the same on every rank holding it
    return out
