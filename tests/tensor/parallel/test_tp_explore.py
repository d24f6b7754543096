"""Exploring tests (hypothesis) for tensor parallelism: ``parallelize_module`` with Colwise/Rowwise
(default and Replicate layouts), a sequence-parallel region (RowwiseParallel(output_layouts=Shard(1))
-> SequenceParallel LayerNorm -> ColwiseParallel(input_layouts=Shard(1))), and
``vocab_parallel_cross_entropy`` (ignore_index, reduction mean/sum/none, all targets ignored) on
random widths, batch shapes and dtypes, against the dense single-process model: output, loss and
every gradient within 1e-10 in float64 (float32: a float32 tolerance and a float32 result).
Widths that do not divide tp must raise a clear error on every rank, never compute.
Ranks are real gloo processes (one RankPool of 3 for the module: 3 divides few widths).
"""

import os

import pytest
import tp_explore_rank_fns as fns
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    Replicate,
    RowwiseParallel,
    Shard,
)
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)
WORLD = 3
# EXPLORE_EXAMPLES=300 explores with random draws; the suite runs a small derandomized set
_SETTINGS = {"max_examples": int(os.environ.get("EXPLORE_EXAMPLES", "12")), "deadline": None,
             "suppress_health_check": list(HealthCheck), "derandomize": "EXPLORE_EXAMPLES" not in os.environ}


@pytest.fixture(scope="module")
def pool():
    with RankPool(WORLD, backend="gloo", timeout=120.0) as p:
        yield p


def _tol(dtype):
    return 1e-10 if dtype == "float64" else 2e-3


mlp_cases = st.fixed_dictionaries({
    "cin": st.integers(1, 5), "hid": st.sampled_from([3, 6, 4, 7]), "cout": st.integers(1, 4),
    "bias": st.booleans(), "gather": st.booleans(), "seq": st.booleans(),
    "batch": st.integers(1, 3), "t": st.sampled_from([0, 3, 6, 2]),
    "dtype": st.sampled_from(["float64", "float32"]), "seed": st.integers(0, 50)})


@settings(**_SETTINGS)
@given(case=mlp_cases)
@example(case={"cin": 1, "hid": 3, "cout": 1, "bias": False, "gather": True, "seq": False, "batch": 1, "t": 0,
               "dtype": "float64", "seed": 0})                                  # size 1 everywhere
@example(case={"cin": 2, "hid": 6, "cout": 3, "bias": True, "gather": False, "seq": True, "batch": 2, "t": 2,
               "dtype": "float64", "seed": 1})                                  # T=2 does not divide tp=3
def test_parallelize_module_mlp_equals_the_dense_model(pool, case):
    results = pool.run(fns.mlp_run, case)
    # a sequence-parallel region cuts T (t=0 there: an empty sequence, which computes an empty result)
    divides = case["hid"] % WORLD == 0 and (not case["seq"] or case["t"] % WORLD == 0)
    for rank, r in enumerate(results):
        if not divides:
            assert r["error"] is not None, f"rank {rank}: {case} computed instead of raising: {r}"
            assert r["error"][0] == "ValueError" and "divisible" in r["error"][1], r["error"]
            continue
        assert r["error"] is None, f"rank {rank}: {case}: {r['error']}"
        assert r["missing"] == [], f"rank {rank}: no gradient for {r['missing']}"
        assert r["dtype"] == case["dtype"], f"rank {rank}: {case} computed in {r['dtype']}"
        tol = _tol(case["dtype"])
        for what in ("out", "loss", "grad"):
            assert r[what] <= tol * (100 if what == "loss" else 1), f"rank {rank} {case}: {what} differs by {r[what]}"


loss_cases = st.fixed_dictionaries({
    "vocab": st.sampled_from([3, 6, 9]), "shape": st.sampled_from([[1], [4], [2, 3], [1, 1]]),
    "reduction": st.sampled_from(["mean", "sum", "none"]), "ignore_index": st.sampled_from([-100, 0, 2]),
    "n_ignored": st.integers(0, 6), "dtype": st.sampled_from(["float64", "float32"]), "seed": st.integers(0, 50)})


