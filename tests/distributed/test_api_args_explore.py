"""Exploring properties of the collectives' public arguments, on real gloo ranks (one RankPool).

* ``all_to_all_single`` with uneven split lists (empty splits, trailing dims, three dtypes) and the
  list forms of scatter / gather / ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` equal
  their NumPy reference;
* a wrong length, shape, dtype or rank is a clear error naming the argument on **every** rank,
  never a hang and never wrong data, and the group stays usable afterwards.
"""

from __future__ import annotations

import api_args_rank_fns as fns
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.testing import RankPool

WORLD = 3


@pytest.fixture(scope="module")
def pool():
    with RankPool(WORLD, backend="gloo", timeout=60.0) as p:
        yield p


@settings(max_examples=8)
@given(counts=st.lists(st.lists(st.integers(0, 3), min_size=WORLD, max_size=WORLD), min_size=WORLD, max_size=WORLD),
       dtype=st.sampled_from(["float64", "float32", "int64"]), tail=st.sampled_from([(), (2,), (1, 3)]))
@example(counts=[[0, 0, 0], [0, 0, 0], [0, 0, 0]], dtype="float64", tail=())     # every split empty
@example(counts=[[0, 3, 0], [1, 0, 0], [0, 0, 2]], dtype="float32", tail=(2,))   # one-way traffic
def test_all_to_all_single_uneven_splits_match_numpy(pool, counts, dtype, tail):
    got = pool.run(fns.all_to_all_single_run, counts, dtype, tail, timeout=60)
    for r, rows in enumerate(got):
        want = [np.full(tail, 100 * s + 10 * r + k, dtype=dtype).tolist()
                for s in range(WORLD) for k in range(counts[s][r])]
        assert rows == want


@settings(max_examples=5)
@given(shape=st.sampled_from([(), (1,), (2, 3)]), dtype=st.sampled_from(["float64", "float32", "int32"]),
       root=st.integers(0, WORLD - 1))
def test_list_collectives_match_numpy(pool, shape, dtype, root):
    for r, (mine, got, flat, rs) in enumerate(pool.run(fns.scatter_gather_run, shape, dtype, root, timeout=60)):
        assert mine == np.full(shape, 10 * r + 1, dtype=dtype).tolist()
        if r == root:
            assert got == [np.full(shape, k, dtype=dtype).tolist() for k in range(WORLD)]
        else:
            assert got is None
        lead = shape[0] if shape else 1
        assert flat == np.repeat(np.arange(WORLD, dtype=dtype), lead * int(np.prod(shape[1:] or (1,))))\
            .reshape((WORLD * lead,) + shape[1:]).tolist()
        assert rs == np.full(shape, WORLD * (r + 1), dtype=dtype).tolist()


# case -> (exception type, a word the message must contain), on every rank that made the bad call
SAME_ON_EVERY_RANK = {
    "split_len": ("ValueError", "input_split_sizes"),
    "split_sum": ("ValueError", "input_split_sizes"),
    "split_negative": ("ValueError", "input_split_sizes"),
    "split_dtype": ("ValueError", "dtype"),
    "split_peers_disagree": ("ValueError", "output_split_sizes"),
    "agit_output_shape": ("ValueError", "output_tensor"),
    "agit_output_dtype": ("TypeError", "output_tensor"),
    "rst_input_shape": ("ValueError", "divisible"),
    "rst_output_noncontiguous": ("ValueError", "contiguous"),
    "bol_not_list": ("TypeError", "object_list"),
    "bol_src_range": ("ValueError", "src"),
    "ago_len": ("ValueError", "object_list"),
    "send_tag": ("ValueError", "tag"),
    "send_dst_range": ("ValueError", "dst"),
    "send_self": ("ValueError", "dst"),
}


@pytest.mark.parametrize("case", sorted(SAME_ON_EVERY_RANK))
def test_bad_argument_is_a_clear_error_on_every_rank(pool, case):
    kind, word = SAME_ON_EVERY_RANK[case]
    for rank, ((got_kind, message), healthy) in enumerate(pool.run(fns.error_cases_run, case, timeout=30)):
        assert (got_kind, word in message) == (kind, True), (rank, got_kind, message)
        assert healthy == WORLD


@pytest.mark.parametrize("case, root, arg", [
    ("scatter_list_len", 0, "scatter_list"), ("scatter_list_shape", 0, "scatter_list"),
    ("scatter_list_missing", 0, "scatter_list"),
    ("gather_list_len", WORLD - 1, "gather_list"), ("gather_list_dtype", 0, "gather_list"),
    ("gather_object_list_len", 0, "object_gather_list"),
    ("scatter_object_list_len", WORLD - 1, "scatter_object_input_list"),
])
def test_root_only_argument_error_reaches_every_rank(pool, case, root, arg):
    """The root alone sees ``scatter_list`` / ``gather_list``: a bad one used to leave the other ranks
    waiting for a scatter that never came (a hang) or returning from a gather as if it had run."""
    for rank, ((got_kind, message), healthy) in enumerate(pool.run(fns.error_cases_run, case, timeout=30)):
        assert got_kind in ("ValueError", "TypeError") and arg in message, (rank, got_kind, message)
        if rank != root:
            assert f"global rank {root}" in message
        assert healthy == WORLD


def test_recv_into_a_buffer_of_another_shape_names_both(pool):
    out = pool.run(fns.error_cases_run, "recv_shape", timeout=30)
    assert out[0][0] == ("ok", None)
    kind, message = out[1][0]
    assert kind == "ValueError" and "(2,)" in message and "(3,)" in message
    assert all(healthy == WORLD for _, healthy in out)
