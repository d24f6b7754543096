"""Rank functions of the ``fully_shard`` (FSDP2) exploration tests (``test_fully_shard_explore.py``;
module level: pickled by reference).

Each trains (or differentiates) a tiny float64 model under ``fully_shard`` on the first ``world``
ranks of a pool, and the same model in one process, and returns the differences: the parameters
after SGD steps (:func:`train_case_run`: wrapping per block or root only, ``reshard_after_forward``,
gradient accumulation, ``set_reshard_after_backward``, a block applied twice, a frozen parameter
beside trainable ones in one unit, a block unused on some ranks, a tied parameter), the gradients
under a ``MixedPrecisionPolicy`` against a NumPy reference that rounds at the same points
(:func:`mixed_precision_run`), and a sharded state dict saved under one wrapping and world and
loaded under another (:func:`state_dict_run`).

Example (on every rank of a RankPool)::

    out = train_case_run({"world": 2, "sizes": (2, 3), "blocks": 2, "wrap": "blocks", "steps": 2})
    assert out["params"] <= 1e-10
"""

from __future__ import annotations

import numpy as np
from pooled_groups import group_of, mesh_of


def _net_cls():
    from neural_arch import nn

    class Block(nn.Module):
        """``tanh(lin(x)) + x`` with ``lin`` ``h x h`` (so a block can be applied twice)."""

        def __init__(self, h, dtype):
            super().__init__()
            self.lin = nn.Linear(h, h, dtype=dtype)

        def forward(self, x):
            return self.lin(x).tanh() + x

    class Net(nn.Module):
        """``inp`` (d -> h), the blocks (``order``: which block runs at each position, so a block may
        run twice or not at all), then ``head`` (h -> d)."""

        def __init__(self, d, h, n_blocks, dtype, extra: bool):
            super().__init__()
            self.inp = nn.Linear(d, h, dtype=dtype)
            self.blocks = nn.ModuleList([Block(h, dtype) for _ in range(n_blocks)])
            self.head = nn.Linear(h, d, dtype=dtype)
            self.extra = nn.Linear(h, d, dtype=dtype) if extra else None
            self.order = list(range(n_blocks))
            self.use_extra = True
            self.discard = False        # run the last block but drop its output (no gradient reaches it)
            self.keyword = False        # call the blocks with x=... (torch casts keyword inputs too)

        def forward(self, x):
            x = self.inp(x).tanh()
            for k, i in enumerate(self.order):
                y = self.blocks[i](x=x) if self.keyword else self.blocks[i](x)
                x = x if self.discard and k == len(self.order) - 1 else y
            out = self.head(x)
            return out + self.extra(x) if self.extra is not None and self.use_extra else out

    return Net


def build(cfg: dict, dtype=np.float64, seed: int = 0):
    """The model ``cfg`` describes, the same values on every rank (``tie``: block 1 uses block 0's
    weight -- ``"siblings"`` -- or the head uses block 0's -- ``"head"``; ``extra``: a second head in
    the root's unit, used only in some steps or on some ranks, see :func:`_uses_extra`)."""
    d, h = cfg["sizes"]
    model = _net_cls()(d, h, cfg["blocks"], dtype, bool(cfg.get("extra")))
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.6, size=p.data.shape).astype(dtype)
    tie = cfg.get("tie")
    if tie == "siblings":
        model.blocks[1].lin.weight = model.blocks[0].lin.weight
    elif tie == "head":
        model.head.weight = model.blocks[0].lin.weight      # square: h == d in these cases
    if cfg.get("frozen"):              # one frozen parameter beside trainable ones in a unit
        (model.blocks[0].lin if cfg["blocks"] else model.inp).bias.requires_grad = False
    return model


def _order(cfg: dict, rank: int) -> list:
    """Which blocks run on ``rank``: ``twice`` applies block 0 twice; ``skip`` leaves the last block
    out on the odd ranks (a unit unused on some ranks)."""
    order = list(range(cfg["blocks"]))
    if cfg.get("twice") and order:
        order = [0, *order]
    if cfg.get("skip") and order and rank % 2 == 1:
        order = order[:-1]
    return order


