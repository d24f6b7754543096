"""Exploring DDP comm hooks against NumPy on every rank's gradients (hypothesis; float64 <= 1e-10).

Each example draws a world of 1-4 ranks (the first ranks of one pool of four), buckets of
parameters of various shapes (1-element, vectors, non-square matrices, 3-d), float64 or float32,
and runs a hook over a few steps exactly as DDP's reducer calls it (every bucket handed over, then
waited for in order). The reference is computed here from the same seeded gradients:

* ``allreduce_hook``: the average (and, through DDP, bitwise what DDP does without a hook, with
  bucket caps that split the model and caps that do not);
* ``fp16/bf16_compress_hook``: the average of the gradients rounded to float16 / bfloat16, summed
  in that dtype (within that dtype's summation error), and exactly representable in it;
* PowerSGD: with ``matrix_approximation_rank >= min(n, m)`` the exact average; plain averaging
  before ``start_powerSGD_iter`` and for 1-d gradients; at any rank, with error feedback, nothing
  is lost: ``sum over steps of what was applied + sum over ranks of the residuals == sum over
  steps of the true averages``;
* top-k: the same conservation (plus what spread delivery still holds), the average at ratio 1, and
  SGD momentum at ratio 1 with momentum correction;
* ``plan_buckets``: every parameter in exactly one bucket, one dtype per bucket, reverse order, each
  bucket closed by the parameter that reaches its cap (one larger than the cap included).

Pinned bugs (found here, fixed in neural_arch/distributed):

* PowerSGD on a bucket holding a parameter with no rows (shape ``(0, 3)``) raised ZeroDivisionError
  inside backward; an empty gradient is now simply not compressed (powerSGD_hook.py);
* a hook state whose ``process_group`` is not a group (``"gloo"``, ``[0, 1]``) failed with an
  AttributeError in the middle of backward; now a TypeError when the state is made (comm_hook.py);
* ``plan_buckets`` turned a negative (or NaN) cap into 1 byte; now a ValueError (bucketing.py).
"""

import os

import comm_hooks_explore_rank_fns as fns
import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.bucketing import plan_buckets
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

#: ``NEURAL_ARCH_EXPLORE_SCALE=20`` (with ``HYPOTHESIS_PROFILE=dev``) explores 20x more examples
SCALE = int(os.environ.get("NEURAL_ARCH_EXPLORE_SCALE", "1"))


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


def _true_means(cfg):
    """Per step, per bucket: the exact (float64) average of every rank's flat gradients."""
    world = cfg["world"]
    out = []
    for step in range(cfg["steps"]):
        per_rank = [fns.local_grads(cfg, step, r) for r in range(world)]
        out.append([sum(np.concatenate([g.reshape(-1).astype(np.float64) for g in per_rank[r][b]] or [np.zeros(0)])
                        for r in range(world)) / world
                    for b in range(len(cfg["shapes"]))])
    return out


def _members(results, world):
    assert all(r is None for r in results[world:]), "ranks outside the group returned something"
    return results[:world]


def _close(got, want, tol, what):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = 1.0 + (float(np.max(np.abs(want))) if want.size else 0.0)
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= tol * scale, f"{what}: off by {err:g} (> {tol:g} x {scale:g})"


shapes = st.sampled_from([(1,), (5,), (1, 1), (3, 2), (2, 5), (4, 4), (1, 6), (6, 1), (2, 3, 2), (0, 3), (3, 0), ()])
buckets = st.lists(st.lists(shapes, min_size=1, max_size=3), min_size=1, max_size=2)


# ----------------------------------------------------------------------------------- default hooks
@settings(max_examples=6 * SCALE)
@given(world=st.integers(1, 4), shapes=buckets, dtype=st.sampled_from(["float64", "float32"]),
       hook=st.sampled_from(["allreduce", "fp16", "bf16"]), seed=st.integers(0, 99))