@settings(**_SETTINGS)
@given(case=loss_cases)
@example(case={"vocab": 3, "shape": [2, 3], "reduction": "mean", "ignore_index": -100, "n_ignored": 6,
               "dtype": "float64", "seed": 0})                                  # every target ignored: nan, as torch
@example(case={"vocab": 6, "shape": [1], "reduction": "none", "ignore_index": 2, "n_ignored": 1,
               "dtype": "float32", "seed": 3})
def test_vocab_parallel_cross_entropy_equals_cross_entropy(pool, case):
    for rank, r in enumerate(pool.run(fns.vocab_loss_run, case)):
        assert r["error"] is None, f"rank {rank}: {case}: {r['error']}"
        assert r["shape"][0] == r["shape"][1], f"rank {rank}: {case}: shapes {r['shape']}"
        assert r["dtype"] == case["dtype"]
        tol = _tol(case["dtype"])
        assert r["loss"] <= tol * 10 and r["grad"] <= tol, f"rank {rank} {case}: {r}"


@pytest.mark.parametrize("kind, error, words", [
    ("tied_gpt", "NotImplementedError", "tok_emb.weight is the same parameter as head.weight"),  # was silently untied
    ("tied_linear", "NotImplementedError", "0.weight is the same parameter as 1.weight"),       # was silently untied
    ("sequence_parallel_twice", "ValueError", "already sequence-parallel"),  # was: LayerNorm grads all-reduced twice
    ("rowwise_twice", "TypeError", "not RowParallelLinear"),
])
def test_a_plan_that_would_change_the_model_raises_on_every_rank(pool, kind, error, words):
    for rank, err in enumerate(pool.run(fns.misuse_run, kind)):
        assert err is not None, f"rank {rank}: {kind} went through (a silently different model)"
        assert err[0] == error and words in err[1], f"rank {rank}: {err}"


gpt_cases = st.fixed_dictionaries({
    "vocab": st.sampled_from([6, 9, 7]), "n_head": st.sampled_from([3, 6, 2]), "head_dim": st.integers(1, 2),
    "t": st.sampled_from([3, 6, 2, 1]), "batch": st.integers(1, 2), "loss_parallel": st.booleans(),
    "sp": st.booleans(), "seed": st.integers(0, 50)})


@settings(**_SETTINGS)
@given(case=gpt_cases)
@example(case={"vocab": 6, "n_head": 3, "head_dim": 1, "t": 1, "batch": 1, "loss_parallel": True, "sp": False,
               "seed": 0})                                                      # one position
@example(case={"vocab": 9, "n_head": 3, "head_dim": 2, "t": 3, "batch": 2, "loss_parallel": False, "sp": True,
               "seed": 1})
def test_parallelize_gpt_equals_the_dense_gpt(pool, case):
    results = pool.run(fns.gpt_run, case)
    ok = case["vocab"] % WORLD == 0 and case["n_head"] % WORLD == 0 and (not case["sp"] or case["t"] % WORLD == 0)
    for rank, r in enumerate(results):
        if not ok:
            assert r["error"] is not None and r["error"][0] == "ValueError", f"rank {rank} {case}: {r}"
            assert "divisible" in r["error"][1], r["error"]
            continue
        assert r["error"] is None, f"rank {rank} {case}: {r['error']}"
        assert r["missing"] == [], f"rank {rank}: no gradient for {r['missing']}"
        assert r["loss"] <= 1e-10 and r["grad"] <= 1e-10, f"rank {rank} {case}: {r}"


@pytest.mark.parametrize("make", [
    lambda: ColwiseParallel(use_local_output=False),
    lambda: RowwiseParallel(use_local_output=False),
    lambda: PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1), use_local_output=False),
], ids=["colwise", "rowwise", "prepare_input"])
def test_use_local_output_false_is_refused_at_the_call(make):
    # torch returns a DTensor there; the local shard it returned instead made y.sum() silently local
    with pytest.raises(NotImplementedError, match=r"use_local_output=False\): a DTensor output is not implemented"):
        make()
