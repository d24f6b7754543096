"""Failures are loud and bounded: a missing rank times out naming it, a dead rank fails its peers fast,
and the debug mode catches mismatched collectives on every rank."""

import gloo_procs
import numpy as np
import pytest
from gloo_inproc import run_threads

import neural_arch.distributed.comm.gloo.transport.engine  # noqa: F401  (a broken transport must fail, not skip)
from neural_arch.distributed.errors import CollectiveMismatchError

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(60)]


def _pool(size, mode, timeout_s):
    from neural_arch.distributed.testing import RankPool

    return RankPool(size, backend="gloo", init=False, timeout=40,
                    env={"GLOO_TEST_TRANSPORT": mode, "GLOO_TEST_TIMEOUT": str(timeout_s)})


@pytest.mark.parametrize("mode", ["shm", "tcp"])
def test_missing_rank_times_out_with_a_useful_message(mode):
    with _pool(3, mode, 3) as pool:
        results = pool.run_detailed(gloo_procs.allreduce_unless_last)
    kinds = [r.value[0] if r.ok else r.exc_type for r in results]
    # the first rank to time out poisons the job: the other may see its own timeout or that first
    # failure -- either way the message names the op and the missing rank
    assert kinds[2] == "skipped" and "CollectiveTimeoutError" in kinds[:2], results
    assert set(kinds[:2]) <= {"CollectiveTimeoutError", "GroupPoisonedError"}, results
    msgs = [r.value[1] for r in results[:2]]
    assert all("all_reduce #2" in m and "shape (4,)" in m for m in msgs), msgs
    # rank 1 waits on rank 2 itself: whether it timed out first or was told by rank 0 (which waits
    # on rank 1 and may only know its direct peer), its message names rank 2
    assert "ranks [2] did not arrive" in msgs[1] or "still waiting for ranks [2]" in msgs[1], msgs
    assert all(2.5 < r.value[2] < 15 for r in results[:2])


@pytest.mark.parametrize("mode", ["shm", "tcp"])
def test_dead_rank_fails_its_peer_fast(mode):
    with _pool(2, mode, 20) as pool:
        results = pool.run_detailed(gloo_procs.die_if_last)
    first = results[0]
    assert first.ok, first
    kind, msg, waited = first.value
    assert kind == "PeerFailureError", (kind, msg)
    assert "rank 1" in msg and waited < 10, (msg, waited)


def test_debug_mode_reports_mismatch_on_every_rank():
    def body(b):
        b.debug = True
        try:
            b.allreduce(np.ones(3 + b.rank, np.float32))
        except CollectiveMismatchError as exc:
            return str(exc)
        return "no error"
    out = run_threads(2, body)
    assert all("shape (3,)" in m and "shape (4,)" in m for m in out), out
