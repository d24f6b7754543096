"""Rank functions for tests/ports: each one is a PyTorch idiom, written as a torch user would write it.

They run on every rank of a RankPool (module level, so they travel by reference). Each returns
plain data that the test compares with an oracle computed independently (NumPy, or autograd on
the global batch), so a wrong implementation fails.
"""

from __future__ import annotations

import os

import numpy as np


def _dist():
    import neural_arch.distributed as dist

    return dist


# ---------------------------------------------------------------------------------- SyncBatchNorm
def _reference_bn(x, dy, weight, bias, eps):
    """BatchNorm on the whole (global) batch through plain autograd ops: the oracle."""
    from neural_arch.core.tensor import Tensor

    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    xt = Tensor(x, requires_grad=True)
    w, b = Tensor(weight, requires_grad=True), Tensor(bias, requires_grad=True)
    mean = xt.mean(axis=axes, keepdims=True)
    var = ((xt - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (xt - mean) / (var + eps) ** 0.5 * w.reshape(shape) + b.reshape(shape)
    (y * Tensor(dy)).sum().backward()
    return y.data, xt.grad.data, w.grad.data, b.grad.data


def sync_bn_oracle(seed: int, sizes: list[int], spatial: tuple, steps: int = 3) -> dict:
    """SyncBatchNorm on uneven per-rank batches vs BatchNorm on the concatenated batch."""
    dist = _dist()
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import SyncBatchNorm

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = sizes[:world]
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
    channels, eps, momentum = 3, 1e-5, 0.1
    rng = np.random.default_rng(seed)
    bn = SyncBatchNorm(channels, eps=eps, momentum=momentum, dtype=np.float64)
    bn.weight.data[...] = rng.normal(1, 0.3, channels)
    bn.bias.data[...] = rng.normal(0, 0.3, channels)
    run_mean, run_var = np.zeros(channels), np.ones(channels)
    worst = {"y": 0.0, "grad_x": 0.0, "grad_w": 0.0, "grad_b": 0.0, "running": 0.0}
    for _ in range(steps):
        x = rng.normal(2.0, 3.0, (sum(sizes), channels) + tuple(spatial))
        dy = rng.normal(0, 1, x.shape)
        y_ref, gx_ref, gw_ref, gb_ref = _reference_bn(x, dy, bn.weight.data.copy(), bn.bias.data.copy(), eps)
        bn.weight.grad = bn.bias.grad = None
        xt = Tensor(x[lo:hi].copy(), requires_grad=True)
        y = bn(xt)
        (y * Tensor(dy[lo:hi])).sum().backward()
        grads = np.concatenate([bn.weight.grad.data, bn.bias.grad.data])
        dist.all_reduce(grads)  # weight/bias grads are local (as in torch): their sum is the global one
        worst["y"] = max(worst["y"], float(np.abs(y.data - y_ref[lo:hi]).max(initial=0)))
        worst["grad_x"] = max(worst["grad_x"], float(np.abs(xt.grad.data - gx_ref[lo:hi]).max(initial=0)))
        worst["grad_w"] = max(worst["grad_w"], float(np.abs(grads[:channels] - gw_ref).max()))
        worst["grad_b"] = max(worst["grad_b"], float(np.abs(grads[channels:] - gb_ref).max()))
        axes = (0,) + tuple(range(2, x.ndim))
        run_mean = (1 - momentum) * run_mean + momentum * x.mean(axis=axes)
        n = x.size // channels
        run_var = (1 - momentum) * run_var + momentum * x.var(axis=axes) * n / (n - 1)
        worst["running"] = max(worst["running"], float(np.abs(bn.running_mean.data - run_mean).max()),
                               float(np.abs(bn.running_var.data - run_var).max()))
    worst["tracked"] = int(bn.num_batches_tracked.data)
    bn.eval()
    x = rng.normal(0, 1, (2, channels) + tuple(spatial))
    shape = (1, channels) + (1,) * len(spatial)
    expect = ((x - run_mean.reshape(shape)) / np.sqrt(run_var.reshape(shape) + eps)
              * bn.weight.data.reshape(shape) + bn.bias.data.reshape(shape))
    worst["eval"] = float(np.abs(bn(Tensor(x)).data - expect).max())
    return worst


def sync_bn_ddp_training(seed: int, sizes: list[int], steps: int = 4) -> float:
    """DDP + convert_sync_batchnorm on uneven batches == one process training on the global batch."""
    dist = _dist()
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import DistributedDataParallel, SyncBatchNorm

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = sizes[:world]
    lo, hi, total = sum(sizes[:rank]), sum(sizes[:rank + 1]), sum(sizes)

    def build():
        rng = np.random.default_rng(seed)
        model = nn.Sequential(nn.Linear(4, 5, dtype=np.float64), SyncBatchNorm(5, dtype=np.float64), nn.ReLU(),
                              nn.Linear(5, 1, dtype=np.float64))
        for p in model.parameters():
            p.data[...] = rng.normal(0, 0.7, p.data.shape)
        return model

    ref, model = build(), DistributedDataParallel(build())
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    opt = optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(seed + 1)
    for _ in range(steps):
        x, t = rng.normal(0, 2, (total, 4)), rng.normal(0, 1, (total, 1))
        # reference: plain BatchNorm semantics (a world of one never communicates)
        with _single_process_bn(ref):
            ref_opt.zero_grad()
            loss = ((ref(Tensor(x)) - Tensor(t)) ** 2).sum() * (1.0 / total)
            loss.backward()
            ref_opt.step()
        opt.zero_grad()
        # each rank's share of the global mean loss, times world (DDP averages the gradients)
        local = ((model(Tensor(x[lo:hi])) - Tensor(t[lo:hi])) ** 2).sum() * (world / total)
        local.backward()
        opt.step()
    diff = max(float(np.abs(a.data - b.data).max()) for a, b in zip(model.module.parameters(), ref.parameters()))
    bn_ref, bn = ref[1], model.module[1]
    return max(diff, float(np.abs(bn.running_mean.data - bn_ref.running_mean.data).max()),
               float(np.abs(bn.running_var.data - bn_ref.running_var.data).max()))


class _single_process_bn:
    """Run a model's SyncBatchNorm layers as plain BatchNorm (the statistics of this batch only)."""

    def __init__(self, model):
        self.layers = [m for m in model.modules() if type(m).__name__ == "SyncBatchNorm"]

    def __enter__(self):
        import neural_arch.distributed.ddp.sync_batchnorm as sbn

        self._saved = sbn._group_size
        sbn._group_size = lambda group: 1

    def __exit__(self, *exc):
        import neural_arch.distributed.ddp.sync_batchnorm as sbn

        sbn._group_size = self._saved


# ---------------------------------------------------------------------------------- torch idioms
def torchrun_env_init() -> dict:
    """`torchrun` scripts: init from the environment, LOCAL_RANK from os.environ."""
    dist = _dist()
    from neural_arch.core.tensor import Tensor

    dist.init_process_group(backend="gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    try:
        local_rank = int(os.environ["LOCAL_RANK"])
        rank, world = dist.get_rank(), dist.get_world_size()
        t = Tensor(np.array([float(rank)]))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return {"rank": rank, "env_rank": int(os.environ["RANK"]), "world": world,
                "env_world": int(os.environ["WORLD_SIZE"]), "local_rank": local_rank, "sum": float(t.data[0]),
                "elastic": dist.is_torchelastic_launched(), "is_init": dist.is_initialized()}
    finally:
        dist.destroy_process_group()


def sampler_set_epoch(n: int, epochs: int) -> list:
    """DistributedSampler + set_epoch: each epoch a new permutation, split across the ranks."""
    dist = _dist()
    from neural_arch.distributed import DistributedSampler

    sampler = DistributedSampler(list(range(n)), num_replicas=dist.get_world_size(), rank=dist.get_rank(),
                                 shuffle=True, seed=7)
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def checkpoint_rank0_barrier_load(path: str) -> float:
    """Save on rank 0, barrier, every rank loads: the tutorial's checkpoint pattern."""
    dist = _dist()
    import neural_arch
    from neural_arch import nn

    model = nn.Linear(3, 2, dtype=np.float64)
    rng = np.random.default_rng(dist.get_rank())
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.data.shape)
    if dist.get_rank() == 0:
        neural_arch.save(model.state_dict(), path)
    dist.barrier()
    model.load_state_dict(neural_arch.load(path))
    flat = np.concatenate([p.data.ravel() for p in model.parameters()])
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, flat)
    expect = np.concatenate([p.ravel() for p in _rank0_params()])
    return max(float(np.abs(g - expect).max()) for g in gathered)


def _rank0_params():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(2, 3)), rng.normal(size=(2,))]


