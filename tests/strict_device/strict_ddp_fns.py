"""Rank functions of the strict-device DDP test (module level: the ranks import them by name)."""

from __future__ import annotations

import numpy as np


def _mlp(seed: int):
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(6, 16, dtype=np.float64), nn.ReLU(), nn.Linear(16, 4, dtype=np.float64))
    for p in model.parameters():  # rank-specific initial weights: DDP must broadcast rank 0's
        p.data[...] = rng.normal(0, 0.5, size=p.shape)
    return model


def ddp_on_fake_device(steps: int = 3, per_rank: int = 4):
    """DDP over gloo with parameters on the fake device vs single-process NumPy training on the
    global batch. Returns (max parameter difference, everything stayed on the device, grads averaged)."""
    import fake_device as fd

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import backend, optim
    from neural_arch.core.tensor import Tensor

    fd.install("fake")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        model = _mlp(100 + rank).to("fake")
        ref = _mlp(100)
        ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.0005, first_bucket_mb=0.0002)
        opt = optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        rng = np.random.default_rng(7)
        on_device = True
        for _ in range(steps):
            X = rng.normal(size=(world * per_rank, 6))
            y = rng.integers(0, 4, size=world * per_rank)
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            loss = F.cross_entropy(ddp(Tensor(X[mine], device="fake")), backend.to_device(y[mine], "fake"))
            loss.backward()
            on_device &= all(type(p.grad.data) is fd.FakeArray for p in model.parameters())
            opt.step()
            opt.zero_grad()
            F.cross_entropy(ref(Tensor(X)), y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        on_device &= all(type(p.data) is fd.FakeArray for p in model.parameters())
        diff = max(float(np.max(np.abs(backend.to_host(p.data) - q.data)))
                   for p, q in zip(model.parameters(), ref.parameters()))
        return diff, bool(on_device)
    finally:
        fd.uninstall("fake")
