"""Never silently wrong: ranks whose collectives at one sequence number differ in size, dtype or
reduce op get an error on *every* rank, on every gloo transport -- never each other's bytes.

Over TCP a large all_reduce streams in pipelined segments; a segment can have exactly the byte count
of a smaller all_reduce's whole buffer, and before every frame carried its op's byte count
(``framing.HEADER``) two such ranks exchanged a segment for a buffer and returned mixed data. The
shared-memory direct collectives compare their op words (size included) at the first barrier.

A call rejected by argument validation (a read-only buffer on one rank) does not consume a sequence
number (as in torch): the rank's next call takes it, so a retry with a valid buffer pairs with the
peers' call, and any other call is caught by the same checks on both ranks.

One pool of two rank processes for the module; every example that fails rebuilds the group (a
mismatch poisons it).
"""

import pytest
import wire_mismatch_procs as W
from hypothesis import given, settings
from hypothesis import strategies as st

import neural_arch.distributed.comm.gloo.transport.engine  # noqa: F401  (a broken transport must fail, not skip)
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(120)]

# element counts around the crossovers: 128 Ki float32 is one 512 KiB pipeline segment, 1 Mi
# float32 (4 MiB) is where two ranks switch from recursive doubling to the ring
SIZES = [1, 1000, 128 << 10, 1 << 20]
DTYPES = ["float32", "float64", "int32"]
OPS = ["sum", "max"]
SPEC = st.tuples(st.sampled_from(SIZES), st.sampled_from(DTYPES), st.sampled_from(OPS))


@st.composite
def spec_pairs(draw):
    """Rank 0's (nelems, dtype, op) and rank 1's: the same, or differing in one field, or in any."""
    mine = draw(SPEC)
    how = draw(st.sampled_from(["same", "size", "dtype", "op", "any"]))
    if how == "same":
        return [mine, mine]
    theirs = draw(SPEC.filter(lambda s: s != mine and all(
        a == b for i, (a, b) in enumerate(zip(s, mine)) if how != "any" and i != ["size", "dtype", "op"].index(how))))
    return [mine, theirs]


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", init=False, timeout=60, env={"GLOO_TEST_TIMEOUT": "10"}) as p:
        p.fresh = True
        yield p


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@settings(max_examples=16)
@given(specs=spec_pairs(), algo=st.sampled_from([None, None, "ring", "rd"]))
def test_mismatched_all_reduce_fails_on_every_rank_never_returns_wrong_data(pool, transport, specs, algo):
    results = pool.run(W.mismatched_allreduce, transport, specs, algo, pool.fresh)
    if specs[0] == specs[1]:
        assert results == [("ok", True)] * 2, (specs, algo, results)
        pool.fresh = False
    else:
        pool.fresh = True
        assert all(r[0] != "ok" for r in results), (specs, algo, results)   # loud on both ranks
        assert all("Mismatch" in r[0] or r[0] == "GroupPoisonedError" for r in results), results


def test_pipelined_segment_of_a_large_all_reduce_is_not_taken_for_a_small_one(pool):
    """The case the property found first, pinned: 4 MiB (ring, 512 KiB segments) against 512 KiB."""
    pool.fresh = True
    results = pool.run(W.mismatched_allreduce, "tcp", [(1 << 20, "float32", "sum"), (128 << 10, "float32", "sum")],
                       None, True)
    assert [r[0] for r in results] == ["FrameMismatchError"] * 2, results
    assert "4194304 bytes" in results[0][1] and "524288 bytes" in results[0][1], results


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_call_rejected_on_one_rank_only_never_pairs_wrongly(pool, transport):
    pool.fresh = True
    # the next call differs (512 KiB): both ranks fail at once, naming both sizes -- not rank 0
    # returning a slice of rank 1's 8 MiB, nor rank 1 waiting for the timeout
    r0, r1 = pool.run(W.rejected_then_next, transport, 128 << 10)
    assert r0[0][0] == "ValueError" and "read-only" in r0[0][1], r0
    assert r0[1][0] != "ok" and r1[0][0] != "ok", (r0, r1)
    assert "8388608" in r0[1][1] and "524288" in r0[1][1], r0
    assert r0[-1] < 8 and r1[-1] < 8, (r0, r1)
    # the next call is the retry with a writable buffer: it pairs with rank 1's call, correctly
    r0, r1 = pool.run(W.rejected_then_next, transport, 2 << 20)
    assert r0[0][0] == "ValueError" and r0[1] == ("ok", True) and r1[0] == ("ok", True), (r0, r1)
