"""Rank functions of the DDP exploration tests (``test_ddp_explore.py``; module level: pickled by reference).

:func:`ddp_case_run` trains one small model with DistributedDataParallel under the options a
hypothesis example draws (per-rank batch sizes that differ, ``no_sync`` windows, a frozen
parameter, tied parameters, a parameter unused on one rank only, tiny or huge buckets,
``gradient_as_bucket_view``, comm hooks, a buffer) and a plain single-process copy on the same
data, and returns the largest parameter difference. torch's semantics decide the reference: each
rank's gradient is the gradient of its own mean loss, and DDP averages those over the ranks (so
with uneven batches the reference weights every rank's mean equally, not every sample).

Example (on every rank of a RankPool)::

    diff = ddp_case_run({"sizes": (3, 4, 2), "batches": [2, 1], "steps": 2, "dtype": "float64"})
"""

from __future__ import annotations

import numpy as np


def _imports():
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    return nn, optim, F, Tensor, dist


from pooled_groups import group_of


def _explore_model_cls():
    nn = _imports()[0]

    class ExploreNet(nn.Module):
        """fc1 -> relu -> (side, skipped on ``skip`` ranks) -> fc2, optionally ``fc2`` tied to ``side``
        (one Parameter under two names) and a running buffer updated in forward."""

        def __init__(self, sizes, dtype, tied: bool, buffer: bool):
            super().__init__()
            d_in, hidden, d_out = sizes
            self.fc1 = nn.Linear(d_in, hidden, dtype=dtype)
            self.side = nn.Linear(hidden, hidden, dtype=dtype)
            self.fc2 = nn.Linear(hidden, d_out, dtype=dtype)
            self.tied = tied
            if tied:
                self.back = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
                self.back.weight = self.side.weight       # a second name for the same Parameter
            if buffer:
                self.register_buffer("running", _imports()[3](np.zeros(hidden, dtype=dtype)))

        def forward(self, x, use_side=True):
            h = self.fc1(x).relu()
            if getattr(self, "running", None) is not None:
                self.running.data[...] = 0.5 * self.running.data + 0.5 * h.data.mean(axis=0)
                h = h + _imports()[3](self.running.data)   # a buffer that changes the output
            if use_side:
                h = self.side(h).relu()
                if self.tied:
                    h = self.back(h)
            return self.fc2(h)

    return ExploreNet


def build(cfg: dict, seed: int):
    dtype = np.dtype(cfg.get("dtype", "float64"))
    model = _explore_model_cls()(cfg["sizes"], dtype, cfg.get("tied", False), cfg.get("buffer", False))
    rng = np.random.default_rng(seed)
    for p in model.parameters():  # rank-specific init: DDP's broadcast from rank 0 is part of the test
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    if cfg.get("frozen"):
        model.fc1.weight.requires_grad = False
    if cfg.get("buffer"):
        model.running.data[...] = rng.normal(size=model.running.data.shape)
    return model


def _data(cfg: dict, step: int, rank: int, n: int):
    dtype = np.dtype(cfg.get("dtype", "float64"))
    rng = np.random.default_rng(1000 * step + rank)
    X = rng.normal(size=(n, cfg["sizes"][0])).astype(dtype)
    y = rng.integers(0, cfg["sizes"][2], size=n)
    return X, y


def _hook(name: str, group):
    from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from neural_arch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    if name == "powersgd-full-rank":  # rank >= every matrix's smaller side: exact averaging
        return ps.PowerSGDState(group, matrix_approximation_rank=64, start_powerSGD_iter=0,
                                min_compression_rate=0.0), ps.powerSGD_hook
    return group, getattr(default_hooks, name)