def accuracy_with_max(seed: int) -> list:
    """`_, pred = out.max(1)` then `(pred == y).sum().item()`, summed over ranks with all_reduce."""
    dist = _dist()
    from neural_arch.core.tensor import Tensor

    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(5 * dist.get_world_size(), 4))
    labels = rng.integers(0, 4, size=logits.shape[0])
    r = dist.get_rank()
    out = Tensor(logits[r * 5:(r + 1) * 5])
    _, pred = out.max(1)
    correct = Tensor(np.array([float((pred == Tensor(labels[r * 5:(r + 1) * 5])).sum().item())]))
    dist.all_reduce(correct)
    return [float(correct.data[0]), float((logits.argmax(1) == labels).sum())]


def ring(mode: str) -> list:
    """Pass a token around the ring: blocking send/recv (tutorial order), isend/irecv, or a batch."""
    dist = _dist()
    from neural_arch.core.tensor import Tensor

    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    send = Tensor(np.array([10.0 * rank, 1.0]))
    recv = Tensor(np.zeros(2))
    if mode == "blocking":
        if rank == 0:
            dist.send(send, dst=right)
            dist.recv(recv, src=left)
        else:
            dist.recv(recv, src=left)
            dist.send(send, dst=right)
    elif mode == "async":
        reqs = [dist.isend(send, dst=right), dist.irecv(recv, src=left)]
        for req in reqs:
            req.wait()
    else:
        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return recv.data.tolist()


