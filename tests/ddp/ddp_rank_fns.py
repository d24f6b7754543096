"""Functions the DDP tests run on every rank of a RankPool (module level: pickled by reference).

The central one, :func:`equivalence_run`, trains the same model two ways on every rank:

* **DDP**: each rank takes its per-rank batch ``B`` from a ``DistributedSampler`` (rank-specific
  initial weights, so DDP's broadcast from rank 0 is exercised too);
* **reference**: a plain single-process copy (rank 0's initial weights) trained on the global
  batch of ``N * B`` samples, i.e. the union of all ranks' batches of that step;

and returns the largest parameter difference (plus a fingerprint to compare across ranks).
"""

from __future__ import annotations

import numpy as np


def _imports():
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor

    return nn, optim, F, Tensor, dist


def build_mlp(seed: int, dtype, sizes=(6, 16, 4)):
    nn = _imports()[0]
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(sizes[0], sizes[1], dtype=dtype), nn.ReLU(),
                          nn.Linear(sizes[1], sizes[2], dtype=dtype))
    for p in model.parameters():  # deterministic, rank-specific init without the global RNG
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    return model


def _sometimes_unused_cls():
    nn = _imports()[0]

    class SometimesUnused(nn.Module):
        """``extra`` is used on even steps only; ``dead`` never."""

        def __init__(self, dtype):
            super().__init__()
            self.fc1 = nn.Linear(6, 16, dtype=dtype)
            self.extra = nn.Linear(16, 16, dtype=dtype)
            self.dead = nn.Linear(16, 4, dtype=dtype)
            self.fc2 = nn.Linear(16, 4, dtype=dtype)
            self.relu = nn.ReLU()

        def forward(self, x, step=0):
            h = self.relu(self.fc1(x))
            if step % 2 == 0:
                h = self.relu(self.extra(h))
            return self.fc2(h)

    return SometimesUnused


def build_model(kind: str, seed: int, dtype):
    if kind == "mlp":
        return build_mlp(seed, dtype)
    model = _sometimes_unused_cls()(dtype)
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape).astype(dtype)
    return model


def make_data(n: int, dtype, seed: int = 7):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6)).astype(dtype)
    y = (X[:, :4].argmax(axis=1) + (X[:, 4] > 0)).astype(np.int64) % 4
    return X, y


def make_opt(name: str, params):
    optim = _imports()[1]
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if name == "adam":
        return optim.Adam(params, lr=0.01)
    if name == "sgd-momentum":  # plain heavy-ball momentum (what Top-K's momentum correction reproduces)
        return optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "sgd-no-momentum":
        return optim.SGD(params, lr=0.1)
    raise ValueError(name)


def make_hook(name: str, group):
    """A comm hook for the equivalence tests: torch's registered by name, or a hand-written one that
    sums raw (not pre-scaled) gradients and divides in a ``then`` continuation."""
    from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import then
    from neural_arch.distributed.comm.work import ReduceOp

    if name == "custom":
        def sum_then_divide(state, bucket):
            backend = (state or _imports()[4].get_default_group()).backend
            assert not bucket.prescaled  # custom hooks see this rank's raw local gradients
            work = backend.allreduce(bucket.buffer(), ReduceOp.SUM, async_op=True)
            return then(work, lambda w: w.result() / backend.size)  # a new array: the reducer copies it in
        return group, sum_then_divide
    if name == "powersgd-full-rank":  # rank >= every matrix's smaller side: exact averaging
        from neural_arch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        return ps.PowerSGDState(group, matrix_approximation_rank=64, start_powerSGD_iter=0,
                                min_compression_rate=0.0), ps.powerSGD_hook
    if name == "powersgd-rank1":  # lossy: rank 1 with error feedback, from the first step
        from neural_arch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        return ps.PowerSGDState(group, matrix_approximation_rank=1, start_powerSGD_iter=0), ps.powerSGD_hook
    if name == "topk-30%":  # lossy: 30% of each bucket per rank, error feedback
        from neural_arch.distributed.algorithms.ddp_comm_hooks import topk_hook as tk

        return tk.TopKState(ratio=0.3, process_group=group), tk.topk_hook
    if name == "topk-momentum-everything":  # ratio 1 + momentum correction: SGD momentum in the hook
        from neural_arch.distributed.algorithms.ddp_comm_hooks import topk_hook as tk

        return tk.TopKState(ratio=1.0, momentum=0.9, process_group=group), tk.topk_hook
    if name == "topk-warmup":  # lossy: dense, then 50%, 25%, 12.5%, then 5% with momentum correction
        from neural_arch.distributed.algorithms.ddp_comm_hooks import topk_hook as tk

        return tk.TopKState(ratio=0.05, start_iter=1, warmup_iters=3, warmup_start_ratio=0.5, warmup_factor=2.0,
                            momentum=0.5, process_group=group), tk.topk_hook
    if name == "topk-everything":  # ratio 1: every entry sent, residual always zero
        from neural_arch.distributed.algorithms.ddp_comm_hooks import topk_hook as tk

        return tk.TopKState(ratio=1.0, process_group=group), tk.topk_hook
    return group, getattr(default_hooks, name)