def ddp_case_run(cfg: dict) -> float:
    """Train DDP and the single-process reference (see the module docstring); the largest difference
    of any parameter (and of the buffer) after ``cfg["steps"]`` optimizer steps."""
    _nn, optim, F, Tensor, dist = _imports()
    member = group_of(cfg["world"])
    if member is None:
        return 0.0
    group, rank, world = member
    batches = cfg["batches"][:world]                 # per-rank micro-batch sizes (may differ)
    accum, skip = cfg.get("accum", 1), cfg.get("skip_side_on")
    model, ref = build(cfg, 100 + rank), build(cfg, 100)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=cfg.get("cap", 25.0), first_bucket_mb=cfg.get("cap", 1.0),
                                       find_unused_parameters=skip is not None, process_group=group,
                                       gradient_as_bucket_view=cfg.get("view", False),
                                       broadcast_buffers=cfg.get("buffer", False), static_graph=cfg.get("static", False))
    if cfg.get("hook"):
        ddp.register_comm_hook(*_hook(cfg["hook"], group))
    make = (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)) if cfg.get("opt") == "sgd" \
        else (lambda ps: optim.Adam(ps, lr=0.01))
    opt = make([p for p in ddp.parameters() if p.requires_grad])
    ref_opt = make([p for p in ref.parameters() if p.requires_grad])
    for step in range(cfg["steps"]):
        for j in range(accum):
            X, y = _data(cfg, step * accum + j, rank, batches[rank])
            use_side = not (skip is not None and rank == skip % world)
            loss = F.cross_entropy(ddp(Tensor(X), use_side), y) * (1.0 / accum)
            if j < accum - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
        opt.zero_grad()
        # reference: broadcast_buffers gives every rank's forward rank 0's buffer, and rank 0's update wins
        for j in range(accum):
            before = ref.running.data.copy() if cfg.get("buffer") else None
            after = None
            for r in range(world):
                X, y = _data(cfg, step * accum + j, r, batches[r])
                if before is not None:
                    ref.running.data[...] = before
                out = ref(Tensor(X), not (skip is not None and r == skip % world))
                if before is not None and r == 0:
                    after = ref.running.data.copy()
                (F.cross_entropy(out, y) * (1.0 / (accum * world))).backward()
            if after is not None:
                ref.running.data[...] = after
        ref_opt.step()
        ref_opt.zero_grad()
    diffs = [float(np.max(np.abs(p.data - q.data))) for p, q in zip(model.parameters(), ref.parameters())]
    return max(diffs)


def join_case_run(cfg: dict) -> float:
    """``with ddp.join():`` with ``cfg["rounds"][r]`` batches on rank ``r``; the reference steps on the
    sum of the still-training ranks' gradients divided by the full world size (torch's default), and
    every rank must end with the parameters of that training."""
    _nn, optim, F, Tensor, dist = _imports()
    member = group_of(cfg["world"])
    if member is None:
        return 0.0
    group, rank, world = member
    rounds, batches = cfg["rounds"][:world], cfg["batches"][:world]
    model, ref = build(cfg, 100 + rank), build(cfg, 100)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=cfg.get("cap", 25.0), first_bucket_mb=cfg.get("cap", 1.0),
                                       gradient_as_bucket_view=cfg.get("view", False), process_group=group)
    opt, ref_opt = optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9), optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    with ddp.join():
        for step in range(rounds[rank]):
            X, y = _data(cfg, step, rank, batches[rank])
            F.cross_entropy(ddp(Tensor(X)), y).backward()
            opt.step()
            opt.zero_grad()
    for step in range(max(rounds)):
        for r in range(world):
            if step < rounds[r]:
                X, y = _data(cfg, step, r, batches[r])
                (F.cross_entropy(ref(Tensor(X)), y) * (1.0 / world)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max(float(np.max(np.abs(p.data - q.data))) for p, q in zip(model.parameters(), ref.parameters()))


def compressed_hook_run(cfg: dict) -> float:
    """One backward with ``cfg["hook"]`` (fp16/bf16 compression): the largest relative error of the
    averaged gradient against the exact float64 average."""
    _nn, _optim, F, Tensor, dist = _imports()
    member = group_of(cfg["world"])
    if member is None:
        return 0.0
    group, rank, world = member
    model, ref = build(cfg, 100 + rank), build(cfg, 100)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=cfg.get("cap", 25.0), first_bucket_mb=cfg.get("cap", 1.0),
                                       process_group=group)
    ddp.register_comm_hook(*_hook(cfg["hook"], group))
    X, y = _data(cfg, 0, rank, cfg["batches"][rank])
    F.cross_entropy(ddp(Tensor(X)), y).backward()
    for r in range(world):
        X, y = _data(cfg, 0, r, cfg["batches"][r])
        (F.cross_entropy(ref(Tensor(X)), y) * (1.0 / world)).backward()
    worst = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        scale = max(float(np.max(np.abs(q.grad.data))), 1e-30)
        worst = max(worst, float(np.max(np.abs(p.grad.data - q.grad.data))) / scale)
    return worst


