"""What the TP-DTensor-parameter tests run on every rank of a RankPool (module level: pickled by
reference), and in-process on a world of one: each returns a list of failure strings."""

from __future__ import annotations

import numpy as np

GPT_SHAPE = {"vocab_size": 16, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 8}


def _mlp():
    from neural_arch import nn

    model = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.ReLU(), nn.Linear(8, 6, dtype=np.float64))
    rng = np.random.default_rng(3)
    for p in model.parameters():
        p.data[...] = rng.standard_normal(p.data.shape)
    return model


def _check(bad: list, name: str, p, full: np.ndarray, placements, mesh) -> None:
    """``p`` is a DTensor parameter of ``full`` with ``placements`` on ``mesh`` (collective: full_tensor)."""
    from neural_arch.distributed.tensor import DTensor
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset

    if not isinstance(p, DTensor):
        bad.append(f"{name}: a {type(p).__name__}, not a DTensor")
        return
    if tuple(p.placements) != tuple(placements):
        bad.append(f"{name}: placements {p.placements}, want {placements}")
    if mesh is not None and p.device_mesh != mesh:
        bad.append(f"{name}: mesh {p.device_mesh!r}, want {mesh!r}")
    if p.to_local() is not p or p.dtensor_shape != full.shape:
        bad.append(f"{name}: to_local() is not the parameter, or global shape {p.dtensor_shape} != {full.shape}")
    shape, offsets = compute_local_shape_and_global_offset(full.shape, p.device_mesh, p.placements)
    if not np.array_equal(p.data, full[tuple(slice(o, o + n) for o, n in zip(offsets, shape))]):
        bad.append(f"{name}: the local piece is not this rank's slice of the single-process weight")
    if not np.array_equal(p.full_tensor().data, full):
        bad.append(f"{name}: full_tensor() is not the single-process weight")


def mlp_placements_run(by_group: bool) -> list[str]:
    """Colwise/Rowwise on an MLP, over a 1-d mesh (``by_group``: over its ProcessGroup instead, and
    the weights loaded from whole arrays by ``set_model_state_dict``)."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import Replicate, Shard
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    full = {n: p.data.copy() for n, p in _mlp().named_parameters()}
    model = parallelize_module(_mlp(), mesh.get_group() if by_group else mesh,
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    want = {"0.weight": Shard(0), "0.bias": Shard(0), "2.weight": Shard(1), "2.bias": Replicate()}
    bad: list[str] = []
    if by_group:  # whole arrays (a full state dict) load into the pieces: each rank keeps its own
        from neural_arch.distributed.checkpoint.state_dict import set_model_state_dict

        for p in model.parameters():
            p.data[...] = 0.0
        set_model_state_dict(model, full)
    for name, p in model.named_parameters():
        # over a group the mesh is built from it (no dim names): compare its ranks only
        _check(bad, name, p, full[name], (want[name],), None if by_group else mesh)
        if by_group and p.device_mesh.mesh.tolist() != mesh.mesh.tolist():
            bad.append(f"{name}: mesh over {p.device_mesh.mesh.tolist()}")
    return bad


def gpt_placements_run(sequence_parallel: bool) -> list[str]:
    """parallelize_gpt: every sharded weight a DTensor with its style's placement; SequenceParallel's
    LayerNorm parameters Replicate DTensors; clip_grad_norm_ and one Adam step still equal the
    single-process ones."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.tensor import DTensor, Replicate, Shard
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset
    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy
    from neural_arch.nn import functional as F
    from neural_arch.optim import Adam, clip_grad_norm_

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    manual_seed(0)
    ref = nn.GPT(**GPT_SHAPE).double()
    manual_seed(0)
    model = parallelize_gpt(nn.GPT(**GPT_SHAPE).double(), mesh, sequence_parallel=sequence_parallel)
    full = {n: p.data.copy() for n, p in ref.named_parameters()}
    styles = {"tok_emb.weight": Shard(0), "head.weight": Shard(0), "attn.q_proj.weight": Shard(0),
              "attn.out_proj.weight": Shard(1), "attn.out_proj.bias": Replicate(), "mlp.fc1.bias": Shard(0),
              "mlp.fc2.weight": Shard(1)}
    bad: list[str] = []
    for name, p in model.named_parameters():
        key = next((k for k in styles if name.endswith(k)), None)
        if key is not None:
            _check(bad, name, p, full[name], (styles[key],), mesh)
        elif ".ln" in name or name.startswith("ln_f"):
            if sequence_parallel:
                _check(bad, name, p, full[name], (Replicate(),), mesh)
            elif isinstance(p, DTensor):
                bad.append(f"{name}: replicated LayerNorm parameter became a DTensor without SequenceParallel")
    rng = np.random.default_rng(5)
    idx = rng.integers(0, GPT_SHAPE["vocab_size"], size=(2, 8))
    tgt = rng.integers(0, GPT_SHAPE["vocab_size"], size=(2, 8))
    opt, ref_opt = Adam(model.parameters(), lr=0.01), Adam(ref.parameters(), lr=0.01)
    vocab_parallel_cross_entropy(model(idx), tgt, process_group=mesh).backward()
    F.cross_entropy(ref(idx).reshape(-1, GPT_SHAPE["vocab_size"]), tgt.reshape(-1)).backward()
    # clip_grad_norm_ of the DTensor parameters: the global norm (Shard pieces summed over tp,
    # Replicate ones counted once) and the single-process clipped gradients
    norm, ref_norm = clip_grad_norm_(model.parameters(), 0.05), clip_grad_norm_(ref.parameters(), 0.05)
    if not (ref_norm > 0.05 and abs(norm - ref_norm) <= 1e-10 * ref_norm):
        bad.append(f"clip_grad_norm_: {norm} on tp, {ref_norm} in one process")
    pieces = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        want = p.grad.data
        if isinstance(pieces[name], DTensor):
            shape, offsets = compute_local_shape_and_global_offset(want.shape, mesh, pieces[name].placements)
            want = want[tuple(slice(o, o + n) for o, n in zip(offsets, shape))]
        if np.abs(pieces[name].grad.data - want).max() > 1e-10:
            bad.append(f"{name}: clipped gradient differs from single-process clipping")
    opt.step()
    ref_opt.step()
    got = {n: p for n, p in model.named_parameters()}
    for name, p in ref.named_parameters():
        mine = got[name]
        whole = mine.full_tensor().data if isinstance(mine, DTensor) else mine.data
        if np.abs(whole - p.data).max() > 1e-10:
            bad.append(f"{name}: differs from single-process after one Adam step")
    return bad