def topk_feedback_run(ratio: float, steps: int = 5, kwargs=None):
    """Drive topk_hook on random buckets (two gradients, so per-tensor selection is exercised).

    Checks, every step: what this rank sent + its new residual == what it owed (its share of the
    gradient, or with momentum correction of the velocity, plus the old residual); only the k
    entries the schedule allows are nonzero in what was sent; the result is the sum over ranks of
    what each sent. Over all steps: sent + residual == the sum of what was owed (nothing lost).
    Returns (largest error, [(numbers sent, bucket size) per step])."""
    dist = _imports()[4]
    from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import GradBucket
    from neural_arch.distributed.algorithms.ddp_comm_hooks.topk_hook import TopKState, topk_hook

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_default_group().backend
    state = TopKState(ratio=ratio, **({"warmup_iters": 0} if kwargs is None else kwargs))
    rng = np.random.default_rng(10 + rank)
    n = 37
    slots = [(0, 28, (4, 7)), (28, n, (9,))]
    total_owed = np.zeros(n)
    total_sent = np.zeros(n)
    velocity = np.zeros(n)
    errors, sent_log = [], []
    for _ in range(steps):
        grad = rng.normal(size=n)
        velocity = state.momentum * velocity + grad / world
        owed_now = velocity if state.momentum else grad / world
        total_owed += owed_now
        owed = owed_now + state.residuals.get(0, np.zeros(n))
        bucket = GradBucket(0, grad.copy(), slots, params=["w", "b"], last=True)
        result = topk_hook(state, bucket).result()
        sent = owed - state.residuals[0]
        sent_log.append(state.last_sent)
        k = state.last_sent[0] // 2 if state.last_sent[0] < n else n
        errors.append(float(np.max(np.abs(np.sort(np.abs(sent))[:n - k]), initial=0.0)))  # only k nonzero
        total_sent += sent
        summed = sent.copy()
        backend.allreduce(summed)
        errors.append(float(np.max(np.abs(summed - result))))
        if state.momentum:  # momentum factor masking: the velocity of sent entries starts afresh
            # (a sent entry is one well above rounding: x / 3 and x * (1 / 3) differ in the last bit)
            velocity[(np.abs(sent) > 1e-9) & (state.last_sent[0] < n)] = 0
            errors.append(float(np.max(np.abs(velocity - state.velocities[0]))))
    errors.append(float(np.max(np.abs(total_sent + state.residuals[0] - total_owed))))
    return max(errors), sent_log


def hook_calls_run():
    """Record what the comm hook sees: bucket indices, is_last, parameter counts, in call order."""
    _nn, _optim, F, Tensor, dist = _imports()
    from neural_arch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = build_mlp(0, np.float64, sizes=(32, 64, 10))
    # buckets: [2.bias], [2.weight, 0.bias], [0.weight] (a bucket closes once it holds the cap)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.005, first_bucket_mb=0.00005)
    seen = []

    def recording(state, bucket):
        seen.append((bucket.index(), bucket.is_last(), len(bucket.parameters()), int(bucket.buffer().size)))
        return allreduce_hook(state, bucket)
    ddp.register_comm_hook(None, recording)
    X, y = make_data(8, np.float64)
    X = np.tile(X, (1, 6))[:, :32]
    for _ in range(2):
        F.cross_entropy(ddp(Tensor(X)), y).backward()
    try:
        ddp.register_comm_hook(None, recording)
        twice = "no error"
    except RuntimeError as exc:
        twice = str(exc)
    return seen, len(ddp.bucket_plan), twice


