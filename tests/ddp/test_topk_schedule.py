"""Top-K compression's density schedule as plain data (no processes): warm-up stages, printing,
the per-iteration lookup, and the byte rule that sends a step dense when sparse would not pay."""

import itertools
import math

import pytest

from neural_arch.distributed.algorithms.ddp_comm_hooks.topk_hook import (
    Stage,
    TopKState,
    _sparse_pays,
    format_schedule,
    topk_schedule,
)


def test_schedule_stages_cover_every_iteration_once():
    stages = topk_schedule(0.01, start_iter=10, warmup_iters=31)
    assert stages[0] == Stage(0, 10, 1.0)
    assert [s.ratio for s in stages[1:]] == [0.25, 0.0625, 0.015625, 0.01]
    assert [s.stop - s.start for s in stages[1:-1]] == [11, 10, 10]  # the remainder goes to the first stages
    for a, b in itertools.pairwise(stages):
        assert a.stop == b.start
    assert stages[-1] == Stage(41, None, 0.01)


@pytest.mark.parametrize("ratio,warmup,expected", [
    (0.25, 100, [0.25]),   # nothing denser than the target: no warm-up stage
    (0.3, 100, [0.3]),
    (0.01, 0, [0.01]),     # warm-up off
    (0.05, 8, [0.25, 0.0625, 0.05]),
])
def test_warmup_densities_are_those_above_the_target(ratio, warmup, expected):
    assert [s.ratio for s in topk_schedule(ratio, warmup_iters=warmup)] == expected


def test_ratio_at_follows_the_schedule():
    state = TopKState(ratio=0.01, start_iter=2, warmup_iters=6, warmup_start_ratio=0.2, warmup_factor=2.0)
    densities = [state.ratio_at(i) for i in range(12)]
    assert densities == [1.0, 1.0, 0.2, 0.2, 0.1, 0.05, 0.025, 0.0125] + [0.01] * 4
    assert "iterations 0-1: dense (all-reduce)" in repr(state)


def test_format_schedule_one_line_per_stage():
    text = format_schedule(topk_schedule(0.01, start_iter=10, warmup_iters=30))
    assert text.splitlines() == ["iterations 0-9: dense (all-reduce)", "iterations 10-19: top 25%",
                                 "iterations 20-29: top 6.25%", "iterations 30-39: top 1.562%",
                                 "iterations 40-: top 1%"]


def test_default_warmup_is_off_with_spread_delivery():
    # spread delivery trains best without warm-up (docs/benchmarks.md); plain delivery keeps 150
    assert TopKState(ratio=0.01, spread=True).schedule == [Stage(0, None, 0.01)]
    assert [s.ratio for s in TopKState(ratio=0.01, spread=False).schedule] == [0.25, 0.0625, 0.015625, 0.01]
    assert TopKState(ratio=0.01, spread=True, warmup_iters=30).schedule[0] == Stage(0, 10, 0.25)


@pytest.mark.parametrize("bad", [{"ratio": 0.0}, {"ratio": 1.5}, {"momentum": 1.0}, {"warmup_factor": 1.0},
                                 {"warmup_iters": -1}])
def test_bad_arguments_say_what_is_allowed(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TopKState(**{"ratio": 0.01, **bad})


@pytest.mark.parametrize("world", [2, 3, 8])
def test_sparse_pays_only_below_the_ring_allreduce_bytes(world):
    n = 10_000
    for itemsize in (4, 8):
        # a (int32 index, value) pair per entry, world * k of them received vs 2n values of a ring
        limit = 2 * n * itemsize / (world * (4 + itemsize))
        k_ok, k_bad = math.ceil(limit) - 1, math.ceil(limit)
        assert _sparse_pays(k_ok, n, world, itemsize) and not _sparse_pays(k_bad, n, world, itemsize)
