"""What the DTensor checkpoint tests run on every rank of a 4-rank RankPool (module level: pickled by
reference), and in-process on a world of one.

The model is a float64 MLP ``Linear(4, 8) -> ReLU -> Linear(8, 4)`` with fixed weights. It is trained
(Adam, two steps) under tensor parallelism x DDP on a 2 x 2 mesh and saved with ``dcp.save`` of
``get_model_state_dict`` / ``get_optimizer_state_dict`` (DTensor pieces, no communication). Then it
is loaded into other layouts: one process (plain parameters), tp2 on ranks {0, 1}, ``fully_shard`` on
ranks {0, 1, 2} (uneven ``torch.chunk`` pieces, one of them empty), tp4, and ``fully_shard`` over dp of
tp on the 2 x 2 mesh (2-d DTensor parameters). Layouts over part of the world use a 1-d mesh over a
subgroup (every rank creates the subgroups; the others sit out). The same training under ``fully_shard``
over dp of tp (:func:`save_fsdp_tp`) is saved too, and loaded into one process, tp2 and ``fully_shard``
on ranks {0, 1}.

Each load returns a list of differences between every rank's pieces (parameters and every Adam
state array) and the matching slices of the saved full arrays, compared bitwise.
"""

from __future__ import annotations

import numpy as np

LAYOUTS = {"one": 1, "tp2": 2, "fsdp2": 2, "fsdp3": 3, "tp4": 4, "fsdp_tp": 4}


def _model():
    from neural_arch import nn

    model = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.ReLU(), nn.Linear(8, 4, dtype=np.float64))
    rng = np.random.default_rng(7)
    for p in model.parameters():
        p.data[...] = rng.standard_normal(p.data.shape)
    return model


def _tp(model, mesh):
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _batch(seed: int):
    rng = np.random.default_rng(100 + seed)
    return rng.standard_normal((3, 4)), rng.standard_normal((3, 4))


def _step(model, opt, x, y):
    from neural_arch.core.tensor import Tensor

    out = model(Tensor(x))
    loss = ((out - Tensor(y)) * (out - Tensor(y))).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def save_fsdp_tp(directory: str):
    """:func:`save_tp_ddp`'s training under ``fully_shard`` over dp of tp on the 2 x 2 mesh."""
    return save_tp_ddp(directory, fsdp=True)


def save_tp_ddp(directory: str, fsdp: bool = False):
    """Train tp2 x DDP2 (``fsdp``: tp2 x ``fully_shard`` over dp) two steps and save; returns
    (placements by name, full model, full optimizer state) -- the full dicts on rank 0 only
    (``cpu_offload``), so the others return None for them."""
    import neural_arch.distributed as dist
    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from neural_arch.distributed.ddp import DistributedDataParallel
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import fully_shard
    from neural_arch.optim import Adam

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _tp(_model(), mesh["tp"])
    if fsdp:
        ddp = fully_shard(model, mesh=mesh["dp"])
    else:
        ddp = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
    opt = Adam(ddp.parameters(), lr=0.05)
    dp_rank = mesh.get_local_rank("dp")
    for step in range(2):
        _step(ddp, opt, *_batch(2 * step + dp_rank))
    msd, osd = get_model_state_dict(ddp), get_optimizer_state_dict(ddp, opt)
    placements = {k: (type(v).__name__, tuple(v.placements), tuple(v.to_local().shape)) for k, v in msd.items()}
    if fsdp:
        placements["mesh"] = {k: v.device_mesh.mesh.tolist() for k, v in msd.items()}
    placements.update({f"exp_avg:{k}": (type(v["exp_avg"]).__name__, tuple(v["exp_avg"].placements))
                       for k, v in osd["state"].items()})
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_model = get_model_state_dict(ddp, options=full)
    full_optim = get_optimizer_state_dict(ddp, opt, options=full)["state"]
    if dist.get_rank() != 0:
        assert full_model == {} and full_optim == {}, "cpu_offload: only rank 0 keeps the full state dict"
        return placements, None, None
    return placements, full_model, full_optim


def _layout(name: str):
    """(model, optimizer) of layout ``name`` on this rank, or None where this rank sits out."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import fully_shard
    from neural_arch.distributed.tensor.parallel.layers import tp_device_mesh
    from neural_arch.optim import Adam

    world, rank = dist.get_world_size(), dist.get_rank()
    size = LAYOUTS[name]
    if name == "fsdp_tp":  # fully_shard over dp of tp on the 2 x 2 mesh: 2-d DTensor parameters
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        model = _model()
        for p in model.parameters():
            p.data[...] = -1.0
        model = fully_shard(_tp(model, mesh["tp"]), mesh=mesh["dp"])
        return model, Adam(model.parameters(), lr=0.5)
    if size < world:
        group = dist.new_group(list(range(size)))   # collective: every rank creates it
        if rank >= size:
            return None
        mesh = tp_device_mesh(group)
    else:
        mesh = init_device_mesh("cpu", (world,))
    model = _model()
    for p in model.parameters():
        p.data[...] = -1.0  # nothing of the saved values is there before the load
    if name.startswith("tp"):
        model = _tp(model, mesh)
    elif name.startswith("fsdp"):
        fully_shard(model, mesh=mesh)
    return model, Adam(model.parameters(), lr=0.5)


def load_into(name: str, directory: str, full_model: dict, full_optim: dict, fresh_optimizer: bool) -> list[str]:
    """Load into layout ``name``; the differences from ``full_*`` (the saved global arrays).

    ``fresh_optimizer``: the optimizer has no state yet (its state dict's ``state`` is empty and
    dcp.load fills it with whole arrays); otherwise one step first gives it DTensor state to load into.
    """
    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from neural_arch.distributed.tensor import DTensor
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset

    built = _layout(name)
    if built is None:
        return []
    model, opt = built
    if not fresh_optimizer:
        _step(model, opt, *_batch(9))
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])

    def mine(p, full):
        if not isinstance(p, DTensor):
            return full
        shape, offsets = compute_local_shape_and_global_offset(full.shape, p.device_mesh, p.placements)
        return full[tuple(slice(o, o + n) for o, n in zip(offsets, shape))]

    diffs = []
    names = {id(p): n for n, p in model.named_parameters()}
    for p in model.parameters():
        n = names[id(p)]
        want = mine(p, full_model[n])
        if want.shape != p.data.shape or not np.array_equal(want, p.data):
            diffs.append(f"{name}: parameter {n}")
        st = opt.state.get(p, {})
        for k, v in full_optim[n].items():
            got = st.get(k)
            if isinstance(v, np.ndarray) and v.ndim:
                ok = got is not None and mine(p, v).shape == got.shape and np.array_equal(mine(p, v), got)
            else:
                ok = got == v
            if not ok:
                diffs.append(f"{name}: {n}.{k}")
        # the DTensor face agrees (a collective over the tp mesh)
        if isinstance(p, DTensor) and name.startswith(("tp", "fsdp_tp")) and not np.array_equal(p.full_tensor().data,
                                                                                  full_model[n]):
            diffs.append(f"{name}: {n}.full_tensor()")
    return diffs