def equivalence_run(cfg: dict):
    """Train DDP vs single-process reference (see module docstring); return (max diff, fingerprint)."""
    _nn, _optim, F, Tensor, dist = _imports()
    group = None
    if cfg.get("subgroup"):
        group = dist.new_group(cfg["subgroup"])
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            return None
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dtype = np.dtype(cfg.get("dtype", "float64"))
    kind = cfg.get("model", "mlp")
    B, accum, epochs = cfg.get("B", 4), cfg.get("accum", 1), cfg.get("epochs", 2)
    model = build_model(kind, 100 + rank, dtype)
    ref = build_model(kind, 100, dtype)
    ddp = dist.DistributedDataParallel(
        model, bucket_cap_mb=cfg.get("cap", 25.0), first_bucket_mb=cfg.get("first", 1.0),
        find_unused_parameters=cfg.get("find_unused", False),
        gradient_as_bucket_view=cfg.get("view", False), process_group=group)
    if cfg.get("hook"):
        state, hook = make_hook(cfg["hook"], group)
        ddp.register_comm_hook(state, hook)
    # (the DDP side may use another optimizer: Top-K's momentum correction moves SGD's momentum into the hook)
    opt = make_opt(cfg.get("ddp_opt", cfg.get("opt", "sgd")), ddp.parameters())
    ref_opt = make_opt(cfg.get("opt", "sgd"), ref.parameters())
    X, y = make_data(cfg.get("n", 40), dtype)
    shuffle = cfg.get("shuffle", True)
    samplers = [dist.DistributedSampler(len(X), world, r, shuffle=shuffle, seed=3) for r in range(world)]
    step = 0
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        every = [s.indices() for s in samplers]
        for t in range(len(every[rank]) // B):
            idx = every[rank][t * B:(t + 1) * B]
            micro = np.array_split(idx, accum)
            for j, mb in enumerate(micro):
                def backward(mb=mb, idx=idx, step=step):
                    loss = F.cross_entropy(ddp(Tensor(X[mb]), step) if kind != "mlp" else ddp(Tensor(X[mb])), y[mb])
                    (loss * (len(mb) / len(idx))).backward()
                if cfg.get("grad_sync_flag"):  # nanoGPT's spelling of gradient accumulation
                    ddp.require_backward_grad_sync = j == len(micro) - 1
                    backward()
                elif j < len(micro) - 1:
                    ctx = dist.no_sync() if cfg.get("global_no_sync") else ddp.no_sync()
                    with ctx:
                        backward()
                else:
                    backward()
            if cfg.get("manual_sync"):
                ddp.sync_gradients()  # harmless after the automatic sync: no double averaging
            opt.step()
            opt.zero_grad()
            gidx = np.concatenate([e[t * B:(t + 1) * B] for e in every])
            out = ref(Tensor(X[gidx]), step) if kind != "mlp" else ref(Tensor(X[gidx]))
            F.cross_entropy(out, y[gidx]).backward()
            ref_opt.step()
            ref_opt.zero_grad()
            step += 1
    diff = max(float(np.max(np.abs(p.data - q.data))) for p, q in zip(model.parameters(), ref.parameters()))
    fingerprint = float(sum(float(np.sum(p.data.astype(np.float64) * (i + 1))) for i, p in enumerate(model.parameters())))
    return diff, fingerprint, step


def unused_error_run(find_unused: bool):
    """A model with a never-used layer and find_unused_parameters=False must fail on every rank."""
    _nn, _optim, F, Tensor, dist = _imports()
    model = build_model("unused", 1, np.float64)
    ddp = dist.DistributedDataParallel(model, find_unused_parameters=find_unused)
    X, y = make_data(8, np.float64)
    try:
        F.cross_entropy(ddp(Tensor(X), 1), y).backward()
    except RuntimeError as exc:
        return type(exc).__name__, str(exc)
    grads = {n: (None if p.grad is None else float(np.abs(p.grad.data).sum())) for n, p in model.named_parameters()}
    return "ok", grads


def locally_unused_run():
    """``extra`` used on rank 0 only: its gradient is rank 0's divided by the world size, on every rank."""
    _nn, _optim, F, Tensor, dist = _imports()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model("unused", 1, np.float64)
    ddp = dist.DistributedDataParallel(model, find_unused_parameters=True)
    X, y = make_data(8, np.float64)
    F.cross_entropy(ddp(Tensor(X), 0 if rank == 0 else 1), y).backward()
    ref = build_model("unused", 1, np.float64)
    F.cross_entropy(ref(Tensor(X), 0), y).backward()
    return float(np.max(np.abs(model.extra.weight.grad.data - ref.extra.weight.grad.data / world)))


def count_allreduces_run(cap_mb: float, first_mb: float):
    """Number of gradient all-reduce calls of one backward for a given bucket cap, and the plan."""
    _nn, _optim, F, Tensor, dist = _imports()
    model = build_mlp(0, np.float64, sizes=(32, 64, 10))
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=cap_mb, first_bucket_mb=first_mb)
    backend = ddp._backend
    calls = []
    original = backend.allreduce

    def counting(array, *args, **kwargs):
        calls.append(int(array.size))
        return original(array, *args, **kwargs)

    backend.allreduce = counting
    try:
        X, y = make_data(8, np.float64)
        X = np.tile(X, (1, 6))[:, :32]
        F.cross_entropy(ddp(Tensor(X)), y).backward()
    finally:
        del backend.allreduce  # back to the class method
    return len(calls), ddp.bucket_plan


