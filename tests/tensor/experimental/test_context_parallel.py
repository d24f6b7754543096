"""Context parallelism: ring attention (p2p and allgather rotation), Ulysses, both sequence layouts,
cp = 1..world (subgroups of one 4-rank pool), forward and every input gradient equal to full
attention on the unsharded sequence (float64 <= 1e-10); the clear errors; torch's context-manager
form; GPT trained with CP equals single-process training. Ranks are real processes (one RankPool
per module parameter: gloo with 4 ranks, mpi with 2 under a real mpiexec).
"""

import cp_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(240)

TOL = 1e-10


@pytest.fixture(scope="module", params=[
    pytest.param(("gloo", 4), id="gloo-4"),
    pytest.param(("mpi", 2), id="mpi-2", marks=pytest.mark.mpi),
])
def pool(request):
    backend, world = request.param
    with RankPool(world, backend=backend, timeout=120.0) as p:
        yield p


def _cases(world):
    cases = []
    for algo in ("p2p", "allgather", "ulysses"):
        for cp in range(1, world + 1):
            for causal in (False, True):
                for lb in (True, False):
                    cases.append((algo, cp, causal, lb, 24, cp))
    # chunks of odd length (5) that the key blocks (2) cut unevenly
    cases += [("p2p", cp, True, True, 10 * cp, 50 + cp) for cp in range(2, world + 1)]
    return cases


def test_cp_attention_equals_full_attention(pool):
    cases = _cases(pool.world_size)
    results = pool.run(fns.attention_cases, cases)
    checked = 0
    for rank, per_rank in enumerate(results):
        for case, got in zip(cases, per_rank):
            algo, cp, causal, lb = case[:4]
            assert (got is None) == (rank >= cp), (rank, case)
            if got is None:
                continue
            checked += 1
            diffs, skipped = got
            for what, d in zip(("out", "dq", "dk", "dv", "unshard"), diffs):
                assert d <= TOL, f"rank {rank} {case}: {what} differs by {d:g}"
            if algo != "ulysses":
                # causal + contiguous: the blocks of later ranks are all masked for rank r and never
                # computed; load-balanced: every block holds something each rank sees
                assert skipped == (cp - 1 - rank if causal and not lb else 0), (rank, case, skipped)
    assert checked == sum(min(c[1], pool.world_size) for c in cases)


def test_clear_errors_for_lengths_and_heads(pool):
    n = pool.world_size
    for out in pool.run(fns.error_cases):
        assert f"sequence length {2 * n + 1} does not divide into 2 x cp = {2 * n} chunks" in out["length"]
        assert "pad the sequence at its end" in out["length"] and "ignore_index" in out["length"]
        assert f"number of heads ({n + 1}) must be divisible by the context-parallel size {n}" in out["heads"]


@pytest.mark.parametrize("rotate", ["alltoall", "allgather"])
def test_torch_context_manager_form(pool, rotate):
    for out in pool.run(fns.context_manager_case, rotate):
        assert out["shape"] == (2, 4, 8) and out["restored"]
        assert out["diff"] <= TOL


@pytest.mark.parametrize("load_balance, algorithm", [(True, "ring"), (False, "ring"), (True, "ulysses")])
def test_gpt_with_context_parallel_equals_single_process(pool, load_balance, algorithm):
    for rank, out in enumerate(pool.run(fns.gpt_cp_case, load_balance, algorithm)):
        for key in ("loss", "grads", "params"):
            assert out[key] <= TOL, f"rank {rank}: {key} differs by {out[key]:g}"


@pytest.mark.cases(lambda p: p["pool"][1] == 4)   # a 2 x 2 mesh needs 4 ranks
def test_gpt_with_tensor_and_context_parallel_equals_single_process(pool):
    for rank, out in enumerate(pool.run(fns.gpt_tp_cp_case)):
        assert out["loss"] <= TOL and out["params"] <= TOL, f"rank {rank}: {out}"


def test_padding_at_the_end_keeps_causal_results(pool):
    assert all(d <= TOL for d in pool.run(fns.padded_case))
