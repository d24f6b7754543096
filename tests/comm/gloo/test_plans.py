"""Oracle tests of the collective plans: simulate them in NumPy and compare with a NumPy reduction.

No sockets here. ``simulate`` itself asserts that every receive meets the matching send of the
same length in the same step, so a plan that passes cannot deadlock or desynchronise on the wire.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neural_arch.distributed.comm.gloo import plans as P

SIZES = range(1, 10)
LENGTHS = [0, 1, 2, 3, 5, 7, 8, 9, 13, 64, 101]
OPS = {
    "sum": (np.add, lambda a: a.sum(axis=0)),
    "max": (np.maximum, lambda a: a.max(axis=0)),
    "min": (np.minimum, lambda a: a.min(axis=0)),
}


def _inputs(size, n, seed=0):
    rng = np.random.default_rng(seed + 97 * size + n)
    return rng.integers(-50, 50, size=(size, n)).astype(np.int64)


def _reducer(ufunc):
    return lambda dst, src: ufunc(dst, src, out=dst)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("builder", [P.ring_allreduce_plan, P.recursive_doubling_plan])
def test_allreduce_plans_match_numpy(builder, size, op):
    ufunc, oracle = OPS[op]
    for n in LENGTHS:
        data = _inputs(size, n)
        out = P.simulate(builder(size, n), list(data), _reducer(ufunc))
        for r in range(size):
            np.testing.assert_array_equal(out[r], oracle(data), err_msg=f"{builder.__name__} size={size} n={n} r={r}")


@pytest.mark.parametrize("size", SIZES)
def test_ring_reduce_scatter_gives_rank_r_chunk_r(size):
    for n in LENGTHS:
        data = _inputs(size, n)
        out = P.simulate(P.ring_reduce_scatter_plan(size, n), list(data))
        total = data.sum(axis=0)
        for r, (a, b) in enumerate(P.chunk_bounds(n, size)):
            np.testing.assert_array_equal(out[r][a:b], total[a:b])


@pytest.mark.parametrize("size", SIZES)
def test_ring_allgather_collects_every_chunk(size):
    for n in LENGTHS:
        bounds = P.chunk_bounds(n, size)
        full = np.arange(n)
        bufs = []
        for r, (a, b) in enumerate(bounds):
            buf = np.full(n, -1)
            buf[a:b] = full[a:b]
            bufs.append(buf)
        for out in P.simulate(P.ring_allgather_plan(size, n), bufs):
            np.testing.assert_array_equal(out, full)


@pytest.mark.parametrize("size", SIZES)
def test_broadcast_plans_deliver_root_data(size):
    for n in LENGTHS:
        for root in range(size):
            data = _inputs(size, n, seed=root)
            plans = [P.binomial_broadcast_plan(size, n, root)]
            plans += [P.chain_broadcast_plan(size, n, root, segments=k) for k in (1, 2, 3, 5)]
            for plan in plans:
                for out in P.simulate(plan, list(data)):
                    np.testing.assert_array_equal(out, data[root], err_msg=f"{plan.name} n={n} root={root}")


@pytest.mark.parametrize("size", SIZES)
def test_binomial_reduce_reaches_root(size):
    for n in LENGTHS:
        for root in range(size):
            data = _inputs(size, n, seed=root)
            for builder in (P.binomial_reduce_plan, P.ring_reduce_plan):
                out = P.simulate(builder(size, n, root), list(data), _reducer(np.maximum))
                np.testing.assert_array_equal(out[root], data.max(axis=0), err_msg=builder.__name__)


@pytest.mark.parametrize("size", SIZES)
def test_pairwise_alltoall_transposes_blocks(size):
    for per in (0, 1, 3):
        n = per * size
        data = _inputs(size, n)
        out = P.simulate(P.pairwise_alltoall_plan(size, n), list(data))
        blocks = data.reshape(size, size, per)      # [sender, dest, elem]
        for r in range(size):
            np.testing.assert_array_equal(out[r], blocks[:, r, :].reshape(-1))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), size=st.integers(1, 6), width=st.integers(0, 3))
def test_pairwise_alltoallv_moves_uneven_blocks(data, size, width):
    """Uneven splits, zeros included (a rank that sends or receives nothing, an all-zero matrix): rank r
    ends with block r of every sender, in sender order; a zero-length block is no message at all."""
    counts = np.array(data.draw(st.lists(st.lists(st.sampled_from([0, 0, 1, 2, 5]), min_size=size, max_size=size),
                                         min_size=size, max_size=size), label="counts"))
    plan = P.pairwise_alltoallv_plan(counts, width)
    inputs = [np.arange(counts[s].sum() * width, dtype=np.int64) + 1000 * s for s in range(size)]
    outputs = [np.full(counts[:, r].sum() * width, -1, dtype=np.int64) for r in range(size)]
    out = P.simulate(plan, inputs, outputs=outputs)
    for r in range(size):
        blocks = [inputs[s][counts[s, :r].sum() * width:counts[s, :r + 1].sum() * width] for s in range(size)]
        np.testing.assert_array_equal(out[r], np.concatenate(blocks))
    for step in plan:
        if step.send_to is not None and step.send_to != step.rank:
            assert step.send_len > 0, step
        if step.recv_from is not None and step.recv_from != step.rank:
            assert step.recv_len > 0, step


def test_pairwise_alltoallv_steps_need_one_count_per_rank():
    with pytest.raises(ValueError, match="counts"):
        P.pairwise_alltoallv_steps(3, 0, [1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="square"):
        P.pairwise_alltoallv_plan([[1, 2]])


def test_alltoall_rejects_non_divisible():
    with pytest.raises(ValueError, match="divisible"):
        P.pairwise_alltoall_plan(3, 7)


@pytest.mark.parametrize("size", SIZES)
def test_dissemination_barrier_hears_from_everyone(size):
    plan = P.dissemination_barrier_plan(size)
    P.simulate(plan, [np.zeros(1)] * size)             # messages all match
    known = [{r} for r in range(size)]
    for k in range(plan.nsteps):
        before = [set(s) for s in known]
        for s in plan:
            if s.step == k:
                known[s.rank] |= before[s.recv_from]
    assert all(len(s) == size for s in known)


@pytest.mark.parametrize("size", SIZES)
def test_ring_invariants(size):
    for n in LENGTHS:
        bounds = P.chunk_bounds(n, size)
        # chunks partition the array, in order, sizes within one of each other
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        lens = [b - a for a, b in bounds]
        assert max(lens) - min(lens) <= 1
        assert [b - a for a, b in bounds] == [len(x) for x in np.array_split(np.arange(n), size)]
        plan = P.ring_allreduce_plan(size, n)
        if n >= size:  # no empty chunks: every rank is busy every step
            counts = {len(plan.for_rank(r)) for r in range(size)}
            assert counts == {2 * (size - 1)}
            for r in range(size):
                steps = plan.for_rank(r)
                assert all(s.send_to == (r + 1) % size and s.recv_from == (r - 1) % size for s in steps)
                # reduce-scatter phase receives every chunk but one exactly once
                got = [s.recv_chunk for s in steps[:size - 1]]
                assert len(set(got)) == size - 1
        for s in plan:  # a step never receives (copy) over the slice it is sending
            if s.send_to is not None and s.recv_from is not None:
                assert s.send_chunk[1] <= s.recv_chunk[0] or s.recv_chunk[1] <= s.send_chunk[0]


@pytest.mark.parametrize("size", SIZES)
def test_latency_plans_are_logarithmic(size):
    q = 1 << (size.bit_length() - 1)
    rd = P.recursive_doubling_plan(size, 4)
    assert rd.nsteps == (q.bit_length() - 1) + (2 if size != q else 0)
    assert P.binomial_broadcast_plan(size, 4).nsteps == (size - 1).bit_length()
    assert P.dissemination_barrier_plan(size).nsteps == (size - 1).bit_length()
    assert P.recursive_doubling_plan(2, 4).nsteps == 1


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 9), n=st.integers(0, 300), op=st.sampled_from(sorted(OPS)), seed=st.integers(0, 99))
def test_allreduce_property(size, n, op, seed):
    ufunc, oracle = OPS[op]
    data = _inputs(size, n, seed)
    for plan in (P.ring_allreduce_plan(size, n), P.recursive_doubling_plan(size, n)):
        for out in P.simulate(plan, list(data), _reducer(ufunc)):
            np.testing.assert_array_equal(out, oracle(data))


def test_float_allreduce_identical_on_every_rank():
    # Ring and recursive doubling must give bit-identical results on every rank (DDP replicas
    # would drift apart otherwise), even though float addition is not associative.
    data = np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32)
    for plan in (P.ring_allreduce_plan(5, 37), P.recursive_doubling_plan(5, 37)):
        out = P.simulate(plan, list(data))
        for r in range(1, 5):
            np.testing.assert_array_equal(out[r], out[0])
        np.testing.assert_allclose(out[0], data.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_simulate_catches_a_broken_plan():
    good = P.ring_allreduce_plan(3, 6)
    rows = list(good.by_rank)
    rows[1] = rows[1][1:]          # rank 1 forgets a step
    bad = P.Plan("broken", 3, 6, tuple(rows))
    with pytest.raises(AssertionError):
        P.simulate(bad, [np.ones(6)] * 3)


def test_format_plan_is_readable():
    text = P.format_plan(P.ring_allreduce_plan(3, 7))
    assert text.splitlines()[0] == "ring_allreduce (size=3, nelems=7)"
    assert ">1[5:7] <2[3:5]+" in text
    assert "root=2" in P.format_plan(P.binomial_broadcast_plan(4, 8, root=2))
    assert "more ranks" in P.format_plan(P.ring_allreduce_plan(9, 9), max_ranks=4)


def test_plan_iteration_and_len():
    plan = P.ring_allreduce_plan(4, 8)
    steps = list(plan)
    assert len(steps) == len(plan) == 4 * 6
    assert [s.step for s in steps] == sorted(s.step for s in steps)
    with pytest.raises(ValueError):
        P.ring_allreduce_plan(0, 3)