def overlap_run():
    """Show that bucket all-reduces start before backward finishes (timeline of one backward)."""
    _nn, _optim, F, Tensor, dist = _imports()
    model = build_mlp(0, np.float32, sizes=(256, 512, 10))
    # buckets: [2.bias, 2.weight, 0.bias] (20 KiB reached), [0.weight]
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.02, first_bucket_mb=0.02)
    X = np.random.default_rng(0).normal(size=(64, 256)).astype(np.float32)
    y = np.arange(64) % 10
    F.cross_entropy(ddp(Tensor(X)), y).backward()
    return ddp.bucket_timeline(), ddp.comm_stats()


def manual_sync_run():
    """Seed 001 style: backward under no_sync, then sync_gradients(); then auto sync + sync_gradients()."""
    _nn, _optim, F, Tensor, dist = _imports()
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = make_data(8 * world, np.float64)
    model = build_mlp(5 + rank, np.float64)
    ddp = dist.DistributedDataParallel(model)
    ref = build_mlp(5, np.float64)
    F.cross_entropy(ref(Tensor(X)), y).backward()
    mine = slice(rank * 8, (rank + 1) * 8)
    diffs = []
    with ddp.no_sync():
        F.cross_entropy(ddp(Tensor(X[mine])), y[mine]).backward()
    ddp.sync_gradients()
    diffs.append(max(float(np.max(np.abs(p.grad.data - q.grad.data))) for p, q in zip(model.parameters(), ref.parameters())))
    ddp.zero_grad()
    F.cross_entropy(ddp(Tensor(X[mine])), y[mine]).backward()
    ddp.sync_gradients()
    ddp.sync_gradients()
    diffs.append(max(float(np.max(np.abs(p.grad.data - q.grad.data))) for p, q in zip(model.parameters(), ref.parameters())))
    return diffs


def join_reference(extra_batches_per_rank: int, world: int) -> list:
    """Single-process training equal to :func:`join_run` on ``world`` ranks: step t averages the gradients
    of the ranks still training (k_t of them, all on the same batch) over the whole group, so the update
    is ``k_t / world`` times the batch's gradient; the optimizer is the longest-training rank's, whose
    parameters every rank takes at the end. Returns the final parameters."""
    _nn, _optim, F, Tensor, _dist = _imports()
    model = build_mlp(0, np.float64)       # DDP starts every rank from rank 0's parameters
    opt = make_opt("sgd", model.parameters())
    X, y = make_data(64, np.float64)
    steps = [2 + r * extra_batches_per_rank for r in range(world)]
    for t in range(max(steps)):
        sl = slice(4 * t, 4 * t + 4)
        F.cross_entropy(model(Tensor(X[sl])), y[sl]).backward()
        active = sum(n > t for n in steps)
        for p in model.parameters():
            p.grad.data[...] *= active / world
        opt.step()
        opt.zero_grad()
    return [p.data.copy() for p in model.parameters()]


def join_run(extra_batches_per_rank: int, find_unused: bool = False):
    """Uneven inputs: rank r runs 2 + r * extra batches inside join(); returns a parameter fingerprint
    and the parameters right after the join block."""
    _nn, _optim, F, Tensor, dist = _imports()
    rank = dist.get_rank()
    model = build_mlp(rank, np.float64)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.0005, first_bucket_mb=0.0005,
                                       find_unused_parameters=find_unused)
    opt = make_opt("sgd", ddp.parameters())
    X, y = make_data(64, np.float64)
    n = 2 + rank * extra_batches_per_rank
    with ddp.join():
        for t in range(n):
            sl = slice(4 * t, 4 * t + 4)
            F.cross_entropy(ddp(Tensor(X[sl])), y[sl]).backward()
            opt.step()
            opt.zero_grad()
    fingerprint = float(sum(float(np.sum(p.data * (i + 1))) for i, p in enumerate(model.parameters())))
    joined = [p.data.copy() for p in model.parameters()]
    # after join, ordinary synchronised training goes on (optimizer state is per rank, as in torch)
    F.cross_entropy(ddp(Tensor(X[:4])), y[:4]).backward()
    opt.step()
    return fingerprint, joined


