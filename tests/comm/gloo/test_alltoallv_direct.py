"""gloo's uneven all-to-all on the shared segment (``DirectCollectives.alltoallv``) over real processes.

One pool of 5 ranks with 4 KiB chunks: groups of 1 to 5 ranks (sub-groups of the world) run split
matrices that break uneven exchanges (nothing moves, a rank that sends or receives nothing, only the
own blocks, one block of many chunks beside zeros, random ones with many zeros), a mix of dtypes
(bfloat16 included: bytes move, nothing is reduced), rows of 0-3 dims, sync and async, each followed
by an all_reduce that turns the segment's buffers over; every rank checks its output against NumPy.
The same cases run over the plans (forced, and on TCP: the pairwise steps and their cache). Splits
that disagree are an error on every rank naming the pairs (a CollectiveMismatchError, or the poisoned
group's error carrying it where a faster rank raised first), every output untouched; a peer that
never arrives is a CollectiveTimeoutError naming the op, its number and the missing rank.
"""

from __future__ import annotations

import re

import alltoallv_direct_procs as D
import numpy as np
import pytest

from neural_arch.distributed.comm.gloo.transport.shm_segment import direct_supported
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(120),
              pytest.mark.skipif(not direct_supported(), reason="direct shm collectives need Linux on x86-64")]

WORLD = 5
_ENV = {"GLOO_TEST_TRANSPORT": "shm", "GLOO_TEST_TIMEOUT": "30", "NEURAL_ARCH_SHM_CHUNK_BYTES": "4096"}
_DTYPES = ["float64", "float32", "float16", "int64", "int32", "int8", "bool", "uint8", "bfloat16"]
_TAILS = [(2,), (), (2, 3), (0,), (1, 2, 2), (300,)]     # (300,) float64: 2400-byte rows, chunks of 4 KiB


def _cases(k: int) -> list:
    pins = [
        [[0] * k for _ in range(k)],                                             # nothing moves
        [[0] * k] + [[(s + d) % 3 for d in range(k)] for s in range(1, k)],      # rank 0 sends nothing
        [[(s * d) % 4 if d else 0 for d in range(k)] for s in range(k)],        # rank 0 receives nothing
        [[3 if s == d else 0 for d in range(k)] for s in range(k)],               # only the own blocks
        [[9 if (s, d) == (k - 1, 0) else 0 for d in range(k)] for s in range(k)],  # one big block, zeros
    ]
    rng = np.random.default_rng(100 + k)
    for _ in range(3):
        pins.append((rng.integers(0, 5, size=(k, k)) * (rng.random((k, k)) > 0.4)).tolist())
    return [(1000 * k + i, counts, _DTYPES[(i + k) % len(_DTYPES)], _TAILS[i % len(_TAILS)] if i != 4 else (300,),
             i % 3 == 2) for i, counts in enumerate(pins)]


CASES = {k: _cases(k) for k in range(1, WORLD + 1)}


@pytest.fixture(scope="module")
def pool():
    with RankPool(WORLD, backend="gloo", init=False, timeout=90, env=_ENV) as p:
        yield p


def test_groups_of_one_to_five_match_numpy_on_the_segment_and_over_the_plans(pool):
    for rank, got in enumerate(pool.run(D.cases_on_subgroups, CASES)):
        for k, cases in CASES.items():
            if rank < k:
                assert got[k] == ["ok"] * len(cases), (rank, k, got[k])
            else:
                assert k not in got
        if rank < 3:
            assert got["plans"] == ["ok"] * 8, (rank, got["plans"])


def test_tcp_runs_the_cached_pairwise_steps(pool):
    cases = CASES[3]
    results = pool.run(D.tcp_cases, cases)
    assert results[:3] == [["ok"] * (2 * len(cases))] * 3, results
    assert results[3:] == [None, None]


def test_splits_that_disagree_raise_on_every_rank_and_touch_no_output(pool):
    results = pool.run(D.mismatched_splits)
    for rank, (text, untouched, algo) in enumerate(results[:3]):
        assert algo == "direct", (rank, algo)
        # a rank still in the barrier when a faster one raised sees the group poisoned by that error
        assert text.split(":")[0] in ("CollectiveMismatchError", "GroupPoisonedError"), (rank, text)
        assert "all_to_allv #1" in text and "rank 1 sends 1 rows to rank 0, which expects 2" in text, (rank, text)
        assert untouched, rank
    assert any(text.startswith("CollectiveMismatchError") for text, _, _ in results[:3]), results
    assert results[3:] == [None, None]


def test_a_peer_that_never_arrives_is_a_timeout_naming_the_op(pool):
    timeout = 1.0
    results = pool.run(D.peer_never_arrives, timeout)
    kind, msg, waited, _ = results[0]
    assert kind == "CollectiveTimeoutError", results[0]
    assert "all_to_allv #2" in msg and re.search(r"ranks \[1\] did not arrive", msg), msg
    assert timeout - 0.2 < waited < timeout + 5, waited
    assert results[1][0] == "skipped" and results[2:] == [None, None, None]
