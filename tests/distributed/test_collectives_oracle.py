"""Oracle property tests: every collective against NumPy on the whole global array.

One suite, run against every backend variant and world size (see conftest.py): hypothesis
varies dtype, shape (0-d, empty, smaller than the world, non-divisible), reduce op, roots
and sub-groups; the ranks run the collective and send their answers back; the test compares
each rank's answer with NumPy's on the global array.

Each configuration explores its own examples (:func:`explore` seeds hypothesis from the variant and
world size, so runs are reproducible and gloo-tcp-3 does not re-check gloo-tcp-2's examples), and
``@example``-style pins run everywhere: every dtype x reduce op pair, and sizes on both sides of each
algorithm's switch-over (gloo's ring / chain thresholds, MPI's two-rank pairwise window).
"""

from __future__ import annotations

import os
import zlib

import dist_oracle_fns as F
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

from neural_arch.config import get as config_get
from neural_arch.distributed.comm.gloo.executor import (
    CHAIN_BROADCAST_MIN_BYTES,
    RING_ALLREDUCE_DEFAULT_MIN_BYTES,
    RING_ALLREDUCE_MIN_BYTES,
)

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(240)]

EXAMPLES = int(os.environ.get("NEURAL_ARCH_ORACLE_EXAMPLES", "25"))

DTYPE_NAMES = ["float16", "float32", "float64", "int32", "int64"]
OP_NAMES = ["sum", "avg", "max", "min", "product"]
DTYPES = st.sampled_from(DTYPE_NAMES)
SHAPES = array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
OPS = st.sampled_from(OP_NAMES)
SEEDS = st.integers(0, 2**31 - 1)
TOL = {"float16": {"rtol": 2e-2, "atol": 5e-2}, "float32": {"rtol": 1e-5, "atol": 1e-5},
       "float64": {"rtol": 1e-12, "atol": 1e-12}}


def _threshold_lengths(*thresholds: int) -> list[int]:
    """float64 lengths just under and at each byte threshold."""
    return sorted({n for t in thresholds for n in (t // 8 - 1, t // 8)})


def all_reduce_pins(pool) -> list[dict]:
    """Every dtype x op pair on a small shape (float32 included), then float64 sizes on both sides of the
    switch-overs this configuration has: gloo's ring all_reduce threshold for its world size, MPI's
    two-rank pairwise window (16 KiB up to NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES). The "pipe" variants force
    their algorithms at every size: no switch-over to cross."""
    pins = [dict(seed=7, shape=(3,), dtype=d, op=o, async_op=False) for d in DTYPE_NAMES for o in OP_NAMES]
    variant, n = getattr(pool, "variant", pool.backend), pool.world_size
    edges = []
    if variant in ("gloo-tcp", "gloo-shm") and n > 1:
        edges = _threshold_lengths(RING_ALLREDUCE_MIN_BYTES.get(n, RING_ALLREDUCE_DEFAULT_MIN_BYTES))
    elif variant == "mpi" and n == 2:
        edges = _threshold_lengths(16 << 10, int(config_get("NEURAL_ARCH_MPI_PAIRWISE_MAX_BYTES")))
    return pins + [dict(seed=11, shape=(e,), dtype="float64", op="sum", async_op=True) for e in edges]


def broadcast_pins(pool) -> list[dict]:
    """Both sides of gloo's chain-broadcast threshold (3+ ranks, unforced variants)."""
    if getattr(pool, "variant", "") not in ("gloo-tcp", "gloo-shm") or pool.world_size < 3:
        return []
    return [dict(seed=5, shape=(e,), dtype="float64", root=1) for e in _threshold_lengths(CHAIN_BROADCAST_MIN_BYTES)]


def explore(*, examples: int = EXAMPLES, pins=(), **strategies):
    """Make ``body(pool, **drawn)`` a property test of the ``pool`` configuration: hypothesis draws
    ``examples`` examples from ``strategies`` with a seed derived from the configuration, after the
    ``pins`` (dicts of arguments, hypothesis's ``@example``; or a function of the pool giving them)."""
    def decorate(body):
        def test(pool):
            def case(**drawn):
                body(pool, **drawn)

            run = given(**strategies)(case)
            for pin in reversed(pins(pool) if callable(pins) else pins):
                run = example(**pin)(run)
            configuration = f"{getattr(pool, 'variant', pool.backend)}-{pool.world_size}:{body.__name__}"
            run = settings(max_examples=examples, deadline=None, derandomize=False, database=None,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                  HealthCheck.differing_executors])(run)
            seed(zlib.crc32(configuration.encode()))(run)()
        # the test's own name and docstring, but not functools.wraps: pytest must see test(pool)'s signature
        test.__name__, test.__qualname__, test.__doc__ = body.__name__, body.__qualname__, body.__doc__
        test.pytestmark = getattr(body, "pytestmark", [])
        return test
    return decorate


def assert_same(got, expected, dtype, where=""):
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype), f"{where}: dtype {got.dtype} != {dtype}"
    assert got.shape == expected.shape, f"{where}: shape {got.shape} != {expected.shape}"
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), err_msg=where,
                                   **TOL[str(np.dtype(dtype))])
    else:
        np.testing.assert_array_equal(got, expected, err_msg=where)


