"""``ft.DistributedDataParallel`` reduces in DDP's buckets: one collective per bucket per step (two
replicas as threads, gloo over TCP), and every ``.grad`` is the average of the replicas' own."""

import threading

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor
from neural_arch.distributed import ft


class CountingGroup(ft.ProcessGroupGloo):
    """The replica group, counting its all-reduces."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allreduces = 0

    def allreduce(self, array, *args, **kwargs):
        self.allreduces += 1
        return super().allreduce(array, *args, **kwargs)


def local_grads(seed):
    model = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.Tanh(), nn.Linear(4, 2, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = np.random.default_rng(7).normal(size=p.data.shape)
    x = np.random.default_rng(seed).normal(size=(5, 3))
    return model, x


@pytest.mark.timeout(60)
def test_one_collective_per_bucket_per_step_and_grads_are_the_quorum_average():
    # Autograd is one engine per process: replica "a" runs backward through ft.DistributedDataParallel;
    # replica "b" (another thread) sends its own gradients bucket by bucket, as its DDP would.
    steps, out, errors = 2, {}, []
    both = threading.Barrier(2)
    own = []           # each replica's own gradients, computed here without any group
    for seed in (1, 2):
        model, x = local_grads(seed)
        (model(Tensor(x)) ** 2).sum().backward()
        own.append([p.grad.data.copy() for p in model.parameters()])

    def manager(name, pg):
        return ft.Manager(pg=pg, replica_id=name, lighthouse_addr=lighthouse.address, timeout=10.0,
                          heartbeat_interval=0.02, init_sync=False)

    def a():
        pg = CountingGroup(timeout=10.0, transport="tcp")
        m = manager("a", pg)
        model, x = local_grads(1)
        # caps in float64 bytes: the last bias (16 B) fills the first bucket; (2, 4) + (4,) the second
        ddp = ft.DistributedDataParallel(m, model, bucket_cap_mb=80 / 2**20, first_bucket_mb=16 / 2**20)
        out["plan"] = ddp.bucket_plan
        both.wait(30)
        counts = []
        while m.current_step() < steps:
            m.start_quorum()
            for p in model.parameters():
                p.grad = None
            before = pg.allreduces
            (ddp(Tensor(x)) ** 2).sum().backward()
            counts.append(pg.allreduces - before)
            out["grads"] = [p.grad.data.copy() for p in model.parameters()]
            assert m.should_commit() and m.num_participants() == 2
        m.shutdown()
        out["counts"] = counts

    def b():
        m = manager("b", ft.ProcessGroupGloo(timeout=10.0, transport="tcp"))
        both.wait(30)
        while m.current_step() < steps:
            m.start_quorum()
            for bucket in out["plan"]:
                m.allreduce(np.concatenate([own[1][i].reshape(-1) for i in bucket]))
            assert m.should_commit()
        m.shutdown()

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with ft.Lighthouse(min_replicas=2, heartbeat_timeout=2.0, join_timeout=2.0) as lighthouse:
        threads = [threading.Thread(target=run, args=(fn,), daemon=True) for fn in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
    assert not errors, errors
    assert out["plan"] == [[3], [2, 1], [0]]                 # 3 buckets for 4 parameters
    assert out["counts"] == [3] * steps                       # one collective per bucket per step
    for got, g1, g2 in zip(out["grads"], *own):
        assert np.max(np.abs(got - (g1 + g2) / 2)) <= 1e-12
