"""Tensor-parallel generation: ``GPT.generate`` on a model from ``parallelize_gpt`` (tp = 2, gloo and
mpi) gives the single-process model's tokens, its float64 logits within 1e-10 at every step, a KV
cache holding this rank's heads only, and a fixed number of collectives per decode step.

What is counted per decode step (the collective spans this process reports, one step = the forward
of the new token plus the choice of the token before it), with L blocks:

* ``all_reduce``: 2 L + 1 -- one closing each of Megatron's parallel blocks (attention's row-parallel
  ``out_proj`` and the MLP's row-parallel ``fc2``: two per transformer block) and one for the
  vocabulary-parallel token embedding;
* the token choice: with vocabulary-parallel logits one ``all_gather`` (greedy: (value, id) pairs;
  sampling: the last position's logits) plus, when sampling, one ``broadcast`` of rank 0's tokens;
  with gathered logits (``loss_parallel=False``) the head's ``all_gather`` and, when sampling, the
  ``broadcast``.
"""

import pytest
import tp_rank_fns as fns

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

TOL = 1e-10


@pytest.fixture(scope="module", params=[
    pytest.param("gloo", id="gloo-2"),
    pytest.param("mpi", id="mpi-2", marks=pytest.mark.mpi),
])
def pool(request):
    with RankPool(2, backend=request.param, timeout=120.0) as p:
        yield p


def _expected_per_step(n_layer: int, do_sample: bool) -> dict:
    want = {"all_reduce": 2 * n_layer + 1, "all_gather": 1}
    if do_sample:
        want["broadcast"] = 1
    return want


@pytest.mark.parametrize("loss_parallel", [True, False], ids=["vocab-parallel-logits", "gathered-logits"])
@pytest.mark.parametrize("padded", [False, True], ids=["same-length", "left-padded"])
def test_greedy_tokens_and_logits_equal_single_process(pool, loss_parallel, padded):
    for rank, out in enumerate(pool.run(fns.tp_generate_run, loss_parallel, False, padded)):
        assert out["tp"] == out["ref"], f"rank {rank}: {out['tp']} != {out['ref']}"
        assert out["steps"] == 6 and out["logits"] <= TOL, f"rank {rank}: logits differ by {out['logits']:g}"
        assert out["cache_heads"] == fns.TP_GENERATE_SHAPE["n_head"] // pool.world_size
        want = _expected_per_step(out["n_layer"], False)
        assert out["per_step"] == [want] * (out["steps"] - 1), f"rank {rank}: {out['per_step']}"
        # the prefill's forward alone (no choice yet), and the last step's choice alone
        head_gathers = {} if loss_parallel else {"all_gather": 1}
        assert out["first_step"] == {"all_reduce": 2 * out["n_layer"] + 1, **head_gathers}
        assert out["last_choice"] == ({"all_gather": 1} if loss_parallel else {})


@pytest.mark.parametrize("rank_seeds_differ", [False, True], ids=["same-seed", "rank-seeds-differ"])
def test_sampling_draws_the_same_tokens_on_every_rank(pool, rank_seeds_differ):
    results = pool.run(fns.tp_generate_run, True, True, True, 0, 6, rank_seeds_differ)
    assert results[0]["tp"] == results[1]["tp"]       # rank 0's draw is broadcast
    for rank, out in enumerate(results):
        # rank 0's generator is seeded as the single-process one: its draws are the reference's
        assert out["tp"] == out["ref"], f"rank {rank}"
        assert out["logits"] <= TOL
        assert out["per_step"] == [_expected_per_step(out["n_layer"], True)] * (out["steps"] - 1)


def test_vocab_parallel_argmax_resolves_ties_and_nans_as_argmax(pool):
    for got, want in pool.run(fns.vocab_parallel_argmax_run):
        assert got == want


def test_sequence_parallel_model_cannot_decode_and_says_why(pool):
    for msg in pool.run(fns.sequence_parallel_generate_run):
        assert msg is not None and "sequence_parallel=False for inference" in msg
