"""Functions the SyncBatchNorm exploration runs on every rank of a RankPool.

Each rank draws the same *global* batch from the seed, keeps its own rows (uneven sizes, an empty
share allowed) and compares SyncBatchNorm with the project's own single-process ``nn.BatchNorm1d``
/ ``BatchNorm2d`` on the whole batch: outputs, running statistics, ``num_batches_tracked`` and the
input/weight/bias gradients (the weight/bias ones summed over ranks, as DDP would), then the eval
forward. Each returns the worst absolute differences, so the test asserts in the parent.
"""

from __future__ import annotations

import numpy as np


def _reference_layer(case, dtype):
    from neural_arch import nn

    cls = nn.BatchNorm2d if len(case["spatial"]) == 2 else nn.BatchNorm1d
    return cls(case["channels"], eps=case["eps"], momentum=case["momentum"], affine=case["affine"],
               track_running_stats=case["track"], dtype=dtype)


def _copy_params(dst, src) -> None:
    if src.affine:
        dst.weight.data[...] = src.weight.data
        dst.bias.data[...] = src.bias.data


def sync_bn_vs_global_batchnorm(case: dict) -> dict:
    """``case``: seed, sizes (per rank), channels, spatial, dtype, affine, track, momentum, eps,
    offset (a large mean probes cancellation), steps."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import SyncBatchNorm

    rank = dist.get_rank()
    sizes = case["sizes"]
    lo, hi, total = sum(sizes[:rank]), sum(sizes[:rank + 1]), sum(sizes)
    dtype = np.dtype(case["dtype"])
    rng = np.random.default_rng(case["seed"])
    sync = SyncBatchNorm(case["channels"], eps=case["eps"], momentum=case["momentum"], affine=case["affine"],
                         track_running_stats=case["track"], dtype=dtype)
    ref = _reference_layer(case, dtype)
    if case["affine"]:
        sync.weight.data[...] = rng.normal(1, 0.5, case["channels"])
        sync.bias.data[...] = rng.normal(0, 0.5, case["channels"])
    _copy_params(ref, sync)
    worst = {"y": 0.0, "grad_x": 0.0, "grad_w": 0.0, "grad_b": 0.0, "running": 0.0, "eval": 0.0}

    def note(key, got, want):
        worst[key] = max(worst[key], float(np.abs(np.asarray(got, np.float64) - want).max(initial=0.0)))

    shape = (total, case["channels"]) + tuple(case["spatial"])
    for _ in range(case["steps"]):
        x = (case["offset"] + rng.normal(0, 2, shape)).astype(dtype)
        dy = rng.normal(0, 1, shape).astype(dtype)
        for layer in (sync, ref):
            if layer.affine:
                layer.weight.grad = layer.bias.grad = None
        xs, xr = Tensor(x[lo:hi].copy(), requires_grad=True), Tensor(x, requires_grad=True)
        ys, yr = sync(xs), ref(xr)
        (ys * Tensor(dy[lo:hi])).sum().backward()
        (yr * Tensor(dy)).sum().backward()
        note("y", ys.data, yr.data[lo:hi].astype(np.float64))
        note("grad_x", xs.grad.data, xr.grad.data[lo:hi].astype(np.float64))
        if case["affine"]:
            grads = np.concatenate([sync.weight.grad.data, sync.bias.grad.data]).astype(np.float64)
            dist.all_reduce(grads)  # local, as in torch: their sum is the global batch's
            c = case["channels"]
            note("grad_w", grads[:c], ref.weight.grad.data.astype(np.float64))
            note("grad_b", grads[c:], ref.bias.grad.data.astype(np.float64))
        if case["track"]:
            note("running", sync.running_mean.data, ref.running_mean.data.astype(np.float64))
            note("running", sync.running_var.data, ref.running_var.data.astype(np.float64))
    tracked = (int(sync.num_batches_tracked.data), int(ref.num_batches_tracked.data)) if case["track"] else None
    # eval: running statistics (no communication); without them each rank's own batch (torch)
    sync.eval(), ref.eval()
    local = (case["offset"] + rng.normal(0, 2, (2, case["channels"]) + tuple(case["spatial"]))).astype(dtype)
    note("eval", sync(Tensor(local)).data, ref(Tensor(local)).data.astype(np.float64))
    return {"worst": worst, "tracked": tracked, "dtype": str(sync(Tensor(local)).data.dtype)}


def sync_bn_error(sizes: list, spatial: tuple) -> str | None:
    """The message every rank raises when the whole group holds one value per channel or none."""
    import neural_arch.distributed as dist
    from neural_arch.distributed import SyncBatchNorm

    n = sizes[dist.get_rank()]
    bn = SyncBatchNorm(2, dtype=np.float64)
    try:
        bn(np.ones((n, 2) + tuple(spatial)))
    except ValueError as e:
        return str(e)
    return None


def sync_bn_eval_untracked_is_local(seed: int) -> float:
    """eval() with track_running_stats=False uses this rank's batch statistics and never
    communicates (torch): rank 0 alone runs forwards here, which would hang if it did."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import SyncBatchNorm

    bn = SyncBatchNorm(3, track_running_stats=False, dtype=np.float64).eval()
    ref = nn.BatchNorm2d(3, track_running_stats=False, dtype=np.float64).eval()
    worst = 0.0
    if dist.get_rank() == 0:
        x = np.random.default_rng(seed).normal(0, 1, (4, 3, 2, 2))
        for _ in range(2):
            worst = max(worst, float(np.abs(bn(Tensor(x)).data - ref(Tensor(x)).data).max()))
    dist.barrier()
    return worst