@example(world=3, shapes=[[(1,)], [(2, 3, 2), (6, 1)]], dtype="float32", hook="fp16", seed=0)
@example(world=4, shapes=[[(3, 2), (5,)]], dtype="float64", hook="bf16", seed=1)
def test_default_hooks_average_as_documented(pool, world, shapes, dtype, hook, seed):
    cfg = {"world": world, "shapes": shapes, "dtype": dtype, "hook": hook, "seed": seed, "steps": 1}
    means = _true_means(cfg)[0]
    scale = np.dtype(dtype).type(1.0 / world)
    for rank, out in enumerate(_members(pool.run(fns.hook_steps_run, cfg), world)):
        for b, got in enumerate(out["delivered"][0]):
            assert got.dtype == np.dtype(dtype), (rank, b, got.dtype)
            if hook == "allreduce":
                _close(got, means[b], 1e-12 if dtype == "float64" else 1e-6, f"rank {rank} bucket {b}")
                continue
            wire = np.float16 if hook == "fp16" else ml_dtypes.bfloat16
            unit, tiny = (2.0 ** -11, 2.0 ** -24) if hook == "fp16" else (2.0 ** -8, 0.0)
            # each rank's (gradient / world) rounded to the wire dtype, then summed in it
            sent = [np.concatenate([g.reshape(-1) for g in fns.local_grads(cfg, 0, r)[b]]) * scale
                    for r in range(world)]
            sent = [s.astype(wire).astype(np.float64) for s in sent]
            exact = sum(sent)
            bound = (world - 1) * unit * sum(np.abs(s) for s in sent) + world * tiny
            err = np.abs(got.astype(np.float64) - exact)
            assert (err <= bound + 1e-300).all(), f"rank {rank} bucket {b}: {err.max():g} beyond {hook} summation"
            assert (got.astype(wire).astype(got.dtype) == got).all(), f"{hook}: result not representable in it"


@settings(max_examples=6 * SCALE)
@given(world=st.integers(1, 4), widths=st.lists(st.integers(1, 4), min_size=2, max_size=4),
       cap=st.sampled_from([1e-6, 25.0]), dtype=st.sampled_from(["float64", "float32"]),
       hook=st.sampled_from(["allreduce", "fp16", "bf16", "powersgd"]), seed=st.integers(0, 9))
@example(world=3, widths=[3, 1, 4, 2], cap=1e-6, dtype="float64", hook="allreduce", seed=0)   # a bucket per parameter
@example(world=2, widths=[2, 3, 1], cap=25.0, dtype="float32", hook="allreduce", seed=1)      # one bucket
@example(world=3, widths=[4, 1, 3], cap=1e-6, dtype="float32", hook="fp16", seed=2)
@example(world=4, widths=[2, 4, 2], cap=25.0, dtype="float64", hook="powersgd", seed=3)
def test_hooks_through_ddp(pool, world, widths, cap, dtype, hook, seed):
    """Through DDP's reducer (bucket caps that split the model and caps that do not): allreduce_hook is
    bitwise plain DDP, PowerSGD at full rank the average, fp16/bf16 the average rounded to their dtype."""
    cfg = {"world": world, "widths": widths, "cap": cap, "dtype": dtype, "seed": seed, "batch": 3, "hook": hook,
           "rank": 8, "min_rate": 0.0}
    results = _members(pool.run(fns.ddp_hook_run, cfg), world)
    locals_ = [r[2] for r in results]
    for rank, (hooked, plain, _local, n_buckets) in enumerate(results):
        assert n_buckets == (2 * (len(widths) - 1) if cap < 1 else 1)
        for k, (h, p) in enumerate(zip(hooked, plain)):
            want = sum(loc[k].astype(np.float64) for loc in locals_) / world
            if world == 1:   # a world of one runs no collective (DDP installs no hook): the local gradient
                assert np.array_equal(h, p) and np.array_equal(h, locals_[0][k]), (rank, k, hook)
                continue
            if hook == "allreduce":
                assert np.array_equal(h, p), f"rank {rank} parameter {k}: allreduce_hook differs from plain DDP"
            if hook in ("allreduce", "powersgd"):
                tol = 1e-12 if hook == "allreduce" else 1e-10
                _close(h, want, tol if dtype == "float64" else 2e-5, f"rank {rank} parameter {k} ({hook})")
                continue
            wire = np.float16 if hook == "fp16" else ml_dtypes.bfloat16
            unit, tiny = (2.0 ** -11, 2.0 ** -24) if hook == "fp16" else (2.0 ** -8, 0.0)
            scale = np.dtype(dtype).type(1.0 / world)
            sent = [(loc[k] * scale).astype(wire).astype(np.float64) for loc in locals_]
            bound = (world - 1) * unit * sum(np.abs(v) for v in sent) + world * tiny
            assert (np.abs(h.astype(np.float64) - sum(sent)) <= bound + 1e-300).all(), (rank, k, hook)


# ---------------------------------------------------------------------------------------- PowerSGD
@settings(max_examples=8 * SCALE)
@given(world=st.integers(1, 4), shapes=buckets, rank=st.integers(1, 3), steps=st.integers(1, 3),
       start=st.integers(0, 2), warm=st.booleans(), min_rate=st.sampled_from([0.0, 2.0]), seed=st.integers(0, 99))