def _uses_extra(cfg: dict, step: int, rank: int) -> bool:
    """``extra == "steps"``: the extra head is unused on every rank in odd steps (a single process
    leaves its gradient None and the optimizer skips it); ``"ranks"``: unused on odd ranks (its
    gradient there is zero: the mean over ranks is half the even ranks')."""
    return {"steps": step % 2 == 0, "ranks": rank % 2 == 0}.get(cfg.get("extra"), True)


def _freeze_later(model, opt, cfg: dict) -> None:
    """Freeze ``inp.weight`` after the model was built (fine-tuning: the optimizer still holds it and
    skips it while it has no gradient), or (``cfg["frozen"]``) unfreeze the frozen bias and give it to
    the optimizer."""
    if cfg.get("frozen"):
        bias = (model.blocks[0].lin if cfg["blocks"] else model.inp).bias
        bias.requires_grad = True
        opt.add_param_group({"params": [bias]})
    else:
        model.inp.weight.requires_grad = False


def _discards(cfg: dict, step: int, rank: int) -> bool:
    """``discard == "steps"``: in odd steps the last block runs on every rank but its output is dropped
    (its unit gathers, and no gradient reaches it); ``"ranks"``: so on the odd ranks only."""
    return {"steps": step % 2 == 1, "ranks": rank % 2 == 1}.get(cfg.get("discard"), False)


def _batch(cfg: dict, step: int, micro: int, world: int):
    """The global batch of one micro-batch: ``B`` rows per rank."""
    d = cfg["sizes"][0]
    rng = np.random.default_rng(1000 * step + micro)
    n = world * cfg["B"]
    return rng.normal(size=(n, d)), rng.normal(size=(n, d))


def _local_loss(model, x, y, scale: float):
    from neural_arch.core.tensor import Tensor

    diff = model(Tensor(x)) - Tensor(y.astype(np.float64))
    return (diff * diff).mean() * scale


def _reference(cfg: dict, world: int):
    """One process: per step, the mean over ranks of each rank's loss (its own rows, its own block
    order), summed over the micro-batches, each scaled by ``1 / micro`` (one SGD step per step)."""
    from neural_arch import optim

    ref = build(cfg)
    opt = optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.2, momentum=0.5)
    if cfg.get("freeze_later") == "before_forward":
        _freeze_later(ref, opt, cfg)
    B = cfg["B"]
    for step in range(cfg["steps"]):
        for k in range(cfg["micro"]):
            X, Y = _batch(cfg, step, k, world)
            for r in range(world):
                ref.order, ref.use_extra = _order(cfg, r), _uses_extra(cfg, step, r)
                ref.discard = _discards(cfg, step, r)
                _local_loss(ref, X[r * B:(r + 1) * B], Y[r * B:(r + 1) * B], 1.0 / (world * cfg["micro"])).backward()
        opt.step()
        opt.zero_grad()
        if cfg.get("freeze_later") == "after_step" and step == 0:
            _freeze_later(ref, opt, cfg)
    return ref


def _full(p) -> np.ndarray:
    return p.full_tensor().data if hasattr(p, "full_tensor") else p.data


def _mesh(group):
    from neural_arch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, "cpu")


def _shard(model, cfg: dict, mesh, mp=None) -> None:
    from neural_arch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = mp or MixedPrecisionPolicy()
    if cfg["wrap"] == "blocks":
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=cfg.get("reshard", True), mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=cfg.get("reshard", True), mp_policy=mp)
    if cfg.get("keep_after_backward"):
        model.set_reshard_after_backward(False)


def _poison_on_release():
    """Make every reshard overwrite the gathered buffer with NaN (what giving its memory back may do):
    a backward that read it without re-gathering would give NaN. Returns the undo."""
    from neural_arch.distributed.fsdp import storage

    original = storage.release

    def release(arr):
        arr[...] = np.nan
        return original(arr)

    storage.release = release
    return lambda: setattr(storage, "release", original)