def convert_then_train(seed: int, sizes: list) -> dict:
    """convert_sync_batchnorm on a small CNN (BatchNorm2d, and a BatchNorm1d without affine in eval
    mode): parameters are shared, buffers kept, modes kept, and one training step on uneven
    batches equals the unconverted model on the global batch."""
    import neural_arch.distributed as dist
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import SyncBatchNorm

    rank = dist.get_rank()
    lo, hi, total = sum(sizes[:rank]), sum(sizes[:rank + 1]), sum(sizes)

    def build():
        rng = np.random.default_rng(seed)
        net = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, dtype=np.float64), nn.BatchNorm2d(3, dtype=np.float64),
                            nn.Flatten(), nn.BatchNorm1d(12, affine=False, dtype=np.float64))
        for p in net.parameters():
            p.data[...] = rng.normal(0, 0.7, p.data.shape)
        net[3].running_mean.data[...] = rng.normal(0, 1, 12)
        net[3].eval()
        return net

    ref, net = build(), build()
    weight = net[1].weight
    out = SyncBatchNorm.convert_sync_batchnorm(net)
    facts = {"same_module": out is net, "types": [type(m).__name__ for m in net],
             "weight_shared": net[1].weight is weight, "modes": [net[1].training, net[3].training],
             "running_kept": bool(np.array_equal(net[3].running_mean.data, ref[3].running_mean.data))}
    x = np.random.default_rng(seed + 1).normal(0, 1, (total, 2, 2, 2))
    xs, xr = Tensor(x[lo:hi].copy(), requires_grad=True), Tensor(x, requires_grad=True)
    ys, yr = net(xs), ref(xr)
    ys.sum().backward()
    yr.sum().backward()
    grads = np.concatenate([p.grad.data.ravel() for p in net.parameters()])
    dist.all_reduce(grads)
    want = np.concatenate([p.grad.data.ravel() for p in ref.parameters()])
    facts["worst"] = max(float(np.abs(ys.data - yr.data[lo:hi]).max(initial=0.0)),
                         float(np.abs(xs.grad.data - xr.grad.data[lo:hi]).max(initial=0.0)),
                         float(np.abs(grads - want).max()),
                         float(np.abs(net[1].running_var.data - ref[1].running_var.data).max()))
    return facts
