"""The Backend interface's uneven all-to-all (``Backend.alltoallv``) against NumPy, on real ranks.

gloo runs its pairwise exchange of blocks of their own length, MPI its ``Ialltoallv`` on the caller's
buffers, and both also run the interface's default hook (the padding path other backends inherit).
Three ranks (an odd size: pairwise steps past the first), every dtype family, rows of 0-3 dims
(a zero-byte row included), and the split matrices that break uneven exchanges: nothing moves, a
rank whose rows all go elsewhere, a rank that receives nothing, only the own block, one huge block
beside zeros; then seeded random matrices with many zeros. Every rank rebuilds the global case from
its seed; each output is compared with NumPy's on the whole matrix. MPI also checks the splits
inside its call check: ranks whose splits disagree all raise, nothing sent.
"""

from __future__ import annotations

import alltoallv_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(180)]

N = 3


def _cases() -> list:
    pins = [
        [[0, 0, 0], [0, 0, 0], [0, 0, 0]],          # nothing moves
        [[0, 2, 1], [0, 1, 3], [0, 0, 2]],          # rank 0 keeps nothing and receives nothing
        [[1, 1, 1], [0, 0, 0], [2, 0, 1]],          # rank 1 sends nothing
        [[2, 0, 0], [0, 3, 0], [0, 0, 1]],          # only the own blocks
        [[0, 9, 0], [0, 0, 0], [1, 0, 0]],          # one large block beside zeros
    ]
    dtypes = ["float64", "float32", "float16", "int64", "int32", "bool", "uint8"]
    tails = [(2,), (), (2, 3), (0,), (1, 2, 2)]
    cases = [(i, counts, dtypes[i % len(dtypes)], tails[i % len(tails)], i % 2 == 1) for i, counts in enumerate(pins)]
    rng = np.random.default_rng(31)
    for i in range(12):
        counts = rng.integers(0, 5, size=(N, N)) * (rng.random((N, N)) > 0.35)
        cases.append((100 + i, counts.tolist(), dtypes[i % len(dtypes)], tails[(i + 1) % len(tails)], i % 3 == 0))
    return cases


CASES = _cases()


@pytest.fixture(scope="module", params=[pytest.param("gloo", id="gloo-3"),
                                        pytest.param("mpi", id="mpi-3", marks=pytest.mark.mpi)])
def pool(request):
    with RankPool(N, backend=request.param, timeout=60.0) as p:
        p.backend_name = request.param
        yield p


@pytest.mark.parametrize("padded", [False, True], ids=["native", "padding-default"])
def test_alltoallv_matches_numpy(pool, padded):
    results = pool.run(fns.alltoallv_cases, CASES, padded)
    for rank, outputs in enumerate(results):
        assert len(outputs) == len(CASES)
        for (seed, counts, dtype, tail, _async), got in zip(CASES, outputs):
            want = fns.expected_output(seed, counts, dtype, tail, rank)
            assert got.dtype == want.dtype and got.shape == want.shape, (seed, rank, got.shape, want.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"case {seed} {counts} {dtype} {tail}: rank {rank}")


def test_argument_errors_are_raised_before_any_io(pool):
    for rank, errors in enumerate(pool.run(fns.bad_arguments)):
        *messages, after = errors
        assert len(messages) == 5 and all("all_to_allv" in m for m in messages), (rank, messages)
        assert after == [float(2 * rank)] * N           # an equal split afterwards still works


@pytest.mark.cases(lambda p: p["pool"] == "mpi")
def test_mpi_split_mismatch_raises_on_every_rank(pool):
    """Checked inside MPI's call check (on a sub-group, so the pool's world stays usable)."""
    for rank, text in enumerate(pool.run(fns.mismatched_splits)):
        assert text.startswith("CollectiveMismatchError"), (rank, text)
        assert "rank 1 sends 1 rows to rank 0, which expects 2" in text, (rank, text)