@example(world=3, shapes=[[(6, 1), (1,), (2, 3, 2)], [(4, 4)]], rank=1, steps=3, start=1, warm=True, min_rate=0.0,
         seed=0)
@example(world=4, shapes=[[(1, 1), (1, 6)]], rank=2, steps=2, start=0, warm=False, min_rate=0.0, seed=3)
@example(world=2, shapes=[[(0, 3), (3, 2), ()]], rank=1, steps=1, start=0, warm=True, min_rate=0.0, seed=5)  # empty
@example(world=2, shapes=[[(4, 4), (3, 2)]], rank=1, steps=2, start=0, warm=True, min_rate=2.0, seed=4)
def test_powersgd_error_feedback_loses_nothing(pool, world, shapes, rank, steps, start, warm, min_rate, seed):
    # min_rate 2 (torch's default) leaves the small matrices uncompressed, 0 compresses every matrix
    cfg = {"world": world, "shapes": shapes, "dtype": "float64", "hook": "powersgd", "seed": seed, "steps": steps,
           "rank": rank, "start": start, "warm_start": warm, "min_rate": min_rate}
    means = _true_means(cfg)
    results = _members(pool.run(fns.hook_steps_run, cfg), world)
    for b in range(len(shapes)):
        truth = sum(means[t][b] for t in range(steps))
        for t in range(min(start, steps)):    # plain all-reduce before start_powerSGD_iter
            for r, out in enumerate(results):
                _close(out["delivered"][t][b], means[t][b], 1e-12, f"rank {r} step {t} (before start)")
        residual = sum(np.zeros_like(truth) if out["residual"][b] is None else out["residual"][b] for out in results)
        for r, out in enumerate(results):
            applied = sum(out["delivered"][t][b] for t in range(steps))
            _close(applied + residual, truth, 1e-10, f"rank {r} bucket {b}: applied + residual vs sum of averages")
            assert all(np.array_equal(out["delivered"][t][b], results[0]["delivered"][t][b]) for t in range(steps)), \
                f"rank {r} applied another gradient than rank 0"


@settings(max_examples=6 * SCALE)
@given(world=st.integers(1, 4), shapes=buckets, steps=st.integers(1, 2), dtype=st.sampled_from(["float64", "float32"]),
       seed=st.integers(0, 99))
@example(world=2, shapes=[[(2, 3, 2), (1, 1)], [(6, 1), (5,)]], steps=2, dtype="float64", seed=0)
def test_powersgd_at_full_rank_is_the_exact_average(pool, world, shapes, steps, dtype, seed):
    cfg = {"world": world, "shapes": shapes, "dtype": dtype, "hook": "powersgd", "seed": seed, "steps": steps,
           "rank": 6, "start": 0}
    means = _true_means(cfg)
    tol = 1e-10 if dtype == "float64" else 2e-5
    for r, out in enumerate(_members(pool.run(fns.hook_steps_run, cfg), world)):
        for t in range(steps):
            for b in range(len(shapes)):
                _close(out["delivered"][t][b], means[t][b], tol, f"rank {r} step {t} bucket {b}")


# -------------------------------------------------------------------------------------------- top-k
@settings(max_examples=6 * SCALE)
@given(world=st.integers(1, 4), shapes=buckets, ratio=st.sampled_from([0.05, 0.3, 1.0]), steps=st.integers(1, 3),
       spread=st.booleans(), seed=st.integers(0, 99))
@example(world=3, shapes=[[(4, 4), (2, 5)], [(1,)]], ratio=0.05, steps=3, spread=True, seed=0)
def test_topk_error_feedback_loses_nothing(pool, world, shapes, ratio, steps, spread, seed):
    cfg = {"world": world, "shapes": shapes, "dtype": "float64", "hook": "topk", "seed": seed, "steps": steps,
           "ratio": ratio, "spread": spread}
    means = _true_means(cfg)
    results = _members(pool.run(fns.hook_steps_run, cfg), world)
    for b in range(len(shapes)):
        truth = sum(means[t][b] for t in range(steps))
        owed = sum(out["residual"][b] for out in results)
        if spread:
            owed = owed + results[0]["pending"][b]       # the same on every rank
        for r, out in enumerate(results):
            applied = sum(out["delivered"][t][b] for t in range(steps))
            _close(applied + owed, truth, 1e-10, f"rank {r} bucket {b}: applied + owed vs sum of averages")
            if ratio == 1.0:
                for t in range(steps):
                    _close(out["delivered"][t][b], means[t][b], 1e-12, f"rank {r} step {t}: ratio 1 is the average")