def _train(model, opt, cfg: dict, rank: int, world: int) -> None:
    """``cfg["steps"]`` SGD steps of ``cfg["micro"]`` micro-batches each on this rank's rows."""
    from neural_arch.core.tensor import Tensor, no_grad

    B, micro = cfg["B"], cfg["micro"]
    for step in range(cfg["steps"]):
        model.use_extra, model.discard = _uses_extra(cfg, step, rank), _discards(cfg, step, rank)
        for k in range(micro):
            if cfg.get("accumulate") == "no_all_reduce":   # HSDP: reduce-scatter each, all-reduce the last
                model.set_requires_all_reduce(k == micro - 1)
            else:
                model.set_requires_gradient_sync(k == micro - 1)
            X, Y = _batch(cfg, step, k, world)
            x, y = X[rank * B:(rank + 1) * B], Y[rank * B:(rank + 1) * B]
            if cfg.get("eval_first"):      # a no-grad forward first (evaluation): it must leave no trace
                with no_grad():
                    model(Tensor(x))
            if cfg.get("split") and B == 2:    # two forwards (one row each), one backward of their mean
                (_local_loss(model, x[:1], y[:1], 0.5 / micro) + _local_loss(model, x[1:], y[1:], 0.5 / micro)).backward()
            else:
                _local_loss(model, x, y, 1.0 / micro).backward()
        opt.step()
        opt.zero_grad()
        if cfg.get("freeze_later") == "after_step" and step == 0:
            _freeze_later(model, opt, cfg)


def train_case_run(cfg: dict) -> dict:
    """``fully_shard`` training against :func:`_reference`: ``{"params": worst difference, "all_reduces":
    how many all-reduces training made}``, or ``{"error": message}`` when ``fully_shard`` refused the
    model (tied parameters across units). Every reshard poisons the gathered buffer (NaN)."""
    import time

    from neural_arch import optim
    from neural_arch.distributed.flight_recorder.buffer import RECORDER

    member = group_of(cfg["world"])
    if member is None:
        return {}
    group, rank, world = member
    model = build(cfg)
    if cfg.get("ckpt"):        # activation checkpointing of each block (applied before fully_shard)
        from neural_arch.utils.checkpoint import checkpoint_wrapper

        for block in model.blocks:
            checkpoint_wrapper(block)
    # hsdp: a 2-d (replicate, shard) mesh over the whole pool of three
    mesh = mesh_of(cfg["hsdp"]) if cfg.get("hsdp") else _mesh(group)
    try:
        _shard(model, cfg, mesh)
    except ValueError as exc:
        return {"error": str(exc)}
    model.order = _order(cfg, rank)
    opt = optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.2, momentum=0.5)
    if cfg.get("freeze_later") == "before_forward":
        _freeze_later(model, opt, cfg)
    mark = time.time()
    restore = _poison_on_release()
    try:
        _train(model, opt, cfg, rank, world)
    finally:
        restore()
    all_reduces = sum(r["op"] == "all_reduce" for r in RECORDER.snapshot() if (r["t_start"] or 0) >= mark)
    ref = dict(_reference(cfg, world).named_parameters())
    got = {n: _full(p) for n, p in model.named_parameters()}
    out = {"params": max(float(np.max(np.abs(got[n] - ref[n].data))) if got[n].size else 0.0 for n in ref),
           "all_reduces": all_reduces}
    if cfg.get("digest"):     # the parameters' bytes, to compare runs bitwise
        import hashlib

        out["digest"] = hashlib.sha256(b"".join(got[n].tobytes() for n in sorted(got))).hexdigest()
    if set(got) != set(ref):
        out["keys"] = float("inf")
    return out


# ---------------------------------------------------------------------------------- mixed precision
def _mp_loss(out, y):
    from neural_arch.core.tensor import Tensor

    diff = out - Tensor(y.astype(out.dtype))
    return (diff * diff).mean()