def fix_op(op, dtype):
    return "sum" if op == "avg" and np.dtype(dtype).kind != "f" else op


@explore(pins=all_reduce_pins, seed=SEEDS, shape=SHAPES, dtype=DTYPES, op=OPS, async_op=st.booleans())
def test_all_reduce(pool, seed, shape, dtype, op, async_op):
    op = fix_op(op, dtype)
    expected = F.reduce_np(F.global_array(seed, pool.world_size, shape, dtype), op)
    for r, got in enumerate(pool.run(F.all_reduce_fn, seed, shape, dtype, op, async_op)):
        assert_same(got, expected, dtype, f"rank {r}")


@explore(seed=SEEDS, shape=SHAPES, dtype=DTYPES, op=st.sampled_from(["sum", "max"]))
def test_all_reduce_raw_array(pool, seed, shape, dtype, op):
    expected = F.reduce_np(F.global_array(seed, pool.world_size, shape, dtype), op)
    for r, got in enumerate(pool.run(F.all_reduce_raw_fn, seed, shape, dtype, op)):
        assert_same(got, expected, dtype, f"rank {r}")


@explore(seed=SEEDS, shape=SHAPES, dtype=DTYPES, op=OPS)
def test_all_reduce_repeated_shape(pool, seed, shape, dtype, op):
    """Repeats hit the cached paths (gloo's whole-buffer exchange path from the second call)."""
    op = fix_op(op, dtype)
    for r, results in enumerate(pool.run(F.all_reduce_repeated_fn, seed, shape, dtype, op)):
        for i, got in enumerate(results):
            expected = F.reduce_np(F.global_array(seed + i, pool.world_size, shape, dtype), op)
            assert_same(got, expected, dtype, f"rank {r} call {i}")


@explore(pins=broadcast_pins,
         seed=SEEDS, shape=SHAPES, dtype=DTYPES, root=st.integers(0, 4))
def test_broadcast(pool, seed, shape, dtype, root):
    src = root % pool.world_size
    g = F.global_array(seed, pool.world_size, shape, dtype)
    for r, got in enumerate(pool.run(F.broadcast_fn, seed, shape, dtype, src)):
        assert_same(got, g[src], dtype, f"rank {r}")


@explore(pins=[dict(seed=3, shape=(5,), dtype=d, op=o, root=2) for d in DTYPE_NAMES for o in OP_NAMES],
         seed=SEEDS, shape=SHAPES, dtype=DTYPES, op=OPS, root=st.integers(0, 4))
def test_reduce(pool, seed, shape, dtype, op, root):
    op, dst = fix_op(op, dtype), root % pool.world_size
    g = F.global_array(seed, pool.world_size, shape, dtype)
    for r, got in enumerate(pool.run(F.reduce_fn, seed, shape, dtype, op, dst)):
        # the root holds the reduction; every other rank's tensor is left as it was
        assert_same(got, F.reduce_np(g, op) if r == dst else g[r], dtype, f"rank {r}")


@explore(seed=SEEDS, shape=SHAPES, dtype=DTYPES, torch_form=st.booleans())
def test_all_gather(pool, seed, shape, dtype, torch_form):
    g = F.global_array(seed, pool.world_size, shape, dtype)
    for r, got in enumerate(pool.run(F.all_gather_fn, seed, shape, dtype, torch_form)):
        assert len(got) == pool.world_size
        for i, part in enumerate(got):
            assert_same(part, g[i], dtype, f"rank {r} slot {i}")


@explore(seed=SEEDS, shape=SHAPES, dtype=DTYPES, root=st.integers(0, 4), torch_form=st.booleans())
def test_gather_and_scatter(pool, seed, shape, dtype, root, torch_form):
    root %= pool.world_size
    g = F.global_array(seed, pool.world_size, shape, dtype)
    for r, got in enumerate(pool.run(F.gather_fn, seed, shape, dtype, root, torch_form)):
        if r != root:
            assert got is None
            continue
        for i, part in enumerate(got):
            assert_same(part, g[i], dtype, f"gather slot {i}")
    for r, got in enumerate(pool.run(F.scatter_fn, seed, shape, dtype, root)):
        assert_same(got, g[r], dtype, f"scatter rank {r}")


