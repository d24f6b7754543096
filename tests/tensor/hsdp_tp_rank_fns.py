"""HSDP x TP (a 3-d ``("replicate", "shard", "tp")`` mesh, ``fully_shard`` over the first two, tensor
parallel over the third): two Adam steps with gradient accumulation equal one process on the global
batch (float64). Run on every rank of the DTensor RankPool."""

from __future__ import annotations

import numpy as np


def _model():
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed

    manual_seed(3)
    return nn.Sequential(nn.Linear(4, 6, dtype=np.float64), nn.GELU(), nn.Linear(6, 4, dtype=np.float64))


def _loss(model, x, y):
    from neural_arch.core.tensor import Tensor

    d = model(Tensor(x)) - Tensor(y)
    return (d * d).mean()


def hsdp_tp_run(shape) -> dict:
    """Train on mesh ``shape`` (replicate, shard, tp); returns placements and the worst difference of
    every parameter from single-process training."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import fully_shard
    from neural_arch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from neural_arch.optim import Adam

    rng = np.random.default_rng(0)
    steps, micro = 2, 2
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=("replicate", "shard", "tp"))
    dp = mesh.size(0) * mesh.size(1)
    X, Y = rng.normal(size=(steps, dp * micro * 2, 4)), rng.normal(size=(steps, dp * micro * 2, 4))

    ref = _model()
    ref_opt = Adam(ref.parameters(), lr=0.05)
    for s in range(steps):
        pieces = [(x, y) for xs, ys in zip(np.split(X[s], dp), np.split(Y[s], dp))
                  for x, y in zip(np.split(xs, micro), np.split(ys, micro))]
        total = None
        for x, y in pieces:  # FSDP's gradient: the mean over dp ranks of the sum over micro-batches
            term = _loss(ref, x, y) * Tensor(np.array(1.0 / dp))
            total = term if total is None else total + term
        total.backward()
        ref_opt.step()
        ref_opt.zero_grad()

    model = _model()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["replicate", "shard"])
    opt = Adam(model.parameters(), lr=0.05)
    me = mesh.get_local_rank(0) * mesh.size(1) + mesh.get_local_rank(1)
    for s in range(steps):
        xs, ys = np.split(X[s], dp)[me], np.split(Y[s], dp)[me]
        for k, (x, y) in enumerate(zip(np.split(xs, micro), np.split(ys, micro))):
            model.set_requires_gradient_sync(k == micro - 1)
            _loss(model, x, y).backward()
        opt.step()
        opt.zero_grad()
    want = dict(ref.named_parameters())
    return {"placements": {n: str(p.placements) for n, p in model.named_parameters()},
            "worst": max(float(np.abs(p.full_tensor().data - want[n].data).max())
                         for n, p in model.named_parameters())}