@settings(max_examples=4 * SCALE)
@given(world=st.integers(1, 4), shapes=buckets, steps=st.integers(1, 3), momentum=st.sampled_from([0.5, 0.9]),
       seed=st.integers(0, 99))
def test_topk_at_ratio_one_with_momentum_is_sgd_momentum(pool, world, shapes, steps, momentum, seed):
    # the module docstring's promise: dense steps keep the velocity u = m u + mean
    cfg = {"world": world, "shapes": shapes, "dtype": "float64", "hook": "topk", "seed": seed, "steps": steps,
           "ratio": 1.0, "momentum": momentum}
    means = _true_means(cfg)
    results = _members(pool.run(fns.hook_steps_run, cfg), world)
    for b in range(len(shapes)):
        velocity = np.zeros_like(means[0][b])
        for t in range(steps):
            velocity = momentum * velocity + means[t][b]
            for r, out in enumerate(results):
                _close(out["delivered"][t][b], velocity, 1e-12, f"rank {r} step {t} bucket {b}")


# ----------------------------------------------------------------------------------------- bucketing
params = st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["float32", "float64", "float16"])), max_size=8)


@given(params=params, cap=st.integers(0, 200), first_cap=st.none() | st.integers(0, 200))
@example(params=[(100, "float64"), (1, "float64")], cap=16, first_cap=None)      # a parameter larger than the cap
@example(params=[(3, "float32"), (3, "float64"), (3, "float32")], cap=10 ** 6, first_cap=None)
@example(params=[], cap=0, first_cap=0)
def test_plan_buckets_places_every_parameter_once_by_torchs_rule(params, cap, first_cap):
    plan = plan_buckets(params, cap, first_cap)
    assert sorted(i for b in plan for i in b) == list(range(len(params))), plan   # each exactly once
    limit = max(cap, 1)
    first = limit if first_cap is None else max(min(first_cap, limit), 1)
    seen_dtypes = set()
    for b in plan:
        assert b and len({np.dtype(params[i][1]) for i in b}) == 1, f"mixed dtypes in {b}"
        assert b == sorted(b, reverse=True), f"{b}: not in reverse registration order"
        dtype = np.dtype(params[b[0]][1])
        bucket_cap = limit if dtype in seen_dtypes else first
        seen_dtypes.add(dtype)
        nbytes = [params[i][0] * dtype.itemsize for i in b]
        # closed as soon as it reached its cap: only its last parameter may take it there
        assert sum(nbytes[:-1]) < bucket_cap, (b, nbytes, bucket_cap)
    # launch order: per dtype, buckets follow reverse registration order
    for dtype in {np.dtype(d) for _, d in params}:
        mine = [b for b in plan if np.dtype(params[b[0]][1]) == dtype]
        assert [i for b in mine for i in b] == sorted((i for b in mine for i in b), reverse=True)


@pytest.mark.parametrize("cap, first_cap", [(-1, None), (10, -1), (float("nan"), None)])
def test_plan_buckets_refuses_a_negative_cap(cap, first_cap):
    with pytest.raises(ValueError, match=r"plan_buckets: (first_)?cap=.* must be a number of bytes >= 0"):
        plan_buckets([(3, "float32")], cap, first_cap)


@pytest.mark.parametrize("cap", [0, -1.0, float("nan")])
def test_ddp_refuses_a_bucket_cap_that_is_not_positive_at_the_call(cap):
    from neural_arch import nn
    from neural_arch.distributed import DistributedDataParallel

    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0"):
        DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=cap)   # a world of one: no init needed


@pytest.mark.parametrize("state", ["gloo", [0, 1], 2])
def test_a_hook_state_that_is_not_a_group_is_a_clear_error_at_the_call(state):
    # it was an AttributeError ('str' object has no attribute 'size') in the middle of backward
    from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook, topk_hook

    pattern = r"process_group=.* must be a ProcessGroup from new_group\(\) \(or None for the default group\)"
    with pytest.raises(TypeError, match="PowerSGDState: " + pattern):
        powerSGD_hook.PowerSGDState(process_group=state)
    with pytest.raises(TypeError, match="TopKState: " + pattern):
        topk_hook.TopKState(process_group=state)
    bucket = fns.bucket_of(0, [np.ones(3)], last=True)
    with pytest.raises(TypeError, match="comm hook: " + pattern):
        default_hooks.allreduce_hook(state, bucket)
    assert bucket.buffer().tolist() == [1.0, 1.0, 1.0]     # refused before touching the gradients
