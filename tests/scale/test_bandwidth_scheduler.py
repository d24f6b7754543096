"""The bandwidth scheduler's plan: caps from the link budget, backward order, splits, no byte lost."""

from __future__ import annotations

import pytest

from neural_arch.distributed.scale.bandwidth_scheduler import BandwidthScheduler


def test_cap_follows_the_budget_and_the_ring_factor():
    s = BandwidthScheduler(link_gbit_per_s=8, max_bucket_seconds=0.001)     # 1e6 bytes of link time
    assert s.cap_bytes(world_size=2) == 1_000_000                           # 2 (n-1)/n = 1
    assert s.cap_bytes(world_size=4) == 666_666                             # 1.5
    assert s.cap_bytes(world_size=1) == 1_000_000                           # nothing crosses a link


def test_plan_keeps_backward_order_splits_large_gradients_and_loses_no_byte():
    grads = [("embed", 2_500_000), ("w1", 300_000), ("b1", 1_000), ("head", 800_000)]
    plan = BandwidthScheduler(link_gbit_per_s=8, max_bucket_seconds=0.001).plan(grads, world_size=2)
    assert plan.total_bytes == sum(n for _, n in grads)
    assert all(b.nbytes <= plan.cap_bytes for b in plan.buckets)
    order = [name for b in plan.buckets for name in b.names]
    assert order == ["head", "b1", "w1", "w1", "embed", "embed", "embed"]   # reverse parameter order
    assert [b.nbytes for b in plan.buckets] == [1_000_000, 1_000_000, 1_000_000, 601_000]
    # back to back on the link: each bucket starts when the previous one ends
    for prev, nxt in zip(plan.buckets, plan.buckets[1:]):
        assert nxt.start_seconds == pytest.approx(prev.end_seconds)
    assert plan.link_seconds == pytest.approx(plan.total_bytes / 1e9)
    assert plan.bucket_cap_mb == pytest.approx(1_000_000 / 2**20)
    assert str(plan).splitlines()[0].startswith("4 bucket(s), cap 1000000 B")


def test_bucket_size_does_not_change_the_links_total_time():
    grads = {f"p{i}": 123_457 * (i + 1) for i in range(6)}
    small = BandwidthScheduler(10, 0.0001).plan(grads, world_size=4)
    large = BandwidthScheduler(10, 0.1).plan(grads, world_size=4)
    assert len(small.buckets) > len(large.buckets) == 1
    assert small.link_seconds == pytest.approx(large.link_seconds)


def test_bad_budgets_and_sizes_are_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        BandwidthScheduler(link_gbit_per_s=0)
    with pytest.raises(ValueError, match="-1 bytes"):
        BandwidthScheduler().plan({"w": -1}, world_size=2)
