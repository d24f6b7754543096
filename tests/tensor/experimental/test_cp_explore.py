"""Exploring properties of context parallelism against a plain NumPy float64 reference: ring attention
(p2p and allgather) and Ulysses for random leading dims, lengths, head sizes (Dv != D), scales, block
sizes, cp = 1..4 (subgroups of one 4-rank pool), both layouts, float32 and float64; the
shard/unshard round trip for lengths that do and do not divide; bad inputs that must be clear errors.
Bugs this exploration found are pinned in test_bad_inputs_are_clear_errors.
"""

import cp_explore_rank_fns as fns
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(240)

WORLD = 4


@pytest.fixture(scope="module")
def pool():
    with RankPool(WORLD, backend="gloo", timeout=120.0) as p:
        yield p


@st.composite
def cp_case(draw):
    algo = draw(st.sampled_from(["p2p", "allgather", "ulysses"]))
    cp = draw(st.integers(1, WORLD))
    lb = draw(st.booleans())
    per_rank = draw(st.integers(1, 3)) * (2 if lb else 1)
    if algo == "ulysses":
        lead = (draw(st.integers(1, 2)), cp * draw(st.integers(1, 2)))       # (B, H): H divides by cp
    else:
        lead = tuple(draw(st.lists(st.integers(1, 2), min_size=0, max_size=2)))
    return (algo, cp, draw(st.booleans()), lb, lead, per_rank * cp, draw(st.integers(1, 3)),
            draw(st.integers(1, 3)), draw(st.sampled_from([None, 0.5])),
            draw(st.sampled_from(["float64", "float32"])), draw(st.sampled_from([None, 1, 3])),
            draw(st.integers(0, 999)))


def _check(pool, cases):
    results = pool.run(fns.attention_cases, cases)
    for rank, per_rank in enumerate(results):
        for case, got in zip(cases, per_rank):
            assert (got is None) == (rank >= case[1]), (rank, case)
            if got is None:
                continue
            diffs, dtype = got
            assert dtype == case[9], (case, dtype)
            tol = 1e-10 if case[9] == "float64" else 1e-4
            for what, d in zip(("out", "dq", "dk", "dv", "unshard"), diffs):
                assert d <= tol, f"rank {rank} {case}: {what} differs by {d:g}"


@given(st.lists(cp_case(), min_size=12, max_size=12))
@settings(max_examples=2)
def test_cp_attention_equals_reference(pool, cases):
    _check(pool, cases)


def test_cp_attention_pinned_edge_cases(pool):
    _check(pool, [
        ("p2p", 4, True, False, (), 4, 1, 2, None, "float64", 1, 0),            # one position per rank, 2-D
        ("allgather", 3, True, True, (2,), 6, 2, 3, 0.5, "float64", 3, 1),      # Dv != D, cp = 3
        ("ulysses", 4, True, True, (1, 4), 8, 2, 1, None, "float32", None, 2),
        ("ulysses", 2, False, False, (2, 2), 2, 3, 2, 0.5, "float64", 1, 3),
        ("p2p", 2, False, True, (1, 1, 1), 4, 1, 1, None, "float32", None, 4),
    ])


LAYOUTS = [(cp, shape, dim, lb) for cp in (1, 2, 3, 4)
           for shape, dim in (((2, 12, 1), 1), ((12,), 0), ((1, 2, 12), -1), ((2, 7), 1), ((0, 12), 1))
           for lb in (True, False)]


def test_shard_unshard_round_trip_or_clear_error(pool):
    results = pool.run(fns.layout_cases, LAYOUTS)
    for rank, per_rank in enumerate(results):
        for (cp, shape, dim, lb), got in zip(LAYOUTS, per_rank):
            if rank >= cp:
                assert got is None
                continue
            length = shape[dim]
            parts = 2 * cp if lb else cp
            if length % parts:
                assert got[0] == "error" and f"sequence length {length} does not divide" in got[1], got
                continue
            assert got[:3] == ("ok", True, True), (rank, cp, shape, dim, lb, got)
            share = np.asarray(got[3])
            # the unshard's backward sums every rank's gradient (cp each) onto this rank's share only
            assert np.all(share == cp) and got[4] == cp * share.size, (rank, cp, shape, dim, lb, got)


def test_bad_inputs_are_clear_errors(pool):
    for out in pool.run(fns.bad_input_cases):
        for name, message in out.items():
            assert message != "no error", f"{name}: accepted silently"
        assert "ValueError" in out["ring_kv_len"]
        assert "does not divide" in out["ring_odd_local"]
        assert "must be (B, H, T/cp, D)" in out["ulysses_k_heads"]
        assert "NotImplementedError" in out["lse_in_context_parallel"] and "return_lse" in out["lse_in_context_parallel"]