def accumulation(mode: str, seed: int = 3, micro: int = 3) -> float:
    """Gradient accumulation: no_sync() (or require_backward_grad_sync=False) on all but the last
    micro-batch, then one synchronised backward == single-process training on everything."""
    dist = _dist()
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    B = 2

    def build():
        rng = np.random.default_rng(seed)
        m = nn.Linear(3, 2, dtype=np.float64)
        for p in m.parameters():
            p.data[...] = rng.normal(size=p.data.shape)
        return m

    ref, ddp = build(), DistributedDataParallel(build())
    ref_opt, opt = optim.SGD(ref.parameters(), lr=0.05), optim.SGD(ddp.parameters(), lr=0.05)
    rng = np.random.default_rng(seed + 10)
    for _step in range(2):
        xs = rng.normal(size=(micro, world * B, 3))
        ts = rng.normal(size=(micro, world * B, 2))
        ref_opt.zero_grad()
        loss = sum(((ref(Tensor(xs[k])) - Tensor(ts[k])) ** 2).mean() for k in range(micro)) * (1.0 / micro)
        loss.backward()
        ref_opt.step()
        opt.zero_grad()
        for k in range(micro):
            x, t = Tensor(xs[k, rank * B:(rank + 1) * B]), Tensor(ts[k, rank * B:(rank + 1) * B])
            last = k == micro - 1
            if mode == "no_sync" and not last:
                with ddp.no_sync():
                    (((ddp(x) - t) ** 2).mean() * (1.0 / micro)).backward()
                continue
            ddp.require_backward_grad_sync = last if mode == "flag" else True
            (((ddp(x) - t) ** 2).mean() * (1.0 / micro)).backward()
        opt.step()
    return max(float(np.abs(a.data - b.data).max()) for a, b in zip(ddp.module.parameters(), ref.parameters()))