def mismatch_run():
    """Ranks build different models: construction must fail on every rank, naming the parameter."""
    _nn, _optim, _f, _tensor, dist = _imports()
    rank = dist.get_rank()
    model = build_mlp(0, np.float64, sizes=(6, 16 + rank, 4))
    try:
        dist.DistributedDataParallel(model)
    except ValueError as exc:
        return str(exc)
    return "no error"


def broadcast_run():
    """Parameters and buffers equal rank 0's right after construction."""
    _nn, _optim, _f, Tensor, dist = _imports()
    rank = dist.get_rank()
    model = build_mlp(rank, np.float32)
    model.register_buffer("running", Tensor(np.full(3, float(rank), dtype=np.float64)))
    dist.DistributedDataParallel(model)
    return [p.data.tolist() for p in model.parameters()], model.running.data.tolist()


def evaluate_run(n: int):
    """distributed_evaluate over n samples vs. the single-process truth (n not divisible by the world)."""
    _nn, _optim, _f, Tensor, dist = _imports()
    from neural_arch.data import TensorDataset

    model = build_mlp(0, np.float64)
    X, y = make_data(n, np.float64)
    stats = dist.distributed_evaluate(model, (X, y), ["accuracy", "loss"], batch_size=7)
    ddp_stats = dist.distributed_evaluate(dist.DistributedDataParallel(model), TensorDataset(X, y), "accuracy")
    logits = model(Tensor(X)).data
    z = logits - logits.max(axis=1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(n), y]))
    return stats, ddp_stats, float(np.mean(logits.argmax(axis=1) == y)), loss


def recover_run():
    """A backward that raises midway (after some buckets launched) must not poison the next one."""
    _nn, _optim, F, Tensor, dist = _imports()
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = make_data(4 * world, np.float64)
    model = build_mlp(0, np.float64)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.0001, first_bucket_mb=0.0001)
    mine = slice(4 * rank, 4 * rank + 4)
    hidden = model[0](Tensor(X[mine]))
    hidden.register_hook(lambda g: (_ for _ in ()).throw(KeyError("boom")))
    out = ddp.module[2](model[1](hidden))
    try:
        F.cross_entropy(out, y[mine]).backward()
    except KeyError:
        pass
    ddp.zero_grad()
    F.cross_entropy(ddp(Tensor(X[mine])), y[mine]).backward()
    ref = build_mlp(0, np.float64)
    F.cross_entropy(ref(Tensor(X)), y).backward()
    return max(float(np.max(np.abs(p.grad.data - q.grad.data))) for p, q in zip(model.parameters(), ref.parameters()))


def join_throw_run():
    """join(throw_on_early_termination=True): every rank raises once one rank runs out of inputs."""
    _nn, _optim, F, Tensor, dist = _imports()
    rank = dist.get_rank()
    model = build_mlp(0, np.float64)
    ddp = dist.DistributedDataParallel(model)
    X, y = make_data(64, np.float64)
    done = 0
    try:
        with ddp.join(throw_on_early_termination=True):
            for t in range(2 + 2 * rank):
                F.cross_entropy(ddp(Tensor(X[4 * t:4 * t + 4])), y[4 * t:4 * t + 4]).backward()
                done += 1
    except RuntimeError as exc:
        return done, str(exc)
    return done, "no error"


def view_run():
    """gradient_as_bucket_view=True: after backward every .grad.data *is* its bucket slot (no copy back)."""
    _nn, _optim, F, Tensor, dist = _imports()
    model = build_mlp(0, np.float32)
    ddp = dist.DistributedDataParallel(model, gradient_as_bucket_view=True)
    X, y = make_data(8, np.float32)
    checks = []
    for _ in range(2):  # the second backward accumulates straight into the views (zero_grad(False))
        F.cross_entropy(ddp(Tensor(X)), y).backward()
        views = {id(g) for b in ddp.reducer.buckets for g in b.views}
        checks.append(all(id(p.grad.data) in views for p in model.parameters()))
        ddp.zero_grad(set_to_none=False)
    return checks