def bad_input_run(case: str) -> str:
    """What a wrong call raises (``"<ExcType>: message"``), or ``"no error"``."""
    nn, optim, _F, _Tensor, dist = _imports()
    model = nn.Linear(2, 2, dtype=np.float64)
    try:
        if case == "no-parameters":
            dist.DistributedDataParallel(nn.ReLU())
        elif case == "all-frozen":
            model.requires_grad_(False)
            dist.DistributedDataParallel(model)
        elif case == "group-is-a-string":
            dist.DistributedDataParallel(model, process_group="gloo")
        elif case == "group-is-ranks":
            dist.DistributedDataParallel(model, process_group=[0, 1])
        elif case == "bucket-cap-nan":
            dist.DistributedDataParallel(model, bucket_cap_mb=float("nan"))
        elif case == "bucket-cap-inf":
            dist.DistributedDataParallel(model, bucket_cap_mb=float("inf"))
        elif case == "hook-group-not-the-ddps":
            # DDP over the first 2 ranks; a built-in hook whose state (None) means the default group
            # would average its buckets over all 4 (found: the gradients came out mixed, exit 0)
            from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks

            member = group_of(2)
            if member is None:
                return "not a member"
            ddp = dist.DistributedDataParallel(model, process_group=member[0])
            ddp.register_comm_hook(member[0], default_hooks.allreduce_hook)     # its own group: fine
            fresh = dist.DistributedDataParallel(nn.Linear(2, 2, dtype=np.float64), process_group=member[0])
            fresh.register_comm_hook(None, default_hooks.allreduce_hook)
        elif case == "user-comm-hook-own-state":
            # a user's @comm_hook with a state object of its own: not a process group to check
            from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import comm_hook
            from neural_arch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            @comm_hook()
            def counting(state, bucket):
                state["calls"] += 1
                return allreduce_hook(None, bucket)

            dist.DistributedDataParallel(model).register_comm_hook({"calls": 0}, counting)
        elif case == "hook-twice":
            from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp = dist.DistributedDataParallel(model)
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif case == "hook-not-callable":
            dist.DistributedDataParallel(model).register_comm_hook(None, "allreduce")
        elif case == "zero-group-is-a-string":
            from neural_arch.distributed.optim import ZeroRedundancyOptimizer

            ZeroRedundancyOptimizer(model.parameters(), optim.SGD, process_group="gloo", lr=0.1)
        elif case == "zero-bucket-cap-nan":
            from neural_arch.distributed.optim import ZeroRedundancyOptimizer

            ZeroRedundancyOptimizer(model.parameters(), optim.SGD, stage=2, bucket_cap_mb=float("nan"), lr=0.1)
        elif case == "zero-not-an-optimizer-class":
            from neural_arch.distributed.optim import ZeroRedundancyOptimizer

            ZeroRedundancyOptimizer(model.parameters(), optim.SGD(model.parameters(), lr=0.1), lr=0.1)
        elif case == "fsdp-no-parameters":
            from neural_arch.distributed.fsdp import FSDP

            FSDP(nn.ReLU())
        elif case == "fully-shard-no-parameters":
            from neural_arch.distributed.fsdp import fully_shard

            fully_shard(nn.ReLU())
        elif case == "ddp-of-ddp":
            dist.DistributedDataParallel(dist.DistributedDataParallel(model))
        elif case == "ddp-of-fsdp":
            from neural_arch.distributed.fsdp import FSDP

            dist.DistributedDataParallel(FSDP(model))
        else:
            raise AssertionError(case)
    except Exception as exc:  # noqa: BLE001 - the answer is the exception
        return f"{type(exc).__name__}: {exc}"
    return "no error"
