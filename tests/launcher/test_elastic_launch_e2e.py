"""Issue 15's "Elastic end-to-end": two launchers ("nodes" of 2 ranks on one host, --nnodes 1:2);
node 1 joins mid-training (the job grows to 4 ranks at the next restart), then its launcher is
SIGKILLed; the job re-forms on node 0's 2 ranks from the last commit without operator action and
finishes. The final model equals plain NumPy SGD on the same
global batches (the example keeps the global batch across the size change), and every sample of
the interrupted epoch is trained on exactly once in the surviving lineage of steps."""

from __future__ import annotations

import numpy as np
import pytest
from elastic_e2e_driver import attempts, run_elastic_job
from launcher_helpers import pid_alive

N, G, EPOCHS, LR, SAMPLER_SEED = 256, 8, 3, 0.05, 1


def numpy_reference():
    """The example's run done by hand: float64 linear regression, SGD on order[kG:(k+1)G]."""
    rng = np.random.default_rng(0)
    X, w_true = rng.normal(size=(N, 8)), rng.normal(size=(8, 1))
    Y = X @ w_true
    w, b = 0.1 * np.random.default_rng(2).normal(size=(1, 8)), np.zeros(1)
    for epoch in range(EPOCHS):
        order = np.random.default_rng(SAMPLER_SEED + epoch).permutation(N)
        for k in range(N // G):
            idx = order[k * G:(k + 1) * G]
            err = X[idx] @ w.T + b - Y[idx]                   # (G, 1)
            w = w - LR * (2.0 / G) * (err.T @ X[idx])
            b = b - LR * (2.0 / G) * err.sum(axis=0)
    return w, b


@pytest.mark.timeout(150)
def test_a_node_joins_mid_training_then_dies_and_the_job_finishes_equal_to_the_reference(tmp_path):
    """Node 0 alone (2 ranks); node 1 arrives at step 12: the job restarts at 4 ranks (a membership
    change, restart count 0); node 1's launcher is SIGKILLed at step 40: the job shrinks back to 2
    (restart 1) without operator action and finishes."""
    res = run_elastic_job(str(tmp_path), join_at_step=12, kill_at_step=40, last_call=0.3)
    assert res["codes"] == (0, -9), res["err"][-4000:]
    assert "node 1 is waiting to join round 1" in res["err"]
    assert "node 1's launcher disconnected during round 1" in res["err"]
    runs = attempts(res["records"])
    assert [({r["world"] for r in recs}, ) for recs in runs] == [({2},), ({4},), ({2},)], "2 -> 4 -> 2 ranks"
    assert sorted(res["records"]) == [0, 1], "joining keeps restart 0; the failure makes restart 1"

    # the ranks of every earlier attempt are gone (stopped by their launcher, or died with it)
    assert all(not pid_alive(r["pid"]) for recs in runs[:-1] for r in recs)

    # the surviving lineage: each attempt from its resume point to the next attempt's
    resumes = [min(r["step"] for r in recs) for recs in runs]
    assert resumes[0] == 0 and all(s % 2 == 0 for s in resumes)  # commit boundaries
    assert all(0 < b <= max(r["step"] for r in runs[k]) + 1 for k, b in enumerate(resumes[1:]))
    lineage: dict[int, list[int]] = {}
    for k, recs in enumerate(runs):
        end = resumes[k + 1] if k + 1 < len(runs) else float("inf")
        for r in recs:
            if resumes[k] <= r["step"] < end:
                lineage.setdefault(r["step"], []).extend(r["ids"])
    assert sorted(lineage) == list(range(EPOCHS * N // G)), "no step lost or run twice"
    for step, ids in lineage.items():  # each step trains on the epoch's order[kG:(k+1)G], at any size
        epoch, k = divmod(step, N // G)
        order = np.random.default_rng(SAMPLER_SEED + epoch).permutation(N)
        assert sorted(ids) == sorted(order[k * G:(k + 1) * G].tolist()), step
    for resume in resumes[1:]:
        interrupted = resume // (N // G)
        seen = [i for step, ids in lineage.items() if step // (N // G) == interrupted for i in ids]
        assert sorted(seen) == list(range(N)), "every sample of an interrupted epoch exactly once"

    final = np.load(res["final"])
    w, b = numpy_reference()
    assert int(final["step"]) == EPOCHS * N // G
    np.testing.assert_allclose(final["weight"], w, rtol=0, atol=1e-10)
    np.testing.assert_allclose(final["bias"], b, rtol=0, atol=1e-10)
    print(f"node 1 started -> first step at world size 4: {res['join_to_first_step_s']:.2f} s; "
          f"kill -> first step at world size 2: {res['kill_to_first_step_s']:.2f} s (shared box; not asserted)")