def bf16_probe() -> str:
    """"ok" when the backend all-reduces ml_dtypes.bfloat16 arrays correctly, else why not.

    Probed on a fresh group of every rank: a backend that accepts the dtype but fails once the
    operation started poisons the group it ran on, and that must not be the pool's world."""
    import ml_dtypes

    dist = _imports()[4]
    probe = dist.new_group(list(range(dist.get_world_size())))
    x = np.ones(3, dtype=ml_dtypes.bfloat16)
    try:
        probe.backend.allreduce(x)
    except Exception as exc:  # noqa: BLE001 - reported as the skip reason
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    if x.astype(np.float32).tolist() != [float(dist.get_world_size())] * 3:
        return f"wrong result {x.astype(np.float32).tolist()}"
    return "ok"


def powersgd_feedback_run(rank_r: int, steps: int = 5):
    """Drive powerSGD_hook (rank ``rank_r``, error feedback) on random buckets of a matrix and a
    vector. Conservation: sum over steps of what was delivered + the residuals summed over ranks
    == the sum over steps of the true mean gradients. Returns (error, numbers sent, numbers plain)."""
    dist = _imports()[4]
    from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import GradBucket
    from neural_arch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_default_group().backend
    state = PowerSGDState(None, matrix_approximation_rank=rank_r, start_powerSGD_iter=0, min_compression_rate=1.0)
    rng = np.random.default_rng(20 + rank)
    shape, n_vec = (12, 9), 5
    n = shape[0] * shape[1] + n_vec
    slots = [(0, 108, shape), (108, n, (n_vec,))]
    delivered, true_mean = np.zeros(n), np.zeros(n)
    for _ in range(steps):
        grad = rng.normal(size=n)
        mean = grad.copy()
        backend.allreduce(mean)
        true_mean += mean / world
        bucket = GradBucket(0, grad.copy(), slots, params=["w", "b"], last=True)
        delivered += powerSGD_hook(state, bucket).result()
    residual = state.error_dict[0].copy()
    backend.allreduce(residual)
    return float(np.max(np.abs(delivered + residual - true_mean))), state.last_sent


def facade_compressed_run(ratio: float, steps: int = 4):
    """CommunicationOptimizer.all_reduce_compressed: every rank gets the same result, and over
    steps delivered + residuals (summed over ranks) == the true means (nothing lost)."""
    dist = _imports()[4]
    from neural_arch.distributed.trainer.communication_optimizer import CommunicationOptimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_default_group().backend
    opt = CommunicationOptimizer(compression_ratio=ratio, bucket_size_mb=1)
    rng = np.random.default_rng(30 + rank)
    delivered, true_mean = np.zeros((4, 6)), np.zeros((4, 6))
    results = []
    for _ in range(steps):
        grad = rng.normal(size=(4, 6))
        mean = grad.copy()
        backend.allreduce(mean)
        true_mean += mean / world
        out = opt.all_reduce_compressed(grad)
        assert out is grad  # in place and returned, like all_reduce
        delivered += out
        results.append(out.copy())
    residual = np.zeros((4, 6))
    if opt.topk_state.residuals:
        residual = opt.topk_state.residuals[0].reshape(4, 6).copy()
    backend.allreduce(residual)
    table = np.empty((world, *results[-1].shape))
    backend.allgather(table, results[-1])
    same = bool((table == table[0]).all())
    return float(np.max(np.abs(delivered + residual - true_mean))), same, opt.last_sent


def bucket_spans_run():
    """One synchronised backward with a subscriber on the profiler seam: the bucket spans it gets,
    DDP's per-bucket stats, and the timeline."""
    _nn, _optim, F, Tensor, dist = _imports()
    from neural_arch.profiler import events

    model = build_mlp(0, np.float32, sizes=(256, 512, 10))
    # buckets: [2.bias, 2.weight] (ready after the last layer's backward), [0.bias], [0.weight]
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.0019, first_bucket_mb=0.0019)
    X = np.random.default_rng(0).normal(size=(64, 256)).astype(np.float32)
    y = np.arange(64) % 10
    F.cross_entropy(ddp(Tensor(X)), y).backward()  # not recorded: nobody subscribed yet
    seen = []
    events.subscribe(seen.append)
    try:
        F.cross_entropy(ddp(Tensor(X)), y).backward()
    finally:
        events.unsubscribe(seen.append)
    spans = [(s.name, s.category, s.start, s.end, dict(s.args)) for s in seen if s.category == "bucket"]
    return spans, ddp.bucket_stats(), ddp.bucket_timeline(), ddp.comm_stats(), len(ddp.bucket_plan)
