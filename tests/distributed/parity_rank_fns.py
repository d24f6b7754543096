"""Functions test_mpi4py_slurm_parity.py runs on every rank of a RankPool (module level: pickled by reference)."""

from __future__ import annotations

import numpy as np


def sendrecv_run(_arg=None) -> dict:
    """A ring exchange of large messages (every rank sends before anyone receives), a swap with oneself,
    and the errors for mpi4py habits."""
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.collectives import sendrecv

    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    # 1 MiB: larger than a socket buffer, so two blocking sends facing each other would deadlock
    got = sendrecv(Tensor(np.full(1 << 17, float(rank))), right, Tensor(np.zeros(1 << 17)), left)
    raw = sendrecv(np.arange(3, dtype=np.int64) + 10 * rank, right, np.zeros(3, np.int64), left, tag=5)
    mine = sendrecv(np.ones(2), rank, np.zeros(2), rank)
    errors = {}
    for name, call in (("all_reduce_recv", lambda: dist.all_reduce(np.ones(2), np.zeros(2))),
                       ("scalar", lambda: dist.all_reduce(3.0)),
                       ("broadcast_scalar", lambda: dist.broadcast(7, src=0))):
        try:
            call()
            errors[name] = "no error"
        except TypeError as exc:
            errors[name] = str(exc)
    summed = dist.all_reduce(np.array(float(rank)))   # the suggested fix works
    return {"ring": (float(got.data.min()), float(got.data.max())), "raw": raw.tolist(), "self": mine.tolist(),
            "errors": errors, "summed": float(summed), "left": left}


def ddp_mesh_run(_arg=None) -> dict:
    """DDP(model, device_mesh=1-d mesh) against one process on the union of the ranks' batches (float64)."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()

    def mlp(seed):
        rng = np.random.default_rng(seed)
        model = nn.Sequential(nn.Linear(3, 5, dtype=np.float64), nn.Tanh(), nn.Linear(5, 2, dtype=np.float64))
        for p in model.parameters():
            p.data[...] = rng.normal(0, 0.5, size=p.data.shape)
        return model

    rng = np.random.default_rng(42)
    X, Y = rng.normal(size=(4 * world, 3)), rng.normal(size=(4 * world, 2))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    dp = mesh["dp"]
    ddp = dist.DistributedDataParallel(mlp(rank), device_mesh=dp)   # rank 0's weights win
    mine = slice(4 * rank, 4 * rank + 4)
    F.mse_loss(ddp(Tensor(X[mine])), Tensor(Y[mine])).backward()
    ref = mlp(0)
    F.mse_loss(ref(Tensor(X)), Tensor(Y)).backward()
    diff = max(float(np.max(np.abs(a.grad.data - b.grad.data))) for a, b in zip(ddp.module.parameters(), ref.parameters()))
    errors = {}
    for name, kwargs in (("both", {"device_mesh": mesh, "process_group": mesh.get_group()}),
                         ("two_d", {"device_mesh": init_device_mesh("cpu", (1, world))})):
        try:
            dist.DistributedDataParallel(mlp(0), **kwargs)
            errors[name] = "no error"
        except ValueError as exc:
            errors[name] = str(exc)
    return {"diff": diff, "errors": errors, "mesh_kept": ddp.device_mesh is dp}
