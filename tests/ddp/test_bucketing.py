"""The one gradient-bucketing concept (neural_arch.distributed.bucketing), the comm hooks' declared
capabilities (CommHook) and the overlap observer, without sockets."""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import CommHook, comm_hook
from neural_arch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from neural_arch.distributed.bucketing import BucketSet, plan_buckets
from neural_arch.distributed.comm.work import Work
from neural_arch.distributed.ddp.overlap_stats import BucketTimingObserver
from neural_arch.nn.parameter import Parameter


def test_plan_buckets_without_first_cap_uses_cap_for_every_bucket():
    sizes = [(10, "float32"), (10, np.float32), (10, "float32")]  # a dtype may be given either way
    assert plan_buckets(sizes, cap=80) == [[2, 1], [0]]
    assert plan_buckets(sizes, cap=80, first_cap=40) == [[2], [1, 0]]


def test_bucket_set_launches_complete_buckets_in_plan_order():
    params = [Parameter(np.zeros(3)) for _ in range(3)]
    buckets = BucketSet([[params[2]], [params[1]], [params[0]]])
    assert [buckets.locate(p) for p in params] == [(2, 0), (1, 0), (0, 0)]
    launched = []
    buckets[1].pending = 0           # complete, but bucket 0 has not gone yet: it waits
    buckets.launch_ready(launched.append)
    assert launched == [] and not buckets.launched(1)
    buckets[0].pending = 0
    buckets.launch_ready(launched.append)
    assert [b.index for b in launched] == [0, 1]
    buckets.launch_rest(launched.append)  # backward's end: the rest, complete or not
    assert [b.index for b in launched] == [0, 1, 2]
    buckets.reset()
    assert buckets.next_launch == 0 and [b.pending for b in buckets] == [1, 1, 1]


def test_bucket_set_refuses_a_parameter_in_two_buckets():
    p = Parameter(np.zeros(2))
    with pytest.raises(ValueError, match="two buckets"):
        BucketSet([[p], [p]], owner="ShardedGradReducer")


def test_bucket_views_and_tail_share_one_array():
    p, q = Parameter(np.zeros((2, 2))), Parameter(np.zeros(3))
    bucket = BucketSet([[p, q]], world_size=2)[0]
    wire = bucket.allocate(np, np.float64, tail=2)
    bucket.put(1, np.arange(3.0))
    bucket.put(1, np.ones(3), add=True)
    assert wire.size == 8 + 2 and bucket.views[1].tolist() == [1.0, 2.0, 3.0]
    assert bucket.tail.size == 2 and np.shares_memory(bucket.tail, wire)


def test_comm_hook_capabilities_are_declared_not_read_from_attributes():
    def plain(state, bucket):
        return Work.completed(bucket)
    plain.accepts_prescaled = True  # an attribute is not a declaration: the reducer reads CommHook's
    hook = CommHook.of(plain)
    assert (hook.accepts_prescaled, hook.supports_inline) == (False, False)
    assert hook(None, "b", async_op=False).result() == "b"  # async_op is not passed to it
    assert CommHook.of(allreduce_hook) is allreduce_hook
    assert (allreduce_hook.accepts_prescaled, allreduce_hook.supports_inline) == (True, True)

    @comm_hook(supports_inline=True)
    def inline(state, bucket, async_op=True):
        return Work.completed(async_op)
    assert inline.__name__ == "inline" and inline(None, None, async_op=False).result() is False


def test_ddp_reads_capabilities_from_the_hook_type():
    import neural_arch.distributed as dist
    from neural_arch import nn

    ddp = dist.DistributedDataParallel(nn.Linear(3, 2))  # a world of one: no process group needed
    assert all(b.prescaled for b in ddp.reducer.grad_buckets)  # the default hook takes pre-scaled buckets

    def plain(state, bucket):
        return Work.completed(bucket.buffer())
    plain.accepts_prescaled = True
    ddp.register_comm_hook(None, plain)
    assert isinstance(ddp.reducer.hook, CommHook) and not any(b.prescaled for b in ddp.reducer.grad_buckets)


class _Timed:
    def __init__(self, started_at, completed_at):
        self.started_at, self.completed_at = started_at, completed_at


def test_bucket_timing_observer_splits_hidden_and_exposed_communication():
    obs = BucketTimingObserver([800])
    obs.iteration_started("backward_start")
    obs.bucket_launched(0)
    obs.bucket_done(0, _Timed(started_at=1.0, completed_at=3.0))
    obs.waited(t_end=2.0, launched_before_end=1)
    (rec,) = obs.records
    assert (rec["comm_s"], rec["hidden_s"], rec["bytes"]) == (2.0, 1.0, 800)
    stats = obs.comm_stats()
    assert (stats["backwards"], stats["exposed_s"], stats["hidden_fraction"]) == (1, 1.0, 0.5)
    assert stats["bucket_hidden_fraction"] == [0.5]
    obs.waited(t_end=2.0, launched_before_end=1, record=False)  # join's shadow backward: not counted
    assert obs.comm_stats()["backwards"] == 1
    obs.reset()
    assert obs.comm_stats()["comm_s"] == 0.0 and obs.comm_stats()["bucket_comm_s"] == [0.0]


def test_a_hook_registered_on_a_world_of_one_sees_every_bucket():
    """A plain ``python`` run (no init_process_group) is a world of one: DDP reduces nothing, but a
    hook the user registers must still run, as in torch (found: it never did, so a hook that
    scales or compresses gradients silently did nothing); the default hook's state None works there."""
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import DistributedDataParallel

    def doubling_hook(state, bucket):
        buffer = bucket.buffer()
        buffer *= 2.0
        return Work.completed(buffer)

    grads = {}
    for name, hook in (("plain", None), ("default", allreduce_hook), ("doubling", doubling_hook)):
        model = nn.Linear(3, 2, dtype=np.float64)
        model.weight.data[...] = 1.0
        ddp = DistributedDataParallel(model)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        ddp(Tensor(np.arange(6.0).reshape(2, 3))).sum().backward()
        grads[name] = model.weight.grad.data.copy()
    assert np.array_equal(grads["default"], grads["plain"])
    assert np.array_equal(grads["doubling"], 2 * grads["plain"])