def object_collectives() -> dict:
    """The pickling collectives, with torch's in-place list conventions."""
    dist = _dist()

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    objs = [{"lr": 0.1, "epochs": 3}, "cfg"] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    out["broadcast"] = objs
    gathered = [None] * world
    dist.all_gather_object(gathered, ("rank", rank))
    out["all_gather"] = gathered
    g = [None] * world if rank == 0 else None
    dist.gather_object({"r": rank}, g, dst=0)
    out["gather"] = g
    received = [None]
    dist.scatter_object_list(received, [f"item{i}" for i in range(world)] if rank == 0 else None, src=0)
    out["scatter"] = received[0]
    # p2p objects: rank 0 sends to the last rank
    if rank == 0:
        dist.send_object_list([{"step": 7}, [1, 2, 3]], dst=world - 1)
    elif rank == world - 1:
        box = [None, None]
        out["sender"] = dist.recv_object_list(box, src=0)
        out["p2p"] = box
    return out


def new_tensor_collectives(seed: int) -> dict:
    """all_to_all_single with uneven splits, all_gather_into_tensor, monitored_barrier, non-members."""
    dist = _dist()
    import warnings

    from neural_arch.core.tensor import Tensor

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(seed)
    # splits[s][d] = rows rank s sends to rank d (same table on every rank)
    splits = rng.integers(0, 4, size=(world, world))
    rows = [rng.normal(size=(int(splits[s].sum()), 2)) for s in range(world)]
    inp = Tensor(rows[rank].copy())
    out = Tensor(np.zeros((int(splits[:, rank].sum()), 2)))
    dist.all_to_all_single(out, inp, output_split_sizes=splits[:, rank].tolist(),
                           input_split_sizes=splits[rank].tolist())
    expect = np.concatenate([rows[s][int(splits[s, :rank].sum()):int(splits[s, :rank + 1].sum())]
                             for s in range(world)])
    res = {"a2a": float(np.abs(out.data - expect).max(initial=0))}
    # mismatching sizes: every rank raises
    try:
        wrong = splits[:, rank].copy()
        if rank == 0:
            wrong[0] += 1
        dist.all_to_all_single(Tensor(np.zeros((int(wrong.sum()), 2))), inp, output_split_sizes=wrong.tolist(),
                               input_split_sizes=splits[rank].tolist())
        res["mismatch"] = "no error"
    except ValueError as exc:
        res["mismatch"] = "disagree" in str(exc)
    flat = Tensor(np.zeros(3 * world))
    dist.all_gather_into_tensor(flat, Tensor(np.full(3, float(rank))))
    stacked = Tensor(np.zeros((world, 3)))
    dist.all_gather_into_tensor(stacked, Tensor(np.full(3, float(rank))))
    res["into"] = flat.data.tolist() == np.repeat(np.arange(world, dtype=float), 3).tolist() and \
        stacked.data.tolist() == np.repeat(np.arange(world, dtype=float), 3).reshape(world, 3).tolist()
    dist.monitored_barrier(timeout=30)
    group = dist.new_group([0, 1])
    t = Tensor(np.ones(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ret = dist.all_reduce(t, group=group)
    member = group is not dist.GroupMember.NON_GROUP_MEMBER
    res["group"] = (member, float(t.data[0]), ret is None, len(caught))
    res["group_ranks"] = dist.get_process_group_ranks(group) if member else None
    res["world_is_default"] = dist.group.WORLD is dist.GroupMember.WORLD and dist.group.WORLD is not None
    if member:
        dist.destroy_process_group(group)
    return res


def monitored_barrier_missing(timeout: float) -> str:
    """The last rank never arrives: rank 0's error names it."""
    dist = _dist()
    import time

    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        time.sleep(timeout + 1.5)
        return "absent"
    try:
        dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
        return "passed"
    except dist.CollectiveTimeoutError as exc:
        return str(exc)


# ---------------------------------------------------------------------------------- spawn tutorial
def tutorial_demo(rank: int, world_size: int, port: int, out_dir: str, fail_rank: int = -1) -> None:
    """The DDP tutorial's ``demo_basic(rank, world_size)`` with its ``setup()``/``cleanup()``."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor

    leaked = "RANK" in os.environ or "WORLD_SIZE" in os.environ  # torch's children have neither
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = Tensor(np.array([float(rank + 1)]))
    dist.all_reduce(t)
    if rank == fail_rank:
        raise KeyError(f"rank {rank} fails on purpose")
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(f"{dist.get_rank()} {dist.get_world_size()} {t.data[0]} {leaked}")
    dist.destroy_process_group()