@explore(pins=[dict(seed=9, k=2, tail=(), dtype=d, op=o, form=f) for d in DTYPE_NAMES for o in OP_NAMES
               for f in ("list", "tensor")],
         seed=SEEDS, k=st.integers(0, 3), tail=array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4),
         dtype=DTYPES, op=OPS, form=st.sampled_from(["seed", "list", "tensor"]))
def test_reduce_scatter(pool, seed, k, tail, dtype, op, form):
    n = pool.world_size
    op = fix_op(op, dtype)
    shape = (n * k,) + tuple(tail)
    total = F.reduce_np(F.global_array(seed, n, shape, dtype), op)
    for r, got in enumerate(pool.run(F.reduce_scatter_fn, seed, shape, dtype, op, form)):
        assert_same(got, total[r * k:(r + 1) * k], dtype, f"rank {r}")


@explore(seed=SEEDS, k=st.integers(0, 3), tail=array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4),
         dtype=DTYPES, form=st.sampled_from(["list", "pair", "single"]))
def test_all_to_all(pool, seed, k, tail, dtype, form):
    n = pool.world_size
    shape = (n * k,) + tuple(tail)
    g = F.global_array(seed, n, shape, dtype)
    for r, got in enumerate(pool.run(F.all_to_all_fn, seed, shape, dtype, form)):
        # slot s of rank r's output is chunk r of rank s's input
        expected = np.concatenate([g[s][r * k:(r + 1) * k] for s in range(n)]) if n else g[0]
        assert_same(got, expected, dtype, f"rank {r}")


@pytest.mark.cases(lambda p: p["pool"][1] >= 2)   # a ring of one rank sends nothing: nothing to prove
@explore(seed=SEEDS, shape=SHAPES, dtype=DTYPES, tag=st.integers(0, 1000), blocking=st.booleans())
def test_send_recv_ring(pool, seed, shape, dtype, tag, blocking):
    n = pool.world_size
    g = F.global_array(seed, n, shape, dtype)
    for r, got in enumerate(pool.run(F.ring_fn, seed, shape, dtype, tag, blocking)):
        assert_same(got, g[(r - 1) % n], dtype, f"rank {r}")


@explore(seed=SEEDS, shape=array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4), dtype=DTYPES,
         data=st.data(), op=OPS)
def test_subgroups(pool, seed, shape, dtype, data, op):
    n = pool.world_size
    op = fix_op(op, dtype)
    members = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1), label="members"))
    src = data.draw(st.sampled_from(members), label="src (global rank)")
    g = F.global_array(seed, n, shape, dtype)
    for r, got in enumerate(pool.run(F.subgroup_fn, seed, shape, dtype, members, op, src)):
        if r not in members:
            assert got is None
            continue
        red, bc, gathered = got
        assert_same(red, F.reduce_np(g[members], op), dtype, f"group all_reduce rank {r}")
        assert_same(bc, g[src], dtype, f"group broadcast rank {r}")
        assert len(gathered) == len(members)
        for i, m in enumerate(members):
            assert_same(gathered[i], g[m], dtype, f"group all_gather rank {r} slot {i}")


@explore(examples=max(3, EXAMPLES // 3), seed=st.integers(0, 1000), root=st.integers(0, 4))
def test_object_collectives(pool, seed, root):
    n = pool.world_size
    src = root % n
    for r, (objs, everyone, gathered, item) in enumerate(pool.run(F.objects_fn, seed, src)):
        assert objs == [{"seed": seed, "from": src}, ("tuple", src)]
        assert everyone == [{"rank": i, "payload": "x" * (i * 7 + seed % 5)} for i in range(n)]
        assert gathered == ([i * 10 for i in range(n)] if r == src else None)
        assert item == f"item{r}"


@explore(examples=max(3, EXAMPLES // 3), seed=SEEDS,
         shape=array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=64), k=st.integers(1, 6))
def test_async_in_flight(pool, seed, shape, k):
    n = pool.world_size
    for r, (results, last) in enumerate(pool.run(F.async_many_fn, seed, shape, "float32", k)):
        for i, got in enumerate(results):
            expected = F.reduce_np(F.global_array(seed + i, n, shape, "float32"), "sum")
            assert_same(got, expected, "float32", f"rank {r} op {i}")
        np.testing.assert_array_equal(last, np.full(2, float(n - 1)))


@pytest.mark.cases(lambda p: "pipe" in p["pool"][0])   # only the gloo-pipe-* variants force those algorithms
def test_pipe_variants_really_run_the_ring_and_chain(pool):
    """Guards the "pipe" variants themselves: if the env names drift, they would silently test
    recursive doubling again."""
    for seg, used in pool.run(F.algorithms_fn):
        assert seg == 64
        assert used == {"all_reduce": True, "reduce": True, "broadcast": True}, used