def _cast(t, dtype):
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def _hand_cast_forward(low, x, cfg: dict):
    """``low``'s forward with the casts ``MixedPrecisionPolicy`` makes at each ``fully_shard`` module's
    boundary, written out by hand: inputs to ``param_dtype`` (``cast_forward_inputs``), outputs to
    ``output_dtype``."""
    from neural_arch.core.tensor import Tensor

    pd = np.dtype(cfg["param_dtype"]) if cfg["param_dtype"] else None
    od = np.dtype(cfg["output_dtype"]) if cfg["output_dtype"] else None
    cast_in = pd if cfg["cast_forward_inputs"] else None
    h = low.inp(_cast(Tensor(x), cast_in)).tanh()
    for i in range(cfg["blocks"]):
        if cfg["wrap"] == "blocks":
            h = _cast(low.blocks[i](_cast(h, cast_in)), od)
        else:
            h = low.blocks[i](h)
    return _cast(low.head(h), od)


def mixed_precision_run(cfg: dict) -> dict:
    """One backward under ``MixedPrecisionPolicy`` (master parameters in ``cfg["master"]``) against
    one process making the same casts by hand: each rank's gradient computed in the compute dtype,
    cast to ``reduce_dtype``, summed in rank order and divided by the world there, then cast to the
    master dtype. Returns ``{"grad": worst difference in units of the reduce dtype's eps times the
    terms' magnitude, "vs_no_cast": (smallest, largest) over the parameters of the largest relative
    difference from an all-float64 run with no casts, "out_dtype" and "ref_out_dtype" (the hand-cast run's), "grad_dtypes"}``."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.fsdp import MixedPrecisionPolicy

    member = group_of(cfg["world"])
    if member is None:
        return {}
    group, rank, world = member
    master = np.dtype(cfg["master"])
    mp = MixedPrecisionPolicy(param_dtype=cfg["param_dtype"], reduce_dtype=cfg["reduce_dtype"],
                              output_dtype=cfg["output_dtype"], cast_forward_inputs=cfg["cast_forward_inputs"])
    model = build(cfg, master)
    _shard(model, cfg, _mesh(group), mp)
    B = cfg["B"]
    X, Y = _batch(cfg, 0, 0, world)
    x = Tensor(X[rank * B:(rank + 1) * B].astype(master))
    model.keyword = bool(cfg.get("keyword"))      # every module's input by keyword
    out = model(x=x) if model.keyword else model(x)
    _mp_loss(out, Y[rank * B:(rank + 1) * B]).backward()
    got = {n: p.grad.full_tensor().data for n, p in model.named_parameters()}
    grad_dtypes = sorted({str(p.grad.dtype) for _, p in model.named_parameters()})
    # the reference: every rank's gradient in one process, each with the casts by hand
    compute = np.dtype(cfg["param_dtype"]) if cfg["param_dtype"] else master
    reduce = np.dtype(cfg["reduce_dtype"]) if cfg["reduce_dtype"] else compute
    per_rank = []
    for r in range(world):
        low = build(cfg, compute)
        for p, q in zip(low.parameters(), build(cfg, master).parameters()):
            p.data[...] = q.data.astype(compute)
        ref_out = _hand_cast_forward(low, X[r * B:(r + 1) * B].astype(master), cfg)
        _mp_loss(ref_out, Y[r * B:(r + 1) * B]).backward()
        per_rank.append({n: p.grad.data.astype(reduce) for n, p in low.named_parameters()})
    worst, vs_plain = 0.0, []
    plain = _plain_grads(cfg, X, Y, world, master)
    for n, g in got.items():
        total = per_rank[0][n].copy()
        for r in range(1, world):
            total += per_rank[r][n]
        want = (total / reduce.type(world)).astype(master)
        scale = sum(np.abs(pr[n].astype(np.float64)) for pr in per_rank) / world + np.finfo(reduce).tiny
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - want) / scale)) / np.finfo(reduce).eps)
        rel = np.abs(g.astype(np.float64) - plain[n]) / (np.abs(plain[n]) + 1e-300)
        vs_plain.append(float(np.max(rel)))
    return {"grad": worst, "vs_no_cast": (min(vs_plain), max(vs_plain)), "out_dtype": str(out.dtype), "ref_out_dtype": str(ref_out.dtype),
            "grad_dtypes": grad_dtypes}


def _plain_grads(cfg: dict, X, Y, world: int, master) -> dict:
    """The gradient of the same step with no casts at all, in float64 (what a skipped cast gives)."""
    from neural_arch.core.tensor import Tensor

    ref = build(cfg, np.float64)
    for p, q in zip(ref.parameters(), build(cfg, master).parameters()):
        p.data[...] = q.data.astype(np.float64)
    B = cfg["B"]
    for r in range(world):
        out = ref(Tensor(X[r * B:(r + 1) * B].astype(master).astype(np.float64)))
        (_mp_loss(out, Y[r * B:(r + 1) * B]) * (1.0 / world)).backward()
    return {n: p.grad.data for n, p in ref.named_parameters()}


# ---------------------------------------------------------------------------------- state dicts
def _adam(model):
    from neural_arch import optim

    return optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)


def _adam_step(model, opt, cfg: dict, step: int, rank: int, world: int) -> None:
    B = cfg["B"]
    X, Y = _batch(cfg, step, 0, world)
    _local_loss(model, X[rank * B:(rank + 1) * B], Y[rank * B:(rank + 1) * B], 1.0).backward()
    opt.step()
    opt.zero_grad()


def state_dict_run(cfg: dict) -> dict:
    """Train one Adam step under ``cfg["save"]`` (``(world, wrap)``), save the sharded model and
    optimizer state dicts (``get_state_dict``; DCP into ``cfg["dir"]``, or a full state dict), load them
    under ``cfg["load"]`` into a fresh model of other values and take one more step there.

    Returns, on the loading ranks, ``{"loaded": worst difference of the loaded full parameters from the
    saved ones (bitwise: 0.0), "resumed": worst difference from one process taking both steps}``."""
    import neural_arch.distributed as dist
    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    out: dict = {}
    (save_world, save_wrap), (load_world, load_wrap) = cfg["save"], cfg["load"]
    saved_full = None
    full_sd = None
    member = group_of(save_world)
    if member is not None:
        group, rank, world = member
        model = build(cfg)
        _shard(model, {**cfg, "wrap": save_wrap}, _mesh(group))
        opt = _adam(model)
        _adam_step(model, opt, cfg, 0, rank, world)
        saved_full = {n: _full(p).copy() for n, p in model.named_parameters()}
        if cfg["via"] == "dcp":
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=cfg["dir"], process_group=group)
        else:
            full_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    if cfg["via"] == "full":   # whole arrays, from rank 0 of the saving ranks to every rank
        obj = [full_sd]
        dist.broadcast_object_list(obj, src=0)
        full_sd = obj[0]
    dist.barrier()
    member = group_of(load_world)
    if member is None:
        return out
    group, rank, world = member
    model = build(cfg, seed=7)          # other values: the load must replace every one
    _shard(model, {**cfg, "wrap": load_wrap}, _mesh(group))
    opt = _adam(model)
    if cfg["via"] == "dcp":
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=cfg["dir"])
        msd, osd = state["model"], state["optim"]
    else:
        msd, osd = full_sd
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    loaded = {n: _full(p) for n, p in model.named_parameters()}
    if saved_full is not None:
        out["loaded"] = max(float(np.max(np.abs(loaded[n] - v))) if v.size else 0.0 for n, v in saved_full.items())
    _adam_step(model, opt, cfg, 1, rank, world)
    # one process: the first step on the saving world's global batch, the second on the loading one's
    ref = build(cfg)
    ref_opt = _adam(ref)
    for step, w in ((0, save_world), (1, load_world)):
        X, Y = _batch(cfg, step, 0, w)
        for r in range(w):
            B = cfg["B"]
            _local_loss(ref, X[r * B:(r + 1) * B], Y[r * B:(r + 1) * B], 1.0 / w).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    want = dict(ref.named_parameters())
    got = {n: _full(p) for n, p in model.named_parameters()}
    out["resumed"] = max(float(np.max(np.abs(got[n] - want[n].data))) if got[n].size else 0.0 for n in want)
    return out
