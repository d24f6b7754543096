"""Issue 15's "Elastic end-to-end": 4 ranks on two launchers (two "nodes" on one host, --nnodes 1:2);
node 1's launcher is SIGKILLed mid-training; the job re-forms on node 0's 2 ranks from the last
commit without operator action and finishes. The final model equals plain NumPy SGD on the same
global batches (the example keeps the global batch across the size change), and every sample of
the interrupted epoch is trained on exactly once in the surviving lineage of steps."""

from __future__ import annotations

import numpy as np
import pytest
from elastic_e2e_driver import run_shrink_job
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
def test_killing_a_node_shrinks_the_job_which_resumes_from_the_last_commit_and_finishes(tmp_path):
    res = run_shrink_job(str(tmp_path), kill_at_step=40)
    assert res["codes"] == (0, -9), res["err"][-4000:]
    assert "node 1's launcher disconnected during round 0" in res["err"]
    records = res["records"]
    assert sorted(records) == [0, 1], "exactly one re-formation (restart 0 at 4 ranks, restart 1 at 2)"
    assert {r["world"] for r in records[0]} == {4} and {r["world"] for r in records[1]} == {2}

    # node 1's ranks died with their launcher (they watch their parent)
    dead_pids = {r["pid"] for r in records[0]}
    assert all(not pid_alive(pid) for pid in dead_pids)

    # the surviving lineage: steps before the resume point from attempt 0, the rest from attempt 1
    resume = min(r["step"] for r in records[1])
    assert resume % 2 == 0 and 0 < resume <= max(r["step"] for r in records[0]) + 1  # a commit boundary
    lineage: dict[int, list[int]] = {}
    for attempt, keep in ((0, lambda s: s < resume), (1, lambda s: s >= resume)):
        for r in records[attempt]:
            if keep(r["step"]):
                lineage.setdefault(r["step"], []).extend(r["ids"])
    assert sorted(lineage) == list(range(EPOCHS * N // G)), "no step lost or run twice"
    for step, ids in lineage.items():  # each step trains on the epoch's order[kG:(k+1)G], at any size
        epoch, k = divmod(step, N // G)
        order = np.random.default_rng(SAMPLER_SEED + epoch).permutation(N)
        assert sorted(ids) == sorted(order[k * G:(k + 1) * G].tolist()), step
    interrupted = resume // (N // G)
    seen = [i for step, ids in lineage.items() if step // (N // G) == interrupted for i in ids]
    assert sorted(seen) == list(range(N)), "every sample of the interrupted epoch exactly once"

    final = np.load(res["final"])
    w, b = numpy_reference()
    assert int(final["step"]) == EPOCHS * N // G
    np.testing.assert_allclose(final["weight"], w, rtol=0, atol=1e-10)
    np.testing.assert_allclose(final["bias"], b, rtol=0, atol=1e-10)
    print(f"kill -> first step at world size 2: {res['kill_to_first_step_s']:.2f} s (shared box; not asserted)")
